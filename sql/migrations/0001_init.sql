-- The foundation: tenants and keys, items with versions and sources, parts with full-text and
-- vector indexes, the durable job ledger with attempts and dead letters, the embedding cache.
-- Every row carries tenant_id; every query filters by it.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE tenants (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Only a SHA-256 of each key is stored; the prefix lets a person tell keys apart.
CREATE TABLE api_keys (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    prefix       text NOT NULL,
    key_hash     bytea NOT NULL UNIQUE,
    name         text NOT NULL DEFAULT 'default',
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

CREATE TABLE items (
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id           text NOT NULL,
    kind         text NOT NULL DEFAULT 'text',
    uri          text,
    title        text,
    summary      text,
    tags         jsonb NOT NULL DEFAULT '{}'::jsonb,
    content_hash text NOT NULL,
    version      integer NOT NULL DEFAULT 1,
    status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'ready', 'failed')),
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    accessed_at  timestamptz,
    access_count bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX items_tags ON items USING gin (tags jsonb_path_ops);
CREATE INDEX items_updated ON items (tenant_id, updated_at DESC);

-- Previous versions, archived on every change of content or tags.
CREATE TABLE item_versions (
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    item_id      text NOT NULL,
    version      integer NOT NULL,
    kind         text NOT NULL,
    uri          text,
    title        text,
    summary      text,
    tags         jsonb NOT NULL,
    content_hash text NOT NULL,
    created_at   timestamptz NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, item_id, version)
);

-- What was ingested, kept so that any job can be retried or re-run from it.
CREATE TABLE sources (
    tenant_id  bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    item_id    text NOT NULL,
    version    integer NOT NULL,
    media_type text NOT NULL DEFAULT 'text/plain',
    content    text,
    data       bytea,
    byte_size  integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, item_id, version)
);

CREATE TABLE parts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    bigint NOT NULL,
    item_id      text NOT NULL,
    version      integer NOT NULL,
    position     integer NOT NULL,
    text         text NOT NULL,
    meta         jsonb NOT NULL DEFAULT '{}'::jsonb,
    content_hash text NOT NULL,
    tsv          tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    embedding    vector(384),
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, item_id, version, position),
    FOREIGN KEY (tenant_id, item_id) REFERENCES items (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX parts_tsv ON parts USING gin (tsv);
CREATE INDEX parts_embedding ON parts USING hnsw (embedding vector_cosine_ops);
CREATE INDEX parts_tenant ON parts (tenant_id);

-- The durable job ledger: Postgres is the truth, Redis only the fast lane.
-- waiting: blocked on depends_on; queued: due at run_after; running: leased until lease_until.
CREATE TABLE jobs (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    kind         text NOT NULL,
    item_id      text,
    version      integer,
    status       text NOT NULL
                 CHECK (status IN ('waiting', 'queued', 'running', 'done', 'dead', 'cancelled')),
    depends_on   uuid REFERENCES jobs (id) ON DELETE SET NULL,
    attempts     integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    payload      jsonb NOT NULL DEFAULT '{}'::jsonb,
    last_error   text,
    run_after    timestamptz NOT NULL DEFAULT now(),
    enqueued_at  timestamptz,
    lease_until  timestamptz,
    worker_id    text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_tenant_created ON jobs (tenant_id, created_at DESC);
CREATE INDEX jobs_item ON jobs (tenant_id, item_id, version);
CREATE INDEX jobs_due ON jobs (run_after) WHERE status = 'queued';
CREATE INDEX jobs_leased ON jobs (lease_until) WHERE status = 'running';
CREATE INDEX jobs_dependents ON jobs (depends_on) WHERE status = 'waiting';

CREATE TABLE job_attempts (
    tenant_id   bigint NOT NULL,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt     integer NOT NULL,
    worker_id   text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    outcome     text CHECK (outcome IN ('done', 'retry', 'dead', 'lost', 'skipped')),
    error       text,
    traceback   text,
    PRIMARY KEY (job_id, attempt)
);

CREATE TABLE dead_letters (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    kind        text NOT NULL,
    item_id     text,
    payload     jsonb NOT NULL,
    reason      text NOT NULL,
    permanent   boolean NOT NULL,
    attempts    integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    replayed_at timestamptz
);
CREATE INDEX dead_letters_tenant ON dead_letters (tenant_id, created_at DESC);

-- Identical content is never embedded twice.
CREATE TABLE embedding_cache (
    tenant_id    bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    model        text NOT NULL,
    content_hash text NOT NULL,
    embedding    vector(384) NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, model, content_hash)
);
