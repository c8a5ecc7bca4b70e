"""The agent memory's jobs: embed what was written, extract memories from a quiet session,
delete by scope. Each runs under the job wrapper (pipeline/runner.py) like any other kind: its
result is written in the transaction that marks it done, failures back off and dead-letter."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from pipeline import jobs, reindex, webhooks
from pipeline.db import Q
from pipeline.errors import PermanentError
from pipeline.jobs import JobRef
from pipeline.memory import inbox, memories, policy, profile
from pipeline.memory.extraction.model import Decision, Proposal, Similar, Turn
from pipeline.memory.memories import Author, NewMemory
from pipeline.memory.scopes import Scope
from pipeline.providers.chat import get_summarizer
from pipeline.tasks import Deps, Task, Writer, cache_vectors, vectors_by_hash

# Events an extract job reads at most; a longer backlog continues in the next job.
EXTRACT_BATCH = 200
SIMILAR_SHOWN = 5
FORGET_BATCH = 500
FORGET_ROUNDS = 3
SUMMARY_TURNS = 200


async def embed_memory(job: asyncpg.Record, deps: Deps) -> Writer:
    """Embed a batch of events or memories; vectors come from the cache where the same text
    was embedded before. A memory edited meanwhile keeps no stale vector (its content hash no
    longer matches; the edit queued its own job)."""
    tenant_id, payload = job["tenant_id"], job["payload"]
    key = reindex.model_key(deps.settings)
    if "events" in payload:
        rows = await deps.pool.fetch(Q["events.for_embedding"], tenant_id,
                                     [int(s) for s in payload["events"]])
    else:
        rows = await deps.pool.fetch(Q["memories.for_embedding"], tenant_id,
                                     [uuid.UUID(i) for i in payload.get("memories", [])])
    vectors, computed = await vectors_by_hash(deps, tenant_id, rows)

    async def write(conn: asyncpg.Connection) -> None:
        if "events" in payload:
            await conn.executemany(Q["events.set_embedding"], [
                (tenant_id, r["seq"], vectors[r["content_hash"]], key) for r in rows])
        else:
            await conn.executemany(Q["memories.set_embedding"], [
                (tenant_id, r["id"], vectors[r["content_hash"]], key, r["content_hash"])
                for r in rows])
        await cache_vectors(conn, deps, tenant_id, computed)
        await conn.execute(Q["operations.finish"], job["id"], {"embedded": len(rows)})

    return write


# extract -----------------------------------------------------------------------------------


def _normalized(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .!")


def _unique(proposals: Sequence[Proposal]) -> list[Proposal]:
    seen: set[str] = set()
    kept = []
    for p in proposals:
        if _normalized(p.content) not in seen:
            seen.add(_normalized(p.content))
            kept.append(p)
    return kept


async def _handover(conn: asyncpg.Connection, job: asyncpg.Record, deps: Deps,
                    delay_s: float, payload: dict[str, Any]) -> list[JobRef]:
    """Hand the job's operation to a new extract job due in `delay_s`; if a write queued one
    meanwhile, to that one."""
    job_id = uuid.uuid4()
    created = await conn.fetchval(
        Q["extract.insert"], job_id, job["tenant_id"],
        deps.settings.max_attempts_for(jobs.EXTRACT), payload, delay_s)
    if not created:
        waiting = await conn.fetchrow(Q["extract.waiting"], job["tenant_id"],
                                      payload["session_id"])
        if waiting is not None:
            await conn.execute(Q["operations.move_to_job"], job["id"], waiting["id"])
        return []
    await conn.execute(Q["operations.move_to_job"], job["id"], job_id)
    return [JobRef(job_id, jobs.EXTRACT, 0, defer_s=delay_s, tenant_id=job["tenant_id"])]


async def extract(job: asyncpg.Record, deps: Deps) -> Writer:
    """Read the session's events past its watermark, propose memories, decide what each does
    against similar memories of the same scope, and apply the decisions together with the new
    watermark, so that an attempt that fails leaves nothing half-applied."""
    tenant_id, payload = job["tenant_id"], job["payload"]
    session_id = payload["session_id"]
    session = await deps.pool.fetchrow(Q["extract.session"], tenant_id, session_id)
    if session is None:
        async def gone(conn: asyncpg.Connection) -> None:
            await conn.execute(Q["operations.finish"], job["id"],
                               {"skipped": "the session was deleted"})
        return gone
    quiet_until = session["last_write_at"] + timedelta(seconds=deps.settings.extraction_quiet_s)
    wait_s = (quiet_until - datetime.now(UTC)).total_seconds()
    if wait_s > 0 and session["ended_at"] is None and not payload.get("now"):
        async def later(conn: asyncpg.Connection) -> list[JobRef]:
            return await _handover(conn, job, deps, wait_s, {"session_id": session_id})
        return later

    # Imported here: a worker that never extracts never loads the extractors.
    from pipeline.memory.extraction.factory import get_decider, get_extractor

    watermark = session["extracted_seq"]
    rows = await deps.pool.fetch(Q["events.unextracted"], tenant_id, session_id, watermark,
                                 EXTRACT_BATCH)
    turns = [Turn(r["session_id"], r["event_id"], r["role"], r["sender_name"], r["content"],
                  r["created_at"]) for r in rows]
    types = await memories.known_types(deps.pool, tenant_id)
    proposals = _unique(await get_extractor(deps.settings).extract(turns, types=types)
                        if turns else [])
    vectors = list(await deps.embedder.embed([p.content for p in proposals])) if proposals else []
    key = reindex.model_key(deps.settings)
    decider = get_decider(deps.settings)
    scope = Scope(session["user_id"], session["agent_id"])
    summary = await _summary(deps, tenant_id, session_id) if rows else None
    # Only a user has a profile (an agent's own session has none).
    findings = profile.detect(turns, session_id, None) if session["user_id"] else []
    planned: list[tuple[Proposal, Any, Decision, list[asyncpg.Record]]] = []
    # Proposals extraction is not sure of wait in the inbox (pipeline/memory/inbox.py).
    doubtful = [(p, v) for p, v in zip(proposals, vectors, strict=True)
                if inbox.waits(p, deps.settings)]
    for proposal, vector in zip(proposals, vectors, strict=True):
        if inbox.waits(proposal, deps.settings):
            continue
        found = await deps.pool.fetch(
            Q["memories.similar"], tenant_id, scope.user_id, scope.agent_id,
            session["visibility"], key, vector, SIMILAR_SHOWN)
        similar = [Similar(i, r["type"], r["content"], float(r["similarity"]), r["observed_at"])
                   for i, r in enumerate(found)]
        planned.append((proposal, vector, await decider.decide(proposal, similar), list(found)))

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        current = await conn.fetchrow(Q["extract.lock_session"], tenant_id, session_id)
        if current is None or current["extracted_seq"] != watermark:
            # Deleted, or another extraction read these events first: its result stands.
            await conn.execute(Q["operations.finish"], job["id"],
                               {"skipped": "the events were extracted by another job"})
            return []
        op = await conn.fetchval(Q["operations.of_job"], job["id"])
        author = Author(None, None, op)
        follow_ups: list[JobRef] = []
        counts = {"events": len(rows), "proposals": len(planned) + len(doubtful), "ADD": 0,
                  "UPDATE": 0, "SUPERSEDE": 0, "NOOP_DUPLICATE": 0}
        for position, (proposal, vector, decision, found) in enumerate(planned):
            record, refs = await _apply(conn, deps, tenant_id, session, scope, proposal,
                                        vector, key, decision, found, author)
            follow_ups += refs
            counts[record["action"]] += 1
            if op is not None:
                await conn.execute(Q["operations.insert_decisions"], tenant_id, op, position,
                                   *record.values())
        if rows:
            await conn.execute(Q["extract.advance"], tenant_id, session_id, rows[-1]["seq"],
                               summary)
        if findings:
            counts["profile_topics"] = await profile.record(conn, tenant_id,
                                                            session["user_id"], findings)
        for proposal, vector in doubtful:
            await inbox.hear(conn, tenant_id=tenant_id, session=session, proposal=proposal,
                             vector=vector, model=key, settings=deps.settings)
        if doubtful:
            counts["inbox"] = len(doubtful)
        if len(rows) == EXTRACT_BATCH:
            return follow_ups + await _handover(conn, job, deps, 0.0,
                                                {"session_id": session_id, "now": True})
        await conn.execute(Q["operations.finish"], job["id"], counts)
        return follow_ups

    return write


async def _summary(deps: Deps, tenant_id: int, session_id: str) -> str | None:
    """The session's summary for its context, by the configured summarizer (extractive and
    offline by default) over its latest turns."""
    turns = await deps.pool.fetch(Q["events.recent"], tenant_id, session_id, SUMMARY_TURNS)
    text = "\n".join(f"{r['sender_name'] or r['role']}: {r['content']}" for r in turns)
    return await get_summarizer(deps.settings).summarize(text) if text.strip() else None


async def _apply(conn: asyncpg.Connection, deps: Deps, tenant_id: int, session: asyncpg.Record,
                 scope: Scope, proposal: Proposal, vector: Any, key: str, decision: Decision,
                 found: list[asyncpg.Record], author: Author,
                 ) -> tuple[dict[str, Any], list[JobRef]]:
    """Carry out one decision; returns its row for operation_decisions (in column order) and
    any embedding job it queued."""
    target = found[decision.target] if decision.target is not None else None
    action, reason, old = decision.action, decision.reason, None
    if target is not None:
        locked = await conn.fetchrow(Q["memories.lock"], tenant_id, target["id"],
                                     scope.user_id, scope.agent_id)
        if locked is None or locked["content"] != target["content"] or (
                locked["valid_until"] is not None and action != "NOOP_DUPLICATE"):
            action, reason, target = "ADD", f"{reason}; but the memory changed meanwhile, so " \
                "the proposal is added as a new memory", None
        else:
            old = locked["content"]
    memory_id = None
    refs: list[JobRef] = []
    new = NewMemory(type=proposal.type, content=decision.content, confidence=proposal.confidence,
                    source="extraction", hints=proposal.hints, observed_at=proposal.observed_at,
                    session_id=session["id"], source_events=proposal.source_events)
    if action in ("ADD", "SUPERSEDE"):
        rules = await policy.load(conn, tenant_id, deps.settings)
        row = await memories.insert(conn, tenant_id=tenant_id, scope=scope,
                                    visibility=session["visibility"], memory=new, author=author,
                                    rules=rules,
                                    embedding=vector if decision.content == proposal.content
                                    else None, model=key, reason=reason)
        memory_id = row["id"]
        if row["embedding"] is None:
            refs += (await memories.embed_later(conn, tenant_id, [memory_id], author,
                                                deps.settings))[1]
        refs += await webhooks.emit(conn, tenant_id, "memory.added", webhooks.memory_data(row))
    if action == "SUPERSEDE" and target is not None:
        gone = await memories.invalidate(conn, tenant_id=tenant_id, memory_id=target["id"],
                                         reader=scope, expected_version=None, reason=reason,
                                         author=author, superseded_by=memory_id)
        refs += await webhooks.emit(conn, tenant_id, "memory.superseded",
                                    webhooks.memory_data(gone, reason=reason))
    elif action == "UPDATE" and target is not None:
        updated = await memories.update(
            conn, tenant_id=tenant_id, memory_id=target["id"], reader=scope,
            expected_version=None, author=author, settings=deps.settings, reason=reason,
            change=memories.Change(content=decision.content, observed_at=proposal.observed_at))
        refs += updated[2]
        memory_id = target["id"]
    elif action == "NOOP_DUPLICATE" and target is not None:
        memory_id = target["id"]
    similarity = float(target["similarity"]) if target is not None else (
        float(found[0]["similarity"]) if found else None)
    return {"action": action, "reason": reason, "type": proposal.type,
            "confidence": proposal.confidence, "similarity": similarity,
            "memory_id": memory_id, "target_id": target["id"] if target is not None else None,
            "old_content": old, "new_content": decision.content,
            "observed_at": proposal.observed_at,
            "source_events": memories.source_events_json(proposal.source_events)}, refs


# forget ------------------------------------------------------------------------------------


async def forget(job: asyncpg.Record, deps: Deps) -> Writer:
    """Delete a scope's memories a batch at a time, each batch its own transaction (rows,
    vectors and text index entries go together, and no lock is held for long), then count
    again: the report says how many went and that none is left. Running it twice deletes
    nothing more, so a retried attempt is harmless."""
    tenant_id, scope = job["tenant_id"], job["payload"]["scope"]
    args = (scope.get("user_id"), scope.get("agent_id"), scope.get("session_id"))
    if not any(args):
        raise PermanentError("a delete by scope needs a user_id, agent_id or session_id")
    deleted = batches = 0
    remaining = 1
    notices: list[JobRef] = []
    # A memory written into the scope while the delete runs is deleted too, a few rounds over;
    # one that keeps arriving after that is counted in `remaining`.
    for _ in range(FORGET_ROUNDS):
        while True:
            async with deps.pool.acquire() as conn, conn.transaction():
                gone = await conn.fetch(Q["memories.delete_scope_batch"], tenant_id, *args,
                                        FORGET_BATCH)
                if gone:
                    notices += await webhooks.emit(conn, tenant_id, "memory.deleted", {
                        "memory_ids": [r["id"] for r in gone],
                        **dict(zip(("user_id", "agent_id", "session_id"), args, strict=True))})
            deleted += len(gone)
            batches += 1
            if len(gone) < FORGET_BATCH:
                break
        remaining = await deps.pool.fetchval(Q["memories.count_scope"], tenant_id, *args)
        if remaining == 0:
            break

    async def write(conn: asyncpg.Connection) -> list[JobRef]:
        await conn.execute(Q["operations.finish"], job["id"], {
            "deleted": deleted, "batches": batches, "remaining": remaining,
            "verified": remaining == 0})
        return notices  # each batch's memory.deleted, enqueued with this job's done

    return write


TASKS: dict[str, Task] = {
    jobs.EMBED_MEMORY: embed_memory,
    jobs.EXTRACT: extract,
    jobs.FORGET: forget,
}
