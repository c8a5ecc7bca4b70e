"""Upkeep runs: start one (its steps as chained jobs in the ledger), report it, and undo it.

A run is also an operation (same id): its status is the status of its last step's job, so
`GET /v1/operations/{id}`, `wait=` and the `operation.completed` webhook work for it as for any
operation, and a step that dies cancels the steps after it.

Undo puts every memory the run changed back as it was before the run, as a new version with a
history row, unless the memory changed since (its version moved on): that one is left as it is
and listed. Relations the run wrote are removed, observations it wrote deleted (unless changed
since) and memories it pruned written back with their history."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.errors import BadInput, Conflict, NotFound
from pipeline.jobs import JobRef, JobSpec
from pipeline.memory import operations, policy
from pipeline.memory.memories import Author, write_history
from pipeline.memory.scopes import Scope
from pipeline.settings import Settings

STEP_KINDS = {"prune": jobs.PRUNE_MEMORIES, "promote": jobs.PROMOTE_MEMORIES,
              "merge": jobs.MERGE_MEMORIES, "decay": jobs.DECAY_MEMORIES,
              "link": jobs.LINK_MEMORIES}
STEPS = tuple(STEP_KINDS)
CONSOLIDATION = ("promote", "merge", "decay", "link")
# What a run may override of the tenant's policy, for itself alone.
OPTIONS = ("merge_similarity", "link_similarity")


def ordered(steps: Sequence[str]) -> list[str]:
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        raise BadInput(f"steps: unknown {unknown}; the steps are {', '.join(STEPS)}")
    if not steps:
        raise BadInput("steps: name at least one step")
    return [s for s in STEPS if s in steps]


async def start(conn: asyncpg.Connection, *, tenant_id: int, steps: Sequence[str],
                dry_run: bool, scope: dict[str, str], options: dict[str, float],
                trigger: str, key_id: int | None,
                settings: Settings) -> tuple[uuid.UUID, list[JobRef]]:
    """Write the run, its jobs (each step waits for the one before) and its operation, in the
    caller's transaction; returns the run's id and the first job to enqueue after commit.

    One run at a time per tenant: a run reads its whole scope, and a second one started
    meanwhile would only queue behind it and act on what the first is changing. A run whose
    step died does not hold the next one back (its later steps are cancelled)."""
    steps = ordered(steps)
    await conn.execute(Q["upkeep.lock_tenant"], tenant_id)
    going = await conn.fetchval(Q["upkeep.run_going"], tenant_id)
    if going is not None:
        raise RunGoing(going)
    run_id = uuid.uuid4()
    rows = await jobs.create_jobs(
        conn, tenant_id=tenant_id, item_id=None, version=None,
        specs=[JobSpec(STEP_KINDS[s], after=STEP_KINDS[p] if p else None)
               for s, p in zip(steps, [None, *steps[:-1]], strict=True)],
        max_attempts=settings.max_attempts_for, payload={"run_id": str(run_id)})
    await conn.execute(Q["upkeep.run_insert"], tenant_id, run_id, steps, dry_run, trigger,
                       scope, options, key_id)
    await conn.execute(Q["upkeep.operation_insert"], tenant_id, run_id, rows[-1]["id"], scope,
                       key_id)
    return run_id, jobs.refs_to_enqueue(rows)


class RunGoing(Conflict):
    """Another run of the tenant has not finished."""

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(f"run {run_id} has not finished: a tenant runs one at a time; wait "
                         f"for it (GET /v1/consolidation/runs/{run_id}) and start again")
        self.run_id = run_id


def status_of(run: asyncpg.Record) -> str:
    if run["undone_at"] is not None:
        return "undone"
    if run["finished_at"] is not None:
        return "done"
    return operations.STATE.get(run["job_status"] or "", "pending")


def within(run: asyncpg.Record, bound: Scope) -> bool:
    """Whether a key bound to `bound` may see the run: one over its own scope. A run over more
    (the whole tenant) shows other users' memories in its changes."""
    return all(run["scope"].get(k) == v for k, v in bound.as_dict().items())


async def get(pool: asyncpg.Pool | asyncpg.Connection, tenant_id: int, run_id: uuid.UUID,
              bound: Scope = Scope()) -> dict[str, Any]:
    run = await pool.fetchrow(Q["upkeep.run_get"], tenant_id, run_id)
    if run is None or not within(run, bound):
        raise NotFound(f"no consolidation run {run_id}")
    counted = await pool.fetch(Q["upkeep.change_counts"], tenant_id, run_id)
    return describe(run, counted)


def describe(run: asyncpg.Record, counted: Sequence[asyncpg.Record] = ()) -> dict[str, Any]:
    changes: dict[str, dict[str, int]] = {}
    for r in counted:
        changes.setdefault(r["step"], {})[r["action"]] = r["n"]
    return {
        "id": run["id"], "status": status_of(run), "steps": list(run["steps"]),
        "dry_run": run["dry_run"], "trigger": run["trigger"], "scope": run["scope"],
        "options": run["options"], "counts": run["counts"], "changes": changes,
        "created_at": run["created_at"], "finished_at": run["finished_at"],
        "undone_at": run["undone_at"], "undo": run["undo"],
        "error": run["last_error"] if run["job_status"] == "dead" else None}


async def undo(pool: asyncpg.Pool, tenant_id: int, run_id: uuid.UUID, key_id: int | None,
               settings: Settings, bound: Scope = Scope()) -> dict[str, Any]:
    """Reverse an applied, finished run in one transaction; returns what it did."""
    async with pool.acquire() as conn, conn.transaction():
        run = await conn.fetchrow(Q["upkeep.run_lock"], tenant_id, run_id)
        if run is None or not within(run, bound):
            raise NotFound(f"no consolidation run {run_id}")
        if run["dry_run"]:
            raise Conflict("this run was a dry run: it changed nothing to undo")
        if run["undone_at"] is not None:
            raise Conflict(f"this run was undone already, at {run['undone_at'].isoformat()}")
        if run["finished_at"] is None:
            raise Conflict("this run has not finished: undo it once it has")
        changes = await conn.fetch(Q["upkeep.changes_all"], tenant_id, run_id)
        report = await _reverse(conn, tenant_id, run_id, changes, Author(key_id, None, run_id),
                                await policy.load(conn, tenant_id, settings))
        await conn.execute(Q["upkeep.run_undone"], tenant_id, run_id, report)
    return report


async def _reverse(conn: asyncpg.Connection, tenant_id: int, run_id: uuid.UUID,
                   changes: Sequence[asyncpg.Record], author: Author,
                   rules: policy.Policy) -> dict[str, Any]:
    report: dict[str, Any] = {"restored": 0, "reinserted": 0, "observations_deleted": 0,
                              "promotions_deleted": 0, "inbox_reopened": 0,
                              "relations_removed": 0, "skipped": []}
    status = await conn.execute(Q["upkeep.delete_run_relations"], tenant_id, run_id)
    report["relations_removed"] = int(status.rsplit(" ", 1)[-1])
    # Per memory: the fields as they were before the run's first change of them, and the
    # version its last change left it at (the one it must still be at to be restored).
    before: dict[uuid.UUID, dict[str, Any]] = {}
    last_version: dict[uuid.UUID, int] = {}
    for c in changes:
        if c["action"] in ("expire", "cap", "observe", "link", "promote", "drop") \
                or c["after_version"] is None:
            continue
        fields = before.setdefault(c["memory_id"], {})
        for k, v in (c["before"] or {}).items():
            fields.setdefault(k, v)
        last_version[c["memory_id"]] = c["after_version"]
    current = {r["id"]: r["version"] for r in await conn.fetch(
        Q["upkeep.version_of"], tenant_id, list(before))}
    reason = f"undo of consolidation run {run_id}"
    for memory_id, fields in before.items():
        if current.get(memory_id) != last_version[memory_id]:
            report["skipped"].append({"memory_id": str(memory_id), "reason": (
                "deleted since the run" if memory_id not in current else
                f"changed since the run (version {current[memory_id]}, the run left "
                f"{last_version[memory_id]})")})
            continue
        row = await conn.fetchrow(Q["upkeep.restore_fields"], tenant_id, memory_id, fields)
        await write_history(conn, tenant_id, row, "update", author, row["content"],
                            row["content"], fields, reason)
        report["restored"] += 1
    for c in changes:
        if c["action"] in ("promote", "drop"):
            inbox_id = c["other_id"] if c["action"] == "promote" else c["memory_id"]
            await conn.execute(Q["inbox.reopen"], tenant_id, inbox_id)
            report["inbox_reopened"] += 1
        if c["action"] in ("observe", "promote"):
            what = "observation" if c["action"] == "observe" else "promotion"
            if await conn.fetchval(Q["upkeep.delete_memory"], tenant_id, c["memory_id"],
                                   c["after_version"]) is not None:
                report[f"{what}s_deleted"] += 1
            else:
                report["skipped"].append({"memory_id": str(c["memory_id"]), "reason": (
                    f"a memory of the run ({what}) changed or deleted since")})
        elif c["action"] in ("expire", "cap") and c["before"] is not None:
            back = await conn.fetchval(Q["upkeep.reinsert"], tenant_id, c["before"]["row"])
            if back is None:
                report["skipped"].append({"memory_id": str(c["memory_id"]), "reason": (
                    "a memory with this id exists again")})
                continue
            await conn.execute(Q["upkeep.reinsert_history"], tenant_id, c["before"]["history"])
            # Its expiry as the policy says now: undoing a prune of expired memories usually
            # follows a lifetime found too short and since changed.
            row = c["before"]["row"]
            await conn.execute(Q["upkeep.set_expiry"], tenant_id, back, rules.expires_at(
                row["layer"], row["pinned"], datetime.fromisoformat(row["created_at"])))
            report["reinserted"] += 1
    report["at"] = datetime.now(UTC).isoformat()
    return report
