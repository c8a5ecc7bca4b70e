"""One module per stage. A stage is a pure function of its inputs and clients; it never touches
the queue or the ledger (that is `pipeline.tasks` and `pipeline.runner`)."""
