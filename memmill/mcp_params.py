"""What the model sees of the MCP tools' arguments: each one's type, bounds and description.

A model picks arguments from these descriptions alone, so each says what the value is for and
when to leave it out; the bounds are the API's, so a value the API would refuse is refused
before the call, with pydantic's message naming the argument.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from memmill.mcp_views import compact

MAX_WAIT_S = 60.0  # the longest a tool waits for background work (the API's ?wait= limit)

UserId = Annotated[str | None, Field(description=(
    "The person this is about or for (e.g. their account id). A memory with a user_id is "
    "shared by every agent working for that user. Omit when the key is bound to a user."))]
AgentId = Annotated[str | None, Field(description=(
    "The agent (assistant) acting. A memory with an agent_id and no user_id is private to "
    "that agent. Omit when the key is bound to an agent."))]
SessionId = Annotated[str | None, Field(description=(
    "The conversation (session) id; no slashes."))]
WaitS = Annotated[float, Field(ge=0, le=MAX_WAIT_S, description=(
    "Seconds to wait for the background work to finish before answering (0: answer at once "
    "and check later with `status`)."))]
MemoryText = Annotated[str | None, Field(description=(
    "One memory: a self-contained statement that reads well out of context "
    "(\"Ana prefers the window seat\"). Leave out when sending turns."))]
MemoryType = Annotated[str | None, Field(description=(
    "The memory's type: fact (default), preference, decision, event, project_state, "
    "procedure, conversation, self_assessment, or one the tenant registered."))]
Confidence = Annotated[float | None, Field(ge=0, le=1, description=(
    "How sure this is, 0-1 (default 0.8)."))]
Metadata = Annotated[dict[str, Any] | None, Field(description=(
    "Extra JSON fields kept with the memory."))]
Visibility = Annotated[Literal["private", "user", "tenant"] | None, Field(description=(
    "Who may read it: `user` (default with a user_id), `private` (only this agent; default "
    "with an agent_id alone) or `tenant` (everyone)."))]
Pinned = Annotated[bool | None, Field(description="Always include it in get_context.")]
ExtractNow = Annotated[bool, Field(description=(
    "With turns: the conversation ended, extract memories now rather than when the session "
    "goes quiet."))]


class Turn(BaseModel):
    """One turn of a conversation."""

    role: Literal["user", "assistant", "tool", "system"]
    content: str = Field(description="What was said.")
    sender_name: str | None = Field(default=None, description="Who said it, e.g. 'Ana'.")
    created_at: str | None = Field(default=None, description=(
        "When, ISO 8601 with a time zone; default: now."))
    event_id: str | None = Field(default=None, description=(
        "Your id for the turn, unique in the session: a turn sent again with the same id is "
        "not stored twice. Default: a new id."))

    def event(self, *, ending: bool) -> dict[str, Any]:
        return compact(event_id=self.event_id or uuid.uuid4().hex, role=self.role,
                       content=self.content, sender_name=self.sender_name,
                       created_at=self.created_at, ending=ending or None)


Turns = Annotated[list[Turn] | None, Field(description=(
    "Conversation turns to append to `session_id`, oldest first. memmill extracts memories "
    "from them in the background."))]
