from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter

from api.deps import CurrentTenant, PoolDep
from api.schemas import AttemptPublic, JobPublic
from pipeline.db import Q
from pipeline.errors import NotFound

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get("/{job_id}", response_model=JobPublic)
async def get_job(job_id: UUID, tenant: CurrentTenant, pool: PoolDep) -> JobPublic:
    row = await pool.fetchrow(Q["jobs.get"], tenant, job_id)
    if row is None:
        raise NotFound(f"no job with id {job_id}")
    history = await pool.fetch(Q["jobs.attempts"], tenant, job_id)
    duration = None
    if row["started_at"] and row["finished_at"]:
        duration = (row["finished_at"] - row["started_at"]).total_seconds() * 1000
    fields = {k: row[k] for k in JobPublic.model_fields if k not in ("duration_ms", "history")}
    return JobPublic(
        **fields, duration_ms=duration, history=[AttemptPublic(**dict(h)) for h in history]
    )
