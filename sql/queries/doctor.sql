-- What `memmill doctor` asks Postgres besides its version (asyncpg reads that at connect).

-- The pgvector version created in this database, and the one the server could create
-- (`memmill migrate` creates it): a fresh database has only the second.
-- name: pgvector
SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS installed,
       (SELECT default_version FROM pg_available_extensions WHERE name = 'vector') AS available;
