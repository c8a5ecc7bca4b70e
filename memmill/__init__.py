"""The `memmill` command line and the embedded runtime that starts everything locally."""
