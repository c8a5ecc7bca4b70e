"""The jobs of an upkeep run, one per step. Each reads what it acts on first, outside any
transaction, then writes its changes, the record of them and its counts in the transaction
that marks its job done (pipeline/runner.py): a step that fails leaves nothing half-written,
and a retried one starts over from the data as it then is. In a dry run a step records what it
would change and changes nothing.

A change is applied only to a memory still at the version the step read: a memory edited
meanwhile is left alone and counted (`skipped_changed`)."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from pipeline import jobs, reindex, webhooks
from pipeline.db import Q
from pipeline.errors import PermanentError
from pipeline.jobs import JobRef
from pipeline.memory import memories, policy
from pipeline.memory.memories import Author, NewMemory
from pipeline.memory.scopes import Scope
from pipeline.memory.upkeep import similar
from pipeline.tasks import Deps, Task, Writer

# Sessions one link step writes observations for; the next run takes the rest.
OBSERVE_BATCH = 200
OBSERVATION_LINES = 3
OBSERVATION_LINE_CHARS = 160
# Memories one prune removes at most; the next run takes the rest.
PRUNE_BATCH = 100_000
OBSERVATION_CONFIDENCE = 0.9


@dataclass(frozen=True)
class Run:
    """What a step needs of its run: who, which scope, the thresholds in force."""

    tenant_id: int
    id: uuid.UUID
    dry_run: bool
    user_id: str | None
    agent_id: str | None
    rules: policy.Policy
    merge_similarity: float
    link_similarity: float

    @property
    def author(self) -> Author:
        return Author(None, None, self.id)

    @property
    def scoped(self) -> bool:
        return self.user_id is not None or self.agent_id is not None


async def _run(job: asyncpg.Record, deps: Deps) -> Run:
    tenant_id = job["tenant_id"]
    row = await deps.pool.fetchrow(Q["upkeep.run_get"], tenant_id,
                                   uuid.UUID(job["payload"]["run_id"]))
    if row is None:
        raise PermanentError("its upkeep run is gone (its tenant's data was deleted)")
    rules = await policy.load(deps.pool, tenant_id, deps.settings)
    options = row["options"]
    return Run(tenant_id=tenant_id, id=row["id"], dry_run=row["dry_run"],
               user_id=row["scope"].get("user_id"), agent_id=row["scope"].get("agent_id"),
               rules=rules,
               merge_similarity=options.get("merge_similarity", rules.merge_similarity),
               link_similarity=options.get("link_similarity", rules.link_similarity))


class Changes:
    """The rows of upkeep_changes a step writes, numbered after the run's earlier steps'."""

    def __init__(self, run: Run, step: str) -> None:
        self.run, self.step = run, step
        self.rows: list[tuple[Any, ...]] = []

    def add(self, action: str, memory_id: uuid.UUID, *, other_id: uuid.UUID | None = None,
            detail: dict[str, Any] | None = None, before: dict[str, Any] | None = None,
            after_version: int | None = None) -> None:
        self.rows.append((action, memory_id, other_id, detail or {}, before, after_version))

    async def write(self, conn: asyncpg.Connection, counts: dict[str, Any]) -> None:
        start = await conn.fetchval(Q["upkeep.next_seq"], self.run.tenant_id, self.run.id)
        await conn.executemany(Q["upkeep.change_insert"], [
            (self.run.tenant_id, self.run.id, start + i + 1, self.step, *row)
            for i, row in enumerate(self.rows)])
        await conn.execute(Q["upkeep.run_step_done"], self.run.tenant_id, self.run.id,
                           self.step, counts)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# Reading scopes -----------------------------------------------------------------------------


async def _scopes(deps: Deps, run: Run) -> AsyncIterator[list[asyncpg.Record]]:
    """The run's comparable memories, one scope (user, agent, visibility) at a time."""
    key = reindex.model_key(deps.settings)
    async with deps.pool.acquire() as conn, conn.transaction(readonly=True):
        group: list[asyncpg.Record] = []
        current: tuple[Any, ...] | None = None
        async for r in conn.cursor(Q["upkeep.comparable"], run.tenant_id, run.user_id,
                                   run.agent_id, key, prefetch=2000):
            here = (r["user_id"], r["agent_id"], r["visibility"])
            if here != current and group:
                yield group
                group = []
            current = here
            group.append(r)
        if group:
            yield group


def _rank(row: asyncpg.Record) -> tuple[Any, ...]:
    """Which of two duplicates is kept: a pinned one, one of a permanent layer, the newer
    statement (the latest wording of a fact), the more used, the more confident."""
    return (row["pinned"], row["layer"] in policy.PERMANENT_LAYERS, row["at"],
            row["access_count"], row["confidence"], str(row["id"]))


# prune --------------------------------------------------------------------------------------


async def prune(job: asyncpg.Record, deps: Deps) -> Writer:
    """Remove expired memories, then (for the whole tenant) the impermanent memories of least
    value past the tenant's cap; each removal is recorded with the row and its history."""
    run = await _run(job, deps)

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        changes = Changes(run, "prune")
        start = await conn.fetchval(Q["upkeep.next_seq"], run.tenant_id, run.id)
        expired = await conn.fetch(Q["upkeep.prune_expired"], run.tenant_id, run.user_id,
                                   run.agent_id, run.id, run.dry_run, PRUNE_BATCH, start)
        over = 0
        capped: list[asyncpg.Record] = []
        if not run.scoped:  # the cap is the tenant's: a run over one scope leaves it alone
            total = await conn.fetchval(Q["upkeep.memory_count"], run.tenant_id)
            # In a dry run the expired are still there, but would be gone.
            over = total - (len(expired) if run.dry_run else 0) - run.rules.memory_cap
            if over > 0:
                capped = await conn.fetch(Q["upkeep.prune_cap"], run.tenant_id, run.id,
                                          run.dry_run, start + len(expired),
                                          min(over, PRUNE_BATCH))
        counts = {"expired": len(expired), "over_cap": max(over, 0), "capped": len(capped),
                  "cap": run.rules.memory_cap,
                  "cap_unmet": max(over - len(capped), 0)}
        await changes.write(conn, counts)
        if run.dry_run:
            return []
        return await _announce_deleted(conn, run.tenant_id, [*expired, *capped])

    return write


async def _announce_deleted(conn: asyncpg.Connection, tenant_id: int,
                            rows: list[asyncpg.Record]) -> list[JobRef]:
    by_scope: dict[tuple[Any, ...], list[uuid.UUID]] = {}
    for r in rows:
        by_scope.setdefault((r["user_id"], r["agent_id"], r["session_id"]), []).append(r["id"])
    refs: list[JobRef] = []
    for (user_id, agent_id, session_id), ids in by_scope.items():
        refs += await webhooks.emit(conn, tenant_id, "memory.deleted", {
            "memory_ids": ids, "user_id": user_id, "agent_id": agent_id,
            "session_id": session_id, "reason": "pruned"})
    return refs


# promote ------------------------------------------------------------------------------------


async def promote(job: asyncpg.Record, deps: Deps) -> Writer:
    """Make memories of the inbox's observations whose attention reached the threshold (with
    their vectors: the merge after it compares them at once), and drop those that waited too
    long without."""
    run = await _run(job, deps)
    s = deps.settings
    due = await deps.pool.fetch(Q["inbox.due"], run.tenant_id, run.user_id, run.agent_id,
                                s.memory_inbox_promote, s.memory_inbox_days, PRUNE_BATCH)

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        changes = Changes(run, "promote")
        refs: list[JobRef] = []
        counts = {"promoted": 0, "dropped": 0, "skipped_changed": 0}
        for row in due:
            promoted = row["attention"] >= s.memory_inbox_promote
            detail = {"content": row["content"], "attention": row["attention"],
                      "heard": row["heard"]}
            if run.dry_run:
                changes.add("promote" if promoted else "drop", row["id"], other_id=row["id"],
                            detail=detail)
                counts["promoted" if promoted else "dropped"] += 1
                continue
            memory = None
            if promoted:
                memory = await memories.insert(
                    conn, tenant_id=run.tenant_id, rules=run.rules, author=run.author,
                    scope=Scope(row["user_id"], row["agent_id"]), visibility=row["visibility"],
                    memory=NewMemory(
                        type=row["type"], content=row["content"],
                        confidence=min(row["attention"], 1.0), source="inbox",
                        hints=tuple(row["hints"]), observed_at=row["observed_at"],
                        session_id=row["session_id"], source_events=tuple(
                            (e["session_id"], e["event_id"]) for e in row["source_events"])),
                    embedding=row["embedding"], model=row["embedding_model"],
                    reason=f"promoted from the inbox (attention {row['attention']:.2f}, heard "
                           f"{row['heard']} times) by consolidation run {run.id}")
            if await conn.fetchval(Q["inbox.decide"], run.tenant_id, row["id"],
                                   "promoted" if promoted else "dropped",
                                   memory["id"] if memory else None) is None:
                counts["skipped_changed"] += 1
                continue
            if memory is not None:
                changes.add("promote", memory["id"], other_id=row["id"], detail=detail,
                            after_version=memory["version"])
                refs += await webhooks.emit(conn, run.tenant_id, "memory.added",
                                            webhooks.memory_data(memory))
                counts["promoted"] += 1
            else:
                changes.add("drop", row["id"], detail=detail)
                counts["dropped"] += 1
        await changes.write(conn, counts)
        return refs

    return write


# merge --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Merge:
    keep: asyncpg.Record
    lose: asyncpg.Record
    similarity: float


async def plan_merges(deps: Deps, run: Run) -> tuple[list[Merge], dict[str, int]]:
    """Pairs above the merge similarity, most similar first, except those that open with two
    different names (`similar.different_subjects`). A memory is merged away at most once, and
    one that absorbed another is never merged away itself: merges form stars around the kept
    memories, never chains that would join two facts through a third."""
    plans: list[Merge] = []
    counts = {"compared": 0, "scopes": 0, "scopes_truncated": 0, "different_subjects": 0}
    async for group in _scopes(deps, run):
        counts["scopes"] += 1
        if len(group) > similar.MAX_SCOPE:
            counts["scopes_truncated"] += 1
            group = group[:similar.MAX_SCOPE]
        counts["compared"] += len(group)
        if len(group) < 2:
            continue
        found = await asyncio.to_thread(similar.scope_pairs, [r["embedding"] for r in group],
                                        run.merge_similarity)
        gone: set[int] = set()
        kept: set[int] = set()
        for pair in found:
            if pair.a in gone or pair.b in gone:
                continue
            if similar.different_subjects(group[pair.a]["content"], group[pair.b]["content"]):
                counts["different_subjects"] += 1
                continue
            keep, lose = sorted((pair.a, pair.b), key=lambda i: _rank(group[i]), reverse=True)
            if lose in kept:
                continue
            gone.add(lose)
            kept.add(keep)
            plans.append(Merge(group[keep], group[lose], pair.similarity))
    return plans, counts


class _Changed(Exception):
    """A memory of a merge changed since it was planned: the merge is rolled back."""


async def merge(job: asyncpg.Record, deps: Deps) -> Writer:
    run = await _run(job, deps)
    plans, counts = await plan_merges(deps, run)

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        changes = Changes(run, "merge")
        refs: list[JobRef] = []
        versions: dict[uuid.UUID, int] = {}
        merged = skipped = 0
        for m in plans:
            detail = {"similarity": round(m.similarity, 4), "kept": m.keep["content"],
                      "merged": m.lose["content"]}
            if run.dry_run:
                changes.add("merge", m.lose["id"], other_id=m.keep["id"], detail=detail)
                merged += 1
                continue
            try:
                async with conn.transaction():
                    lost, kept = await _apply_merge(conn, run, m, versions)
            except _Changed:
                skipped += 1
                continue
            versions[kept["id"]] = kept["version"]
            merged += 1
            changes.add("merge", lost["id"], other_id=kept["id"], detail=detail,
                        before={"valid_until": None, "invalid_reason": None,
                                "superseded_by": None},
                        after_version=lost["version"])
            changes.add("keep", kept["id"], other_id=lost["id"], detail=detail,
                        before={"confidence": m.keep["confidence"],
                                "hints": list(m.keep["hints"]),
                                "source_events": m.keep["source_events"]},
                        after_version=kept["version"])
            refs += await webhooks.emit(conn, run.tenant_id, "memory.superseded",
                                        webhooks.memory_data(lost, reason="merged"))
        await changes.write(conn, {**counts, "merged": merged, "skipped_changed": skipped})
        return refs

    return write


async def _apply_merge(conn: asyncpg.Connection, run: Run, m: Merge,
                       versions: dict[uuid.UUID, int]) -> tuple[asyncpg.Record, asyncpg.Record]:
    keep_id, lose_id = m.keep["id"], m.lose["id"]
    reason = (f"duplicate of {keep_id} (cosine {m.similarity:.3f}), merged by consolidation "
              f"run {run.id}")
    lost = await conn.fetchrow(Q["upkeep.supersede"], run.tenant_id, lose_id, reason, keep_id,
                               m.lose["version"])
    kept = await conn.fetchrow(Q["upkeep.absorb"], run.tenant_id, keep_id,
                               m.lose["confidence"], list(m.lose["hints"]),
                               versions.get(keep_id, m.keep["version"]), m.lose["source_events"])
    if lost is None or kept is None:
        raise _Changed
    await conn.execute(Q["relations.insert"], run.tenant_id, keep_id, "supersedes", lose_id,
                       m.similarity, run.id)
    await memories.write_history(conn, run.tenant_id, lost, "supersede", run.author,
                                 lost["content"], lost["content"], {
                                     "valid_until": _iso(lost["valid_until"]),
                                     "superseded_by": str(keep_id)}, reason)
    await memories.write_history(conn, run.tenant_id, kept, "update", run.author,
                                 kept["content"], kept["content"], {
                                     "confidence": kept["confidence"],
                                     "hints": list(kept["hints"]),
                                     "source_events": kept["source_events"]},
                                 f"absorbed its duplicate {lose_id} (consolidation run {run.id})")
    return lost, kept


# decay --------------------------------------------------------------------------------------


async def decay(job: asyncpg.Record, deps: Deps) -> Writer:
    run = await _run(job, deps)
    s = deps.settings
    plan = await deps.pool.fetch(
        Q["upkeep.decay_plan"], run.tenant_id, run.user_id, run.agent_id,
        s.memory_decay_idle_days, s.memory_decay_rate, s.memory_confidence_floor,
        s.memory_reinforce_uses, s.memory_reinforce_step)
    reason = (f"unused for over {s.memory_decay_idle_days:g} days at the confidence floor "
              f"({s.memory_confidence_floor:g}); invalidated by consolidation run {run.id}")

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        changes = Changes(run, "decay")
        counts = {"reinforce": 0, "decay": 0, "invalidate": 0, "skipped_changed": 0}
        applied: dict[uuid.UUID, asyncpg.Record] = {}
        if not run.dry_run and plan:
            applied = {r["id"]: r for r in await conn.fetch(
                Q["upkeep.decay_apply"], run.tenant_id, [p["id"] for p in plan],
                [p["new_confidence"] for p in plan], [p["action"] == "invalidate" for p in plan],
                reason, [p["version"] for p in plan])}
            await conn.execute(Q["upkeep.decay_seen"], run.tenant_id, run.user_id, run.agent_id)
        history: dict[str, list[tuple[Any, ...]]] = {"invalidate": [], "update": []}
        for p in plan:
            detail = {"from": p["confidence"], "to": p["new_confidence"]}
            before: dict[str, Any] = {"confidence": p["confidence"]}
            if p["action"] == "invalidate":
                before |= {"valid_until": None, "invalid_reason": None}
            done = applied.get(p["id"])
            if not run.dry_run and done is None:
                counts["skipped_changed"] += 1
                continue
            counts[p["action"]] += 1
            changes.add(p["action"], p["id"], detail=detail,
                        before=None if run.dry_run else before,
                        after_version=None if done is None else done["version"])
            if done is not None:
                invalidated = p["action"] == "invalidate"
                history["invalidate" if invalidated else "update"].append((
                    p["id"], done["version"], done["content"], detail,
                    reason if invalidated else f"{p['action']} by consolidation run {run.id}"))
        for operation, rows in history.items():
            if rows:
                await conn.execute(Q["upkeep.history_many"], run.tenant_id, operation, run.id,
                                   *map(list, zip(*rows, strict=True)))
        await changes.write(conn, counts)
        return []

    return write


# link ---------------------------------------------------------------------------------------


async def link(job: asyncpg.Record, deps: Deps) -> Writer:
    """`related_to` between memories of a scope from the link similarity up to the merge's
    (older to newer, each memory its few closest), and an observation for each finished
    session: its summary and its memories as dated lines, `derived_from` them."""
    run = await _run(job, deps)
    links: list[tuple[asyncpg.Record, asyncpg.Record, float]] = []
    compared = 0
    async for group in _scopes(deps, run):
        group = group[:similar.MAX_SCOPE]
        compared += len(group)
        if len(group) < 2:
            continue
        found = await asyncio.to_thread(similar.scope_pairs, [r["embedding"] for r in group],
                                        run.link_similarity, run.merge_similarity,
                                        deps.settings.memory_links_per_memory)
        for pair in found:
            older, newer = sorted((group[pair.a], group[pair.b]), key=lambda r: r["created_at"])
            links.append((older, newer, pair.similarity))
    ids = list({r["id"] for a, b, _ in links for r in (a, b)})
    existing = {frozenset((r["from_id"], r["to_id"])) for r in await deps.pool.fetch(
        Q["upkeep.related_pairs"], run.tenant_id, ids)} if ids else set()
    links = [t for t in links if frozenset((t[0]["id"], t[1]["id"])) not in existing]
    sessions = await deps.pool.fetch(Q["upkeep.sessions_to_observe"], run.tenant_id,
                                      run.user_id, run.agent_id, OBSERVE_BATCH)
    observations = [(s, await deps.pool.fetch(Q["upkeep.session_memories"], run.tenant_id,
                                              s["id"], OBSERVATION_LINES)) for s in sessions]
    observations = [(s, lines) for s, lines in observations if s["summary"] or lines]

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        changes = Changes(run, "link")
        for older, newer, score in links:
            if not run.dry_run:
                await conn.execute(Q["relations.insert"], run.tenant_id, older["id"],
                                   "related_to", newer["id"], score, run.id)
            changes.add("link", older["id"], other_id=newer["id"],
                        detail={"similarity": round(score, 4)})
        refs: list[JobRef] = []
        written: list[uuid.UUID] = []
        for session, lines in observations:
            content = observation_text(session, lines)
            if run.dry_run:
                changes.add("observe", uuid.uuid4(), detail={
                    "session_id": session["id"], "content": content, "dry_run": True})
                continue
            row = await memories.insert(
                conn, tenant_id=run.tenant_id, rules=run.rules,
                scope=Scope(session["user_id"], session["agent_id"]),
                visibility=session["visibility"], author=run.author,
                memory=NewMemory(type="conversation", content=content, layer="observation",
                                 confidence=OBSERVATION_CONFIDENCE, source="consolidation",
                                 session_id=session["id"],
                                 observed_at=session["last_event_at"],
                                 source_events=observed_events(lines)),
                reason=f"observation of session {session['id']} (consolidation run {run.id})")
            for line in lines:
                await conn.execute(Q["relations.insert"], run.tenant_id, row["id"],
                                   "derived_from", line["id"], None, run.id)
            written.append(row["id"])
            changes.add("observe", row["id"], detail={"session_id": session["id"],
                                                      "content": content},
                        after_version=row["version"])
            refs += await webhooks.emit(conn, run.tenant_id, "memory.added",
                                        webhooks.memory_data(row))
        if written:
            _, embed = await memories.embed_later(conn, run.tenant_id, written, run.author,
                                                  deps.settings)
            refs += embed
        await changes.write(conn, {"compared": compared, "linked": len(links),
                                   "observations": len(observations)})
        return refs

    return write


def observation_text(session: asyncpg.Record, lines: list[asyncpg.Record]) -> str:
    """A session in a few short lines under its dates: what was learned in it, or, when
    nothing was, the first sentence of its summary. Short, because an observation competes for
    a context's budget with the turns it stands for: on LoCoMo, observations of a session's
    whole summary (230 tokens each) crowded out a quarter of the relevant turns."""
    first, last = session["first_event_at"], session["last_event_at"]
    when = "" if first is None else first.astimezone(UTC).date().isoformat()
    if last is not None and first is not None and last.date() != first.date():
        when += f" to {last.astimezone(UTC).date().isoformat()}"
    head = f"Session {session['id']}" + (f" ({when})" if when else "")
    if lines:
        # Dated by the session: a memory's own date is in its words at the precision known
        # ("in 2022"), where its observed_at would say 2022-01-01.
        said = [f"- {clip(line['content'], OBSERVATION_LINE_CHARS)}" for line in lines]
        return head + "\n" + "\n".join(said)
    summary = re.split(r"(?<=[.!?])\s", (session["summary"] or "").strip(), maxsplit=1)[0]
    return f"{head}: {clip(summary, OBSERVATION_LINE_CHARS)}"


def clip(text: str, chars: int) -> str:
    """At most `chars` characters, cut at a word."""
    text = " ".join(text.split())
    if len(text) <= chars:
        return text
    return text[:chars].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def observed_events(lines: list[asyncpg.Record]) -> tuple[tuple[str, str], ...]:
    """The turns an observation stands for: those its lines' memories were drawn from."""
    seen: dict[tuple[str, str], None] = {}
    for line in lines:
        for event in line["source_events"]:
            seen.setdefault((event["session_id"], event["event_id"]), None)
    return tuple(seen)


TASKS: dict[str, Task] = {jobs.PRUNE_MEMORIES: prune, jobs.PROMOTE_MEMORIES: promote,
                          jobs.MERGE_MEMORIES: merge, jobs.DECAY_MEMORIES: decay,
                          jobs.LINK_MEMORIES: link}
