"""Request and response models of a user's knowledge profile and working memory."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from api.memory_schemas import ScopeIn, SessionIdText
from api.schemas import SafeStr, Strict, json_int
from pipeline.memory import profile, working

Level = Literal["beginner", "learning", "expert"]


class TopicSet(Strict):
    level: Level
    summary: SafeStr = Field(min_length=1, max_length=profile.MAX_SUMMARY_CHARS, description=(
        "One line: what the user knows of the topic, or how they learn it."))


class TopicPublic(BaseModel):
    topic: str
    level: Level
    summary: str
    source: Literal["extraction", "caller"]
    source_events: list[dict[str, str]] = Field(description=(
        "The turns extraction heard it in (empty when a caller set it)."))
    evidence: int = Field(description="How many statements it was heard in.")
    updated_at: datetime


class ProfilePublic(BaseModel):
    user_id: str
    topics: list[TopicPublic] = Field(description="Most recently updated first.")


class WorkingMemoryWrite(Strict):
    scope: ScopeIn = Field(description="Its user_id is required; agent_id says who wrote it.")
    session_id: SessionIdText | None = Field(default=None, description=(
        "The session's (or thread's) scratchpad; none: the user's own, across sessions."))
    content: SafeStr = Field(max_length=working.MAX_CHARS, description=(
        "The whole scratchpad: a write replaces it."))
    expected_version: json_int(ge=0, le=2**31 - 1) = Field(  # type: ignore[valid-type]
        description="The version read (0 to create it): a stale one is a 409.")


class WorkingMemoryPublic(BaseModel):
    user_id: str
    session_id: str | None = Field(description="Whose scratchpad this is: the session's, or "
                                               "null for the user's own.")
    level: Literal["session", "user"] | None = Field(description=(
        "Which one a read found: the session's, the user's (the session has none), or "
        "none (null, version 0)."))
    content: str
    version: int
    updated_at: datetime | None
    agent_id: str | None
