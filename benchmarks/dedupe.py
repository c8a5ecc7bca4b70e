"""Duplicate merging: precision and recall of consolidation's merge step, at the default
similarity threshold and around it, on pairs of statements that say one fact twice: the same
fact extracted from the same turn by two extractors, memmill's own and LoCoMo's annotators.

LoCoMo (Maharana et al., ACL 2024; CC BY-NC 4.0, evaluation only: read at run time from
../shared/data/locomo, never copied into this repository) gives, for each session, a list of
`observation`s per speaker, each citing the dialogue turns (`dia_id`) it was drawn from.
memmill's offline extraction, run on the same conversation, gives memories that each list the
turns (`source_events`) they were drawn from. A memory and an observation drawn from the same
single turn, about the same person, are one fact in two wordings, both third-person statements
("Caroline went to a LGBTQ support group (on 7 May 2023)." /
"Caroline attended an LGBTQ support group recently and found the transgender stories
inspiring."), which is what a merge of duplicates should join.

The set, by a rule fixed before any figure was seen, for each conversation:

1. its sessions are written as events, as benchmarks/locomo.py writes them (one user scope
   `{"user_id": "<sample_id>"}`, one memmill session per LoCoMo session, the last event of
   each `ending` so that its extraction runs at once), and memmill's extraction (the server's
   configured extractor; offline rules unless MEMMILL_EXTRACTION_PROVIDER says otherwise) is
   waited for, until the job ledger is idle;
2. for each turn, the valid memories of that scope whose source events include the turn and
   the observations whose evidence includes it are gathered. A turn gives a **pair** (a
   positive: same fact) when exactly one memory and exactly one observation cite it (a turn
   cited by several memories or several observations is ambiguous, and gives none), the
   memory has that one source event and no other, the observation cites that one turn and no
   other, and both are about the turn's speaker: the observation is listed under the speaker
   in the data, and the memory's first word is the speaker's name (possessive or not:
   "Caroline went…", "Caroline's dog…");
3. **distinct facts that look alike** (labelled negatives): for each statement of the set, the
   statement of the same speaker and the same source (memmill's or LoCoMo's) of another pair
   with the most words in common (Jaccard over lowercased words, stop words and the two
   speakers' names left out; ties to the earlier in the data). These need no adding: the set
   holds every statement of every pair, so each statement's look-alike is in it; they are
   listed to count how many the merge joins.

Only the statements of the pairs are compared: they are written into a fresh user scope,
`{"user_id": "<sample_id>-dedupe"}`, with `POST /v1/memories`: memmill's memory as it stands
(its type, content, confidence and `observed_at`), LoCoMo's observation as a `fact` observed
at its session's time. The scope of step 1 is left as it is and is not consolidated. Once
every statement says `embedded`, one dry-run consolidation with the merge step alone is
started per conversation and threshold over the fresh scope: first with the tenant's default
(0.92 unless MEMMILL_MEMORY_MERGE_SIMILARITY says otherwise), then with `merge_similarity`
0.85, 0.88, 0.90, 0.92 and 0.95. The proposed merges are read from
`GET /v1/consolidation/runs/{id}/changes?step=merge`.

Scores, pooled over the conversations: a proposed merge is right when its two statements are a
labelled pair, wrong otherwise (a look-alike, another statement of the same person, or of the
other speaker); precision = right / proposed; recall = pairs merged / pairs (a pair is one
needed merge). Precision is a lower bound: LoCoMo restates some facts in several sessions, and
memmill may extract one fact from two turns, so some "wrong" merges join two statements of one
fact drawn from different turns. Printed apart: the proposed merges that join two statements
citing the same turn without being a labelled pair (true duplicates the strict rule scores
wrong). Since a turn gives at most one pair and only paired statements are written, two
statements that cite one turn are always that turn's pair, so this figure is 0 unless the
construction changes; it is counted, not assumed. Also printed: how many pairs open with two
different names by the merge's own test (`similar.different_subjects`, which refuses them at
any threshold), and how many similar pairs each run refused so.

memmill's extraction decides each proposal against the memories already there, and its jobs
run concurrently, so the memories, and the pairs, may differ by one or two between runs.

Default: all five conversations of the development half (2,960 turns), about two minutes on
two cores, most of it embedding the turns and extracting; `--limit-conversations` for less.
With `--url`, the conversations' user scopes, `<sample_id>` and `<sample_id>-dedupe`, must
hold nothing else (a memory of the fresh scope that this set did not write counts as a wrong
merge when merged; one of the first scope changes what the pairs are).

    .venv/bin/python benchmarks/dedupe.py [--limit-conversations N] [--thresholds 0.85,...]
        [--port PORT | --url URL --key KEY] [--data PATH] [--examples N]
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
import shlex
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from benchmarks.ingest import start_memmill, wait_for_api
from benchmarks.locomo import (
    DATA,
    Conversation,
    evidence_ids,
    finish_run,
    free_port,
    load_conversations,
    session_time,
    wait_indexed,
)
from benchmarks.locomo import (
    store as store_events,
)
from pipeline.memory.upkeep.similar import different_subjects

THRESHOLDS = (0.85, 0.88, 0.90, 0.92, 0.95)
ID_SPACE = uuid.UUID("5b0c4d8e-6a43-4f35-9d2e-1f1f6d0a7c11")  # memory ids, stable per statement
_STOP_TEXT = """
a an the and or but if of to in on at by for with from about into over after before as is are
was were be been being am do does did have has had having i me my mine we us our you your he
him his she her hers they them their it its this that these those there here what which who
whom when where why how so than too very just not no yes can could will would should shall
may might must also some any all each both more most other such own same only up down out off
again then once really yeah oh hey hi thanks thank lot got get gets getting s t re ve ll d m
"""
STOP_WORDS = frozenset(_STOP_TEXT.split())
_WORDS = re.compile(r"[a-z0-9]+")
_FIRST_WORD = re.compile(r"[^\W\d_][\w'’-]*")
MEMMILL, LOCOMO = "memmill", "locomo"  # where a statement comes from


@dataclass
class Statement:
    key: str  # "<dia_id>/memmill" or "<dia_id>/locomo": one of each per paired turn
    source: str  # MEMMILL or LOCOMO
    speaker: str
    content: str
    type: str
    observed_at: datetime | None
    turns: frozenset[str]  # the dia_ids it cites
    pair: int
    confidence: float | None = None


@dataclass
class Observation:
    speaker: str
    content: str
    observed_at: datetime
    turns: frozenset[str]


@dataclass
class Funnel:
    """How the pairs were found: what each rule of the construction left out."""

    memories: int = 0
    single_source: int = 0
    observations: int = 0
    single_turn: int = 0
    turns_cited_by_both: int = 0
    ambiguous: int = 0
    not_single: int = 0
    not_the_speaker: int = 0

    def __iadd__(self, other: Funnel) -> Funnel:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


@dataclass
class ConversationSet:
    sample_id: str
    statements: list[Statement] = field(default_factory=list)
    pairs: int = 0
    lookalikes: set[frozenset[str]] = field(default_factory=set)
    funnel: Funnel = field(default_factory=Funnel)

    @property
    def source_scope(self) -> dict[str, str]:
        """Where the conversation's events are written and memmill's memories extracted."""
        return {"user_id": self.sample_id}

    @property
    def scope(self) -> dict[str, str]:
        """Where the paired statements are written and compared."""
        return {"user_id": f"{self.sample_id}-dedupe"}

    def memory_id(self, key: str) -> str:
        return str(uuid.uuid5(ID_SPACE, f"{self.sample_id}-dedupe/{key}"))


def words(text: str, names: frozenset[str]) -> frozenset[str]:
    return frozenset(w for w in _WORDS.findall(text.lower())
                     if w not in STOP_WORDS and w not in names)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def opens_with(text: str, name: str) -> bool:
    """Whether the statement's first word is the name ("Caroline went…", "Caroline's…")."""
    match = _FIRST_WORD.search(text)
    if match is None or match.start() > 2:
        return False
    word = match.group(0).lower().replace("’", "'").removesuffix("'s")
    return word == name.split()[0].lower()


def read_record(record: dict[str, Any]) -> tuple[dict[str, str], list[str], list[Observation]]:
    """A LoCoMo conversation's turns: each turn's speaker, the turns in order, and the
    observations with the turns they cite."""
    raw = record["conversation"]
    speakers: dict[str, str] = {}
    order: list[str] = []
    dates: dict[int, datetime] = {}
    number = 1
    while f"session_{number}" in raw:
        dates[number] = session_time(raw[f"session_{number}_date_time"])
        for turn in raw[f"session_{number}"]:
            speakers[turn["dia_id"]] = turn["speaker"]
            order.append(turn["dia_id"])
        number += 1
    observations = []
    for name, by_speaker in record["observation"].items():
        session = int(re.search(r"\d+", name)[0])  # type: ignore[index]
        for speaker, entries in by_speaker.items():
            for text, evidence in entries:
                raw_ids = evidence if isinstance(evidence, list) else [evidence]
                observations.append(Observation(speaker, str(text), dates[session],
                                                frozenset(evidence_ids(raw_ids, set(speakers)))))
    return speakers, order, observations


def memory_turns(memory: dict[str, Any], turns: set[str]) -> frozenset[str]:
    """The turns of this conversation a memory was drawn from."""
    return frozenset(e["event_id"] for e in memory.get("source_events") or []
                     if e.get("event_id") in turns)


def build_set(record: dict[str, Any], memories: Sequence[dict[str, Any]]) -> ConversationSet:
    """One conversation's pairs (memmill's memories against LoCoMo's observations, both drawn
    from one turn) and look-alikes, by the rule in the docstring."""
    speakers, order, observations = read_record(record)
    found = ConversationSet(record["sample_id"])
    funnel = found.funnel
    turns = set(speakers)
    by_turn: dict[str, tuple[list[tuple[dict[str, Any], frozenset[str]]], list[Observation]]] = {
        t: ([], []) for t in order}
    for memory in memories:
        cited = memory_turns(memory, turns)
        funnel.memories += 1
        funnel.single_source += len(memory.get("source_events") or []) == 1 and len(cited) == 1
        for turn in cited:
            by_turn[turn][0].append((memory, cited))
    for observation in observations:
        funnel.observations += 1
        funnel.single_turn += len(observation.turns) == 1
        for turn in observation.turns:
            by_turn[turn][1].append(observation)

    for turn in order:
        mems, obs = by_turn[turn]
        if not mems or not obs:
            continue
        funnel.turns_cited_by_both += 1
        if len(mems) != 1 or len(obs) != 1:
            funnel.ambiguous += 1
            continue
        (memory, cited), (observation,) = mems[0], obs
        if len(memory.get("source_events") or []) != 1 or len(cited) != 1 \
                or len(observation.turns) != 1:
            funnel.not_single += 1
            continue
        speaker = speakers[turn]
        if observation.speaker != speaker or not opens_with(memory["content"], speaker):
            funnel.not_the_speaker += 1
            continue
        observed = memory.get("observed_at")
        found.statements += [
            Statement(f"{turn}/{MEMMILL}", MEMMILL, speaker, memory["content"], memory["type"],
                      datetime.fromisoformat(observed) if observed else None, cited,
                      found.pairs, memory.get("confidence")),
            Statement(f"{turn}/{LOCOMO}", LOCOMO, speaker, observation.content, "fact",
                      observation.observed_at, observation.turns, found.pairs)]
        found.pairs += 1

    names = frozenset(w for s in speakers.values() for w in _WORDS.findall(s.lower()))
    bags = [words(s.content, names) for s in found.statements]
    for i, s in enumerate(found.statements):
        best, best_score = None, 0.0
        for j, t in enumerate(found.statements):
            if t.pair == s.pair or t.source != s.source or t.speaker != s.speaker:
                continue
            score = jaccard(bags[i], bags[j])
            if score > best_score:
                best, best_score = t, score
        if best is not None:
            found.lookalikes.add(frozenset((s.key, best.key)))
    return found


def pages(http: httpx.Client, scope: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Every valid memory of the scope."""
    cursor = None
    while True:
        answer = http.get("/v1/memories", params={
            **scope, "limit": 500, **({"cursor": cursor} if cursor else {})})
        answer.raise_for_status()
        page = answer.json()
        yield from page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            return


def store(http: httpx.Client, conversation: ConversationSet) -> int:
    """Write the conversation's paired statements as memories of its fresh scope; how many
    were there already (a second run on the same server with --url)."""
    existing = 0
    for s in conversation.statements:
        body: dict[str, Any] = {
            "memory_id": conversation.memory_id(s.key), "scope": conversation.scope,
            "type": s.type, "content": s.content}
        if s.observed_at is not None:
            body["observed_at"] = s.observed_at.isoformat()
        if s.confidence is not None:
            body["confidence"] = s.confidence
        answer = http.post("/v1/memories", json=body)
        if answer.status_code == 409:
            existing += 1
        elif answer.status_code != 201:
            raise RuntimeError(f"writing {conversation.sample_id} {s.key}: {answer.status_code}"
                               f" {answer.text[:300]}")
    return existing


def wait_embedded(http: httpx.Client, conversations: Sequence[ConversationSet],
                  timeout_s: float = 1800, report_every_s: float = 30) -> None:
    """Until every statement's memory says `embedded` (merge compares embedded memories only)."""
    start = last_report = time.monotonic()
    waiting = {c.sample_id: {c.memory_id(s.key) for s in c.statements} for c in conversations}
    while True:
        for conversation in conversations:
            left = waiting[conversation.sample_id]
            if left:
                left -= {m["id"] for m in pages(http, conversation.scope) if m["embedded"]}
        remaining = sum(map(len, waiting.values()))
        if remaining == 0:
            return
        now = time.monotonic()
        if now - start > timeout_s:
            raise RuntimeError(f"{remaining} memories not embedded after {timeout_s:.0f}s")
        if now - last_report >= report_every_s:
            print(f"  {now - start:6.0f}s  {remaining} memories left to embed", flush=True)
            last_report = now
        time.sleep(2)


def dry_merge(http: httpx.Client, conversation: ConversationSet, threshold: float | None,
              link_similarity: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A dry run of the merge step over the conversation's fresh scope: the run and its
    proposed merges (each `memory_id` merged away into `other_id`). A threshold below the
    tenant's link similarity takes the link similarity down with it (the server refuses a
    link similarity above the merge's, even for a run without the link step)."""
    body: dict[str, Any] = {"scope": conversation.scope, "dry_run": True, "steps": ["merge"]}
    if threshold is not None:
        body["merge_similarity"] = threshold
        if threshold < link_similarity:
            body["link_similarity"] = threshold
    answer = http.post("/v1/consolidation/runs", params={"wait": 60}, json=body)
    if answer.status_code != 202:
        raise RuntimeError(f"starting a run: {answer.status_code} {answer.text[:300]}")
    run = finish_run(http, answer.json()["run"], timeout_s=600)
    merges: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = http.get(f"/v1/consolidation/runs/{run['id']}/changes",
                        params={"step": "merge", "after": after, "limit": 1000})
        page.raise_for_status()
        body = page.json()
        merges += [c for c in body["data"] if c["action"] == "merge"]
        after = body["next_after"]
    return run, merges


@dataclass
class Score:
    proposed: int = 0
    right: int = 0
    lookalikes: int = 0
    same_turn: int = 0  # wrong merges of two statements citing one turn
    different_subjects: int = 0  # pairs above the threshold the merge refused for their names
    wrong_by_kind: Counter[str] = field(default_factory=Counter)
    wrong_examples: list[tuple[float, str, str]] = field(default_factory=list)
    compared: int = 0

    def add(self, conversation: ConversationSet, run: dict[str, Any],
            merges: Sequence[dict[str, Any]]) -> None:
        by_id = {conversation.memory_id(s.key): s for s in conversation.statements}
        self.compared += run["counts"].get("merge", {}).get("compared", 0)
        self.different_subjects += run["counts"].get("merge", {}).get("different_subjects", 0)
        for change in merges:
            a, b = by_id.get(change["memory_id"]), by_id.get(change["other_id"])
            self.proposed += 1
            if a is None or b is None:  # a memory of the scope this set did not write
                self.wrong_by_kind["unknown"] += 1
                continue
            if a.pair == b.pair:
                self.right += 1
                continue
            if frozenset((a.key, b.key)) in conversation.lookalikes:
                self.lookalikes += 1
            if a.turns & b.turns:
                self.same_turn += 1
            kind = "-".join(sorted((a.source, b.source)))
            self.wrong_by_kind[kind + ("" if a.speaker == b.speaker else " (two speakers)")] += 1
            self.wrong_examples.append((change["detail"].get("similarity", 0.0), a.content,
                                        b.content))


def measure(http: httpx.Client, conversations: Sequence[ConversationSet],
            thresholds: Sequence[float], link_similarity: float) -> dict[str, Score]:
    rows: dict[str, Score] = {}
    for label, threshold in [("default", None), *((f"{t:.2f}", t) for t in thresholds)]:
        score = rows[label] = Score()
        start = time.perf_counter()
        for conversation in conversations:
            if not conversation.statements:
                continue
            run, merges = dry_merge(http, conversation, threshold, link_similarity)
            score.add(conversation, run, merges)
        print(f"  threshold {label}: {score.proposed} merges proposed,"
              f" {score.different_subjects} similar pairs refused as two subjects"
              f" ({time.perf_counter() - start:.1f}s)", flush=True)
    return rows


def report_set(conversations: Sequence[ConversationSet]) -> None:
    funnel = Funnel()
    for c in conversations:
        funnel += c.funnel
    pairs = sum(c.pairs for c in conversations)
    named = sum(different_subjects(a.content, b.content) for c in conversations
                for a, b in zip(c.statements[::2], c.statements[1::2], strict=True))
    print(f"pairs: memmill extracted {funnel.memories} valid memories ({funnel.single_source}"
          f" drawn from one turn); LoCoMo has {funnel.observations} observations"
          f" ({funnel.single_turn} citing one turn). {funnel.turns_cited_by_both} turns are cited"
          f" by both: {funnel.ambiguous} left out as ambiguous (more than one memory or"
          f" observation), {funnel.not_single} because the memory or the observation cites more"
          f" turns, {funnel.not_the_speaker} because one is not about the turn's speaker;"
          f" {pairs} pairs, {named} of which open with two different names by the merge's"
          " test (it refuses them at any threshold)", flush=True)
    for c in conversations:
        print(f"  {c.sample_id}: {c.pairs} pairs", flush=True)


def report(rows: dict[str, Score], conversations: Sequence[ConversationSet], default: float,
           examples: int) -> None:
    pairs = sum(c.pairs for c in conversations)
    memories = sum(len(c.statements) for c in conversations)
    lookalikes = sum(len(c.lookalikes) for c in conversations)
    print()
    print(f"set: {len(conversations)} conversations, {memories} memories; {pairs} positive pairs"
          " (same fact from one turn: memmill's extracted memory and LoCoMo's observation),"
          f" {lookalikes} look-alike negative pairs (nearest statement of the same speaker and"
          " source by word overlap); every other pair of the set is a negative too")
    print()
    print("| threshold | proposed merges | right | precision | recall | look-alikes merged |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, score in rows.items():
        name = f"default ({default:g})" if label == "default" else label
        precision = f"{score.right / score.proposed:.3f}" if score.proposed else "-"
        print(f"| {name} | {score.proposed} | {score.right} | {precision} |"
              f" {score.right / pairs if pairs else 0:.3f} | {score.lookalikes} |")
    compared = {score.compared for score in rows.values()}
    if compared != {memories}:
        print(f"\nwarning: the runs compared {sorted(compared)} memories, the set holds"
              f" {memories}")
    print()
    print("merges scored wrong that join two statements citing the same turn (not a labelled"
          " pair; each turn gives at most one pair, so 0 unless the construction changes): "
          + ", ".join(f"{label} {score.same_turn}" for label, score in rows.items()))
    score = rows["default"]
    if score.wrong_by_kind:
        kinds = ", ".join(f"{k} {n}" for k, n in score.wrong_by_kind.most_common())
        print(f"\nwrong merges at the default, by sources of the two statements: {kinds}")
    for similarity, a, b in sorted(score.wrong_examples, reverse=True)[:examples]:
        print(f"  {similarity:.3f}  {a!r}\n         {b!r}")
    print()
    print("command: " + shlex.join([os.path.relpath(sys.executable), *sys.argv]))


def extract(http: httpx.Client, conversations: Sequence[Conversation]) -> None:
    """Write the conversations' sessions as events and wait for their extraction."""
    start = time.perf_counter()
    events = duplicates = 0
    for conversation in conversations:
        stored, repeated = store_events(http, conversation)
        events += stored
        duplicates += repeated
    print(f"stored {events} events ({duplicates} duplicates) in"
          f" {time.perf_counter() - start:.1f}s", flush=True)
    start = time.perf_counter()
    wait_indexed(http, conversations)
    print(f"embedded and extracted {time.perf_counter() - start:.1f}s later", flush=True)


def bench(url: str, key: str, records: Sequence[dict[str, Any]],
          sessions: Sequence[Conversation], thresholds: Sequence[float],
          examples: int) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                      timeout=120) as http:
        extract(http, sessions)
        conversations = [build_set(r, list(pages(http, c.scope)))
                         for r, c in zip(records, sessions, strict=True)]
        report_set(conversations)
        start = time.perf_counter()
        existing = sum(store(http, c) for c in conversations)
        written = sum(len(c.statements) for c in conversations)
        print(f"wrote {written - existing} memories ({existing} there already) in"
              f" {time.perf_counter() - start:.1f}s", flush=True)
        start = time.perf_counter()
        wait_embedded(http, conversations)
        print(f"all embedded {time.perf_counter() - start:.1f}s later", flush=True)
        policy = http.get("/v1/memory-policy")
        policy.raise_for_status()
        rules = policy.json()
        rows = measure(http, conversations, thresholds, rules["link_similarity"])
    report(rows, conversations, rules["merge_similarity"], examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="LoCoMo JSON file")
    parser.add_argument("--limit-conversations", type=int, default=None,
                        help="the first N conversations only (default: all)")
    parser.add_argument("--thresholds", default=",".join(f"{t:.2f}" for t in THRESHOLDS),
                        help="merge_similarity values to try besides the default")
    parser.add_argument("--examples", type=int, default=3,
                        help="wrong merges at the default threshold to print")
    parser.add_argument("--port", type=int, default=None,
                        help="port for the memmill this starts (default: a free one)")
    parser.add_argument("--url", help="use a running memmill at this URL instead of starting one")
    parser.add_argument("--key", help="API key for --url")
    args = parser.parse_args()
    if bool(args.url) != bool(args.key):
        parser.error("--url and --key go together")
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    except ValueError:
        parser.error("--thresholds: numbers separated by commas")

    records = json.loads(args.data.read_text(encoding="utf-8"))[:args.limit_conversations]
    sessions = load_conversations(args.data)[0][:args.limit_conversations]
    if [r["sample_id"] for r in records] != [c.sample_id for c in sessions]:
        raise RuntimeError("the conversations and their sessions are not in the same order")
    print(f"{len(records)} conversations, {sum(len(c.sessions) for c in sessions)} sessions,"
          f" {sum(len(s.events) for c in sessions for s in c.sessions)} turns to write",
          flush=True)

    if args.url:
        bench(args.url.rstrip("/"), args.key, records, sessions, thresholds, args.examples)
        return
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="memmill-dedupe-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, port, workers=1)
        failed = True
        try:
            url = f"http://127.0.0.1:{port}"
            bench(url, wait_for_api(url, data_dir), records, sessions, thresholds,
                  args.examples)
            failed = False
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=60)
            if failed:
                log = (data_dir / "up.log").read_text(errors="replace").splitlines()
                print("\nlast lines of the server's log:\n" + "\n".join(log[-40:]))


if __name__ == "__main__":
    main()
