"""Files only their owner may read: the secrets memmill generates (the embedded servers'
passwords) and the files that carry them (the API key, runtime.json with its URLs)."""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, from its first byte (it holds URLs with secrets)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def read_or_create_secret(path: Path) -> str:
    """The secret in `path`, made on first use: 32 random bytes, URL-safe (it goes in URLs).

    The file is created with mode 0600 and complete before it has its name (a private temp
    file, then a hard link that fails if another process got there first), so it is never
    readable by others, empty or half-written."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.link(temp, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            temp.unlink(missing_ok=True)
    if path.stat().st_mode & 0o077:
        log.warning("%s was readable by others; making it private", path)
        path.chmod(0o600)
    secret = path.read_text().strip()
    if not secret:
        raise RuntimeError(f"{path} is empty; delete it and memmill makes a new secret")
    return secret
