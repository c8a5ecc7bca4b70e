-- Webhooks: a tenant's endpoints, told when its work is done instead of polling, and the log of
-- every delivery. A delivery row is written in the transaction where its event happens, with a
-- `webhook` job in the ledger that sends it (the outbox, pipeline/webhooks.py), so an event is
-- announced if and only if it happened, and a delivery survives any restart.

CREATE TABLE webhooks (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id         bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url               text NOT NULL,
    description       text,
    events            text[] NOT NULL CHECK (cardinality(events) > 0),
    active            boolean NOT NULL DEFAULT true,
    -- Kept as it is, since signing needs it; shown only when made (create, rotate-secret).
    secret            text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    secret_rotated_at timestamptz
);
-- The listing, and the one lookup an event costs a tenant: its active endpoints (a handful).
CREATE INDEX webhooks_tenant ON webhooks (tenant_id, created_at DESC, id DESC);

CREATE TABLE webhook_deliveries (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id        bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    webhook_id       uuid NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event            text NOT NULL,
    -- The event's `data`; the body sent wraps it with the delivery's id, event and time.
    payload          jsonb NOT NULL,
    -- When the event happened: a replay keeps it, and gets a new delivery id.
    event_at         timestamptz NOT NULL DEFAULT now(),
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    last_status_code integer,
    last_error       text,
    -- The start of the last answer's body, never more (pipeline/webhooks.py SNIPPET_CHARS).
    last_response    text,
    response_ms      double precision,
    -- Every attempt: when, the status code (none without an answer), the error, how long.
    history          jsonb NOT NULL DEFAULT '[]'::jsonb,
    job_id           uuid,
    replay_of        uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz,
    delivered_at     timestamptz
);
-- An endpoint's log, newest first by keyset; deleting an endpoint deletes its log by it.
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (webhook_id, created_at DESC, id DESC);
-- Erasing a tenant deletes its deliveries by this.
CREATE INDEX webhook_deliveries_tenant ON webhook_deliveries (tenant_id);
