-- Memory that keeps itself (pipeline/memory/upkeep/, profile.py, working.py): relations
-- between memories, layers with lifetimes, a per-tenant policy and schedule, the record of
-- every upkeep run (from which a run can be undone), knowledge profiles and working memory.

-- A memory's layer says how long it lives (the tenant's policy gives each layer a lifetime,
-- pipeline/memory/policy.py); expires_at follows from the layer when the memory is written
-- or its layer changes. NULL: permanent. Memories written before this migration keep living:
-- they are 'pinned' when pinned and 'observation' (permanent) otherwise.
ALTER TABLE memories
    ADD COLUMN layer text NOT NULL DEFAULT 'observation'
        CHECK (layer IN ('conversation', 'tool', 'group', 'pinned', 'observation', 'profile')),
    ADD COLUMN expires_at timestamptz,
    -- The access count the last decay step saw: the uses since then reinforce a memory.
    ADD COLUMN accesses_seen bigint NOT NULL DEFAULT 0;
UPDATE memories SET layer = 'pinned' WHERE pinned;
-- The daily prune finds what expired without reading the rest.
CREATE INDEX memories_expiring ON memories (tenant_id, expires_at) WHERE expires_at IS NOT NULL;

-- Relations between memories. Deleting a memory removes its relations at both ends (the two
-- foreign keys cascade). A relation joins memories of one tenant; who may see it is who may
-- see both ends (pipeline/memory/relations.py reads it through scope_visible on both).
CREATE TABLE memory_relations (
    tenant_id  bigint NOT NULL,
    from_id    uuid NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('supersedes', 'related_to', 'derived_from')),
    to_id      uuid NOT NULL,
    -- The cosine similarity that made a consolidation link them; NULL for a caller's relation.
    score      double precision,
    -- The upkeep run that wrote it (its undo removes it); NULL: a caller or an extraction.
    run_id     uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, from_id, kind, to_id),
    CHECK (from_id <> to_id),
    FOREIGN KEY (tenant_id, from_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, to_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX memory_relations_to ON memory_relations (tenant_id, to_id);

-- A memory's references to items (and, with a position, to one of the item's parts). The
-- item's deletion removes them; a part is named by position, so a new version of the item
-- keeps the reference meaningful.
CREATE TABLE memory_references (
    tenant_id  bigint NOT NULL,
    memory_id  uuid NOT NULL,
    item_id    text NOT NULL,
    -- -1: the item as a whole (a primary key cannot hold NULL).
    position   integer NOT NULL DEFAULT -1 CHECK (position >= -1),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, memory_id, item_id, position),
    FOREIGN KEY (tenant_id, memory_id) REFERENCES memories (tenant_id, id) ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, item_id) REFERENCES items (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX memory_references_item ON memory_references (tenant_id, item_id);

-- A tenant's memory policy. NULL in any column: the installation's default (MEMMILL_MEMORY_*).
-- lifetimes: {"conversation": 30, "tool": 14, ...} in days, null for permanent.
CREATE TABLE memory_policies (
    tenant_id           bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    lifetimes           jsonb NOT NULL DEFAULT '{}'::jsonb,
    memory_cap          bigint CHECK (memory_cap > 0),
    schedule            text,
    merge_similarity    double precision CHECK (merge_similarity > 0 AND merge_similarity <= 1),
    link_similarity     double precision CHECK (link_similarity > 0 AND link_similarity <= 1),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- When each tenant's next scheduled runs are due. A worker's sweeper claims a due row by
-- moving its time forward (compare and set), so two workers never start the same run.
CREATE TABLE memory_schedules (
    tenant_id          bigint PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    next_consolidation timestamptz NOT NULL,
    next_prune         timestamptz NOT NULL
);

-- An upkeep run: the steps it took (prune, merge, decay, link), on what scope, with which
-- thresholds, what it counted, and whether it was applied or only shown (dry run).
CREATE TABLE upkeep_runs (
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id          uuid NOT NULL,
    steps       text[] NOT NULL,
    dry_run     boolean NOT NULL,
    trigger     text NOT NULL CHECK (trigger IN ('request', 'schedule')),
    scope       jsonb NOT NULL DEFAULT '{}'::jsonb,
    options     jsonb NOT NULL DEFAULT '{}'::jsonb,
    key_id      bigint,
    -- {"merge": {"pairs": 3, ...}, ...}: each step's counts, written when the step finishes.
    counts      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    undone_at   timestamptz,
    undo        jsonb,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX upkeep_runs_recent ON upkeep_runs (tenant_id, created_at DESC);

-- Every change a run made (or, in a dry run, would make): enough to show it and to undo it.
-- `before` holds the fields the change set as they were (for a prune: the whole row and its
-- history), `after` the memory's version once changed, which an undo checks so that it never
-- overwrites a later change.
CREATE TABLE upkeep_changes (
    tenant_id bigint NOT NULL,
    run_id    uuid NOT NULL,
    seq       integer NOT NULL,
    step      text NOT NULL CHECK (step IN ('prune', 'promote', 'merge', 'decay', 'link')),
    action    text NOT NULL CHECK (action IN ('expire', 'cap', 'promote', 'drop', 'merge', 'keep',
                                              'decay', 'reinforce', 'invalidate', 'link',
                                              'observe')),
    memory_id uuid NOT NULL,
    other_id  uuid,
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb,
    before    jsonb,
    after_version integer,
    PRIMARY KEY (tenant_id, run_id, seq),
    FOREIGN KEY (tenant_id, run_id) REFERENCES upkeep_runs (tenant_id, id) ON DELETE CASCADE
);

-- What a prune keeps of a memory it removes, for an undo to write it back: the row (its vector
-- too; its term weights are generated again) and its history.
CREATE FUNCTION memory_snapshot(m memories) RETURNS jsonb
LANGUAGE sql STABLE
RETURN jsonb_build_object(
    'row', to_jsonb(m) - 'terms',
    'history', (SELECT coalesce(jsonb_agg(to_jsonb(h) ORDER BY h.version), '[]'::jsonb)
                FROM memory_history h
                WHERE h.tenant_id = m.tenant_id AND h.memory_id = m.id));

ALTER TABLE operations DROP CONSTRAINT operations_kind_check;
ALTER TABLE operations ADD CONSTRAINT operations_kind_check
    CHECK (kind IN ('embed', 'extract', 'forget', 'upkeep'));

-- Working memory (pipeline/memory/working.py): a scratchpad per user and session, read and
-- written whole with a version check. session_id '' is the user's own, across sessions.
CREATE TABLE working_memory (
    tenant_id  bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    user_id    text NOT NULL,
    session_id text NOT NULL,
    content    text NOT NULL,
    version    integer NOT NULL DEFAULT 1,
    agent_id   text,
    key_id     bigint,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id, session_id)
);

-- A user's knowledge profile (pipeline/memory/profile.py): topics with a comfort level and a
-- one-line summary, from extraction or set by a caller.
CREATE TABLE profile_topics (
    tenant_id     bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    user_id       text NOT NULL,
    topic         text NOT NULL CHECK (length(topic) BETWEEN 1 AND 80),
    level         text NOT NULL CHECK (level IN ('beginner', 'learning', 'expert')),
    summary       text NOT NULL,
    source        text NOT NULL CHECK (source IN ('extraction', 'caller')),
    source_events jsonb NOT NULL DEFAULT '[]'::jsonb,
    evidence      integer NOT NULL DEFAULT 1,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id, topic)
);

-- The inbox (pipeline/memory/inbox.py): observations extraction was not sure enough of to make
-- memories. Each has an attention score (its confidence, raised each time it is heard again);
-- consolidation's promote step makes memories of those at or above a threshold and drops
-- those that waited too long.
CREATE TABLE memory_inbox (
    tenant_id     bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    id            uuid NOT NULL DEFAULT gen_random_uuid(),
    user_id       text,
    agent_id      text,
    session_id    text,
    visibility    text NOT NULL CHECK (visibility IN ('private', 'user', 'tenant')),
    type          text NOT NULL,
    content       text NOT NULL,
    confidence    double precision NOT NULL,
    attention     double precision NOT NULL,
    heard         integer NOT NULL DEFAULT 1,
    hints         text[] NOT NULL DEFAULT '{}',
    observed_at   timestamptz,
    source_events jsonb NOT NULL DEFAULT '[]'::jsonb,
    embedding     vector(384),
    embedding_model text,
    status        text NOT NULL DEFAULT 'waiting' CHECK (status IN ('waiting', 'promoted', 'dropped')),
    memory_id     uuid,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_heard_at timestamptz NOT NULL DEFAULT now(),
    decided_at    timestamptz,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX memory_inbox_waiting ON memory_inbox (tenant_id, user_id, agent_id)
    WHERE status = 'waiting';
