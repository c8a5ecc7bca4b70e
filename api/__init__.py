"""The HTTP API: FastAPI routes over `pipeline`. It enqueues through `pipeline.jobs`."""
