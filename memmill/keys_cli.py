"""`memmill keys create`: a new API key for a tenant, made in the database directly.

An administrator's command, run where the database is reachable (beside `memmill up`, or
with MEMMILL_DATABASE_URL): it needs no key of its own, so it is how the first operator or
read-only key of an installation is made. The key is printed once; only its hash is kept."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.settings import Settings

console = Console()
keys_app = typer.Typer(no_args_is_help=True, help="Make API keys (for administrators).")


async def create_key(dsn: str, *, tenant: str, name: str, operator: bool,
                     read_only: bool) -> str:
    # Imported here: the CLI must start (and `memmill doctor` report) without asyncpg.
    import asyncpg

    from pipeline import tenants

    conn = await asyncpg.connect(dsn)
    try:
        tenant_id = await tenants.ensure_tenant(conn, tenant)
        key = tenants.new_key()
        await tenants.add_key(conn, tenant_id, key, name=name, operator=operator,
                              read_only=read_only)
        return key
    finally:
        await conn.close()


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for (made if new).")]
    = "default",
    name: Annotated[str, typer.Option(help="A name to tell the key apart in the audit log.")]
    = "default",
    operator: Annotated[bool, typer.Option(
        "--operator", help="Sees every tenant on the dashboard and /metrics; may pause "
                           "job kinds.")] = False,
    read_only: Annotated[bool, typer.Option(
        "--read-only", help="Reads what its role may read; changes nothing (403).")] = False,
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", envvar="MEMMILL_DATA_DIR",
        help="The data directory of the embedded Postgres (when no database URL is set).",
    )] = None,
) -> None:
    """Make a key and print it: it is shown this once."""
    from memmill.embedded import start_postgres

    settings = Settings(data_dir=data_dir) if data_dir is not None else Settings()
    if not 1 <= len(tenant) <= 200 or not tenant.isprintable():
        console.print("[red]a tenant name is 1-200 printable characters[/]")
        raise typer.Exit(2)
    dsn = settings.database_url or start_postgres(settings.data_dir,
                                                  settings.embedded_pg_buffers_mb)
    key = asyncio.run(create_key(dsn, tenant=tenant, name=name, operator=operator,
                                 read_only=read_only))
    role = ("operator" if operator else "tenant") + (", read-only" if read_only else "")
    console.print(f"key for tenant {tenant!r} ({role}), shown once:", highlight=False)
    print(key)
