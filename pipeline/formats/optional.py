"""The packages only some jobs need, imported when such a job runs, never at start-up.

A worker without, say, the OCR engine still starts and processes every text, HTML page and
born-digital PDF; only the jobs that need the engine fail, at once (a PermanentError: a retry
would find the same installation) and with a message that names the pip package and the fix.
`memmill doctor` checks the same table, so the two never disagree about what is missing.

Typical use, inside the function that needs the package::

    pdfium = load(PDF)                    # the module, or MissingDependency
    raw = load(PDF, "pypdfium2.raw")      # a submodule of the same package
    load(IMAGES)                          # the guard, then names as usual: this import
    from PIL import Image                 # can no longer fail

The helpers of such a function import the same names again, locally: a lookup in
`sys.modules` once the guarded import succeeded.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from pipeline.errors import MissingDependency

SETUP = "./dev setup"


@dataclass(frozen=True)
class Package:
    """One pip package: what it is imported as, and what memmill needs it for."""

    package: str  # the name pip knows
    module: str  # the top-level import
    what: str  # the subject of the message: "OCR" needs the package…
    purpose: str  # what fails without it, for `memmill doctor`'s table

    @property
    def fix(self) -> str:
        return f"run {SETUP} (or pip install {self.package})"


OCR = Package("rapidocr-onnxruntime", "rapidocr_onnxruntime", "OCR",
              "OCR of scanned pages and images")
PDF = Package("pypdfium2", "pypdfium2", "PDF extraction",
              "PDF text, and scanned PDF pages rendered for OCR")
DOCX = Package("python-docx", "docx", "DOCX extraction", "DOCX files")
PPTX = Package("python-pptx", "pptx", "PPTX extraction", "PPTX files")
IMAGES = Package("pillow", "PIL", "image extraction",
                 "images (size, camera, date) and OCR of them")
AUDIO = Package("tinytag", "tinytag", "audio extraction", "audio files (tags, duration)")
HTML = Package("trafilatura", "trafilatura", "HTML extraction",
               "HTML pages and URLs (main text, title, language)")
LXML = Package("lxml", "lxml", "HTML extraction", "HTML pages, DOCX and PPTX (XML parsing)")
HTML_CLEAN = Package("lxml_html_clean", "lxml_html_clean", "HTML extraction",
                     "HTML pages (trafilatura imports it to strip boilerplate)")
FILE_TYPES = Package("filetype", "filetype", "file type detection",
                     "uploaded files and URLs: their type, from their bytes")
ENCODINGS = Package("charset-normalizer", "charset_normalizer", "encoding detection",
                    "text files that are not UTF-8 (their encoding is guessed)")

OPTIONAL: tuple[Package, ...] = (
    FILE_TYPES, ENCODINGS, HTML, LXML, HTML_CLEAN, PDF, DOCX, PPTX, IMAGES, AUDIO, OCR,
)
_BY_MODULE = {entry.module: entry for entry in OPTIONAL}


def load(entry: Package, module: str | None = None) -> ModuleType:
    """Import `module` (default: the package's own) for `entry`, or raise MissingDependency
    saying which package is missing, what needs it, and how to install it."""
    try:
        return importlib.import_module(module or entry.module)
    except ImportError as err:
        raise MissingDependency(missing_message(entry, err)) from err


@dataclass(frozen=True)
class Missing:
    """Why a package cannot be used, and what to do about it."""

    package: Package  # the one to install (a dependency of the one asked for, at times)
    reason: str  # "not installed", or "installed but cannot be imported (…)"
    fix: str


def diagnose(entry: Package, err: ImportError) -> Missing:
    """A package that is there but fails to import (a dependency of its own is missing, a
    native library does not load) is told apart, with the import's own words: reinstalling is
    the fix then, and the words say what is broken. A missing dependency that is itself in the
    table (python-docx without lxml) is named as the package to install."""
    top = (getattr(err, "name", None) or "").split(".")[0]
    culprit = entry if top == entry.module else _BY_MODULE.get(top)
    if isinstance(err, ModuleNotFoundError) and culprit is not None:
        return Missing(culprit, "not installed", culprit.fix)
    words = " ".join(str(err).split()) or type(err).__name__
    return Missing(entry, f"installed but cannot be imported ({words})",
                   f"run {SETUP} to reinstall it")


def missing_message(entry: Package, err: ImportError) -> str:
    """E.g. "OCR needs the package rapidocr-onnxruntime, which is not installed: run
    ./dev setup (or pip install rapidocr-onnxruntime)"."""
    missing = diagnose(entry, err)
    return (f"{entry.what} needs the package {missing.package.package}, which is "
            f"{missing.reason}: {missing.fix}")
