"""Memory that keeps itself: runs of upkeep steps over a tenant's memories, each step a job in
the ledger (with its backoff and dead letter), every change recorded and reversible.

- prune: expired memories go, and past the tenant's cap the impermanent ones of least value;
- merge: memories of one scope that say the same thing become one, the others superseded;
- decay: confidence falls for memories nobody uses and rises for those used often; a memory
  left at the floor is invalidated;
- link: `related_to` between similar memories, and an observation for each finished session.

A run is requested (POST /v1/consolidation/runs) or started by the tenant's schedule
(`schedule.py`, from the sweeper); `runs.py` starts, reports and undoes runs, `steps.py` holds
the jobs.
"""
