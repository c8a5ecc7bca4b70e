"""HTML: the main text only (trafilatura drops navigation, ads, cookie banners, footers),
with headings kept as Markdown, plus the page title and language. lxml and trafilatura are
imported by the first job that reads a page (see `optional`), not when a worker starts."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pipeline.formats import optional
from pipeline.formats.guards import corrupt_as_permanent
from pipeline.formats.model import Extracted
from pipeline.formats.normalize import clean_tag, clean_tags, join_blocks, normalize_text
from pipeline.formats.text import decode_text

if TYPE_CHECKING:
    import lxml.html

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.IGNORECASE)
_MEANS_WINDOWS_1252 = frozenset({"iso-8859-1", "iso8859-1", "latin1", "latin-1", "l1",
                                 "us-ascii", "ascii", "windows-1252"})
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")
_HIDDEN = ("script", "style", "noscript", "template", "nav", "header", "footer")
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 3, "h5": 3, "h6": 3}
_BLOCKS = frozenset(
    {"p", "div", "section", "article", "main", "aside", "li", "ul", "ol", "dl", "dt", "dd",
     "table", "tr", "pre", "blockquote", "figure", "figcaption", "address", "hr",
     "form", "fieldset", "details", "summary", *_HEADINGS}
)
_WHITESPACE = re.compile(r"\s+")
# Navigation by its HTML semantics, pruned before trafilatura sees the page: its fallback
# algorithms keep everything on short pages, menus included. Headers and footers inside an
# <article> or <main> belong to the content (its title, its byline) and stay.
_PRUNE = [
    "//nav",
    "//*[@role='navigation' or @role='banner' or @role='contentinfo']",
    "//header[not(ancestor::article or ancestor::main)]",
    "//footer[not(ancestor::article or ancestor::main)]",
]


def extract_html(data: bytes, media_type: str) -> Extracted:
    # trafilatura imports lxml_html_clean (through jusText): loaded first, each missing
    # package is named as itself, not as trafilatura failing to import.
    optional.load(optional.LXML, "lxml.html")
    optional.load(optional.HTML_CLEAN)
    optional.load(optional.HTML)
    import lxml.html

    markup = _decode(data)
    with corrupt_as_permanent("HTML page"):
        tree = lxml.html.document_fromstring(markup)
    metadata = _metadata(markup)
    language = _language(tree) or _primary_language(metadata.pop("language", None))
    metadata["title"] = _title(tree) or metadata.get("title")
    with corrupt_as_permanent("HTML page"):
        text = _main_text(markup) or _visible_text(tree)  # the fallback may edit the tree
    tags = clean_tags(metadata)
    return Extracted(
        media_type=media_type, text=text, title=tags.get("title"), language=language, tags=tags
    )


def _decode(data: bytes) -> str:
    """The page's own <meta charset> read the way browsers do (WHATWG): Latin-1 and ASCII mean
    Windows-1252, and a UTF-16 label readable as ASCII cannot be true. lxml refuses a str that
    still carries an XML encoding declaration (XHTML), so that goes."""
    declared = _META_CHARSET.search(data[:4096])
    charset = declared.group(1).decode("ascii", errors="ignore").lower() if declared else None
    if charset in _MEANS_WINDOWS_1252:
        charset = "cp1252"
    elif charset and charset.startswith(("utf-16", "utf-32", "ucs")):
        charset = None
    return _XML_DECLARATION.sub("", decode_text(data, charset), count=1)


def _main_text(markup: str) -> str:
    """trafilatura's main-text extraction, as Markdown so headings survive."""
    import trafilatura

    extracted = trafilatura.extract(
        markup,
        output_format="markdown",
        include_comments=False,
        include_tables=True,
        include_images=False,
        include_links=False,
        with_metadata=False,
        prune_xpath=_PRUNE,
    )
    return normalize_text(extracted or "")


def _metadata(markup: str) -> dict[str, str]:
    """trafilatura's metadata (title, author, site name, description, language), when found.

    `extensive=False` skips the date heuristics: a "© 2024" footer is not a publication date.
    """
    import lxml.etree
    from trafilatura.metadata import extract_metadata

    try:
        document = extract_metadata(markup, extensive=False)
    except (ValueError, TypeError, AttributeError, lxml.etree.LxmlError):
        return {}
    fields = ("title", "author", "sitename", "description", "language")
    return {field: value for field in fields if (value := getattr(document, field, None))}


def _title(tree: lxml.html.HtmlElement) -> str | None:
    title = tree.findtext(".//title")
    if title is None:
        return None
    return clean_tag(title) or None


def _language(tree: lxml.html.HtmlElement) -> str | None:
    """`<html lang>` first, then `<meta http-equiv="content-language">`."""
    lang = tree.get("lang") or tree.get("{http://www.w3.org/XML/1998/namespace}lang")
    if not lang:
        for meta in tree.iter("meta"):
            if (meta.get("http-equiv") or "").lower() == "content-language":
                lang = meta.get("content")
                break
    return _primary_language(lang)


def _primary_language(lang: str | None) -> str | None:
    """"en-GB" -> "en"; the primary subtag is what search needs to pick a stemmer."""
    if not lang:
        return None
    primary = re.split(r"[-_,;\s]", lang.strip(), maxsplit=1)[0].lower()
    return primary if primary.isalpha() and 2 <= len(primary) <= 3 else None


def _visible_text(tree: lxml.html.HtmlElement) -> str:
    """The fallback when trafilatura finds no main text (everything on the page looked like
    boilerplate to it, e.g. text in an <aside> or a comment section): the visible text of
    <body>, one block per paragraph-like element, headings as Markdown. Edits `tree`."""
    import lxml.etree

    body = tree.find("body")
    if body is None:
        body = tree
    lxml.etree.strip_elements(body, lxml.etree.Comment, *_HIDDEN, with_tail=False)
    preformatted = {element for pre in body.iter("pre") for element in pre.iter()}
    for element in body.iter():
        if not isinstance(element.tag, str):
            continue
        element.text = _collapse(element.text, keep=element in preformatted)
        element.tail = _collapse(
            element.tail, keep=element in preformatted and element.tag != "pre"
        )
        if element.tag == "br":
            element.tail = "\n" + (element.tail or "")
        if element.tag in _HEADINGS:
            element.text = "#" * _HEADINGS[element.tag] + " " + (element.text or "")
        if element.tag in _BLOCKS:
            element.text = "\n\n" + (element.text or "")
            element.tail = "\n\n" + (element.tail or "")
    return join_blocks(body.text_content().split("\n\n"))


def _collapse(text: str | None, *, keep: bool) -> str | None:
    """HTML source newlines are spaces (except in <pre>): keep them from splitting a heading."""
    if text is None or keep:
        return text
    return _WHITESPACE.sub(" ", text)
