"""The wire formats of the HTTP model providers, each stated once: the provider's name, where it
listens by default, the path of a call, how a request carries the key, and the checks on an
answer's shape that every use of the format shares.

The summarizers (chat.py), the extraction chats (memory/extraction/llm.py) and the embedders
(embeddings.py) mix these in and add only their own request body and their own reading of the
answer, so a fact about a provider's API (a header, a version, a default URL, an error message
people search their logs for) cannot drift between them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from pipeline.providers.http import ProviderClient, SettingNames, bearer, secret_value
from pipeline.settings import Settings


def client_key(settings: Settings, *own: Any) -> tuple[Any, ...]:
    """The key of a client shared by a process: the caller's own settings, then every setting
    ProviderClient reads, so that changing any of them builds a new client."""
    return (
        *own,
        settings.provider_timeout_s,
        settings.provider_concurrency,
        settings.provider_rate_per_s,
        settings.provider_retries,
        settings.provider_retry_max_wait_s,
    )


def system_and_user(system: str, prompt: str) -> list[dict[str, str]]:
    """The system and user turns, as OpenAI-compatible servers and Ollama both take them
    (Anthropic takes the system prompt beside the messages instead)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]


class Wire:
    """One provider API. Opens the client the same way for every use of it, so the label in
    errors, the default URL and the setting names an error points at are the same."""

    provider: ClassVar[str]
    label: ClassVar[str]
    default_base_url: ClassVar[str]
    path: ClassVar[str]

    client: ProviderClient
    _api_key: str | None

    def _connect(self, settings: Settings, *, base_url: str | None, api_key: Any,
                 names: SettingNames) -> None:
        """Open the client on base_url (else the provider's default); `names` are the settings
        of the caller, which an error tells a person to check."""
        self._api_key = secret_value(api_key)
        self.client = ProviderClient(
            settings,
            label=self.label,
            provider=self.provider,
            base_url=base_url or self.default_base_url,
            names=replace(names, extra_hints=self.hints(names)),
        )

    @classmethod
    def hints(cls, names: SettingNames) -> dict[int, str]:
        """Advice for a status whose usual cause is particular to this provider."""
        return {}

    def _headers(self) -> dict[str, str]:
        return bearer(self._api_key)


class OpenAIWire(Wire):
    """OpenAI's API, or any server that speaks it (vLLM, LM Studio, llama.cpp, OpenRouter...):
    a bearer key."""

    provider = "openai"
    default_base_url = "https://api.openai.com/v1"


class OpenAIChatWire(OpenAIWire):
    """POST {base_url}/chat/completions."""

    label = "OpenAI-compatible chat"
    path = "chat/completions"

    def _message_content(self, data: dict[str, Any]) -> str:
        """The text of choices[0].message. A model that refuses answers with no content and a
        refusal, which the error quotes: it is the only explanation a person gets."""
        try:
            message = data["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise self.client.shape_error(self.path, "no choices[0].message") from None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            refusal = message.get("refusal") if isinstance(message, dict) else None
            what = f"a refusal: {refusal}" if refusal else "no message content"
            raise self.client.shape_error(self.path, what)
        return content


class AnthropicWire(Wire):
    """POST {base_url}/v1/messages, Anthropic's Messages API: the key in x-api-key, and the
    API version in a header of its own."""

    provider = "anthropic"
    label = "Anthropic messages"
    default_base_url = "https://api.anthropic.com"
    path = "v1/messages"
    api_version = "2023-06-01"

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": self.api_version}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def _content_blocks(self, data: dict[str, Any]) -> list[Any]:
        """The answer's content blocks (text, tool_use, thinking...), unchecked one by one:
        which kind a caller wants is its own business."""
        blocks = data.get("content")
        if not isinstance(blocks, list):
            raise self.client.shape_error(self.path, "no content list")
        return blocks


class OllamaWire(Wire):
    """An Ollama server: no key by default (a bearer one when a proxy in front wants it), and a
    404 that most often means a model that was never pulled."""

    provider = "ollama"
    default_base_url = "http://127.0.0.1:11434"

    @classmethod
    def hints(cls, names: SettingNames) -> dict[int, str]:
        return {404: f"check {names.model} (is it pulled? `ollama pull <model>`) "
                     f"and {names.base_url}"}


class OllamaChatWire(OllamaWire):
    """POST {base_url}/api/chat, without streaming."""

    label = "Ollama chat"
    path = "api/chat"

    def _message_content(self, data: dict[str, Any]) -> str:
        """The text of the answer's message."""
        message = data.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise self.client.shape_error(self.path, "no message.content")
        return content
