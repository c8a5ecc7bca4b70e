"""Request and response models of the webhook routes (api/routes/webhooks.py). Requests are
strict like the rest of the API (api/schemas.py): an unknown field, a wrong type or an unknown
event is a 422 naming it. A response never holds an endpoint's secret, except the one answer
that made it (`WebhookWithSecret`: create and rotate-secret)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from api.schemas import SafeStr, Strict
from pipeline.stages.fetch import MAX_URL_CHARS
from pipeline.webhooks import EVENTS, PING

MAX_DESCRIPTION_CHARS = 500
DeliveryStatus = Literal["pending", "delivered", "failed"]
DeliveredEvent = Literal[(*EVENTS, PING)]  # type: ignore[valid-type]


def _events(value: list[str]) -> list[str]:
    unknown = [e for e in value if e not in EVENTS]
    if unknown:
        raise PydanticCustomError(
            "webhook_event", "unknown event {event}; the events are {known}",
            {"event": repr(unknown[0]), "known": ", ".join(EVENTS)})
    if not value:
        raise PydanticCustomError("webhook_events", "subscribe to at least one event: {known}",
                                  {"known": ", ".join(EVENTS)})
    return sorted(set(value), key=EVENTS.index)


Events = Annotated[
    list[SafeStr],
    Field(max_length=50, description="What the endpoint hears about, at least one.",
          json_schema_extra={"minItems": 1,
                             "items": {"type": "string", "enum": list(EVENTS)}}),
    AfterValidator(_events),
]
WebhookUrl = Annotated[SafeStr, Field(
    max_length=MAX_URL_CHARS, json_schema_extra={"format": "uri"},
    description="http or https, no credentials in it; it must not name or resolve to a private,"
                " loopback or link-local address, unless MEMMILL_FETCH_ALLOW allows it.")]
Description = Annotated[SafeStr, Field(max_length=MAX_DESCRIPTION_CHARS)]


class WebhookCreate(Strict):
    url: WebhookUrl
    events: Events
    description: Description | None = None
    active: StrictBool = True


class WebhookUpdate(Strict):
    """Fields to change; a field left out stays as it is (a null description clears it)."""

    url: WebhookUrl | None = None
    events: Events | None = None
    description: Description | None = None
    active: StrictBool | None = None

    @model_validator(mode="after")
    def _no_null_but_description(self) -> WebhookUpdate:
        for name in ("url", "events", "active"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise PydanticCustomError("not_null", "{name}: must not be null; leave it out "
                                          "to keep it", {"name": name})
        return self


class WebhookPublic(BaseModel):
    id: UUID
    url: str
    description: str | None
    events: list[str]
    active: bool
    created_at: datetime
    updated_at: datetime
    secret_rotated_at: datetime | None


class WebhookWithSecret(WebhookPublic):
    secret: str = Field(description="Signs every delivery (`Memmill-Signature`). Shown in this "
                                    "answer only: keep it now, or rotate it to get a new one.")


class WebhooksPublic(BaseModel):
    data: list[WebhookPublic]
    count: int


class DeliveryPublic(BaseModel):
    id: UUID = Field(description="Sent as `Memmill-Delivery` and the body's `id`: the same on "
                                 "every attempt, so a receiver can ignore a repeat.")
    webhook_id: UUID
    event: DeliveredEvent
    status: DeliveryStatus
    attempts: int
    last_status_code: int | None = Field(description="The HTTP status of the last answer; none "
                                                     "when there was no answer.")
    last_error: str | None
    last_response: str | None = Field(description="The start of the last answer's body, at "
                                                  "most 200 characters.")
    response_ms: float | None = Field(description="How long the last attempt took.")
    event_at: datetime = Field(description="When the event happened (a replay keeps it).")
    created_at: datetime
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    replay_of: UUID | None
    job_id: UUID | None = Field(description="The ledger job sending it (GET /v1/jobs/{id}).")


class DeliveryAttempt(BaseModel):
    at: datetime
    status_code: int | None
    error: str | None
    response_ms: float


class DeliveryDetail(DeliveryPublic):
    payload: dict[str, Any] = Field(description="The body as it is sent.")
    history: list[DeliveryAttempt] = Field(description="Every attempt, oldest first.")


class DeliveriesPage(BaseModel):
    data: list[DeliveryPublic]
    next_cursor: str | None
