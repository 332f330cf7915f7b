"""The page's stylesheet, script and skeleton: real files in ``tmpl/view/assets/`` (package data, linted
by Biome in CI: ``biome.json``), read once and inlined into every page (no network, no server).

The script builds every element from data with ``textContent`` (never ``innerHTML``), so HTML or script
inside messages and tool results is shown as text. It reads the summary once, draws the histograms and the
visible rows of the table only, and decodes a sample's token arrays when the sample is opened.

>>> CSS.startswith(":root")
True
"""

from __future__ import annotations

from importlib import resources

__all__ = ["CSS", "JS", "SKELETON"]


def _asset(name: str) -> str:
    """The text of ``tmpl/view/assets/<name>`` as installed (a wheel, an editable install, a checkout)."""
    return (resources.files("tmpl.view") / "assets" / name).read_text(encoding="utf-8")


#: the page's stylesheet (``assets/page.css``)
CSS = _asset("page.css")
#: the page's script (``assets/page.js``)
JS = _asset("page.js")
#: the page's body before the data (``assets/skeleton.html``)
SKELETON = _asset("skeleton.html")
