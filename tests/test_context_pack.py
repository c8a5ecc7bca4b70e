"""Context packing without a database: offline token counts, and the budget rules of
`pack_context` checked on fixed cases and on many random inputs."""

from __future__ import annotations

import os
import random
import socket
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.memory import tokens
from pipeline.memory.context import (
    HEADERS,
    SECTION_ORDER,
    MemoryLine,
    PackedContext,
    TurnLine,
    pack_context,
)
from pipeline.memory.tokens import count_many, count_tokens, truncate_to_tokens

os.environ.setdefault("HF_HUB_OFFLINE", "1")
T0 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
WORDS = [
    "Caroline", "Melanie", "went", "to", "the", "LGBTQ", "support", "group", "yesterday", "and",
    "it", "was", "powerful", "adoption", "agency", "counseling", "2023-05-07", "sunrise!",
    "race,", "beagle", "Oscar", "😀", "naïve", "café:", "we'll", "see…", "pneumonoultramicro",
]


def memory(i: int, content: str | None = None, *, day: int = 7) -> MemoryLine:
    return MemoryLine(
        id=f"m{i}", type="fact", content=content or f"Caroline went to support group {i}.",
        observed_at=datetime(2023, 5, day, tzinfo=UTC), source_events=(("s0", f"e{i}"),),
        pinned=False,
    )


def turn(i: int, content: str | None = None, *, session: str = "s0",
         sender: str | None = "Caroline", minutes: int = 0) -> TurnLine:
    return TurnLine(
        session_id=session, event_id=f"e{i}", role="user", sender_name=sender,
        content=content or f"I went hiking on trail {i} with Mel.",
        created_at=T0 + timedelta(minutes=minutes or i),
    )


def pack(**kwargs: object) -> PackedContext:
    options: dict[str, object] = {
        "pinned": [], "memories": [], "summary": None, "relevant_turns": [],
        "recent_turns": [], "max_tokens": 10_000,
    }
    options.update(kwargs)
    return pack_context(**options)  # type: ignore[arg-type]


def ids(packed: PackedContext, kind: str | None = None) -> list[str]:
    return [e["id"] for e in packed.included if kind is None or e["kind"] == kind]


# --- tokens ---


def test_counts_are_stable_and_need_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer tried to reach the network")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    tokens._tokenizer.cache_clear()  # load again, now with the network blocked
    assert count_tokens("hello world") == 2  # no [CLS]/[SEP]
    assert count_tokens("") == 0
    assert count_tokens("Caroline went to the LGBTQ support group.") == 9
    long = " ".join(["word"] * 600)
    assert count_tokens(long) == 600  # the file's truncation at 128 is off
    texts = ["hello world", "", long, "naïve café 😀", "a\n\nb"]
    assert count_many(texts) == [count_tokens(t) for t in texts]
    assert count_many([]) == []
    assert tokens.TOKENIZER_NAME


def test_truncate_to_tokens_stays_within_bounds_on_word_boundaries() -> None:
    text = "Caroline went to the LGBTQ support group yesterday and it was so powerful."
    full = count_tokens(text)
    assert truncate_to_tokens(text, full) == text
    assert truncate_to_tokens(text, full + 10) == text
    assert truncate_to_tokens(text, 0) == ""
    assert truncate_to_tokens(text, 1) == "…"
    for limit in range(1, full):
        cut = truncate_to_tokens(text, limit)
        assert count_tokens(cut) <= limit
        assert cut.endswith("…")
        kept = cut[:-1]
        assert text.startswith(kept)
        assert kept == "" or text[len(kept)].isspace()  # no word split ("LGBT" of "LGBTQ")
    assert truncate_to_tokens(text, 7) == "Caroline went to the LGBTQ…"
    assert truncate_to_tokens(text, 6) == "Caroline went to the…"


def test_truncating_a_single_long_word_cuts_inside_it() -> None:
    word = "pneumonoultramicroscopicsilicovolcanoconiosis"
    cut = truncate_to_tokens(word, 3)
    assert cut.endswith("…") and len(cut) > 1
    assert count_tokens(cut) <= 3


# --- packing ---


def test_sections_come_in_a_stable_order_with_short_headers() -> None:
    pinned = [MemoryLine("p1", "preference", "Prefers short answers.", None, (), True)]
    packed = pack(pinned=pinned, memories=[memory(1)], summary="They talked about hiking.",
                  relevant_turns=[turn(1)], recent_turns=[turn(9, session="s1")],
                  session_id="s1", profile=[("rust", "- rust: beginner (new to it)")],
                  working_memory=("session", "Step 2: compare flights"))
    assert [s.name for s in packed.sections] == list(SECTION_ORDER)
    positions = [packed.context.index(HEADERS[name]) for name in SECTION_ORDER]
    assert positions == sorted(positions)
    assert packed.context.startswith("## About the user\n- rust: beginner (new to it)\n\n"
                                     "## Working memory\nStep 2: compare flights\n\n"
                                     "## Pinned\n- (preference) Prefers short answers.\n\n")

    assert sum(s.tokens for s in packed.sections) == count_tokens(packed.context)
    assert not packed.truncated
    assert {"kind": "summary", "id": "s1"} in packed.included


def test_empty_sections_are_left_out() -> None:
    packed = pack(memories=[memory(1)], recent_turns=[turn(2)])
    assert [s.name for s in packed.sections] == ["memories", "recent_turns"]
    assert "## Pinned" not in packed.context and "## Summary" not in packed.context


def test_dates_speakers_and_chronology_are_rendered() -> None:
    relevant = [turn(3, minutes=30), turn(1, "Late\n  and\tlong", minutes=10, sender=None)]
    undated = MemoryLine("m9", "event", "Went camping.", None, (), False)
    packed = pack(memories=[memory(1, "Caroline went to a support group."), undated],
                  relevant_turns=relevant)
    lines = packed.context.splitlines()
    assert "- [2023-05-07] (fact) Caroline went to a support group." in lines
    assert "- (event) Went camping." in lines
    # Chosen by relevance, shown in time order; no sender name falls back to the role.
    turns = lines[lines.index("## Relevant past turns") + 1:]
    assert turns == [
        "On 8 May 2023:",
        "user: Late and long",
        "Caroline: I went hiking on trail 3 with Mel.",
    ]
    assert packed.included[0]["source_events"] == [{"session_id": "s0", "event_id": "e1"}]
    assert packed.included[2] == {"kind": "event", "id": "s0/e1", "session_id": "s0",
                                   "event_id": "e1"}


def test_recent_turns_are_reserved_before_anything_else() -> None:
    recent = [turn(i, session="s1") for i in range(10)]
    memories = [memory(i) for i in range(40)]
    packed = pack(memories=memories, recent_turns=recent, max_tokens=200, keep_recent=4)
    assert ids(packed, "event") == [f"s1/e{i}" for i in range(6, 10)]
    assert packed.truncated  # most memories did not fit
    assert packed.sections[-1].name == "recent_turns"
    assert count_tokens(packed.context) <= 200


def test_long_recent_turns_are_cut_and_the_oldest_dropped_when_needed() -> None:
    essay = " ".join(["word"] * 500)
    packed = pack(recent_turns=[turn(1, essay), turn(2, "short")], max_tokens=400)
    lines = packed.context.splitlines()
    assert lines[1].endswith("…") and count_tokens(lines[1]) <= 400 // 8
    assert lines[2].endswith("Caroline: short")
    assert packed.truncated

    many = [turn(i, f"message {i} " * 5) for i in range(6)]
    small = pack(recent_turns=many, max_tokens=60)
    kept = ids(small, "event")
    assert kept and kept == [f"s0/e{i}" for i in range(6 - len(kept), 6)]  # the latest
    assert small.truncated and count_tokens(small.context) <= 60


def test_memories_and_relevant_turns_are_interleaved() -> None:
    memories = [memory(i) for i in range(10)]
    relevant = [turn(i, session="s2") for i in range(10)]
    two_each = {"memories": memories[:2], "relevant_turns": relevant[:2]}
    room = next(n for n in range(400) if not pack(max_tokens=n, **two_each).truncated)
    packed = pack(memories=memories, relevant_turns=relevant, max_tokens=room)
    assert packed.truncated
    assert ids(packed) == ["m0", "m1", "s2/e0", "s2/e1"]  # not four memories, not four turns


def test_an_item_that_does_not_fit_is_skipped_for_smaller_ones() -> None:
    big = memory(0, " ".join(["word"] * 300))
    packed = pack(memories=[big, memory(1), memory(2)], max_tokens=100)
    assert ids(packed) == ["m1", "m2"]
    assert packed.truncated


def test_duplicates_are_not_repeated() -> None:
    shared = turn(5, session="s1")
    pinned = [MemoryLine("m1", "fact", "Pinned fact.", None, (), True)]
    packed = pack(pinned=pinned, memories=[memory(1), memory(2), memory(2)],
                  relevant_turns=[shared, turn(3), turn(3)], recent_turns=[shared])
    assert ids(packed) == ["m1", "m2", "s0/e3", "s1/e5"]
    assert packed.context.count("trail 5") == 1
    assert [s.name for s in packed.sections] == ["pinned", "memories", "relevant_turns",
                                                 "recent_turns"]
    assert not packed.truncated


def test_truncated_is_set_exactly_when_something_is_left_out() -> None:
    options = {"memories": [memory(i) for i in range(3)], "relevant_turns": [turn(7)],
               "summary": "A short summary.", "recent_turns": [turn(9, session="s1")]}
    needed = next(n for n in range(400) if not pack(max_tokens=n, **options).truncated)
    assert len(pack(max_tokens=needed, **options).included) == 6
    assert pack(max_tokens=needed - 1, **options).truncated
    assert count_tokens(pack(max_tokens=needed, **options).context) <= needed


@pytest.mark.parametrize("max_tokens", [0, 1, 2])
def test_a_budget_below_one_header_gives_an_empty_context(max_tokens: int) -> None:
    packed = pack(memories=[memory(1)], recent_turns=[turn(1)], summary="x",
                  max_tokens=max_tokens)
    assert packed == PackedContext("", [], True, [])


def test_nothing_to_pack_is_not_truncated() -> None:
    assert pack(summary="  ", max_tokens=0) == PackedContext("", [], False, [])


def test_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        pack(max_tokens=-1)


def random_text(rng: random.Random, longest: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest)))


def test_random_inputs_never_exceed_the_budget() -> None:
    rng = random.Random(20230508)
    for _ in range(300):
        pinned = [MemoryLine(f"p{i}", "preference", random_text(rng, 20), None, (), True)
                  for i in range(rng.randint(0, 3))]
        memories = [memory(rng.randint(0, 30), random_text(rng, 60))
                    for _ in range(rng.randint(0, 15))]
        relevant = [turn(rng.randint(0, 30), random_text(rng, 120), minutes=rng.randint(1, 999))
                    for _ in range(rng.randint(0, 15))]
        recent = [turn(i, random_text(rng, 300), minutes=1000 + i)
                  for i in range(rng.randint(0, 10))]
        summary = random_text(rng, 80) if rng.random() < 0.7 else None
        max_tokens = rng.choice([rng.randint(0, 40), rng.randint(0, 400), rng.randint(0, 4000)])
        packed = pack(pinned=pinned, memories=memories, relevant_turns=relevant,
                      recent_turns=recent, summary=summary, max_tokens=max_tokens,
                      keep_recent=rng.randint(0, 8), session_id="s0")

        assert count_tokens(packed.context) <= max_tokens
        assert sum(s.tokens for s in packed.sections) == count_tokens(packed.context)
        names = [s.name for s in packed.sections]
        assert names == [n for n in SECTION_ORDER if n in names]
        keys = [(e["kind"], e["id"]) for e in packed.included]
        assert len(keys) == len(set(keys))
        if not packed.truncated:
            assert {m.id for m in memories} <= set(ids(packed, "memory"))
            assert {f"s0/{t.event_id}" for t in relevant} <= set(ids(packed, "event"))
            assert (summary is None) or ("summary", "s0") in keys


def test_observations_take_only_what_the_budget_leaves() -> None:
    observation = MemoryLine("o1", "conversation", "Session s1 (2024-05-01)\n- " + "word " * 40,
                             None, (("s1", "e1"),))
    roomy = pack(pinned=[], memories=[memory(1)], summary=None, relevant_turns=[turn(1)],
                 recent_turns=[], observations=[observation], max_tokens=1000)
    shown = [i["id"] for i in roomy.included]
    assert shown.index("o1") == shown.index("m1") + 1  # with the memories, after them
    tight = pack(pinned=[], memories=[memory(1)], summary=None, relevant_turns=[turn(1)],
                 recent_turns=[], observations=[observation], max_tokens=60)
    assert "o1" not in [i["id"] for i in tight.included]
    assert {i["id"] for i in tight.included} == {"m1", "s0/e1"} and tight.truncated
