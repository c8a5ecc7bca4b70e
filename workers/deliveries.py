"""Taking deliveries off the queue: a whole look's worth in one Redis round trip.

arq starts a job with a WATCH transaction of its own (in-progress marker, queue score, then
the marker set), three or four round trips a job, one job after another. A worker that starts
a hundred jobs at once (a merged embedding call just ended, and its slots are free) spent
up to 2 s in one look at the queue on a busy event loop, and a job put on the queue meanwhile
waited for the next look: another tenant's single item lost that much at each of its stages.

This script does what arq's transaction does, for many deliveries at once, atomically: a
delivery is taken when no worker holds it (no in-progress marker), it is still in the queue,
and it is due; taking it sets the marker, with arq's expiry, as arq would.
"""

from __future__ import annotations

from collections.abc import Sequence

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix

TAKE = """
local now, ttl = tonumber(ARGV[1]), ARGV[2]
local taken = {}
for i = 3, #ARGV do
  local marker = KEYS[i - 1]
  if redis.call('EXISTS', marker) == 0 then
    local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if score and tonumber(score) <= now then
      redis.call('SET', marker, '1', 'PX', ttl)
      taken[#taken + 1] = ARGV[i]
      taken[#taken + 1] = score
    end
  end
end
return taken
"""


async def take(redis: ArqRedis, queue_name: str, queue_job_ids: Sequence[str], *,
               now_ms: int, in_progress_ms: int) -> list[tuple[str, int]]:
    """The deliveries taken, with their scores, in the order asked; the others are held by
    another worker, gone, or not due yet."""
    if not queue_job_ids:
        return []
    script = redis.register_script(TAKE)
    keys = [queue_name, *(in_progress_key_prefix + job_id for job_id in queue_job_ids)]
    flat = await script(keys=keys, args=[now_ms, in_progress_ms, *queue_job_ids])
    return [(flat[i].decode() if isinstance(flat[i], bytes) else flat[i], int(float(flat[i + 1])))
            for i in range(0, len(flat), 2)]
