"""The operator's dashboard: server-rendered pages at /dashboard, live over server-sent events."""
