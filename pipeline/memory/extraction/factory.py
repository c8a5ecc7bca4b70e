"""The extractor and the decider that MEMMILL_EXTRACTION_PROVIDER names."""

from __future__ import annotations

from typing import Any

from pipeline.errors import PermanentError
from pipeline.memory.extraction.decide import RuleDecider
from pipeline.memory.extraction.llm import JSON_CHATS, JSONChat, LLMDecider, LLMExtractor
from pipeline.memory.extraction.model import Decider, Extractor
from pipeline.memory.extraction.rules import RuleExtractor
from pipeline.providers.http import secret_value
from pipeline.providers.wire import client_key
from pipeline.settings import Settings

# One chat client per process and configuration, shared by the extractor and the decider, so
# their connections and their request limits are one budget for every job of the process.
_CHATS: dict[tuple[Any, ...], JSONChat] = {}


def _key(settings: Settings) -> tuple[Any, ...]:
    return client_key(settings, settings.extraction_provider, settings.extraction_model,
                      settings.extraction_base_url, secret_value(settings.extraction_api_key))


def get_chat(settings: Settings) -> JSONChat:
    """The shared chat client of a model provider (not for "rules", which has none)."""
    provider = settings.extraction_provider
    if provider not in JSON_CHATS:
        raise PermanentError(f"unknown extraction provider {provider!r}")
    key = _key(settings)
    if key not in _CHATS:
        _CHATS[key] = JSON_CHATS[provider](settings)
    return _CHATS[key]


def get_extractor(settings: Settings) -> Extractor:
    if settings.extraction_provider == "rules":
        return RuleExtractor()
    return LLMExtractor(get_chat(settings))


def get_decider(settings: Settings) -> Decider:
    if settings.extraction_provider == "rules":
        return RuleDecider(dedup_similarity=settings.dedup_similarity,
                           related_similarity=settings.related_similarity)
    return LLMDecider(get_chat(settings))
