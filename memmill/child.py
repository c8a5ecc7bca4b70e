"""One process that `memmill up` runs (the API or a worker): its output passed through and
remembered, and the policy that decides when it is restarted and when to give up.

A child that dies while memmill starts is most often broken for good (a missing package, a port
taken, a bad setting), and restarting it forever only repeats its traceback. A child that dies
later, after it had worked, is more likely a passing fault, and is restarted with backoff."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

TAIL_LINES = 40
RESTART_BASE_S = 1.0
RESTART_MAX_S = 60.0
# A child that ran this long before dying is treated as having worked: its backoff starts over.
STABLE_AFTER_S = 60.0


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[str] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restart_at: float | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    output_done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Start the process; its stderr is copied to ours line by line and its last lines kept,
        so a death can be explained by its last line without a second traceback."""
        self.tail.clear()
        self.output_done = threading.Event()
        self.process = subprocess.Popen(
            self.argv, env=self.env, stderr=subprocess.PIPE, text=True, errors="replace",
            bufsize=1,
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        threading.Thread(target=self._copy_stderr, args=(self.process, self.output_done),
                         daemon=True).start()

    def _copy_stderr(self, process: subprocess.Popen[str], done: threading.Event) -> None:
        assert process.stderr is not None
        try:
            for line in process.stderr:
                self.tail.append(line.rstrip("\n"))
                sys.stderr.write(line)
                sys.stderr.flush()
        finally:
            done.set()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def last_error_line(self) -> str:
        """The line that names the error: the last non-blank line of its output, which for a
        Python traceback (plain or Rich) is `SomeError: message`."""
        # The copying thread may still be reading the dead process's last lines.
        self.output_done.wait(timeout=2.0)
        for line in reversed(self.tail):
            text = line.strip().strip("│").strip()
            if text and not set(text) <= set("─╭╮╰╯ "):
                return text
        return f"exited with status {self.exit_code()} and printed nothing"

    def schedule_restart(self, now: float) -> float:
        """Decide when to start again after a death at `now`; returns the delay in seconds.

        Backoff doubles with each quick death, from 1 s up to a minute, and starts over once
        the child has run for a minute."""
        if now - self.started_at >= STABLE_AFTER_S:
            self.quick_deaths = 0
        self.quick_deaths += 1
        delay = min(RESTART_BASE_S * 2 ** (self.quick_deaths - 1), RESTART_MAX_S)
        self.restart_at = now + delay
        return delay


def advice(last_line: str) -> str:
    """What to do about a start-up failure, from the line that names the error."""
    if last_line.startswith(("ModuleNotFoundError", "ImportError")):
        return (
            "A Python package memmill needs is missing from this environment. Install the "
            "locked dependencies again: `./dev setup` in a checkout, or "
            "`pip install --require-hashes -r requirements.lock && pip install -e .`. "
            "`memmill doctor` lists every package it cannot import."
        )
    if "address already in use" in last_line.lower():
        return "Another process holds that port: stop it, or pass `--port`."
    return ("Read the error above; `memmill doctor` checks the installation, the model, "
            "Postgres, Redis and the data directory.")
