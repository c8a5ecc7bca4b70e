"""Conversational memory: LoCoMo's dated conversations through memmill's sessions, search and
context APIs, with no language model anywhere.

LoCoMo (Maharana et al., ACL 2024; CC BY-NC 4.0, evaluation only: the data stays in
../shared/data/locomo and is never copied into this repository) holds long conversations
between two people, each in 19-32 dated sessions, and questions whose evidence is a list of
turns (`dia_id`). What is measured, on a real `memmill up` (as in benchmarks/ingest.py) in a
temporary data directory, or on a running server with `--url` and `--key`:

- **store**: each conversation is one user scope, `{"user_id": "<sample_id>"}`; each of its
  sessions becomes the memmill session `<sample_id>-s<N>`, written with
  `POST /v1/sessions/{id}/events` in one call (at most 500 events). A turn is one event:
  `event_id` its `dia_id`, role `user` for both speakers (two people talking; `sender_name`
  tells them apart), content the text with an image's caption appended as
  ` [image: caption]`, `created_at` the session's date and time (UTC) plus i seconds for the
  i-th turn so that the order is kept. The session's last turn is marked `ending` (the
  conversation is over), so its extraction runs at once instead of after the quiet delay.
  Timed from the first write to the moment everything is searchable (`wait_indexed`);
- **search**: each question (categories 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop;
  category 5, adversarial, has no evidence) is sent once to `POST /v1/memories/search` with
  `limit` 10 and `include_events` in its conversation's scope. Each result is mapped to turns:
  an event to its `event_id`, a memory to the `event_id`s of its `source_events`.
  Recall@k of a question is the share of its evidence turns found among the turns of the first
  k results; the figures are the mean over questions (each question weighs the same, whatever
  the number of its evidence turns), per category and overall;
- **context**: the same question to `POST /v1/context` with `max_tokens` 1000; context recall
  is the share of the question's evidence turns among what `included` lists (events directly,
  memories through their source events), averaged the same way;
- p50 latency of each kind of request, as the client sees it, one request at a time.

With `--consolidate`, once everything is searchable, one applied (not dry) consolidation run
is started over each conversation's user scope (`POST /v1/consolidation/runs`, the server's
default steps: merge, decay and link, and promote where the server has it), followed to its
end and its counts printed; then the memories it wrote (each finished session's observation)
are waited for until embedded, and only then are the questions asked. The goal: evidence
recall and context recall no worse than without.

Evidence ids are read as the data writes them, a few malformed ones repaired ("D:11:26",
several ids in one string); ids that name no turn of the conversation are dropped, and a
question left with none (two in the development half) is not asked.

Reference on the development half (plain retrievers over single turns, one conversation at a
time; ../shared/data/locomo/README.md): RRF of BM25 and all-MiniLM-L6-v2, Recall@5 0.487,
Recall@10 0.566. Goal: Recall@10 >= 0.70, Recall@5 >= 0.60, context recall >= 0.85.

    .venv/bin/python benchmarks/locomo.py [--limit-conversations N] [--limit-questions N]
        [--port PORT | --url URL --key KEY] [--data PATH] [--events-only] [--consolidate]
"""

from __future__ import annotations

import os
import sys

# This folder holds queue.py, which would shadow the standard library's `queue` when this script
# runs with the folder first on sys.path; the repository root instead makes `benchmarks.ingest`
# importable (see benchmarks/retrieval.py).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import json
import re
import signal
import socket
import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from benchmarks.ingest import start_memmill, wait_for_api

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = REPO_ROOT.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SEARCH_LIMIT = 10
CONTEXT_TOKENS = 1000
MAX_EVENTS_PER_CALL = 500
MAX_FAILURES_IN_A_ROW = 10  # then the server is down, not one answer wrong: stop
REFERENCE = ("reference (README, single turns): RRF of BM25 and MiniLM, Recall@5 0.487,"
             " Recall@10 0.566; goal Recall@10 >= 0.70, Recall@5 >= 0.60, context recall >= 0.85")
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


@dataclass
class Session:
    session_id: str
    events: list[dict[str, Any]]


@dataclass
class Question:
    text: str
    category: int
    evidence: set[str]


@dataclass
class Conversation:
    sample_id: str
    sessions: list[Session] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)

    @property
    def scope(self) -> dict[str, str]:
        return {"user_id": self.sample_id}


def session_time(text: str) -> datetime:
    """LoCoMo's "1:56 pm on 8 May, 2023", taken as UTC."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def turn_content(turn: Mapping[str, Any]) -> str:
    caption = turn.get("blip_caption")
    return f"{turn['text']} [image: {caption}]" if caption else str(turn["text"])


def evidence_ids(raw: Iterable[str], turns: set[str]) -> set[str]:
    """The turns a question's evidence names, repaired ("D:11:26" -> "D11:26", "D8:6; D9:17"
    -> both) and limited to turns that exist."""
    found = {f"D{m[1]}:{m[2]}" for item in raw for m in _EVIDENCE.finditer(str(item))}
    return found & turns


def load_conversations(path: Path) -> tuple[list[Conversation], int]:
    """The conversations, and how many questions of categories 1-4 were left out for want of
    any evidence turn."""
    conversations, skipped = [], 0
    for record in json.loads(path.read_text(encoding="utf-8")):
        raw = record["conversation"]
        conversation = Conversation(record["sample_id"])
        turns: set[str] = set()
        number = 1
        while f"session_{number}" in raw:
            start = session_time(raw[f"session_{number}_date_time"])
            events = []
            for i, turn in enumerate(raw[f"session_{number}"]):
                turns.add(turn["dia_id"])
                events.append({
                    "event_id": turn["dia_id"], "role": "user", "sender_name": turn["speaker"],
                    "content": turn_content(turn),
                    "created_at": (start + timedelta(seconds=i)).isoformat(),
                })
            if events:
                events[-1]["ending"] = True
                conversation.sessions.append(Session(f"{record['sample_id']}-s{number}", events))
            number += 1
        for qa in record["qa"]:
            if qa["category"] not in CATEGORIES:
                continue
            evidence = evidence_ids(qa.get("evidence", []), turns)
            if not evidence:
                skipped += 1
                continue
            conversation.questions.append(Question(qa["question"], qa["category"], evidence))
        conversations.append(conversation)
    return conversations, skipped


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def store(http: httpx.Client, conversation: Conversation) -> tuple[int, int]:
    """Write every session of the conversation; (events stored, duplicates)."""
    stored = duplicates = 0
    for session in conversation.sessions:
        for offset in range(0, len(session.events), MAX_EVENTS_PER_CALL):
            answer = http.post(f"/v1/sessions/{session.session_id}/events", json={
                "scope": conversation.scope,
                "events": session.events[offset:offset + MAX_EVENTS_PER_CALL]})
            if answer.status_code != 202:
                raise RuntimeError(f"writing {session.session_id}: {answer.status_code}"
                                   f" {answer.text[:500]}")
            body = answer.json()
            stored += body["stored"]
            duplicates += body["duplicates"]
    return stored, duplicates


# --- wait_indexed: what "searchable" means is the server's to say. ----------------------------
# Today: the tenant's job ledger has nothing left to do (embedding of events, extraction of
# memories and their embedding), as benchmarks/ingest.py waits, and then every session says it
# is `embedded` (GET /v1/sessions/{id}). Adjust here if the server grows a better signal.
ACTIVE_STATUSES = ("queued", "running", "waiting")


def wait_indexed(http: httpx.Client, conversations: Sequence[Conversation],
                 timeout_s: float = 3600, report_every_s: float = 30) -> None:
    start = time.monotonic()
    last_report = start
    while True:
        stats = http.get("/v1/jobs/stats")
        stats.raise_for_status()
        figures = stats.json()
        active = sum(figures["by_status"].get(s, 0) for s in ACTIVE_STATUSES)
        now = time.monotonic()
        if active == 0:
            break
        if now - start > timeout_s:
            raise RuntimeError(f"jobs still active after {timeout_s:.0f}s: {figures['by_status']}")
        if now - last_report >= report_every_s:
            kinds = {k: v for k, v in figures["by_kind"].items()
                     if any(v.get(s) for s in ACTIVE_STATUSES)}
            print(f"  {now - start:6.0f}s  waiting for {active} jobs: {kinds}", flush=True)
            last_report = now
        time.sleep(1)
    for conversation in conversations:
        for session in conversation.sessions:
            answer = http.get(f"/v1/sessions/{session.session_id}", params=conversation.scope)
            answer.raise_for_status()
            if answer.json().get("embedded") is False:
                raise RuntimeError(f"the job ledger is idle but {session.session_id} is not"
                                   " embedded")
# ------------------------------------------------------------------------------------------------


FINISHED_RUN = ("done", "failed", "cancelled")


def consolidate(http: httpx.Client, conversations: Sequence[Conversation],
                timeout_s: float = 1800) -> list[dict[str, Any]]:
    """One applied consolidation run (the default steps) per conversation's scope, each
    followed to its end, one after the other; the finished runs."""
    done = []
    for conversation in conversations:
        answer = http.post("/v1/consolidation/runs", params={"wait": 60},
                           json={"scope": conversation.scope, "dry_run": False})
        if answer.status_code != 202:
            raise RuntimeError(f"consolidating {conversation.sample_id}: {answer.status_code}"
                               f" {answer.text[:500]}")
        done.append(finish_run(http, answer.json()["run"], timeout_s))
    return done


def finish_run(http: httpx.Client, run: dict[str, Any], timeout_s: float = 1800) -> dict[str, Any]:
    """The consolidation run once it is done (waiting on it as an operation); one that failed
    or was cancelled raises."""
    deadline = time.monotonic() + timeout_s
    while run["status"] not in FINISHED_RUN:
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run['id']} still {run['status']} after {timeout_s:.0f}s")
        http.get(f"/v1/operations/{run['id']}", params={"wait": 30})
        got = http.get(f"/v1/consolidation/runs/{run['id']}")
        got.raise_for_status()
        run = got.json()
    if run["status"] != "done":
        raise RuntimeError(f"consolidation run {run['id']} {run['status']}: {run.get('error')}")
    return run


def wait_memories_embedded(http: httpx.Client, conversations: Sequence[Conversation],
                           timeout_s: float = 1800) -> int:
    """Until every valid memory of each conversation's scope says `embedded` (the ledger
    being idle should mean so; this checks it); returns how many memories there are."""
    deadline = time.monotonic() + timeout_s
    while True:
        total = pending = 0
        for conversation in conversations:
            cursor = None
            while True:
                answer = http.get("/v1/memories", params={
                    **conversation.scope, "limit": 500, **({"cursor": cursor} if cursor else {})})
                answer.raise_for_status()
                page = answer.json()
                total += len(page["data"])
                pending += sum(not m["embedded"] for m in page["data"])
                cursor = page["next_cursor"]
                if cursor is None:
                    break
        if pending == 0:
            return total
        if time.monotonic() > deadline:
            raise RuntimeError(f"{pending} memories not embedded after {timeout_s:.0f}s")
        time.sleep(2)


def report_consolidation(runs: Sequence[dict[str, Any]], seconds: float, memories: int) -> None:
    """Each step's counts, summed over the runs, and the changes by step and action."""
    counts: dict[str, dict[str, float]] = {}
    changes: dict[str, dict[str, int]] = {}
    for run in runs:
        for step, figures in run["counts"].items():
            for name, value in figures.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    counts.setdefault(step, {})[name] = counts.get(step, {}).get(name, 0) + value
        for step, actions in run["changes"].items():
            for action, n in actions.items():
                changes.setdefault(step, {})[action] = changes.get(step, {}).get(action, 0) + n
    steps = list(dict.fromkeys(s for run in runs for s in run["steps"]))
    print(f"consolidated {len(runs)} scopes (steps {', '.join(steps)}) in {seconds:.1f}s (the"
          f" runs and the embedding of what they wrote); {memories} valid memories in those"
          " scopes now", flush=True)
    for step in [*steps, *(s for s in counts if s not in steps)]:
        figures = ", ".join(f"{k} {v:g}" for k, v in counts.get(step, {}).items()) or "none"
        acted = ", ".join(f"{k} {v}" for k, v in changes.get(step, {}).items()) or "none"
        print(f"  {step}: {figures}; changes: {acted}", flush=True)


def turns_of(entries: Iterable[Mapping[str, Any]]) -> list[set[str]]:
    """Each search result or included entry as the turns it stands for: an event its own id,
    a memory the events it was drawn from, anything else none."""
    mapped = []
    for entry in entries:
        if entry.get("kind") == "event" and entry.get("event_id"):
            mapped.append({entry["event_id"]})
        elif entry.get("kind") == "memory":
            mapped.append({s["event_id"] for s in entry.get("source_events") or []
                           if s.get("event_id")})
        else:
            mapped.append(set())
    return mapped


def recall(found: Sequence[set[str]], evidence: set[str], k: int | None = None) -> float:
    reached = set().union(*found[:k]) if found else set()
    return len(evidence & reached) / len(evidence)


@dataclass
class Scores:
    r5: list[float] = field(default_factory=list)
    r10: list[float] = field(default_factory=list)
    context: list[float] = field(default_factory=list)


@dataclass
class Run:
    by_category: dict[int, Scores] = field(default_factory=dict)
    search_ms: list[float] = field(default_factory=list)
    context_ms: list[float] = field(default_factory=list)
    context_tokens: list[int] = field(default_factory=list)
    results: list[int] = field(default_factory=list)
    memories_in_top10: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class RequestFailed(RuntimeError):
    pass


def ask(http: httpx.Client, conversation: Conversation, question: Question, run: Run,
        events_only: bool) -> None:
    """Search and context for one question, its scores added to `run`; a failed request
    raises RequestFailed and adds no score."""
    start = time.perf_counter()
    answer = http.post("/v1/memories/search", json={
        "query": question.text, "scope": conversation.scope, "limit": SEARCH_LIMIT,
        "include_events": True, **({"include_memories": False} if events_only else {})})
    run.search_ms.append((time.perf_counter() - start) * 1000)
    if answer.status_code != 200:
        raise RequestFailed(f"search: {answer.status_code} {answer.text[:300]}")
    results = answer.json()["results"]
    found = turns_of(results)
    run.results.append(len(results))
    run.memories_in_top10.append(sum(r.get("kind") == "memory" for r in results))

    start = time.perf_counter()
    answer = http.post("/v1/context", json={"scope": conversation.scope,
                                            "query": question.text,
                                            "max_tokens": CONTEXT_TOKENS})
    run.context_ms.append((time.perf_counter() - start) * 1000)
    if answer.status_code != 200:
        raise RequestFailed(f"context: {answer.status_code} {answer.text[:300]}")
    packed = answer.json()
    if "tokens" in packed:
        run.context_tokens.append(packed["tokens"])
    included = turns_of(packed["included"])

    scores = run.by_category.setdefault(question.category, Scores())
    scores.r5.append(recall(found, question.evidence, 5))
    scores.r10.append(recall(found, question.evidence, 10))
    scores.context.append(recall(included, question.evidence))


def p50(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def report(run: Run, conversations: Sequence[Conversation], events: int, duplicates: int,
           store_s: float, index_s: float, consolidated: bool = False) -> None:
    print()
    print(f"LoCoMo: {len(conversations)} conversations, {events} events written"
          f" ({duplicates} duplicates)" + (", asked after consolidation" if consolidated else ""))
    print()
    print("| category | questions | Recall@5 | Recall@10 | context recall@1000 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    overall = Scores()
    for category, name in CATEGORIES.items():
        scores = run.by_category.get(category)
        if not scores:
            continue
        overall.r5 += scores.r5
        overall.r10 += scores.r10
        overall.context += scores.context
        print(f"| {category} {name} | {len(scores.r5)} | {statistics.fmean(scores.r5):.3f} |"
              f" {statistics.fmean(scores.r10):.3f} | {statistics.fmean(scores.context):.3f} |")
    if overall.r5:
        print(f"| overall | {len(overall.r5)} | {statistics.fmean(overall.r5):.3f} |"
              f" {statistics.fmean(overall.r10):.3f} | {statistics.fmean(overall.context):.3f} |")
    print()
    print(f"p50 latency: search {p50(run.search_ms)} ms, context {p50(run.context_ms)} ms"
          " (client side, one request at a time)")
    print(f"store {store_s:.1f}s, then searchable after {index_s:.1f}s more"
          f" ({store_s + index_s:.1f}s in all)")
    if run.results:
        print(f"results per search: mean {statistics.fmean(run.results):.1f}; memories among"
              f" them: mean {statistics.fmean(run.memories_in_top10):.1f}")
    if run.context_tokens:
        print(f"context tokens: mean {statistics.fmean(run.context_tokens):.0f},"
              f" max {max(run.context_tokens)} (budget {CONTEXT_TOKENS})")
    print(REFERENCE)
    if run.failures:
        print(f"\n{len(run.failures)} questions left out because a request failed (their"
              " scores are missing from the figures above); the first:")
        for failure in run.failures[:5]:
            print(f"  {failure}")


def bench(url: str, key: str, conversations: Sequence[Conversation], limit_questions: int | None,
          events_only: bool, consolidated: bool = False) -> list[str]:
    """Store, wait, ask; prints the report and returns the requests that failed."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=120) as http:
        start = time.perf_counter()
        events = duplicates = 0
        for conversation in conversations:
            stored, repeated = store(http, conversation)
            events += stored
            duplicates += repeated
        store_s = time.perf_counter() - start
        print(f"stored {events} events ({duplicates} duplicates) in {store_s:.1f}s", flush=True)
        start = time.perf_counter()
        wait_indexed(http, conversations)
        index_s = time.perf_counter() - start
        print(f"searchable {index_s:.1f}s later", flush=True)
        if consolidated:
            start = time.perf_counter()
            runs = consolidate(http, conversations)
            wait_indexed(http, conversations)
            memories = wait_memories_embedded(http, conversations)
            report_consolidation(runs, time.perf_counter() - start, memories)

        run = Run()
        asked = in_a_row = 0
        for conversation in conversations:
            for question in conversation.questions:
                if limit_questions is not None and asked >= limit_questions:
                    break
                try:
                    ask(http, conversation, question, run, events_only)
                    in_a_row = 0
                except (RequestFailed, httpx.HTTPError) as failure:
                    run.failures.append(f"{conversation.sample_id} {question.text!r}:"
                                        f" {type(failure).__name__}: {failure}")
                    in_a_row += 1
                    if in_a_row >= MAX_FAILURES_IN_A_ROW:
                        raise RuntimeError(f"{in_a_row} questions failed in a row; the last: "
                                           f"{run.failures[-1]}") from failure
                asked += 1
            print(f"  {conversation.sample_id}: {asked} questions asked so far", flush=True)
    report(run, conversations, events, duplicates, store_s, index_s, consolidated)
    return run.failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="LoCoMo JSON file")
    parser.add_argument("--limit-conversations", type=int, default=None,
                        help="the first N conversations only")
    parser.add_argument("--limit-questions", type=int, default=None,
                        help="at most N questions in all, in the data's order")
    parser.add_argument("--port", type=int, default=None,
                        help="port for the memmill this starts (default: a free one)")
    parser.add_argument("--url", help="use a running memmill at this URL instead of starting one")
    parser.add_argument("--key", help="API key for --url")
    parser.add_argument("--events-only", action="store_true",
                        help="search events only (include_memories false); context is unchanged")
    parser.add_argument("--consolidate", action="store_true",
                        help="run one applied consolidation (the default steps) over each"
                             " conversation's scope before the questions")
    args = parser.parse_args()
    if bool(args.url) != bool(args.key):
        parser.error("--url and --key go together")

    conversations, skipped = load_conversations(args.data)
    conversations = conversations[:args.limit_conversations]
    questions = sum(len(c.questions) for c in conversations)
    print(f"{len(conversations)} conversations, {sum(len(c.sessions) for c in conversations)}"
          f" sessions, {sum(len(s.events) for c in conversations for s in c.sessions)} turns,"
          f" {questions} questions of categories 1-4"
          f" ({skipped} in the file have no evidence turn and are left out)", flush=True)

    failures: list[str] = []
    if args.url:
        failures = bench(args.url.rstrip("/"), args.key, conversations, args.limit_questions,
                         args.events_only, args.consolidate)
        sys.exit(1 if failures else 0)
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="memmill-locomo-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, port, workers=1)
        try:
            url = f"http://127.0.0.1:{port}"
            key = wait_for_api(url, data_dir)
            failures = bench(url, key, conversations, args.limit_questions, args.events_only,
                             args.consolidate)
        except BaseException:
            failures = ["the run stopped"]
            raise
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=60)
            if failures:
                log = (data_dir / "up.log").read_text(errors="replace").splitlines()
                print("\nlast lines of the server's log:\n" + "\n".join(log[-40:]))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
