"""`memmill jobs …`, `memmill dead-letters …` and `memmill queues …`: the operator's view
of the job ledger."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:  # imported where it is used: `memmill doctor` runs without httpx
    from memmill.client import Memmill

console = Console()
err = Console(stderr=True)

jobs_app = typer.Typer(no_args_is_help=True, help="List, inspect, retry and cancel jobs.")
dead_app = typer.Typer(no_args_is_help=True, help="Inspect and replay dead letters.")
queues_app = typer.Typer(no_args_is_help=True,
                         help="Job kinds as queues: depth, pause and resume (operators).")

UrlOpt = Annotated[str | None, typer.Option("--url", envvar="MEMMILL_URL", help="API URL.")]
KeyOpt = Annotated[str | None, typer.Option("--key", envvar="MEMMILL_API_KEY", help="API key.")]
T = TypeVar("T")


def _call(url: str | None, key: str | None, fn: Callable[[Memmill], T]) -> T:
    """Run `fn` with a client of the instance the user means (memmill.cli.make_client); a
    refusal is the server's message on stderr and exit 1."""
    from memmill.cli import make_client
    from memmill.client import MemmillError

    with make_client(url, key) as client:
        try:
            return fn(client)
        except MemmillError as exc:
            err.print(f"[red]error:[/] {escape(exc.detail)}")
            raise typer.Exit(1) from None


def _short(text: str | None, width: int = 60) -> str:
    text = (text or "").replace("\n", " ")
    return escape(text if len(text) <= width else text[: width - 1] + "…")


@jobs_app.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option(help="waiting, queued, running, done, dead, "
                                               "cancelled")] = None,
    kind: Annotated[str | None, typer.Option(help="Job kind, e.g. embed.")] = None,
    item: Annotated[str | None, typer.Option("--item", help="Item id.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Jobs, newest first."""
    page = _call(url, key, lambda c: c.jobs.list(status=status or None, kind=kind or None,
                                                 item_id=item or None, limit=limit))
    table = Table("id", "kind", "item", "status", "tries", "created", "last error")
    for j in page.data:
        table.add_row(str(j.id), j.kind, _short(j.item_id, 30), j.status,
                      f"{j.attempts}/{j.max_attempts}", j.created_at.isoformat()[:19],
                      _short(j.last_error, 40))
    console.print(table)
    console.print(f"{len(page.data)} of {page.count}")


@jobs_app.command("show")
def jobs_show(job_id: str, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """One job with its attempt history."""
    console.print_json(_call(url, key, lambda c: c.jobs.get(job_id)).model_dump_json())


@jobs_app.command("stats")
def jobs_stats(url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Counts by status and kind, due jobs, the oldest due job, live workers; an operator's
    key also sees the whole queue's depth and each worker."""
    stats = _call(url, key, lambda c: c.jobs.stats())
    table = Table("kind", *sorted(stats.by_status))
    for kind, counts in sorted(stats.by_kind.items()):
        table.add_row(kind, *(str(counts.get(s, 0)) for s in sorted(stats.by_status)))
    console.print(table)
    age = stats.oldest_queued_age_s
    line = (f"due: {stats.due}   oldest due: {'-' if age is None else f'{age:.1f}s ago'}   "
            f"workers alive: {stats.workers_alive}")
    if stats.workers is not None:  # what an operator's key is shown
        line += f"   queue depth: {stats.queue_depth} (all tenants)"
    console.print(line)
    for w in stats.workers or []:
        console.print(f"  {w.id}  last seen {w.last_seen_at.isoformat()[:19]}")


@jobs_app.command("retry")
def jobs_retry(job_id: str, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Run a dead, cancelled or backing-off job now with fresh attempts."""
    job = _call(url, key, lambda c: c.jobs.retry(job_id))
    console.print(f"{job.id}  {job.kind}  {job.status}")


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Cancel a job that has not started."""
    job = _call(url, key, lambda c: c.jobs.cancel(job_id))
    console.print(f"{job.id}  {job.kind}  {job.status}")


@dead_app.command("list")
def dead_list(
    kind: Annotated[str | None, typer.Option(help="Job kind.")] = None,
    item: Annotated[str | None, typer.Option("--item", help="Item id.")] = None,
    replayed: Annotated[bool | None, typer.Option("--replayed/--pending",
                                                  help="Only replayed / not replayed.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
    url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Dead letters, newest first."""
    page = _call(url, key, lambda c: c.dead_letters.list(kind=kind, item_id=item,
                                                         replayed=replayed, limit=limit))
    table = Table("id", "kind", "item", "tries", "permanent", "replayed", "reason")
    for d in page.data:
        table.add_row(str(d.id), d.kind, _short(d.item_id, 30), str(d.attempts),
                      "yes" if d.permanent else "no", "yes" if d.replayed_at else "no",
                      _short(d.reason))
    console.print(table)
    console.print(f"{len(page.data)} of {page.count}")


@dead_app.command("show")
def dead_show(dead_letter_id: int, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """One dead letter with every attempt's error and traceback."""
    letter = _call(url, key, lambda c: c.dead_letters.get(dead_letter_id))
    console.print_json(letter.model_dump_json())


@dead_app.command("replay")
def dead_replay(
    dead_letter_id: Annotated[int | None, typer.Argument(help="One dead letter; omit and "
                                                         "pass --all or a filter.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every dead letter not replayed.")] = False,
    kind: Annotated[str | None, typer.Option(help="Only this job kind.")] = None,
    item: Annotated[str | None, typer.Option("--item", help="Only this item.")] = None,
    url: UrlOpt = None, key: KeyOpt = None,
) -> None:
    """Replay dead letters through the normal path with fresh attempts."""
    if dead_letter_id is None and not (all_ or kind or item):
        err.print("[red]error:[/] name a dead letter id, or pass --all, --kind or --item")
        raise typer.Exit(2)
    result = _call(url, key, lambda c: c.dead_letters.replay(dead_letter_id)
                   if dead_letter_id is not None
                   else c.dead_letters.replay_all(kind=kind or None, item_id=item or None))
    console.print(f"replayed {result.replayed} job(s)")


@queues_app.command("list")
def queues_list(url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Each job kind: paused or not, and this tenant's queued, retrying, waiting and running
    jobs."""
    result = _call(url, key, lambda c: c.queues.list())
    table = Table("kind", "state", "queued", "retrying", "waiting", "running", "oldest due")
    for q in result.data:
        age = q.oldest_due_age_s
        table.add_row(q.kind, "paused" if q.paused else "running", str(q.queued),
                      str(q.retrying), str(q.waiting), str(q.running),
                      "-" if age is None else f"{age:.0f} s")
    console.print(table)


@queues_app.command("pause")
def queues_pause(kind: str, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Stop workers taking KIND, for every tenant; its jobs wait in the ledger."""
    result = _call(url, key, lambda c: c.queues.pause(kind))
    console.print(f"{kind} paused" if result.changed else f"{kind} was paused already")


@queues_app.command("resume")
def queues_resume(kind: str, url: UrlOpt = None, key: KeyOpt = None) -> None:
    """Let workers take KIND again."""
    result = _call(url, key, lambda c: c.queues.resume(kind))
    console.print(f"{kind} resumed" if result.changed else f"{kind} was not paused")
