"""Memory extraction without a database: relative dates, the offline rule extractor and
decider, and the model-backed extractor and decider against a real local server that speaks
each provider's wire format (OpenAI chat completions, Anthropic messages, Ollama /api/chat).
No mock of httpx: every request goes over a loopback socket to uvicorn."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pipeline.errors import PermanentError, TransientError
from pipeline.memory.extraction import dates
from pipeline.memory.extraction.decide import RuleDecider
from pipeline.memory.extraction.factory import get_chat, get_decider, get_extractor
from pipeline.memory.extraction.llm import (
    AnthropicJSONChat,
    JSONChat,
    LLMDecider,
    LLMExtractor,
    MalformedAnswer,
    OllamaJSONChat,
    OpenAIJSONChat,
)
from pipeline.memory.extraction.model import ACTIONS, Proposal, Similar, Turn
from pipeline.memory.extraction.rules import (
    MAX_CONTENT_CHARS,
    RuleExtractor,
    conjugate,
    third_person,
)
from pipeline.settings import Settings
from tests.fake_providers import Seen, serve_in_thread

REF = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # a Monday
TYPES = ("fact", "preference", "event", "decision", "project_state")
KEY = "sk-extract-0123456789"


def turn(content: str, *, role: str = "user", name: str | None = None, event: str = "e1",
         at: datetime = REF, session: str = "s1") -> Turn:
    return Turn(session_id=session, event_id=event, role=role, sender_name=name,
                content=content, created_at=at)


async def rules(*turns: Turn, types: tuple[str, ...] = TYPES) -> list[Proposal]:
    return await RuleExtractor().extract(turns, types=types)


def contents(proposals: list[Proposal]) -> list[str]:
    return [p.content for p in proposals]


# ----------------------------------------------------------------------------- dates


@pytest.mark.parametrize(("sentence", "phrase", "label", "granularity", "day"), [
    ("I went to a support group yesterday.", "yesterday", "on 7 May 2023", "day", "2023-05-07"),
    ("Last night was fun", "Last night", "on 7 May 2023", "day", "2023-05-07"),
    ("we talked today", "today", "on 8 May 2023", "day", "2023-05-08"),
    ("see you tonight", "tonight", "on 8 May 2023", "day", "2023-05-08"),
    ("last week I ran", "last week", "in the week of 1 May 2023", "week", "2023-05-01"),
    ("this week is busy", "this week", "in the week of 8 May 2023", "week", "2023-05-08"),
    ("next week we fly", "next week", "in the week of 15 May 2023", "week", "2023-05-15"),
    ("last weekend we camped", "last weekend", "on the weekend of 6 May 2023", "week",
     "2023-05-06"),
    ("this weekend", "this weekend", "on the weekend of 13 May 2023", "week", "2023-05-13"),
    ("last month was hard", "last month", "in April 2023", "month", "2023-04-01"),
    ("this month I read", "this month", "in May 2023", "month", "2023-05-01"),
    ("next month I move", "next month", "in June 2023", "month", "2023-06-01"),
    ("last year I quit", "last year", "in 2022", "year", "2022-01-01"),
    ("two days ago I ran", "two days ago", "on 6 May 2023", "day", "2023-05-06"),
    ("3 weeks ago", "3 weeks ago", "in the week of 17 April 2023", "week", "2023-04-17"),
    ("a couple of days ago", "a couple of days ago", "on 6 May 2023", "day", "2023-05-06"),
    ("a few days ago I painted", "a few days ago", "a few days before 8 May 2023", "week",
     "2023-05-05"),
    ("a month ago", "a month ago", "in April 2023", "month", "2023-04-01"),
    ("on Monday I swam", "on Monday", "on 1 May 2023", "day", "2023-05-01"),
    ("last Friday I swam", "last Friday", "on 5 May 2023", "day", "2023-05-05"),
    ("on Saturday", "on Saturday", "on 6 May 2023", "day", "2023-05-06"),
    ("in May we met", "in May", "in May 2023", "month", "2023-05-01"),
    ("last May we met", "last May", "in May 2022", "month", "2022-05-01"),
    ("in March we met", "in March", "in March 2023", "month", "2023-03-01"),
    ("in June we met", "in June", "in June 2022", "month", "2022-06-01"),  # past by default
    ("on 8 May 2023", "on 8 May 2023", "on 8 May 2023", "day", "2023-05-08"),
    ("May 8, 2023 it was", "May 8, 2023", "on 8 May 2023", "day", "2023-05-08"),
    ("the 3rd of June 2021", "the 3rd of June 2021", "on 3 June 2021", "day", "2021-06-03"),
    ("on 2023-05-08", "on 2023-05-08", "on 8 May 2023", "day", "2023-05-08"),
    ("in May 2022 I moved", "in May 2022", "in May 2022", "month", "2022-05-01"),
    ("in 2022 I moved", "in 2022", "in 2022", "year", "2022-01-01"),
])
def test_relative_and_explicit_dates(sentence: str, phrase: str, label: str,
                                     granularity: str, day: str) -> None:
    found = dates.resolve(sentence, REF)
    assert found is not None
    assert (found.phrase, found.label, found.granularity) == (phrase, label, granularity)
    assert found.when == datetime.fromisoformat(day).replace(tzinfo=UTC)
    assert sentence[found.start:found.end].strip() == phrase


def test_dates_are_resolved_in_the_speakers_time_zone() -> None:
    # 23:00 in New York is already the next day in UTC; the speaker's yesterday is the 7th.
    new_york = datetime(2023, 5, 8, 23, 0, tzinfo=timezone(timedelta(hours=-4)))
    found = dates.resolve("I went yesterday", new_york)
    assert found is not None
    assert found.when == datetime(2023, 5, 7, tzinfo=UTC)
    assert found.when.tzinfo is UTC


def test_plans_look_forward() -> None:
    assert dates.resolve("on Monday", REF, tense="future").label == "on 15 May 2023"
    assert dates.resolve("next Friday", REF).label == "on 12 May 2023"
    assert dates.resolve("in April", REF, tense="future").label == "in April 2024"
    assert dates.resolve("on 20 May", REF, tense="future").label == "on 20 May 2023"
    assert dates.resolve("on 20 May", REF).label == "on 20 May 2022"


@pytest.mark.parametrize("sentence", [
    "I may go to the gym", "Mondays are hard", "It's 10:30 now", "nothing here",
])
def test_no_date(sentence: str) -> None:
    assert dates.resolve(sentence, REF) is None


def test_every_date_of_a_sentence_once() -> None:
    found = dates.find_dates("Tonight I pack, tomorrow I fly, and on 8 May 2023 I land", REF)
    assert [f.phrase for f in found] == ["Tonight", "tomorrow", "on 8 May 2023"]


@pytest.mark.parametrize(("text", "expected"), [
    ("2023-05-07", datetime(2023, 5, 7, tzinfo=UTC)),
    ("2023-05-07T10:00:00Z", datetime(2023, 5, 7, 10, tzinfo=UTC)),
    ("2023-05-07T10:00:00+02:00", datetime(2023, 5, 7, 8, tzinfo=UTC)),
    ("2023-05-07T10:00:00", datetime(2023, 5, 7, 10, tzinfo=UTC)),
    ("7 May 2023", datetime(2023, 5, 7, tzinfo=UTC)),
    ("May 7, 2023", datetime(2023, 5, 7, tzinfo=UTC)),
    ("yesterday", None),
    ("2023-02-31", None),
    ("", None),
])
def test_parse_date_is_lenient(text: str, expected: datetime | None) -> None:
    assert dates.parse_date(text) == expected


# ----------------------------------------------------------------------------- rule extractor


async def test_a_conversation_between_two_people() -> None:
    got = await rules(
        turn("Hey Mel! Good to see you. I went to a LGBTQ support group yesterday and it was "
             "so powerful.", name="Caroline", event="e1"),
        turn("Wow, that's great! I'm a mom of two kids. My husband and I went camping last "
             "weekend. I love painting, it's my therapy.", role="assistant", name="Melanie",
             event="e2"),
        turn("I'm thinking of working in counseling. I'm going to apply to a program next "
             "month. What do you think?", name="Caroline", event="e3"),
    )
    assert contents(got) == [
        "Caroline went to a LGBTQ support group (on 7 May 2023).",
        "Melanie is a mom of two kids.",
        "Melanie's husband and Melanie went camping (on the weekend of 6 May 2023).",
        "Melanie loves painting.",
        "Caroline is thinking of working in counseling.",
        "Caroline is going to apply to a program (in June 2023).",
    ]
    support, mom, camping, painting, counseling, program = got
    assert (support.type, support.observed_at) == ("event", datetime(2023, 5, 7, tzinfo=UTC))
    assert support.source_events == (("s1", "e1"),)
    assert support.hints == ("2023-05-07",)
    assert (mom.type, mom.observed_at, mom.confidence) == ("fact", REF, 0.7)
    assert camping.observed_at == datetime(2023, 5, 6, tzinfo=UTC)
    assert (painting.type, painting.confidence) == ("preference", 0.75)
    assert (counseling.type, counseling.observed_at) == ("project_state", REF)
    # A plan with a date is an event in the future.
    assert (program.type, program.observed_at) == ("event", datetime(2023, 6, 1, tzinfo=UTC))


async def test_a_user_and_an_agent_at_work() -> None:
    got = await rules(
        turn("I live in Denver. I work as a nurse at the city hospital. My favorite color is "
             "green."),
        turn("We decided to use Postgres for the queue. Let's go with Redis for caching. "
             "I don't like MongoDB at all.", event="e2"),
        turn("Noted! I will look into that for you. I love helping.", role="assistant",
             event="e3"),
        turn("I'm a software engineer and I'm currently learning Rust. On Monday I finally "
             "adopted a puppy named Max.", event="e4"),
    )
    assert [(p.type, p.content) for p in got] == [
        ("fact", "The user lives in Denver."),
        ("fact", "The user works as a nurse at the city hospital."),
        ("preference", "The user's favorite color is green."),
        ("decision", "The user and others decided to use Postgres for the queue."),
        ("decision", "The user decided to go with Redis for caching."),
        ("preference", "The user doesn't like MongoDB at all."),
        ("fact", "The user is a software engineer and the user is currently learning Rust."),
        ("event", "The user finally adopted a puppy named Max (on 1 May 2023)."),
    ]


async def test_dated_events_and_the_past() -> None:
    got = await rules(turn(
        "Yesterday I started a new job at Acme. A few days ago I visited my parents in Ohio. "
        "I've just finished my first marathon! I moved to Berlin in 2021."))
    assert [(p.content, p.observed_at and p.observed_at.date().isoformat(), p.confidence)
            for p in got] == [
        ("The user started a new job at Acme (on 7 May 2023).", "2023-05-07", 0.7),
        ("The user visited the user's parents in Ohio (a few days before 8 May 2023).",
         "2023-05-05", 0.7),
        # No date: when it happened is unknown, and the memory is less sure.
        ("The user has just finished the user's first marathon.", None, 0.55),
        ("The user moved to Berlin (in 2021).", "2021-01-01", 0.7),
    ]


async def test_a_date_of_another_clause_is_not_the_statements() -> None:
    (got,) = await rules(turn("Last year was hard, but now I'm a nurse at the clinic."))
    assert (got.content, got.observed_at) == ("The user is a nurse at the clinic.", REF)


@pytest.mark.parametrize("text", [
    "Hi! How are you?",
    "Hello Caroline, good morning to you",
    "Do you like hiking in the mountains?",
    "What do I need to bring to the party",
    "I love it so much!",
    "I went there with them.",
    "Thanks so much, I appreciate it.",
    "I'll let you know tomorrow.",
    "I'm going to check later today.",
    "If I win the lottery, I will buy a boat.",
    "Yes, I am.",
    "Sounds good to me.",
    "I love your painting of the lake!",
    "You said you moved to Boston last year.",
    "She lives in Paris with her husband.",
    "I had a great time yesterday!",
])
async def test_what_it_must_not_extract(text: str) -> None:
    assert await rules(turn(text, name="Caroline")) == []


async def test_only_people_speaking_count() -> None:
    said = "I live in Paris with my family."
    assert await rules(turn(said, role="tool")) == []
    assert await rules(turn(said, role="system")) == []
    assert await rules(turn(said, role="assistant")) == []  # the agent itself, unnamed
    (named,) = await rules(turn(said, role="assistant", name="Melanie"))
    assert named.content == "Melanie lives in Paris with Melanie's family."


async def test_types_the_tenant_does_not_have() -> None:
    said = turn("I love hiking in the Alps. I'm from Sweden originally.")
    assert [(p.type, p.content) for p in await rules(said, types=("fact",))] == [
        ("fact", "The user loves hiking in the Alps."),
        ("fact", "The user is from Sweden originally."),
    ]
    assert [p.type for p in await rules(said, types=("preference",))] == ["preference"]
    assert await rules(said, types=()) == []


async def test_hedges_lower_the_confidence() -> None:
    sure, hedged, doubly = await rules(turn(
        "I prefer tea over coffee. Maybe I prefer green tea in the morning. I think I "
        "probably prefer black tea at night."))
    assert sure.confidence == 0.75
    assert hedged.confidence == 0.6
    assert doubly.confidence == 0.45
    assert doubly.content == "The user probably prefers black tea at night."


async def test_a_long_sentence_is_cut() -> None:
    (got,) = await rules(turn("I love " + "long walks on quiet beaches and " * 30 + "tea."))
    assert len(got.content) <= MAX_CONTENT_CHARS
    assert got.content.startswith("The user loves long walks")


async def test_the_same_statement_twice_is_one_proposal_with_both_sources() -> None:
    first = turn("I live in Denver.", event="e1")
    again = turn("Well, I live in Denver!", event="e2")
    (got,) = await rules(first, again)
    assert got.source_events == (("s1", "e1"), ("s1", "e2"))
    assert await rules(first, again) == [got]  # deterministic


@pytest.mark.parametrize(("text", "expected"), [
    ("I love my dog", "Caroline loves Caroline's dog"),
    ("I'm a teacher", "Caroline is a teacher"),
    ("I've been to Rome", "Caroline has been to Rome"),
    ("I don't like fish", "Caroline doesn't like fish"),
    ("I really enjoy watching movies with my kids", "Caroline really enjoys watching movies "
     "with Caroline's kids"),
    ("my sister and I go hiking", "Caroline's sister and Caroline go hiking"),
    ("we're moving to the US", "Caroline and others are moving to the US"),
    ("I study every day", "Caroline studies every day"),
    ("I went with my mom and she drove me", "Caroline went with Caroline's mom and she drove "
     "Caroline"),
])
def test_third_person(text: str, expected: str) -> None:
    assert third_person(text, "Caroline") == expected


def test_third_person_without_a_name() -> None:
    assert third_person("My dog loves me", "The user") == "The user's dog loves the user"


@pytest.mark.parametrize(("verb", "expected"), [
    ("love", "loves"), ("go", "goes"), ("watch", "watches"), ("study", "studies"),
    ("play", "plays"), ("have", "has"), ("went", "went"), ("decided", "decided"),
    ("can", "can"), ("don't", "doesn't"), ("didn't", "didn't"),
])
def test_conjugate(verb: str, expected: str) -> None:
    assert conjugate(verb) == expected


# ----------------------------------------------------------------------------- rule decider


def proposal(content: str, *, type: str = "fact", observed_at: datetime | None = None) -> Proposal:
    return Proposal(type=type, content=content, confidence=0.7, observed_at=observed_at,
                    source_events=(("s1", "e9"),))


def similar(index: int, content: str, similarity: float, *, type: str = "fact",
            observed_at: datetime | None = None) -> Similar:
    return Similar(index=index, type=type, content=content, similarity=similarity,
                   observed_at=observed_at)


DECIDER = RuleDecider(dedup_similarity=0.95, related_similarity=0.75)
MAY_1, MAY_8 = datetime(2023, 5, 1, tzinfo=UTC), datetime(2023, 5, 8, tzinfo=UTC)


@pytest.mark.parametrize(("new", "old", "action", "target", "reason"), [
    (proposal("The user lives in Denver."), [], "ADD", None, "no similar memory"),
    (proposal("The user lives in Denver."),
     [similar(0, "The user likes jazz.", 0.3)], "ADD", None,
     "no memory is similar enough (best: memory 0, similarity 0.30 < 0.75)"),
    (proposal("The user lives in Denver, Colorado."),
     [similar(0, "The user is in Denver a lot.", 0.5),
      similar(1, "Caroline lives in Denver Colorado", 0.97)],
     "NOOP_DUPLICATE", 1, "same content as memory 1 (similarity 0.97)"),
    (proposal("The user lives in Denver."),
     [similar(0, "the user lives in denver", 0.80, type="event")], "NOOP_DUPLICATE", 0,
     "same text as memory 0 (similarity 0.80)"),
    (proposal("The user no longer eats meat.", type="preference"),
     [similar(2, "The user eats meat.", 0.86, type="preference")], "SUPERSEDE", 2,
     "contradicts memory 2 (similarity 0.86): one of them is negated"),
    (proposal("The user lives in Boston."),
     [similar(0, "The user lives in Denver.", 0.88)], "SUPERSEDE", 0,
     'contradicts memory 0 (similarity 0.88): "lives in" changed from "denver" to "boston"'),
    (proposal("Caroline's favorite color is blue.", type="preference"),
     [similar(0, "Caroline's favorite color is green.", 0.9, type="preference")],
     "SUPERSEDE", 0, "contradicts memory 0 (similarity 0.90): \"favorite color is\" "
     "changed from \"green\" to \"blue\""),
    (proposal("The user is migrating the database to Postgres 16.", type="project_state",
              observed_at=MAY_8),
     [similar(0, "The user is migrating the database to Postgres.", 0.9,
              type="project_state", observed_at=MAY_1)],
     "SUPERSEDE", 0, "contradicts memory 0 (similarity 0.90): a later state of the same work"),
    (proposal("Caroline is going to Paris (on 27 May 2023).", type="event",
              observed_at=datetime(2023, 5, 27, tzinfo=UTC)),
     [similar(0, "Caroline is going to Paris (on 20 May 2023).", 0.93, type="event",
              observed_at=datetime(2023, 5, 20, tzinfo=UTC))],
     "SUPERSEDE", 0, "contradicts memory 0 (similarity 0.93): the planned event has another "
     "date"),
    (proposal("Caroline went to a support group (on 20 May 2023).", type="event",
              observed_at=datetime(2023, 5, 20, tzinfo=UTC)),
     [similar(0, "Caroline went to a support group (on 7 May 2023).", 0.93, type="event",
              observed_at=datetime(2023, 5, 7, tzinfo=UTC))],
     "ADD", None, "related to memory 0 (similarity 0.93) but neither contradicts nor "
     "extends it"),
    (proposal("The user lives in Denver, Colorado."),
     [similar(0, "The user lives in Denver.", 0.91)], "UPDATE", 0,
     "adds detail to memory 0 (similarity 0.91)"),
    (proposal("Caroline went to a support group (on 7 May 2023).", type="event",
              observed_at=datetime(2023, 5, 7, tzinfo=UTC)),
     [similar(0, "Caroline went to a support group.", 0.9, type="event")], "UPDATE", 0,
     "adds detail to memory 0 (similarity 0.90)"),
    (proposal("The user lives in Denver."),
     [similar(0, "The user lives in Denver with two cats.", 0.9)], "NOOP_DUPLICATE", 0,
     "memory 0 (similarity 0.90) already says this"),
    (proposal("The user loves hiking.", type="preference"),
     [similar(0, "The user loves hiking in the Alps.", 0.85, type="fact")], "ADD", None,
     "memory 0 is related (similarity 0.85) but a fact, not a preference"),
    (proposal("The user eats meat.", type="preference", observed_at=MAY_1),
     [similar(0, "The user no longer eats meat.", 0.86, type="preference",
              observed_at=MAY_8)], "ADD", None,
     "contradicts memory 0 (similarity 0.86) (it is no longer negated) but was observed "
     "before it, so it does not replace it"),
])
async def test_rule_decider(new: Proposal, old: list[Similar], action: str,
                            target: int | None, reason: str) -> None:
    decision = await DECIDER.decide(new, old)
    assert (decision.action, decision.target, decision.reason) == (action, target, reason)
    assert decision.content == new.content


async def test_rule_decider_loves_two_things() -> None:
    # "loves" is not one-valued: liking hiking does not undo liking painting.
    decision = await DECIDER.decide(
        proposal("Caroline loves hiking.", type="preference"),
        [similar(0, "Caroline loves painting.", 0.8, type="preference")])
    assert decision.action == "ADD"


# ----------------------------------------------------------------------------- a model server


@dataclass
class Reply:
    status: int = 200
    answer: Any = None  # the model's JSON (or text), wrapped in the wire format of the path
    headers: dict[str, str] = field(default_factory=dict)
    times: int | None = 1  # None: forever


class ModelServer:
    """Answers each request with the next scripted reply, in the wire format of its path."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replies: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.url = ""

    def reset(self) -> None:
        with self.lock:
            self.replies.clear()
            self.requests.clear()

    def script(self, *replies: Reply) -> None:
        with self.lock:
            self.replies.extend(replies)

    def take(self, seen: Seen) -> Reply:
        with self.lock:
            self.requests.append(seen)
            if not self.replies:
                return Reply(answer={"memories": []})
            reply = self.replies[0]
            if reply.times is not None:
                reply.times -= 1
                if reply.times <= 0:
                    self.replies.popleft()
            return reply


def _wrap(path: str, body: dict[str, Any], answer: Any) -> dict[str, Any]:
    text = answer if isinstance(answer, str) else json.dumps(answer)
    if path == "/v1/messages":
        blocks: list[dict[str, Any]] = [{"type": "text", "text": "Here is the answer."}]
        if not isinstance(answer, str):
            blocks.append({"type": "tool_use", "id": "toolu_1",
                           "name": body["tool_choice"]["name"], "input": answer})
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": blocks, "stop_reason": "tool_use",
                "usage": {"input_tokens": 10, "output_tokens": 10}}
    if path == "/api/chat":
        return {"model": body["model"], "created_at": "2024-01-01T00:00:00Z",
                "message": {"role": "assistant", "content": text}, "done": True}
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}]}


def build_app(state: ModelServer) -> FastAPI:
    app = FastAPI()

    async def serve(request: Request) -> Response:
        body = await request.json()
        path = request.url.path
        reply = state.take(Seen(path, dict(request.headers), body, time.monotonic()))
        if reply.status != 200:
            return JSONResponse({"error": {"message": "scripted failure"}},
                                status_code=reply.status, headers=reply.headers)
        return JSONResponse(_wrap(path, body, reply.answer))

    for path in ("/v1/chat/completions", "/v1/messages", "/api/chat"):
        app.add_api_route(path, serve, methods=["POST"])
    return app


@pytest.fixture(scope="module")
def model_server() -> Iterator[ModelServer]:
    """The scripted model server, served for the tests of this module."""
    state = ModelServer()
    with serve_in_thread(build_app(state), what="model server") as url:
        state.url = url
        yield state


@pytest.fixture
def model(model_server: ModelServer) -> ModelServer:
    model_server.reset()
    return model_server


BASE_PATHS = {"openai": "/v1", "anthropic": "", "ollama": ""}
CHATS: dict[str, type[JSONChat]] = {
    "openai": OpenAIJSONChat, "anthropic": AnthropicJSONChat, "ollama": OllamaJSONChat,
}


@pytest.fixture
async def chat(model: ModelServer) -> AsyncIterator[Callable[..., JSONChat]]:
    """Builds a provider's chat client against the local server; closes it after the test."""
    made: list[JSONChat] = []

    def build(provider: str = "openai", **overrides: Any) -> JSONChat:
        values: dict[str, Any] = {
            "extraction_provider": provider,
            "extraction_model": f"{provider}-model-x",
            "extraction_base_url": model.url + BASE_PATHS[provider],
            "extraction_api_key": KEY,
            "provider_timeout_s": 5,
            "provider_rate_per_s": 1000,
            "provider_retries": 3,
            "provider_retry_max_wait_s": 0.05,
        }
        values.update(overrides)
        made.append(CHATS[provider](Settings(**values)))
        return made[-1]

    yield build
    for client in made:
        await client.client.aclose()


CONVERSATION = (
    turn("I went to a support group yesterday.", name="Caroline", event="e1"),
    turn("(tool output that is not shown)", role="tool", event="e2"),
    turn("That's brave! I love painting.", role="assistant", name="Melanie", event="e3",
         at=REF + timedelta(minutes=1)),
)


def memory(content: str, turns: list[Any], **fields: Any) -> dict[str, Any]:
    return {"type": "event", "content": content, "confidence": 0.9, "observed_at": None,
            "source_turns": turns, **fields}


def sent_prompt(seen: Seen) -> str:
    messages = seen.body["messages"]
    return messages[-1]["content"]


# ----------------------------------------------------------------------------- LLM extractor


@pytest.mark.parametrize("provider", ["openai", "anthropic", "ollama"])
async def test_llm_extractor_wire_format(provider: str, model: ModelServer,
                                         chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(answer={"memories": [
        memory("Caroline went to a support group on 7 May 2023.", [1],
               observed_at="2023-05-07"),
        memory("Melanie loves painting.", [2], type="preference", confidence=0.8),
    ]}))
    extractor = LLMExtractor(chat(provider))
    got = await extractor.extract(CONVERSATION, types=TYPES)

    assert extractor.name == f"{provider}:{provider}-model-x"
    assert got == [
        Proposal(type="event", content="Caroline went to a support group on 7 May 2023.",
                 confidence=0.9, observed_at=datetime(2023, 5, 7, tzinfo=UTC),
                 source_events=(("s1", "e1"),)),
        Proposal(type="preference", content="Melanie loves painting.", confidence=0.8,
                 observed_at=None, source_events=(("s1", "e3"),)),
    ]
    (seen,) = model.requests
    body = seen.body
    assert body["model"] == f"{provider}-model-x"
    prompt = sent_prompt(seen)
    assert "[1] Mon 2023-05-08 13:56 +0000, Caroline (user): I went to a support group " \
           "yesterday." in prompt
    assert "[2] Mon 2023-05-08 13:57 +0000, Melanie (assistant): That's brave!" in prompt
    assert "tool output" not in prompt and "[3]" not in prompt
    if provider == "openai":
        assert seen.path == "/v1/chat/completions"
        assert seen.headers["authorization"] == f"Bearer {KEY}"
        response_format = body["response_format"]
        assert response_format["type"] == "json_schema"
        assert response_format["json_schema"]["strict"] is True
        schema = response_format["json_schema"]["schema"]
        assert body["messages"][0]["role"] == "system"
    elif provider == "anthropic":
        assert seen.path == "/v1/messages"
        assert seen.headers["x-api-key"] == KEY
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in seen.headers
        (tool,) = body["tools"]
        assert body["tool_choice"] == {"type": "tool", "name": tool["name"]}
        assert body["system"]
        schema = tool["input_schema"]
    else:
        assert seen.path == "/api/chat"
        assert body["stream"] is False
        schema = body["format"]
    item = schema["properties"]["memories"]["items"]
    assert item["properties"]["type"]["enum"] == list(TYPES)
    assert set(item["required"]) == {"type", "content", "confidence", "observed_at",
                                     "source_turns"}


async def test_llm_extractor_trusts_no_number_it_did_not_show(
        model: ModelServer, chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(answer={"memories": [
        memory("Invented turns only.", [0, 3, 99, -1, "7"]),
        memory("Mixed turns.", [99, 2, 2, "1", True], confidence=7, observed_at="whenever"),
        memory("No turns.", []),
        memory("A type the tenant has not.", [1], type="secret"),
        memory("   ", [1]),
        "not an object",
        memory("Bad confidence.", [1], confidence="high", observed_at="7 May 2023"),
    ]}))
    got = await LLMExtractor(chat()).extract(CONVERSATION, types=TYPES)
    assert [(p.content, p.source_events, p.confidence, p.observed_at) for p in got] == [
        ("Mixed turns.", (("s1", "e3"), ("s1", "e1")), 1.0, None),
        ("Bad confidence.", (("s1", "e1"),), 0.5, datetime(2023, 5, 7, tzinfo=UTC)),
    ]


@pytest.mark.parametrize(("provider", "answer"), [
    ("openai", "Sure! Here are the memories: Caroline went to a group."),
    ("openai", '{"memories": [{"type": "event", "content": "cut sh'),
    ("openai", '["a list", "not an object"]'),
    ("openai", {"memorys": []}),
    ("anthropic", "I would rather answer in prose."),  # no tool_use block at all
    ("anthropic", {"memories": "none"}),
    ("ollama", "not json at all"),
])
async def test_a_malformed_answer_is_an_error_not_an_empty_list(
        provider: str, answer: Any, model: ModelServer, chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(answer=answer))
    with pytest.raises(MalformedAnswer) as caught:
        await LLMExtractor(chat(provider)).extract(CONVERSATION, types=TYPES)
    assert isinstance(caught.value, TransientError)  # the job backs off and asks again
    assert len(model.requests) == 1  # the HTTP call itself succeeded: not retried in place


async def test_rate_limited_with_retry_after_then_answers(
        model: ModelServer, chat: Callable[..., JSONChat]) -> None:
    model.script(
        Reply(status=429, headers={"retry-after": "0.3"}),
        Reply(answer={"memories": [memory("Caroline went to a group.", [1])]}),
    )
    got = await LLMExtractor(chat(provider_retry_max_wait_s=2)).extract(CONVERSATION,
                                                                        types=TYPES)
    assert contents(got) == ["Caroline went to a group."]
    first, second = model.requests
    assert second.at - first.at >= 0.3  # the server's wait, not the short fallback


@pytest.mark.parametrize("provider", ["openai", "anthropic", "ollama"])
async def test_a_failing_provider_propagates(provider: str, model: ModelServer,
                                             chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(status=500, times=None))
    with pytest.raises(TransientError, match="still failing after 3 tries"):
        await LLMExtractor(chat(provider)).extract(CONVERSATION, types=TYPES)
    assert len(model.requests) == 3


async def test_a_bad_key_is_permanent_and_names_the_setting(
        model: ModelServer, chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(status=401))
    with pytest.raises(PermanentError, match="MEMMILL_EXTRACTION_API_KEY") as caught:
        await LLMExtractor(chat()).extract(CONVERSATION, types=TYPES)
    assert KEY not in str(caught.value)
    assert len(model.requests) == 1


async def test_nothing_to_read_makes_no_call(model: ModelServer,
                                             chat: Callable[..., JSONChat]) -> None:
    extractor = LLMExtractor(chat())
    assert await extractor.extract([turn("tool says hi", role="tool")], types=TYPES) == []
    assert await extractor.extract(CONVERSATION, types=()) == []
    assert model.requests == []


async def test_a_long_session_is_sent_in_windows(model: ModelServer,
                                                 chat: Callable[..., JSONChat]) -> None:
    long_turns = [turn(f"Turn {i}. " + "words " * 700, event=f"e{i}") for i in range(12)]
    model.script(*(Reply(answer={"memories": [memory("From the first turn shown.", [1])]})
                   for _ in range(12)))
    got = await LLMExtractor(chat()).extract(long_turns, types=TYPES)
    assert 1 < len(model.requests) < 12
    prompts = [sent_prompt(seen) for seen in model.requests]
    assert all(len(p) < 30_000 for p in prompts)
    # Each window is numbered from 1, and its [1] is its own first turn.
    firsts = [int(p.split("[1] ")[1].split(": Turn ")[1].split(".")[0]) for p in prompts]
    assert [p.source_events for p in got] == [(("s1", f"e{i}"),) for i in firsts]


# ----------------------------------------------------------------------------- LLM decider

PROPOSAL = proposal("The user lives in Denver, Colorado.", observed_at=MAY_8)
SHOWN = [similar(0, "The user lives in Denver.", 0.91, observed_at=MAY_1),
         similar(1, "The user likes jazz.", 0.52)]


@pytest.mark.parametrize("provider", ["openai", "anthropic", "ollama"])
async def test_llm_decider_wire_format(provider: str, model: ModelServer,
                                       chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(answer={"action": "UPDATE", "target": 0, "reason": "Adds the state.",
                               "content": "The user lives in Denver, Colorado, USA."}))
    decision = await LLMDecider(chat(provider)).decide(PROPOSAL, SHOWN)
    assert (decision.action, decision.target, decision.reason, decision.content) == (
        "UPDATE", 0, "Adds the state.", "The user lives in Denver, Colorado, USA.")
    (seen,) = model.requests
    prompt = sent_prompt(seen)
    assert "(fact, 2023-05-08) The user lives in Denver, Colorado." in prompt
    assert "[0] (fact, 2023-05-01, similarity 0.91) The user lives in Denver." in prompt
    assert "[1] (fact, unknown date, similarity 0.52) The user likes jazz." in prompt
    schema = {
        "openai": lambda b: b["response_format"]["json_schema"]["schema"],
        "anthropic": lambda b: b["tools"][0]["input_schema"],
        "ollama": lambda b: b["format"],
    }[provider](seen.body)
    assert schema["properties"]["action"]["enum"] == list(ACTIONS)


@pytest.mark.parametrize(("answer", "action", "target", "reason", "content"), [
    ({"action": "SUPERSEDE", "target": 7, "reason": "x", "content": "y"}, "ADD", None,
     "the model chose SUPERSEDE on memory 7, which was not one of those shown: added instead",
     PROPOSAL.content),
    ({"action": "UPDATE", "target": None, "reason": "x", "content": "merged"}, "ADD", None,
     "the model chose UPDATE without a target: added instead", PROPOSAL.content),
    ({"action": "NOOP_DUPLICATE", "target": "zero", "reason": "x", "content": ""}, "ADD",
     None, "the model chose NOOP_DUPLICATE on memory 'zero', which was not one of those "
     "shown: added instead", PROPOSAL.content),
    ({"action": "ADD", "target": 0, "reason": "New.", "content": "rewritten"}, "ADD", None,
     "New.", PROPOSAL.content),
    ({"action": "SUPERSEDE", "target": 1, "reason": "", "content": "rewritten"}, "SUPERSEDE",
     1, "the model chose SUPERSEDE", PROPOSAL.content),
    ({"action": "UPDATE", "target": 0.0, "reason": "More.", "content": "  "}, "UPDATE", 0,
     "More.", PROPOSAL.content),
])
async def test_llm_decider_trusts_no_index_it_did_not_show(
        answer: dict[str, Any], action: str, target: int | None, reason: str, content: str,
        model: ModelServer, chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(answer=answer))
    decision = await LLMDecider(chat()).decide(PROPOSAL, SHOWN)
    assert (decision.action, decision.target, decision.reason, decision.content) == (
        action, target, reason, content)


@pytest.mark.parametrize("answer", [
    {"action": "MERGE", "target": 0, "reason": "x", "content": "y"},
    "UPDATE 0",
])
async def test_llm_decider_malformed_answer(answer: Any, model: ModelServer,
                                            chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(answer=answer))
    with pytest.raises(MalformedAnswer):
        await LLMDecider(chat()).decide(PROPOSAL, SHOWN)


async def test_llm_decider_without_similar_memories_makes_no_call(
        model: ModelServer, chat: Callable[..., JSONChat]) -> None:
    decision = await LLMDecider(chat()).decide(PROPOSAL, [])
    assert (decision.action, decision.target) == ("ADD", None)
    assert model.requests == []


async def test_llm_decider_failure_propagates(model: ModelServer,
                                              chat: Callable[..., JSONChat]) -> None:
    model.script(Reply(status=503, times=None))
    with pytest.raises(TransientError):
        await LLMDecider(chat("anthropic")).decide(PROPOSAL, SHOWN)
    assert len(model.requests) == 3


# ----------------------------------------------------------------------------- factory


def test_factory_rules_by_default() -> None:
    settings = Settings(dedup_similarity=0.9, related_similarity=0.7)
    assert isinstance(get_extractor(settings), RuleExtractor)
    decider = get_decider(settings)
    assert isinstance(decider, RuleDecider)
    assert (decider.dedup_similarity, decider.related_similarity) == (0.9, 0.7)
    assert get_extractor(settings).name == decider.name == "rules"


@pytest.mark.parametrize("provider", ["openai", "anthropic", "ollama"])
async def test_factory_model_providers_share_one_client(provider: str) -> None:
    settings = Settings(extraction_provider=provider, extraction_model="m",
                        extraction_base_url="http://127.0.0.1:9")
    extractor, decider = get_extractor(settings), get_decider(settings)
    assert isinstance(extractor, LLMExtractor) and isinstance(decider, LLMDecider)
    assert extractor.chat is decider.chat is get_chat(settings)
    assert isinstance(extractor.chat, CHATS[provider])
    assert extractor.name == f"{provider}:m"


def test_factory_needs_a_model() -> None:
    with pytest.raises(PermanentError, match="MEMMILL_EXTRACTION_MODEL"):
        get_extractor(Settings(extraction_provider="openai", extraction_model=" "))
