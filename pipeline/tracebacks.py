"""Errors and tracebacks as the ledger stores them: without the server's paths.

A job's error, traceback and dead-letter reason are shown to the tenant whose job it was, and a
traceback names every file it passes through: `/home/deploy/memmill/pipeline/...`,
`/opt/venv/lib/python3.11/site-packages/...`. They are scrubbed when they are written, so no
stored row holds a path (a backup, a psql session or a future endpoint cannot show one), and
the API scrubs what it shows once more, for rows written before this existed. The scrubbing is
idempotent, so the second pass changes nothing in a row the first pass wrote.

Our own files keep their place in the source tree (`pipeline/stages/fetch.py`), installed
packages become `<lib>/…`, the standard library `<python>/…`, and any other absolute path keeps
only its file name (`…/model.bin`): the line of a traceback stays as useful, the host's layout
(user names, deploy directories, the Python build) is gone.
"""

from __future__ import annotations

import re
import site
import sysconfig
import traceback
from functools import cache
from pathlib import Path

MAX_TRACEBACK_CHARS = 8000
LIB = "<lib>/"
PYTHON = "<python>/"

# Any installation's packages and standard library, for text written on another machine.
_ANY_PACKAGES = re.compile(r"""[^\s"'()\[\]<>]*/(?:site|dist)-packages/""")
_ANY_STDLIB = re.compile(r"""[^\s"'()\[\]<>]*/lib/python3\.\d+/""")
# Whatever absolute path is left, down to its last name. Not a path inside a URL or a relative
# one: the slash must not follow a word character, a dot, a colon or another slash.
_ANY_ABSOLUTE = re.compile(r"""(?<![\w.:/~<>…-])/(?:[^\s/"'<>()\[\],:;]+/)+""")


@cache
def _roots() -> tuple[tuple[str, str], ...]:
    """This installation's directories and what each becomes, longest first (the virtual
    environment usually lies inside the source tree)."""
    source = str(Path(__file__).resolve().parent.parent)
    roots: dict[str, str] = {}
    paths = sysconfig.get_paths()
    for name in ("stdlib", "platstdlib"):
        roots[paths[name]] = PYTHON
    for packages in (paths["purelib"], paths["platlib"], *site.getsitepackages(),
                     site.getusersitepackages()):
        roots[packages] = LIB
    roots[source] = ""
    ordered = sorted(roots.items(), key=lambda pair: len(pair[0]), reverse=True)
    return tuple((root.rstrip("/") + "/", shown) for root, shown in ordered)


def scrub_paths(text: str) -> str:
    """`text` with every absolute path of this or another machine made relative (see above)."""
    for root, shown in _roots():
        text = text.replace(root, shown)
    text = _ANY_PACKAGES.sub(LIB, text)
    text = _ANY_STDLIB.sub(PYTHON, text)
    return _ANY_ABSOLUTE.sub("…/", text)


def format_error(exc: BaseException) -> str:
    """`Type: message`, the one line an attempt's error and a job's last error show."""
    return scrub_paths(f"{type(exc).__name__}: {exc}")


def format_traceback(exc: BaseException) -> str:
    """The whole traceback, chained causes included, scrubbed, and its last part only when it
    is long: the innermost frames and the message are what explain a failure."""
    return scrub_paths("".join(traceback.format_exception(exc)))[-MAX_TRACEBACK_CHARS:]
