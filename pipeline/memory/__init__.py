"""Agent memory: scopes, memories with their history, sessions of events, extraction of
memories from sessions, search over both, and context within a token budget."""
