"""Human-readable metric tables (markdown) for the console, log.txt and results.md."""
from __future__ import annotations

import html
import re
from typing import Any, Dict, List, Optional, Sequence

#: line breaks of every kind (and other control characters), which would end a table row or a heading
_BREAKS_RE = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]+")
#: bidirectional overrides and isolates (they reorder the rest of a row in a bidi-aware viewer)
_BIDI_RE = re.compile("[\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: the markdown syntax that makes a link or an image out of a name (``[x](http://...)``, ``![x](...)``):
#: its ``](`` is broken (an interval like ``[0.1, 0.2]`` stays as it is)
_MD_LINK_RE = re.compile(r"\]\(")


def fmt_value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def md_text(value: Any) -> str:
    """Text made inert for one line of markdown (a heading, a list item, a paragraph line): line
    breaks and control characters become one space, and ``&``, ``<``, ``>`` are HTML-escaped."""
    text = _BIDI_RE.sub("", _BREAKS_RE.sub(" ", str(value)))
    return _MD_LINK_RE.sub(r"]\\(", html.escape(text, quote=False))


def md_cell(value: Any) -> str:
    """One markdown table cell: ``md_text`` plus ``\\`` and ``|`` backslash-escaped, so a cell can
    neither split its row nor end it (a name like ``a|b\\n# x`` stays one cell)."""
    return md_text(value).replace("\\", "\\\\").replace("|", "\\|")


def md_row(cells: Sequence[Any]) -> str:
    """One table row; every cell through ``md_cell``."""
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats shown with 4 decimals; every cell escaped (``md_cell``)."""
    lines = [md_row(header), "|" + "|".join("---" for _ in header) + "|"]
    lines += [md_row([fmt_value(c) for c in row]) for row in rows]
    return "\n".join(lines)


def flatten(d: Dict[str, Any], prefix: str = "") -> List[tuple]:
    """Scalar leaves of a nested dict as (dotted key, value)."""
    out: List[tuple] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(flatten(v, key + "."))
        elif not isinstance(v, (list, tuple)):
            out.append((key, v))
    return out


def scalar_table(metrics: Dict[str, Any], notes: Optional[Dict[str, str]] = None) -> str:
    """The metric | value table of top-level scalar metrics; a note column when a metric says
    something beside a number (e.g. a subsample total's missing subtasks)."""
    # a metric that is undefined for these records (None) reads n/a, never a number
    scalars = [(k, "n/a" if v is None else v) for k, v in metrics.items() if not isinstance(v, (dict, list, tuple))]
    if notes:
        return markdown_table(["metric", "value", "note"], [(k, v, notes.get(k, "")) for k, v in scalars])
    return markdown_table(["metric", "value"], scalars)


def headline_report(result: Dict[str, Any], title: str = "Metrics") -> str:
    """The title and the table of top-level scalar metrics: what a command prints on the console
    (every other table goes to the results file's ``.md``)."""
    return f"## {md_text(title)}\n\n" + scalar_table(result.get("metrics", {}), result.get("notes"))


def metrics_report(result: Dict[str, Any], title: str = "Metrics") -> str:
    """The summary table of top-level scalar metrics followed by the metric's own tables."""
    parts = [headline_report(result, title)]
    for name, table in result.get("tables", {}).items():
        parts += [f"### {md_text(name)}", table]
    return "\n\n".join(parts) + "\n"
