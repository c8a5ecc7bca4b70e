"""arq workers: each job function is a thin wrapper over `pipeline.runner.run_job`."""
