"""The one configuration class. Every knob is an environment variable prefixed MEMMILL_."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The job kinds a per-kind override may name (pipeline.jobs.KINDS; repeated here so that the
# settings import nothing of the pipeline, and checked equal by a test).
JOB_KINDS = (
    "regularize", "ocr", "analyze", "summarize", "embed", "extract", "reindex",
    "embed_memory", "forget", "erase_tenant", "webhook",
    "prune_memories", "promote_memories", "merge_memories", "decay_memories", "link_memories",
)


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("memmill"))


class KindOverride(BaseModel):
    """Per-kind exceptions to the job defaults; a field left out keeps the default."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(default=None, gt=0)
    lease_s: float | None = Field(default=None, gt=0)
    max_attempts: int | None = Field(default=None, ge=1)
    retry_base_s: float | None = Field(default=None, ge=0)
    retry_max_s: float | None = Field(default=None, ge=0)


@dataclass(frozen=True)
class JobLimits:
    """The resolved limits of one job kind."""

    timeout_s: float
    lease_s: float
    max_attempts: int
    retry_base_s: float
    retry_max_s: float


class Settings(BaseSettings):
    """Read once per process through `get_settings()`; tests build their own instances."""

    model_config = SettingsConfigDict(env_prefix="MEMMILL_", extra="ignore")

    # Where things live. No URL means "start an embedded server under data_dir".
    database_url: str | None = None
    redis_url: str | None = None
    data_dir: Path = Field(default_factory=_default_data_dir)
    log_level: str = "INFO"
    # The embedded Postgres's shared_buffers in MB; none: a quarter of the machine's memory,
    # at most 2048 (Postgres's own default of 128 MB holds a tenth of 100k parts' index and rows).
    embedded_pg_buffers_mb: int | None = Field(default=None, ge=16)

    # HTTP API
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8700, ge=1, le=65535)
    bootstrap_api_key: str | None = None
    default_tenant: str = "default"
    db_pool_min_size: int = Field(default=1, ge=0)
    db_pool_max_size: int = Field(default=10, ge=1)
    # How long the API trusts a key it has checked; changes to keys reach it at once all the
    # same (pipeline/key_cache.py). 0 checks every request's key in the database.
    auth_cache_seconds: float = Field(default=60.0, ge=0)

    # Input limits: larger bodies are refused with 413 before anything is written.
    max_content_bytes: int = Field(default=2_000_000, ge=1)
    max_request_bytes: int = Field(default=4_000_000, ge=1)
    # POST /v1/items/batch and /v1/items/upload carry many items or files in one body.
    max_bulk_request_bytes: int = Field(default=100_000_000, ge=1)
    # POST /v1/import: a whole tenant's export (spooled to a temporary file while checked).
    max_import_request_bytes: int = Field(default=2_000_000_000, ge=1)
    max_batch_items: int = Field(default=1000, ge=1)
    max_id_chars: int = Field(default=512, ge=1)
    max_tags: int = Field(default=64, ge=0)

    # Per-tenant limits (pipeline/quotas.py, api/rate_limit.py): what a tenant whose own limit
    # is NULL gets. None is unlimited, which a self-hosted single tenant wants; a hosting
    # operator sets MEMMILL_DEFAULT_LIMIT_ITEMS and the like.
    default_limit_requests_per_minute: int | None = Field(default=None, ge=0, le=2**63 - 1)
    default_limit_items: int | None = Field(default=None, ge=0, le=2**63 - 1)
    default_limit_memories: int | None = Field(default=None, ge=0, le=2**63 - 1)
    default_limit_bytes: int | None = Field(default=None, ge=0, le=2**63 - 1)
    default_limit_jobs: int | None = Field(default=None, ge=0, le=2**63 - 1)

    # Queue and workers
    queue_name: str = "memmill:queue"
    # Fair queueing between tenants (pipeline/fairness.py): one tenant's bulk load does not
    # hold back another's next item. Each job costs its tenant this much virtual time; scores
    # are whole milliseconds, so less than 1 would tie a tenant's jobs.
    fair_queueing: bool = True
    fair_cost_ms: float = Field(default=1.0, ge=1.0, le=60_000.0)
    # Concurrent jobs per worker. Embed jobs mostly wait for the model, and the more of them
    # wait at once, the larger the batch the model gets: 32 ingested SciFact about 20% faster
    # than 8, and 128 (merged calls of ~120 texts instead of ~30) 4% faster than 32.
    # CPU-bound extraction still runs one at a time per worker.
    worker_max_jobs: int = Field(default=128, ge=1)
    # Slots of a worker that no one tenant's jobs may fill while fair queueing is on, so that
    # another tenant's next job finds one free at once instead of waiting for a bulk load's
    # embed jobs to finish. None: an eighth of worker_max_jobs (16 of 128), at least 1.
    worker_reserved_slots: int | None = Field(default=None, ge=0)
    # How long an idle worker waits before it looks at the queue again. arq reads at most
    # max_jobs ids per look, so this also caps how fast short jobs start: 0.5 s held a worker
    # to about 45 short jobs/s. An idle look is one cheap ZRANGEBYSCORE.
    worker_poll_delay_s: float = Field(default=0.05, gt=0, le=5)
    job_timeout_s: float = Field(default=600.0, gt=0)
    lease_s: float = Field(default=60.0, gt=0)
    sweep_interval_s: float = Field(default=5.0, gt=0)
    enqueue_grace_s: float = Field(default=30.0, ge=0)
    # On SIGTERM a worker stops taking jobs and lets running ones finish for this long; what is
    # still running then goes back to the queue at once (not after its lease expires).
    shutdown_grace_s: int = Field(default=25, ge=0)
    worker_heartbeat_s: float = Field(default=5.0, gt=0)

    # Dashboard: how often each view's live snapshot is computed (once, for every open tab),
    # and how long a browser session lasts.
    dashboard_refresh_s: float = Field(default=2.0, ge=0.2, le=60)
    dashboard_session_hours: float = Field(default=12.0, gt=0, le=24 * 30)

    # Retry policy (exponential backoff with full jitter)
    retry_base_s: float = Field(default=30.0, ge=0)
    retry_max_s: float = Field(default=3600.0, ge=0)
    max_attempts: int = Field(default=5, ge=1)
    # Per-kind exceptions, as JSON in MEMMILL_JOB_OVERRIDES (which replaces this default whole):
    # OCR renders and recognises page after page, and a long document takes a while to split.
    job_overrides: dict[str, KindOverride] = Field(
        default_factory=lambda: {
            "ocr": KindOverride(timeout_s=1800, lease_s=120),
            "analyze": KindOverride(timeout_s=1200),
        }
    )

    # Files: what an upload or a fetched document may be, checked before and while extracting.
    max_upload_bytes: int = Field(default=50_000_000, ge=1)
    max_pages: int = Field(default=1000, ge=1)
    max_image_pixels: int = Field(default=50_000_000, ge=1)  # decompression bombs
    max_unzipped_bytes: int = Field(default=200_000_000, ge=1)  # zip bombs (DOCX, PPTX)
    ocr_max_pages: int = Field(default=100, ge=1)
    ocr_dpi: int = Field(default=200, ge=50, le=600)

    # URL fetching (the regularize job): SSRF-guarded, bounded in size and time.
    fetch_timeout_s: float = Field(default=20.0, gt=0)
    fetch_max_bytes: int = Field(default=20_000_000, ge=1)
    fetch_max_redirects: int = Field(default=5, ge=0)
    # Private, loopback and link-local addresses are refused unless listed here (host names,
    # addresses or CIDR blocks, as JSON), e.g. '["10.0.0.0/8", "wiki.internal"]'.
    fetch_allow: list[str] = Field(default_factory=list)

    # Webhooks (pipeline/webhooks.py): their URLs pass the same SSRF guard, under
    # MEMMILL_FETCH_ALLOW. A delivery (connect, send, answer) gets this long, redirects are not
    # followed; a tenant may have this many endpoints.
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120)
    webhook_max_endpoints: int = Field(default=20, ge=1, le=1000)

    # Providers: local by default; OpenAI-compatible, Anthropic or Ollama over HTTP by choice.
    summary_model: str = ""
    summary_base_url: str | None = None
    summary_api_key: SecretStr | None = None
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None
    provider_timeout_s: float = Field(default=60.0, gt=0)
    provider_concurrency: int = Field(default=4, ge=1)  # requests in flight per process
    provider_rate_per_s: float = Field(default=10.0, gt=0)  # requests started per second
    provider_retries: int = Field(default=4, ge=1)  # tries in place before the job backs off
    provider_retry_max_wait_s: float = Field(default=30.0, ge=0)

    embedding_provider: Literal["local", "openai", "ollama"] = "local"
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_dim: int = Field(default=384, ge=1)
    # Texts per forward pass of the local model. Small batches pad less: on 2 cores
    # all-MiniLM-L6-v2 ran SciFact parts 4 at a time about 30% faster than 64 at a time.
    embedding_batch_size: int = Field(default=4, ge=1)
    # Texts per request to an HTTP embedding provider, where each request has a fixed cost.
    embedding_request_size: int = Field(default=64, ge=1)
    # Copies of the local model a process runs side by side, each on one thread of its own;
    # 0: one a core in a worker, one in the API (a query is one text). `memmill up` gives
    # each of its N workers cores/N, so they do not fight over the cores.
    embedding_threads: int = Field(default=0, ge=0)
    # How much lower a worker's local model threads run than the rest of it (Unix nice, per
    # thread on Linux): the model takes the CPU that the event loop, Postgres and the API
    # leave, so a bulk load's embeddings do not slow every other tenant's jobs and searches.
    # 0: the same priority as everything else.
    worker_model_nice: int = Field(default=10, ge=0, le=19)
    summary_provider: Literal["extractive", "openai", "anthropic", "ollama"] = "extractive"
    summary_max_chars: int = Field(default=600, ge=50)

    # Splitting into parts
    part_max_words: int = Field(default=160, ge=8)
    part_overlap_words: int = Field(default=20, ge=0)

    # Search: BM25 and vector candidates, fused, then a blend of rerank signals.
    # 'score' fuses each side's score divided by its best; 'rrf' fuses ranks. On SciFact (300
    # test queries) 'score' gave nDCG@10 0.73 where RRF gave 0.71 (benchmarks/retrieval.py).
    search_fusion: Literal["score", "rrf"] = "score"
    search_alpha: float = Field(default=0.7, ge=0, le=1)  # the vector side's weight
    rrf_k: int = Field(default=60, ge=1)
    # Relevance first: at 0.3 a few past accesses outranked several places of relevance.
    rerank_blend: float = Field(default=0.1, ge=0, le=1)
    recency_half_life_days: float = Field(default=30.0, gt=0)
    search_candidates: int = Field(default=100, ge=1, le=1000)
    # Full-text candidates contain one of the query's rarest words, as many of them as have
    # at most this many parts in all (always at least one that occurs): it bounds the work of a
    # query full of common words without changing the ranking measurably.
    fts_candidate_postings: int = Field(default=1000, ge=1)
    # A hybrid search BM25-scores every vector candidate too, so its full-text side reads
    # fewer postings: this many per result of the page (limit, twice that by item), at most
    # fts_candidate_postings (see search.fts_postings).
    hybrid_postings_per_result: int = Field(default=5, ge=1)
    # A filter that at most this many items pass (or 8·√(the tenant's parts), when larger)
    # is searched exactly: their parts are ranked one by one instead of skipping through the
    # vector index for the few that pass. 0 always skips through the index.
    search_exact_items: int = Field(default=2000, ge=0)
    # A filter on tags alone that at most this many parts pass (or 16·√(the tenant's parts),
    # when larger) is searched exactly: the parts carry their item's tags, and are ranked one
    # by one; more, and the vector side checks HNSW candidates. 0 always checks.
    search_exact_parts: int = Field(default=2000, ge=0)
    # How often a tenant's word statistics (BM25's idf) may be recounted while it changes.
    text_stats_interval_s: float = Field(default=30.0, gt=0)
    hnsw_ef_search: int = Field(default=100, ge=1, le=1000)

    # Agent memory: extraction of memories from sessions, and the decisions on each proposal.
    # 'rules' is the offline extractor (pipeline/memory/extraction/rules.py); a chat model
    # over HTTP extracts and decides when one is named here.
    extraction_provider: Literal["rules", "openai", "anthropic", "ollama"] = "rules"
    extraction_model: str = ""
    extraction_base_url: str | None = None
    extraction_api_key: SecretStr | None = None
    # A session is extracted this long after its last event (or at once on an `ending` event).
    extraction_quiet_s: float = Field(default=30.0, ge=0)
    # A proposal this similar (cosine) to a memory in its scope is the same content: no write.
    dedup_similarity: float = Field(default=0.95, gt=0, le=1)
    # From this similarity on, a proposal is about the same thing as a memory, and the decider
    # chooses between UPDATE, SUPERSEDE and ADD.
    related_similarity: float = Field(default=0.75, gt=0, le=1)

    # Memory upkeep (pipeline/memory/upkeep/): the defaults of every tenant's memory policy,
    # which a tenant's admin may override (PUT /v1/memory-policy). Lifetimes are in days per
    # layer; none is permanent.
    memory_lifetime_days: dict[str, float | None] = Field(default_factory=lambda: {
        "conversation": 30.0, "tool": 14.0, "group": 60.0,
        "pinned": None, "observation": None, "profile": None})
    # Past this many memories, the prune removes the impermanent ones of least value.
    memory_cap: int = Field(default=50_000, gt=0)
    # When consolidation runs, in cron syntax (UTC); the prune runs daily whatever this says.
    memory_schedule: str = "0 3 * * *"
    # Two memories of one scope at least this similar (cosine) are one: the newer is kept.
    memory_merge_similarity: float = Field(default=0.92, gt=0, le=1)
    # From this similarity (below the merge's) two memories are linked `related_to`.
    memory_link_similarity: float = Field(default=0.85, gt=0, le=1)
    # At most this many `related_to` links a consolidation gives one memory.
    memory_links_per_memory: int = Field(default=5, ge=0, le=50)
    # A memory unused this long loses this share of its confidence per run, down to the
    # floor; one still unused at the floor is invalidated. One used this many times since the
    # last run gains the step.
    memory_decay_idle_days: float = Field(default=30.0, gt=0)
    memory_decay_rate: float = Field(default=0.1, gt=0, lt=1)
    memory_confidence_floor: float = Field(default=0.2, ge=0, lt=1)
    memory_reinforce_uses: int = Field(default=3, ge=1)
    memory_reinforce_step: float = Field(default=0.05, gt=0, le=1)
    # Extraction's proposals under this confidence wait in the inbox instead of becoming
    # memories; each time one is heard again its attention rises by the boost. Consolidation
    # promotes those at the promotion attention and drops those that waited the days.
    memory_inbox_below: float = Field(default=0.5, ge=0, le=1)
    memory_inbox_boost: float = Field(default=0.2, gt=0, le=1)
    memory_inbox_promote: float = Field(default=0.6, gt=0, le=1)
    memory_inbox_days: float = Field(default=7.0, gt=0)

    @field_validator("job_overrides")
    @classmethod
    def _known_kinds(cls, value: dict[str, KindOverride]) -> dict[str, KindOverride]:
        unknown = sorted(set(value) - set(JOB_KINDS))
        if unknown:
            raise ValueError(f"unknown job kinds {unknown}; known: {', '.join(JOB_KINDS)}")
        return value

    def job_limits(self, kind: str) -> JobLimits:
        defaults = JobLimits(
            timeout_s=self.job_timeout_s,
            lease_s=self.lease_s,
            max_attempts=self.max_attempts,
            retry_base_s=self.retry_base_s,
            retry_max_s=self.retry_max_s,
        )
        override = self.job_overrides.get(kind)
        if override is None:
            return defaults
        return dataclasses.replace(defaults, **override.model_dump(exclude_none=True))

    def max_attempts_for(self, kind: str) -> int:
        return self.job_limits(kind).max_attempts

    @property
    def api_url(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"


@lru_cache
def get_settings() -> Settings:
    return Settings()


def model_key(settings: Settings) -> str:
    """What identifies an embedding space: the same model name from another provider is
    another space."""
    return f"{settings.embedding_provider}:{settings.embedding_model}"
