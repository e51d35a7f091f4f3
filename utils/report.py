"""Human-readable metric tables (markdown) for the console, log.txt and results.md."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence


def fmt_value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats shown with 4 decimals."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt_value(c) for c in row) + " |" for row in rows]
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


def metrics_report(result: Dict[str, Any], title: str = "Metrics") -> str:
    """The summary table of top-level scalar metrics followed by the metric's own tables."""
    scalars = [(k, v) for k, v in result.get("metrics", {}).items() if not isinstance(v, (dict, list, tuple))]
    parts = [f"## {title}", markdown_table(["metric", "value"], scalars)]
    for name, table in result.get("tables", {}).items():
        parts += [f"### {name}", table]
    return "\n\n".join(parts) + "\n"
