"""memmill's core: storage, jobs, stages, providers and search. Knows nothing of HTTP or arq."""
