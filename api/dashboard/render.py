"""The dashboard's templates and the filters that format its figures. Jinja2 escapes every
value it puts into a page: a job's error or an item id is shown as text, never as markup."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi.templating import Jinja2Templates

HERE = Path(__file__).resolve().parent
ASSET_VERSION = str(int(max(p.stat().st_mtime for p in (HERE / "static").iterdir())))

NAV = (
    ("/dashboard", "Overview"), ("/dashboard/jobs", "Jobs"),
    ("/dashboard/dead-letters", "Dead letters"), ("/dashboard/workers", "Workers"),
    ("/dashboard/queues", "Queues"), ("/dashboard/providers", "Providers"),
    ("/dashboard/memory-runs", "Memory"), ("/dashboard/audit", "Actions"),
)


def number(value: float | int | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def rate(value: float | None) -> str:
    return "–" if value is None else (f"{value:.1f}" if value < 10 else f"{value:,.0f}")


def ms(value: float | None) -> str:
    if value is None:
        return "–"
    # The figure is a histogram bucket's upper bound (pipeline.aggregates): "at most".
    if value < 1000:
        return f"≤{value:.0f} ms" if value >= 1 else "≤1 ms"
    return f"≤{duration_s(value / 1000)}"


def duration_s(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value // 60:.0f} min {value % 60:.0f} s"
    if value < 86400:
        return f"{value // 3600:.0f} h {value % 3600 // 60:.0f} min"
    return f"{value // 86400:.0f} d {value % 86400 // 3600:.0f} h"


def ago(value: datetime | None) -> str:
    if value is None:
        return "–"
    seconds = (datetime.now(UTC) - value).total_seconds()
    return "just now" if seconds < 1 else f"{duration_s(seconds)} ago"


def stamp(value: datetime | None) -> str:
    return "–" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%H:%M UTC")


def item_url(tenant_id: int, item_id: str) -> str:
    return f"/dashboard/items/{quote(item_id, safe='')}?tenant={tenant_id}"


def static(name: str) -> str:
    return f"/dashboard/static/{name}?v={ASSET_VERSION}"


templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters.update(number=number, percent=percent, rate=rate, ms=ms,
                             duration_s=duration_s, ago=ago, stamp=stamp, clock=clock)
templates.env.globals.update(item_url=item_url, static=static, nav=NAV)


def fragment(name: str, **context: Any) -> str:
    """A part of a page, rendered once and sent to every open tab (see api.dashboard.live)."""
    return templates.env.get_template(name).render(**context)
