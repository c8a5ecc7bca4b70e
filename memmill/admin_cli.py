"""`memmill tenants …` and `memmill keys …`: managing tenants (operators) and a tenant's keys
(its admins, or operators for any tenant), through the API like every client command, so the
same role checks and audit log apply. Beside `memmill up` they use the instance's own
operator key; elsewhere --url/--key or MEMMILL_URL/MEMMILL_API_KEY."""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memmill.ops import KeyOpt, UrlOpt, _call

if TYPE_CHECKING:  # imported where it is used: `memmill doctor` runs without httpx
    from api.admin_schemas import KeyMade, KeyPublic, KeysPage, TenantPublic
    from api.usage_schemas import TenantLimitsPublic
    from memmill.client import Memmill

console = Console()
err = Console(stderr=True)
tenants_app = typer.Typer(no_args_is_help=True, help="Tenants (operators).")
keys_app = typer.Typer(no_args_is_help=True,
                       help="A tenant's API keys (its admins; operators for any tenant).")

TenantArg = Annotated[str, typer.Argument(help="The tenant's id or name.")]
TenantOpt = Annotated[str | None, typer.Option(
    "--tenant", help="The tenant's id or name (operators; default: the key's own).")]


def _tenant_id(client: Memmill, tenant: str) -> int:
    """A tenant named by its id or by its name (an unknown name is the server's 404)."""
    if tenant.isdigit():
        return int(tenant)
    return client.tenants.list(name=tenant).data[0].id


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M")


def _show_tenant(tenant: TenantPublic) -> None:
    console.print(f"tenant {tenant.id} {escape(tenant.name)!r}: {tenant.status}, "
                  f"{tenant.active_keys} active key(s)", highlight=False)
    erasure = tenant.erasure
    if erasure:
        console.print(f"erased: {erasure['rows_removed']} rows and "
                      f"{erasure['redis_keys_removed']} Redis keys removed; recount: "
                      f"{erasure['rows_left']} rows, {erasure['redis_keys_left']} keys left",
                      highlight=False)
        for table, count in sorted(erasure["removed"].items()):
            console.print(f"  {table}: {count}", highlight=False)


@tenants_app.command("create")
def tenants_create(name: str, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Make a tenant and print its first admin key (shown this once)."""
    made = _call(url, key, lambda c: c.tenants.create(name))
    console.print(f"tenant {made.tenant.id} {escape(name)!r} made; its admin key, "
                  "shown once:", highlight=False)
    print(made.key)


@tenants_app.command("list")
def tenants_list(
    status: Annotated[str | None, typer.Option(
        help="active, suspended, deleting or deleted")] = None,
    url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Every tenant, with its status and active keys."""
    page = _call(url, key, lambda c: c.tenants.list(status=status, limit=500))
    table = Table("id", "name", "status", "keys", "created")
    for t in page.data:
        table.add_row(str(t.id), escape(t.name), t.status, str(t.active_keys),
                      _when(t.created_at))
    console.print(table)


@tenants_app.command("show")
def tenants_show(tenant: TenantArg, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """A tenant; once deleted, what its erasure removed."""
    _show_tenant(_call(url, key, lambda c: c.tenants.get(_tenant_id(c, tenant))))


@tenants_app.command("suspend")
def tenants_suspend(tenant: TenantArg, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Refuse every key of the tenant at once; its data stays."""
    _show_tenant(_call(url, key, lambda c: c.tenants.suspend(_tenant_id(c, tenant))))


@tenants_app.command("resume")
def tenants_resume(tenant: TenantArg, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Accept the tenant's keys again."""
    _show_tenant(_call(url, key, lambda c: c.tenants.resume(_tenant_id(c, tenant))))


@tenants_app.command("delete")
def tenants_delete(
    tenant: TenantArg,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    wait: Annotated[bool, typer.Option(help="Wait for the erasure and print its report.")]
    = True,
    url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Erase a tenant: its keys are refused at once, then a job removes every row, vector and
    Redis key of it and recounts."""
    if not yes and not typer.confirm(f"erase tenant {tenant} and everything it stored?"):
        raise typer.Exit(1)

    def run(client: Memmill) -> TenantPublic:
        tenant_id = _tenant_id(client, tenant)
        started = client.tenants.delete(tenant_id)
        console.print(f"tenant {tenant_id} is being erased (job {started.job_id})",
                      highlight=False)
        state = started.tenant
        while wait and state.status != "deleted":
            time.sleep(0.5)
            state = client.tenants.get(tenant_id)
        return state

    _show_tenant(_call(url, key, run))


LIMITS = ("requests_per_minute", "items", "memories", "bytes", "jobs")
LimitOpt = Annotated[int | None, typer.Option(min=0)]


@tenants_app.command("limits")
def tenants_limits(
    tenant: TenantArg,
    requests_per_minute: LimitOpt = None, items: LimitOpt = None, memories: LimitOpt = None,
    bytes_: Annotated[int | None, typer.Option("--bytes", min=0)] = None,
    jobs: LimitOpt = None,
    default: Annotated[list[str], typer.Option(
        "--default", help="Put this limit back to the installation's default (repeatable).")]
    = [],  # noqa: B006 - typer reads the default, never mutates it
    url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Show a tenant's limits, or change those named (the others stay)."""
    asked = {"requests_per_minute": requests_per_minute, "items": items,
             "memories": memories, "bytes": bytes_, "jobs": jobs}
    unknown = set(default) - set(LIMITS)
    if unknown:
        err.print(f"[red]error:[/] --default takes {', '.join(LIMITS)}")
        raise typer.Exit(2)

    def run(client: Memmill) -> TenantLimitsPublic:
        tenant_id = _tenant_id(client, tenant)
        current = client.tenants.limits(tenant_id)
        if all(v is None for v in asked.values()) and not default:
            return current
        wanted = {name: None if name in default else
                  asked[name] if asked[name] is not None else getattr(current.limits, name)
                  for name in LIMITS}
        return client.tenants.set_limits(tenant_id, wanted)

    shown = _call(url, key, run)
    table = Table("limit", "tenant's own", "applies")
    for name in LIMITS:
        own, applies = getattr(shown.limits, name), getattr(shown.effective, name)
        table.add_row(name, "default" if own is None else str(own),
                      "none" if applies is None else str(applies))
    console.print(table)


def _key_table(rows: list[KeyPublic]) -> Table:
    table = Table("id", "prefix", "name", "role", "bound to", "last used", "expires", "state")
    for k in rows:
        bound = ", ".join(f"{what} {escape(value)}" for what, value in
                          (("user", k.user_id), ("agent", k.agent_id)) if value) or "-"
        state = ("revoked" if k.revoked_at else "active" if k.active else "expired")
        table.add_row(str(k.id), k.prefix, escape(k.name), k.role, bound,
                      _when(k.last_used_at), _when(k.expires_at), state)
    return table


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="A name to tell the key apart (audit log).")]
    = "default",
    role: Annotated[str, typer.Option(help="read, write, admin or operator.")] = "write",
    user_id: Annotated[str | None, typer.Option("--user-id", help="Bind to this user.")]
    = None,
    agent_id: Annotated[str | None, typer.Option("--agent-id", help="Bind to this agent.")]
    = None,
    tenant: TenantOpt = None,
    url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Make a key and print it: it is shown this once."""

    def run(client: Memmill) -> KeyMade:
        tenant_id = _tenant_id(client, tenant) if tenant else None
        # role goes as given: the server's 422 names the roles it takes
        return client.keys.create(name=name, role=role, user_id=user_id,
                                  agent_id=agent_id, tenant_id=tenant_id)

    made = _call(url, key, run)
    info = made.key_info
    console.print(f"key {info.id} {escape(name)!r} ({info.role}) for tenant "
                  f"{info.tenant_id}, shown once:", highlight=False)
    print(made.key)


@keys_app.command("list")
def keys_list(
    all_keys: Annotated[bool, typer.Option("--all", help="Also revoked and expired keys.")]
    = False,
    tenant: TenantOpt = None, url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """The tenant's keys (never the keys themselves: a prefix tells them apart)."""

    def run(client: Memmill) -> KeysPage:
        tenant_id = _tenant_id(client, tenant) if tenant else None
        return client.keys.list(tenant_id=tenant_id, include_inactive=all_keys or None,
                                limit=500)

    console.print(_key_table(_call(url, key, run).data))


@keys_app.command("revoke")
def keys_revoke(key_id: int, tenant: TenantOpt = None, url: UrlOpt = None,
                key: KeyOpt = None) -> None:
    """Refuse a key from now on, in every API process at once."""
    row = _call(url, key, lambda c: c.keys.revoke(
        key_id, tenant_id=_tenant_id(c, tenant) if tenant else None))
    console.print(f"key {row.id} {escape(row.name)!r} revoked", highlight=False)


@keys_app.command("rotate")
def keys_rotate(
    key_id: int,
    grace: Annotated[int, typer.Option(
        "--grace", min=0, help="Seconds the old key keeps working.")] = 3600,
    tenant: TenantOpt = None, url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Replace a key: prints the new one (shown once); the old one works for --grace seconds."""
    made = _call(url, key, lambda c: c.keys.rotate(
        key_id, grace_s=grace, tenant_id=_tenant_id(c, tenant) if tenant else None))
    # The time as the API wrote it (`…Z`), as this line always showed it.
    refused_from = made.old.model_dump(mode="json")["expires_at"]
    console.print(f"key {key_id} rotated to key {made.key_info.id}; the old key is "
                  f"refused from {refused_from}. The new key, shown once:", highlight=False)
    print(made.key)
