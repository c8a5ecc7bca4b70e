"""Extraction and decisions by a chat model over HTTP (OpenAI-compatible, Anthropic, Ollama),
chosen by MEMMILL_EXTRACTION_PROVIDER, on the same client, limits and retries as the summary
providers (pipeline/providers/http.py).

Each call asks for JSON that fits a schema, in the provider's own way: OpenAI's
`response_format` json_schema (strict), Ollama's `format`, Anthropic's forced tool call.
What comes back is still checked, because a schema is a request and not a guarantee, and
because a model must never name what it was not shown: it sees turns by number and memories by
index, and any number it invents is dropped.

Failures are not hidden: a provider failure propagates (the job retries, then dead-letters),
and an answer that is not the JSON asked for is a MalformedAnswer, which is transient, so the
job asks again later; it never becomes "no memories", which would advance the session's
watermark past turns nobody read.
"""

from __future__ import annotations

import json
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pipeline.errors import PermanentError, TransientError
from pipeline.memory.extraction.dates import parse_date
from pipeline.memory.extraction.model import ACTIONS, Decision, Proposal, Similar, Turn
from pipeline.providers.chat import clip
from pipeline.providers.http import SettingNames
from pipeline.providers.wire import (
    AnthropicWire,
    OllamaChatWire,
    OpenAIChatWire,
    Wire,
    system_and_user,
)
from pipeline.settings import Settings

log = logging.getLogger(__name__)

NAMES = SettingNames(
    api_key="MEMMILL_EXTRACTION_API_KEY",
    base_url="MEMMILL_EXTRACTION_BASE_URL",
    model="MEMMILL_EXTRACTION_MODEL",
)
SPOKEN_ROLES = ("user", "assistant")  # tool output and system prompts are not what people said
MAX_TURN_CHARS = 4_000
# Turns are sent in windows of about this many characters, one call each: a long session in
# one prompt would pass the model's context window and be refused or silently cut.
MAX_WINDOW_CHARS = 24_000
MAX_CONTENT_CHARS = 500
EXTRACT_MAX_TOKENS = 4_096
DECIDE_MAX_TOKENS = 1_024
DEFAULT_CONFIDENCE = 0.5


class MalformedAnswer(TransientError):
    """The model's answer is not the JSON that was asked for; the job asks again later."""


# ----------------------------------------------------------------------------- wire formats


class JSONChat(Wire, ABC):
    """One provider's way to ask a chat model for a JSON object that fits a schema."""

    def __init__(self, settings: Settings) -> None:
        if not settings.extraction_model.strip():
            raise PermanentError(
                f"the {self.provider} extraction provider needs a model: "
                f"set {NAMES.model}"
            )
        self.model = settings.extraction_model.strip()
        self.name = f"{self.provider}:{self.model}"
        self._connect(settings, base_url=settings.extraction_base_url,
                      api_key=settings.extraction_api_key, names=NAMES)

    async def ask(self, *, system: str, prompt: str, name: str, schema: dict[str, Any],
                  max_tokens: int) -> dict[str, Any]:
        """The model's JSON object. Raises what the client raises, or MalformedAnswer."""
        body = self._body(system=system, prompt=prompt, name=name, schema=schema,
                          max_tokens=max_tokens)
        data = await self.client.post_json(self.path, body, self._headers())
        return self._answer(data, name)

    @abstractmethod
    def _body(self, *, system: str, prompt: str, name: str, schema: dict[str, Any],
              max_tokens: int) -> dict[str, Any]:
        """The provider's request body."""

    @abstractmethod
    def _answer(self, data: dict[str, Any], name: str) -> dict[str, Any]:
        """The JSON object out of the provider's answer."""

    def _parse(self, text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            raise MalformedAnswer(
                f"{self.label} ({self.model}) answered text that is not JSON: "
                f"{clip(' '.join(str(text).split()), 200)!r}"
            ) from None
        if not isinstance(value, dict):
            raise MalformedAnswer(
                f"{self.label} ({self.model}) answered a JSON {type(value).__name__}, "
                "not an object"
            )
        return value


class OpenAIJSONChat(OpenAIChatWire, JSONChat):
    """POST {base_url}/chat/completions with a strict json_schema response format."""

    def _body(self, *, system: str, prompt: str, name: str, schema: dict[str, Any],
              max_tokens: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": system_and_user(system, prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            },
        }

    def _answer(self, data: dict[str, Any], name: str) -> dict[str, Any]:
        return self._parse(self._message_content(data))


class AnthropicJSONChat(AnthropicWire, JSONChat):
    """POST {base_url}/v1/messages with one tool whose input is the answer, and that tool
    forced: Anthropic's way to a schema-shaped answer."""

    def _body(self, *, system: str, prompt: str, name: str, schema: dict[str, Any],
              max_tokens: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "max_tokens": max_tokens,
            "system": system,
            "messages": [{"role": "user", "content": prompt}],
            "tools": [{"name": name, "description": "Record the answer.",
                       "input_schema": schema}],
            "tool_choice": {"type": "tool", "name": name},
        }

    def _answer(self, data: dict[str, Any], name: str) -> dict[str, Any]:
        for block in self._content_blocks(data):
            if (isinstance(block, dict) and block.get("type") == "tool_use"
                    and block.get("name") == name):
                value = block.get("input")
                if isinstance(value, str):  # some compatible servers send the JSON as text
                    return self._parse(value)
                if isinstance(value, dict):
                    return value
        raise MalformedAnswer(
            f"{self.label} ({self.model}) did not call the {name} tool "
            f"(stop_reason {data.get('stop_reason')!r})"
        )


class OllamaJSONChat(OllamaChatWire, JSONChat):
    """POST {base_url}/api/chat without streaming, with the schema as `format`."""

    def _body(self, *, system: str, prompt: str, name: str, schema: dict[str, Any],
              max_tokens: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": system_and_user(system, prompt),
            "stream": False,
            "format": schema,
            "options": {"temperature": 0, "num_predict": max_tokens},
        }

    def _answer(self, data: dict[str, Any], name: str) -> dict[str, Any]:
        return self._parse(self._message_content(data))


JSON_CHATS: dict[str, type[JSONChat]] = {
    "openai": OpenAIJSONChat,
    "anthropic": AnthropicJSONChat,
    "ollama": OllamaJSONChat,
}


# ----------------------------------------------------------------------------- extraction

EXTRACT_SYSTEM = (
    "You read conversations and write down what an AI agent should remember about the people "
    "in them for later conversations: lasting facts, preferences, plans, decisions and dated "
    "events. Use only what the turns say. Answer with JSON only."
)
EXTRACT_TOOL = "record_memories"


def extract_schema(types: Sequence[str]) -> dict[str, Any]:
    """Strict-mode compatible: every property required, no other properties allowed."""
    memory = {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": list(types)},
            "content": {"type": "string"},
            "confidence": {"type": "number"},
            "observed_at": {"type": ["string", "null"]},
            "source_turns": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["type", "content", "confidence", "observed_at", "source_turns"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"memories": {"type": "array", "items": memory}},
        "required": ["memories"],
        "additionalProperties": False,
    }


def _speaker(turn: Turn) -> str:
    name = (turn.sender_name or "").strip()
    return f"{name} ({turn.role})" if name else turn.role


def format_turn(number: int, turn: Turn) -> str:
    when = turn.created_at if turn.created_at.tzinfo else turn.created_at.replace(tzinfo=UTC)
    text = clip(turn.content, MAX_TURN_CHARS)
    return f"[{number}] {when:%a %Y-%m-%d %H:%M %z}, {_speaker(turn)}: {text}"


def extract_prompt(lines: Sequence[str], types: Sequence[str]) -> str:
    return "\n".join([
        "Write down what is worth remembering from the conversation turns below.",
        "",
        f"Memory types you may use: {', '.join(types)}.",
        "- One memory per lasting fact, preference, plan, decision or event. Skip greetings, "
        "small talk, questions and anything true only for the moment.",
        "- Each memory is one standalone sentence in the third person that names the person "
        "(by the speaker name shown; 'the user' when there is none).",
        "- Resolve relative dates ('yesterday', 'last week', 'on Monday') against the date of "
        "the turn that says them. Put the date in the sentence and in observed_at as "
        "YYYY-MM-DD; observed_at is null when no date is known.",
        "- confidence: from 0 to 1, how sure you are that the memory is true and lasting.",
        "- source_turns: the numbers of the turns the memory comes from.",
        '- If nothing is worth remembering, answer {"memories": []}.',
        "",
        "<turns>",
        *lines,
        "</turns>",
    ])


def _windows(turns: Sequence[Turn]) -> list[list[Turn]]:
    windows: list[list[Turn]] = []
    size = 0
    for turn in turns:
        length = min(len(turn.content), MAX_TURN_CHARS) + 80
        if not windows or size + length > MAX_WINDOW_CHARS:
            windows.append([])
            size = 0
        windows[-1].append(turn)
        size += length
    return windows


class LLMExtractor:
    """Memories proposed by a chat model; the turn numbers it cites are checked."""

    def __init__(self, chat: JSONChat) -> None:
        self.chat = chat
        self.name = chat.name

    async def extract(self, turns: Sequence[Turn], *, types: Sequence[str]) -> list[Proposal]:
        spoken = [t for t in turns if t.role in SPOKEN_ROLES and t.content.strip()]
        if not spoken or not types:
            return []
        proposals: list[Proposal] = []
        for window in _windows(spoken):
            shown = {number: turn for number, turn in enumerate(window, start=1)}
            prompt = extract_prompt([format_turn(n, t) for n, t in shown.items()], types)
            answer = await self.chat.ask(system=EXTRACT_SYSTEM, prompt=prompt,
                                         name=EXTRACT_TOOL, schema=extract_schema(types),
                                         max_tokens=EXTRACT_MAX_TOKENS)
            proposals += read_memories(answer, shown, types, where=self.name)
        return proposals


def read_memories(answer: dict[str, Any], shown: dict[int, Turn], types: Sequence[str], *,
                  where: str = "the model") -> list[Proposal]:
    """The proposals of an answer. A memory of a type the tenant does not have, without text,
    or citing no turn that was shown, is dropped; so is every turn number not shown."""
    memories = answer.get("memories")
    if not isinstance(memories, list):
        raise MalformedAnswer(f"{where} answered without a memories list")
    proposals: list[Proposal] = []
    dropped = 0
    for item in memories:
        proposal = _proposal(item, shown, types) if isinstance(item, dict) else None
        if proposal is None:
            dropped += 1
        else:
            proposals.append(proposal)
    if dropped:
        log.info("%s: dropped %d of %d proposed memories (unknown type, no text or no "
                 "turn that was shown)", where, dropped, len(memories))
    return proposals


def _proposal(item: dict[str, Any], shown: dict[int, Turn],
              types: Sequence[str]) -> Proposal | None:
    content = item.get("content")
    if item.get("type") not in types or not isinstance(content, str) or not content.strip():
        return None
    sources: list[tuple[str, str]] = []
    numbers = item.get("source_turns")
    for number in numbers if isinstance(numbers, list) else ():
        n = _as_int(number)
        turn = shown.get(n) if n is not None else None
        if turn is not None and (turn.session_id, turn.event_id) not in sources:
            sources.append((turn.session_id, turn.event_id))
    if not sources:
        return None
    observed = item.get("observed_at")
    return Proposal(
        type=item["type"],
        content=clip(" ".join(content.split()), MAX_CONTENT_CHARS),
        confidence=_confidence(item.get("confidence")),
        observed_at=parse_date(observed) if isinstance(observed, str) else None,
        source_events=tuple(sources),
    )


def _as_int(value: Any) -> int | None:
    """An integer as a model may write it (3, 3.0, "3"); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _confidence(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return DEFAULT_CONFIDENCE
    return min(1.0, max(0.0, float(value)))


# ----------------------------------------------------------------------------- decisions

DECIDE_SYSTEM = (
    "You keep an AI agent's memory consistent. Given a newly proposed memory and the existing "
    "memories most like it, you decide what the new one does. Answer with JSON only."
)
DECIDE_TOOL = "record_decision"
DECIDE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(ACTIONS)},
        "target": {"type": ["integer", "null"]},
        "reason": {"type": "string"},
        "content": {"type": "string"},
    },
    "required": ["action", "target", "reason", "content"],
    "additionalProperties": False,
}


def _day(value: datetime | None) -> str:
    return value.date().isoformat() if value is not None else "unknown date"


def decide_prompt(proposal: Proposal, similar: Sequence[Similar]) -> str:
    existing = [
        f"[{s.index}] ({s.type}, {_day(s.observed_at)}, similarity {s.similarity:.2f}) "
        f"{s.content}"
        for s in similar
    ]
    return "\n".join([
        "Decide what the proposed memory does to the existing memories.",
        "",
        "- ADD: it is new information. target is null.",
        "- UPDATE: it adds detail to the existing memory `target` without contradicting it. "
        "content is the merged memory: one sentence keeping everything true in both.",
        "- SUPERSEDE: the existing memory `target` is no longer true (changed, contradicted, "
        "rescheduled); the proposed memory replaces it.",
        "- NOOP_DUPLICATE: the existing memory `target` already says this; nothing is stored.",
        "target is the number in brackets of an existing memory. reason is one short sentence. "
        "content is the text to store (the proposed memory unless you merge for UPDATE).",
        "",
        "<proposed_memory>",
        f"({proposal.type}, {_day(proposal.observed_at)}) {proposal.content}",
        "</proposed_memory>",
        "<existing_memories>",
        *existing,
        "</existing_memories>",
    ])


class LLMDecider:
    """Decisions by a chat model; a target it was not shown turns the decision into ADD."""

    def __init__(self, chat: JSONChat) -> None:
        self.chat = chat
        self.name = chat.name

    async def decide(self, proposal: Proposal, similar: Sequence[Similar]) -> Decision:
        if not similar:  # nothing to compare with: no call needed
            return Decision(action="ADD", target=None, reason="no similar memory",
                            content=proposal.content)
        answer = await self.chat.ask(system=DECIDE_SYSTEM,
                                     prompt=decide_prompt(proposal, similar),
                                     name=DECIDE_TOOL, schema=DECIDE_SCHEMA,
                                     max_tokens=DECIDE_MAX_TOKENS)
        return read_decision(answer, proposal, similar, where=self.name)


def read_decision(answer: dict[str, Any], proposal: Proposal, similar: Sequence[Similar], *,
                  where: str = "the model") -> Decision:
    action = answer.get("action")
    if action not in ACTIONS:
        raise MalformedAnswer(f"{where} answered an unknown action {action!r}")
    reason = answer.get("reason")
    reason = " ".join(reason.split()) if isinstance(reason, str) and reason.strip() else (
        f"the model chose {action}")
    if action == "ADD":
        return Decision(action="ADD", target=None, reason=reason, content=proposal.content)
    raw = answer.get("target")
    target = _as_int(raw)
    if target is None or target not in {s.index for s in similar}:
        why = ("without a target" if raw is None
               else f"on memory {raw!r}, which was not one of those shown")
        return Decision(action="ADD", target=None,
                        reason=f"the model chose {action} {why}: added instead",
                        content=proposal.content)
    content = proposal.content
    merged = answer.get("content")
    if action == "UPDATE" and isinstance(merged, str) and merged.strip():
        content = clip(" ".join(merged.split()), MAX_CONTENT_CHARS)
    return Decision(action=action, target=target, reason=reason, content=content)
