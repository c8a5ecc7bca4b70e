"""Every example of the README marked `<!-- example: NAME -->` runs, as a user would run it:
a separate Python process with MEMMILL_URL and MEMMILL_API_KEY set, against the real API and a
real worker, and prints what the README says it shows. An example in the README without an
entry in `EXPECTED` fails, so a new example cannot go untested."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
MARKED = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)
# What each example's output must contain.
EXPECTED: dict[str, list[str]] = {
    "python-client": ["notes/bread", "window seat", "Lisbon"],
    "python-client-async": ["1 The build runs on Python 3.11", "404"],
    "mcp-client": ["'remember'", "window seat", "stdio"],
    "langgraph-store": ["Ana prefers the window seat", "'Ana is vegetarian'",
                        "[('memories', 'ana')]"],
    "langchain-retriever": ["notes/bread", "['Ana prefers the window seat']"],
}


def examples() -> dict[str, str]:
    found = MARKED.findall(README.read_text(encoding="utf-8"))
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), f"example names repeat: {names}"
    return dict(found)


def test_every_example_is_checked() -> None:
    assert set(examples()) == set(EXPECTED)


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[None]:
    from workers.main import build_worker

    running = build_worker(settings, sweep=False, poll_delay_s=0.02)
    task = asyncio.create_task(running.main())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await running.close()


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_example_runs(name: str, api_url: str, tenant: tuple[int, str],
                            worker: None) -> None:
    env = {**os.environ, "MEMMILL_URL": api_url, "MEMMILL_API_KEY": tenant[1]}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", examples()[name], env=env, cwd=README.parent,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    text = output.decode()
    assert process.returncode == 0, text
    for expected in EXPECTED[name]:
        assert expected in text, (expected, text)
