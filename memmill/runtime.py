"""Where a running `memmill up` tells other processes how to reach it: `runtime.json` (its
URLs, with their passwords, mode 0600) and `api_key` in the data directory. Nothing here
imports a database or HTTP client, so the CLI can read them (and `memmill doctor` can run)
even when such a package is missing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.settings import Settings

RUNTIME_FILE = "runtime.json"
KEY_FILE = "api_key"


def key_file(settings: Settings) -> Path:
    return settings.data_dir / KEY_FILE


def read_local_key(settings: Settings) -> str | None:
    path = key_file(settings)
    return path.read_text().strip() if path.exists() else None


def runtime_file(settings: Settings) -> Path:
    return settings.data_dir / RUNTIME_FILE


def read_runtime(settings: Settings) -> dict[str, str] | None:
    """What a running `memmill up` published: URLs for extra workers and for the CLI."""
    path = runtime_file(settings)
    try:
        info = json.loads(path.read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return info
