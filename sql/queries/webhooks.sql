-- Endpoints ---------------------------------------------------------------------------------

-- Two creates of one tenant at once must not both pass the limit: they take turns here, for
-- the rest of their transactions.
-- name: lock_tenant
SELECT pg_advisory_xact_lock(hashtextextended('memmill.webhooks:' || $1::bigint, 0));

-- name: count
SELECT count(*) FROM webhooks WHERE tenant_id = $1;

-- name: insert
INSERT INTO webhooks (tenant_id, url, description, events, active, secret)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING *;

-- name: list
SELECT * FROM webhooks WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC;

-- name: get
SELECT * FROM webhooks WHERE tenant_id = $1 AND id = $2;

-- A null leaves a field as it is; the description is cleared by $4 = true with $5 null.
-- name: update
UPDATE webhooks
SET url = coalesce($3, url),
    description = CASE WHEN $4 THEN $5 ELSE description END,
    events = coalesce($6, events),
    active = coalesce($7, active),
    updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- name: delete
DELETE FROM webhooks WHERE tenant_id = $1 AND id = $2 RETURNING id;

-- name: rotate_secret
UPDATE webhooks SET secret = $3, secret_rotated_at = now(), updated_at = now()
WHERE tenant_id = $1 AND id = $2
RETURNING *;

-- Emission ----------------------------------------------------------------------------------

-- The events a tenant's active endpoints listen to: empty for a tenant without webhooks, which
-- then pays this one indexed lookup and nothing else.
-- name: listened
SELECT DISTINCT unnest(events) AS event FROM webhooks WHERE tenant_id = $1 AND active;

-- The active endpoints subscribed to an event: for a tenant without webhooks, the one lookup
-- an event costs (webhooks_tenant), a plain read, as cheap as a round trip gets.
-- name: subscribers
SELECT id FROM webhooks WHERE tenant_id = $1 AND active AND $2 = ANY (events);

-- name: insert_deliveries
INSERT INTO webhook_deliveries (tenant_id, webhook_id, event, payload)
SELECT $1, unnest($2::uuid[]), $3, $4::jsonb
RETURNING id;

-- name: link_job
UPDATE webhook_deliveries SET job_id = $2 WHERE id = $1;

-- A test ping, or a replay of an earlier delivery's payload (its event time kept).
-- name: insert_delivery
INSERT INTO webhook_deliveries (tenant_id, webhook_id, event, payload, event_at, replay_of)
VALUES ($1, $2, $3, $4, coalesce($5, now()), $6)
RETURNING id;

-- The operation a job carried out, for operation.completed.
-- name: operation_of_job
SELECT id, kind, result FROM operations WHERE tenant_id = $1 AND job_id = $2;

-- Delivery ----------------------------------------------------------------------------------

-- What the webhook job sends, and where: the endpoint as it is now (its URL and secret may have
-- changed since the event) and the tenant's name for the body.
-- name: to_send
SELECT d.id, d.event, d.payload, d.event_at, d.status, w.url, w.secret, w.active,
       t.name AS tenant_name
FROM webhook_deliveries d
JOIN webhooks w ON w.id = d.webhook_id
JOIN tenants t ON t.id = d.tenant_id
WHERE d.tenant_id = $1 AND d.id = $2;

-- name: attempt_failed
UPDATE webhook_deliveries
SET attempts = attempts + 1, status = 'pending', last_status_code = $3, last_error = $4,
    last_response = $5, response_ms = $6, last_attempt_at = now(),
    history = history || jsonb_build_array(jsonb_build_object(
        'at', now(), 'status_code', $3::integer, 'error', $4::text, 'response_ms', $6::float8))
WHERE tenant_id = $1 AND id = $2;

-- name: delivered
UPDATE webhook_deliveries
SET attempts = attempts + 1, status = 'delivered', last_status_code = $3, last_error = NULL,
    last_response = $4, response_ms = $5, last_attempt_at = now(), delivered_at = now(),
    history = history || jsonb_build_array(jsonb_build_object(
        'at', now(), 'status_code', $3::integer, 'error', NULL, 'response_ms', $5::float8))
WHERE tenant_id = $1 AND id = $2;

-- Its job is dead or cancelled, or its endpoint was disabled: no more attempts. The last
-- attempt's error stays; `$3` says why when no attempt left one.
-- name: give_up
UPDATE webhook_deliveries SET status = 'failed', last_error = coalesce(last_error, $3)
WHERE tenant_id = $1 AND id = $2 AND status <> 'delivered';

-- Reading the log ---------------------------------------------------------------------------

-- An endpoint's deliveries, newest first, after the keyset cursor ($3, $4) when given.
-- name: deliveries
SELECT d.* FROM webhook_deliveries d
WHERE d.tenant_id = $1 AND d.webhook_id = $2
  AND ($3::timestamptz IS NULL OR (d.created_at, d.id) < ($3, $4::uuid))
  AND ($5::text IS NULL OR d.status = $5)
  AND ($6::text IS NULL OR d.event = $6)
ORDER BY d.created_at DESC, d.id DESC
LIMIT $7;

-- name: delivery
SELECT d.*, t.name AS tenant_name
FROM webhook_deliveries d JOIN tenants t ON t.id = d.tenant_id
WHERE d.tenant_id = $1 AND d.webhook_id = $2 AND d.id = $3;
