-- No vector index on events or memories: a search ranks exactly the rows its reader may see
-- (one user's memories and conversations, a few thousand rows, found through the scope
-- indexes below), which an HNSW scan filtered to so few rows of a large tenant would miss, and
-- every insert would pay for (pipeline/memory/recall.py).
--
-- Agent memory: sessions of events (what was said), memories (what was learned), the history
-- of every change to a memory, and operations (the outcome of background work a caller can
-- look up). Memories and events are not items: they carry scope columns that no update may
-- change, a history of their own and a visibility rule, and an event is one short turn written
-- 500 at a time, where an item is a document with versions and a source to re-run. They share
-- the spine: the job ledger (embed_memory, extract and forget jobs, with backoff and dead
-- letters), the embedding cache, BM25 term vectors (bm25_terms, migration 0005) and the fusion
-- functions of the document search.
--
-- Scope: user_id, agent_id and session_id are the caller's ids (1-256 characters, no
-- whitespace or control characters, checked by the API). A trigger refuses any change to them,
-- so no code path, present or future, can move a memory into another user's scope.
-- Visibility decides who reads a row (pipeline/memory/scopes.py writes the predicate):
--   private: the writing agent only (agent_id required);
--   user:    every agent of the user (user_id required);
--   tenant:  every agent of the tenant.

CREATE TABLE memory_types (
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]*$' AND length(name) <= 64),
    description text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE sessions (
    tenant_id     bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id            text NOT NULL,
    user_id       text,
    agent_id      text,
    visibility    text NOT NULL CHECK (visibility IN ('private', 'user', 'tenant')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- The client's timestamps of the earliest and latest event, and the server's time of the
    -- last write (extraction waits for the session to go quiet by the server's clock).
    first_event_at timestamptz,
    last_event_at  timestamptz,
    last_write_at  timestamptz NOT NULL DEFAULT now(),
    events        integer NOT NULL DEFAULT 0,
    -- Extraction's watermark: the events up to this sequence number have been read.
    extracted_seq bigint NOT NULL DEFAULT 0,
    ended_at      timestamptz,
    summary       text,
    PRIMARY KEY (tenant_id, id),
    CHECK (visibility <> 'user' OR user_id IS NOT NULL),
    CHECK (visibility <> 'private' OR agent_id IS NOT NULL)
);
CREATE INDEX sessions_user ON sessions (tenant_id, user_id, last_write_at DESC);
CREATE INDEX sessions_agent ON sessions (tenant_id, agent_id, last_write_at DESC);

-- One row per event. `search_text` is what the full-text side indexes and `embed_text` what
-- the vector side embeds: the turn with its speaker, date and the turn it answers (composed by
-- pipeline/memory/events.py when the event is written), so that a question and its answer,
-- said in two turns, are found together.
CREATE TABLE events (
    seq            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      bigint NOT NULL,
    session_id     text NOT NULL,
    event_id       text NOT NULL,
    user_id        text,
    agent_id       text,
    visibility     text NOT NULL CHECK (visibility IN ('private', 'user', 'tenant')),
    role           text NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'system')),
    sender_id      text,
    sender_name    text,
    type           text NOT NULL DEFAULT 'TEXT' CHECK (type IN ('TEXT', 'AUDIO', 'IMAGE', 'SYSTEM')),
    content        text NOT NULL,
    media_item_id  text,
    created_at     timestamptz NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    trace_id       text,
    span_id        text,
    parent_span_id text,
    metadata       jsonb NOT NULL DEFAULT '{}'::jsonb,
    search_text    text NOT NULL,
    embed_text     text NOT NULL,
    content_hash   text NOT NULL,
    -- BM25's term weights of search_text (bm25_terms, migration 0005), written by the
    -- embed_memory job with the vector: computing them in the write took a third of it.
    terms          sparsevec,
    embedding      vector(384),
    embedding_model text,
    UNIQUE (tenant_id, session_id, event_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);
-- A search reads a reader's every row: its vector and term weights must be in the row,
-- not in TOAST, where each read of a value would fetch and decompress it again (a 500-row
-- search spent 70 of its 94 ms that way). The target keeps rows whole up to a page.
ALTER TABLE events SET (toast_tuple_target = 8160);
ALTER TABLE events ALTER COLUMN embedding SET STORAGE PLAIN,
                   ALTER COLUMN terms SET STORAGE MAIN;
CREATE INDEX events_session ON events (tenant_id, session_id, created_at, seq);
CREATE INDEX events_user ON events (tenant_id, user_id, seq);
CREATE INDEX events_agent ON events (tenant_id, agent_id, seq);
CREATE INDEX events_tenant_wide ON events (tenant_id) WHERE visibility = 'tenant';
CREATE INDEX events_trace ON events (tenant_id, trace_id) WHERE trace_id IS NOT NULL;
CREATE INDEX events_unembedded ON events (tenant_id, seq) WHERE embedding IS NULL;

-- What a memory's words are indexed by: its content and its hints. IMMUTABLE as a generated
-- column needs (array_to_string is only STABLE in general, but not for text elements).
CREATE FUNCTION memory_text(content text, hints text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN content || ' ' || array_to_string(hints, ' ');

CREATE TABLE memories (
    tenant_id      bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id             uuid NOT NULL DEFAULT gen_random_uuid(),
    user_id        text,
    agent_id       text,
    session_id     text,
    visibility     text NOT NULL CHECK (visibility IN ('private', 'user', 'tenant')),
    type           text NOT NULL,
    content        text NOT NULL,
    confidence     double precision NOT NULL DEFAULT 0.8 CHECK (confidence >= 0 AND confidence <= 1),
    source         text,
    metadata       jsonb NOT NULL DEFAULT '{}'::jsonb,
    hints          text[] NOT NULL DEFAULT '{}',
    pinned         boolean NOT NULL DEFAULT false,
    observed_at    timestamptz,
    valid_until    timestamptz,
    invalid_reason text,
    superseded_by  uuid,
    -- [{"session_id": …, "event_id": …}]: the events a memory was extracted from.
    source_events  jsonb NOT NULL DEFAULT '[]'::jsonb,
    version        integer NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    access_count   bigint NOT NULL DEFAULT 0,
    accessed_at    timestamptz,
    content_hash   text NOT NULL,
    terms          sparsevec GENERATED ALWAYS AS (bm25_terms(
                       to_tsvector('english', memory_text(content, hints)))) STORED,
    embedding      vector(384),
    embedding_model text,
    PRIMARY KEY (tenant_id, id),
    CHECK (visibility <> 'user' OR user_id IS NOT NULL),
    CHECK (visibility <> 'private' OR agent_id IS NOT NULL)
);
ALTER TABLE memories SET (toast_tuple_target = 8160);
ALTER TABLE memories ALTER COLUMN embedding SET STORAGE PLAIN,
                     ALTER COLUMN terms SET STORAGE MAIN;
CREATE INDEX memories_user ON memories (tenant_id, user_id, created_at);
CREATE INDEX memories_agent ON memories (tenant_id, agent_id, created_at);
CREATE INDEX memories_session ON memories (tenant_id, session_id) WHERE session_id IS NOT NULL;
CREATE INDEX memories_tenant_wide ON memories (tenant_id) WHERE visibility = 'tenant';

-- Scope is written once. Not a CHECK of the API's: a trigger, so that no UPDATE anywhere can
-- move a row into another user's, agent's or session's scope.
CREATE FUNCTION refuse_scope_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    scope text[] := ARRAY['tenant_id', 'user_id', 'agent_id', 'session_id', 'visibility'];
BEGIN
    -- Read through jsonb: a sessions row has no session_id column (its id is the session).
    IF (SELECT jsonb_object_agg(k, to_jsonb(OLD) -> k) FROM unnest(scope) k)
       IS DISTINCT FROM (SELECT jsonb_object_agg(k, to_jsonb(NEW) -> k) FROM unnest(scope) k) THEN
        RAISE EXCEPTION 'the scope of a % row cannot change', TG_TABLE_NAME
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
-- Only an UPDATE that names a scope column can change one, so only such an UPDATE runs the
-- check (it costs a few jsonb conversions of the row, vector included: run on every access
-- count bump, it doubled their cost).
CREATE TRIGGER memories_scope_fixed
    BEFORE UPDATE OF tenant_id, user_id, agent_id, session_id, visibility ON memories
    FOR EACH ROW EXECUTE FUNCTION refuse_scope_change();
CREATE TRIGGER events_scope_fixed
    BEFORE UPDATE OF tenant_id, user_id, agent_id, session_id, visibility ON events
    FOR EACH ROW EXECUTE FUNCTION refuse_scope_change();
CREATE TRIGGER sessions_scope_fixed
    BEFORE UPDATE OF tenant_id, user_id, agent_id, visibility ON sessions
    FOR EACH ROW EXECUTE FUNCTION refuse_scope_change();

-- Every change of a memory: who (key and agent), what, the content before and after. A
-- delete erases a memory's history with it (that is what a delete is for); invalidation is
-- the change that keeps everything.
CREATE TABLE memory_history (
    tenant_id    bigint NOT NULL,
    memory_id    uuid NOT NULL,
    version      integer NOT NULL,
    operation    text NOT NULL CHECK (operation IN ('add', 'update', 'invalidate', 'supersede')),
    key_id       bigint,
    agent_id     text,
    operation_id uuid,
    old_content  text,
    new_content  text,
    changes      jsonb NOT NULL DEFAULT '{}'::jsonb,
    reason       text,
    at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, memory_id, version),
    FOREIGN KEY (tenant_id, memory_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE
);

-- Background work a caller started and can look up: embedding a batch of events or memories,
-- extracting a session, deleting by scope. Its state is its job's (pipeline/memory/operations.py).
CREATE TABLE operations (
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id          uuid NOT NULL DEFAULT gen_random_uuid(),
    kind        text NOT NULL CHECK (kind IN ('embed', 'extract', 'forget')),
    job_id      uuid REFERENCES jobs (id) ON DELETE SET NULL,
    session_id  text,
    scope       jsonb NOT NULL DEFAULT '{}'::jsonb,
    key_id      bigint,
    result      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX operations_job ON operations (job_id);
CREATE INDEX operations_session ON operations (tenant_id, session_id, created_at DESC)
    WHERE session_id IS NOT NULL;

-- What an extraction decided about each proposal, with why.
CREATE TABLE operation_decisions (
    tenant_id     bigint NOT NULL,
    operation_id  uuid NOT NULL,
    position      integer NOT NULL,
    action        text NOT NULL CHECK (action IN ('ADD', 'UPDATE', 'SUPERSEDE', 'NOOP_DUPLICATE')),
    reason        text NOT NULL,
    type          text NOT NULL,
    confidence    double precision NOT NULL,
    similarity    double precision,
    memory_id     uuid,
    target_id     uuid,
    old_content   text,
    new_content   text NOT NULL,
    observed_at   timestamptz,
    source_events jsonb NOT NULL DEFAULT '[]'::jsonb,
    PRIMARY KEY (tenant_id, operation_id, position),
    FOREIGN KEY (tenant_id, operation_id) REFERENCES operations (tenant_id, id) ON DELETE CASCADE
);

-- At most one extraction of a session waits in the ledger at a time: a write to a session with
-- one waiting finds it instead of adding another.
CREATE UNIQUE INDEX jobs_one_extract_queued ON jobs (tenant_id, (payload ->> 'session_id'))
    WHERE kind = 'extract' AND status = 'queued';

-- Whether a reader (a user and/or an agent, either may be NULL) may see a row of this scope:
-- the one definition of the visibility rule, for memories, events and sessions alike. It is
-- a single expression, so Postgres inlines it and its tests reach the indexes; every
-- comparison is guarded, so it answers true or false, never NULL (a NOT of it stays right).
CREATE FUNCTION scope_visible(
    visibility text, user_id text, agent_id text, reader_user text, reader_agent text
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN visibility = 'tenant'
    OR (visibility = 'user' AND user_id IS NOT NULL AND reader_user IS NOT NULL
        AND user_id = reader_user)
    OR (visibility = 'private' AND agent_id IS NOT NULL AND reader_agent IS NOT NULL
        AND agent_id = reader_agent
        AND (user_id IS NULL OR (reader_user IS NOT NULL AND user_id = reader_user)));

-- Text as lowercase words separated by single spaces, for matching a name as whole words:
-- ' ' || words_of(query) || ' ' holds ' ' || words_of(name) || ' ' when the query names them.
CREATE FUNCTION words_of(text text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN btrim(regexp_replace(lower(text), '[^[:alnum:]]+', ' ', 'g'));
