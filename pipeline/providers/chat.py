"""Summary providers: the local extractive summarizer, or a chat model over HTTP
(OpenAI-compatible, Anthropic, Ollama), chosen by MEMMILL_SUMMARY_PROVIDER."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

from pipeline.errors import PermanentError
from pipeline.providers.http import SettingNames, secret_value
from pipeline.providers.wire import (
    AnthropicWire,
    OllamaChatWire,
    OpenAIChatWire,
    Wire,
    client_key,
    system_and_user,
)
from pipeline.settings import Settings
from pipeline.stages import summarize as extractive

# A document longer than this is cut before it is sent: its opening says what it is about,
# and a prompt past the model's context window would be refused (or silently truncated).
MAX_DOCUMENT_CHARS = 48_000
# Related items' summaries are background: at most this many summary lengths of them in all.
CONTEXT_BUDGET_SUMMARIES = 4

SYSTEM_PROMPT = (
    "You write summaries of documents for a search index that people and AI agents read. "
    "Write plain prose without preamble, headings or lists: say what the document is and "
    "give its key facts, names and numbers. Use only what the document says. "
    "Never go over the character limit you are given."
)

NAMES = SettingNames(
    api_key="MEMMILL_SUMMARY_API_KEY",
    base_url="MEMMILL_SUMMARY_BASE_URL",
    model="MEMMILL_SUMMARY_MODEL",
)


class Summarizer(Protocol):
    name: str

    async def summarize(self, text: str, *, context: Sequence[str] = ()) -> str: ...


def clip(text: str, max_chars: int) -> str:
    """Stripped, and at most max_chars long, cut at a word boundary (with an ellipsis)."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    if not text[max_chars - 1].isspace():  # the cut fell inside a word: drop that word
        space = max(cut.rfind(" "), cut.rfind("\n"), cut.rfind("\t"))
        if space >= max_chars // 2:
            cut = cut[:space]
    return cut.rstrip().rstrip(",;:-–—").rstrip() + "…"


def build_prompt(text: str, context: Sequence[str], *, max_chars: int) -> str:
    """The user message: the instruction, the related items as separate background, and the
    document, each clearly delimited."""
    text = text.strip()
    if len(text) > MAX_DOCUMENT_CHARS:
        text = clip(text, MAX_DOCUMENT_CHARS) + "\n[the rest of the document is left out]"
    lines = [
        f"Summarize the document below in at most {max_chars} characters. "
        "Answer with the summary only."
    ]
    budget = CONTEXT_BUDGET_SUMMARIES * max_chars
    background: list[str] = []
    for item in context:
        item = clip(item, max_chars)
        if not item:
            continue
        if len(item) + 3 > budget:
            break
        background.append(f"- {item}")
        budget -= len(item) + 3
    if background:
        lines += [
            "",
            "Background: summaries of related items, for context only. Do not summarize "
            "them and do not repeat them; use them only to understand the document.",
            "<related_items>",
            *background,
            "</related_items>",
        ]
    lines += ["", "<document>", text, "</document>"]
    return "\n".join(lines)


class ExtractiveSummarizer:
    """The local summarizer: no network, no model; it has no use for context."""

    name = "extractive"
    model = "extractive"

    def __init__(self, *, max_chars: int) -> None:
        self.max_chars = max_chars

    async def summarize(self, text: str, *, context: Sequence[str] = ()) -> str:
        return extractive.summarize(text, max_chars=self.max_chars)


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """The system and user turns, as OpenAI-compatible servers and Ollama both take them."""
    return system_and_user(SYSTEM_PROMPT, prompt)


class _ChatSummarizer(Wire, ABC):
    """A chat model over HTTP: builds the prompt, sends it, clips what comes back."""

    def __init__(self, settings: Settings) -> None:
        if not settings.summary_model.strip():
            raise PermanentError(
                f"the {self.provider} summary provider needs a model: set MEMMILL_SUMMARY_MODEL"
            )
        self.model = settings.summary_model.strip()
        self.name = f"{self.provider}:{self.model}"
        self.max_chars = settings.summary_max_chars
        # A token is three to four characters; leave room so the model ends its sentence.
        self.max_tokens = settings.summary_max_chars // 2 + 64
        self._connect(settings, base_url=settings.summary_base_url,
                      api_key=settings.summary_api_key, names=NAMES)

    async def summarize(self, text: str, *, context: Sequence[str] = ()) -> str:
        if not text.strip():
            return ""
        prompt = build_prompt(text, context, max_chars=self.max_chars)
        data = await self.client.post_json(self.path, self._body(prompt), self._headers())
        summary = clip(self._read(data), self.max_chars)
        if not summary:
            raise self.client.shape_error(self.path, "an empty summary")
        return summary

    @abstractmethod
    def _body(self, prompt: str) -> dict[str, Any]:
        """The provider's request body for this prompt."""

    @abstractmethod
    def _read(self, data: dict[str, Any]) -> str:
        """The summary text out of the provider's answer."""


class OpenAIChatSummarizer(OpenAIChatWire, _ChatSummarizer):
    """POST {base_url}/chat/completions: OpenAI or any compatible server (vLLM, LM Studio,
    llama.cpp, OpenRouter...)."""

    def _body(self, prompt: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": chat_messages(prompt),
            "max_tokens": self.max_tokens,
            "temperature": 0,
        }

    def _read(self, data: dict[str, Any]) -> str:
        return self._message_content(data)


class AnthropicSummarizer(AnthropicWire, _ChatSummarizer):
    """POST {base_url}/v1/messages, Anthropic's Messages API."""

    def _body(self, prompt: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": SYSTEM_PROMPT,
            "messages": [{"role": "user", "content": prompt}],
        }

    def _read(self, data: dict[str, Any]) -> str:
        texts = [
            b["text"]
            for b in self._content_blocks(data)
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        ]
        if not texts:
            raise self.client.shape_error(self.path, "no text block in content")
        return "".join(texts)


class OllamaSummarizer(OllamaChatWire, _ChatSummarizer):
    """POST {base_url}/api/chat on an Ollama server, without streaming."""

    def _body(self, prompt: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": chat_messages(prompt),
            "stream": False,
            "options": {"temperature": 0, "num_predict": self.max_tokens},
        }

    def _read(self, data: dict[str, Any]) -> str:
        return self._message_content(data)


_PROVIDERS: dict[str, type[_ChatSummarizer]] = {
    "openai": OpenAIChatSummarizer,
    "anthropic": AnthropicSummarizer,
    "ollama": OllamaSummarizer,
}
_SHARED: dict[tuple[Any, ...], Summarizer] = {}


def _key(settings: Settings) -> tuple[Any, ...]:
    return client_key(
        settings,
        settings.summary_provider,
        settings.summary_model,
        settings.summary_base_url,
        secret_value(settings.summary_api_key),
        settings.summary_max_chars,
    )


def get_summarizer(settings: Settings) -> Summarizer:
    """One summarizer per process and configuration, so its connections and limits are
    shared by every job of the process."""
    key = _key(settings)
    if key not in _SHARED:
        provider = settings.summary_provider
        if provider == "extractive":
            _SHARED[key] = ExtractiveSummarizer(max_chars=settings.summary_max_chars)
        elif provider in _PROVIDERS:
            _SHARED[key] = _PROVIDERS[provider](settings)
        else:
            raise PermanentError(f"unknown summary provider {provider!r}")
    return _SHARED[key]
