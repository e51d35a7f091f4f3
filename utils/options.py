"""``KEY=VALUE`` command-line options (``--dataset_option``, ``--model_option``, ``--metric_option``)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from utils.errors import ReformError


def parse_kv(items: Sequence[str], flag: str) -> Dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars)."""
    import yaml
    out: Dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ReformError(f"{flag} expects KEY=VALUE, got '{item}'")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
        except (yaml.YAMLError, RecursionError):
            raise ReformError(f"{flag} {k.strip()}: cannot parse the value {v!r}") from None
    return out


def metric_options(items: Sequence[str], mme_parse: Optional[str] = None) -> Dict[str, Any]:
    """``--metric_option`` pairs plus the named metric flags (``--mme_parse``)."""
    options = parse_kv(items, "--metric_option")
    if mme_parse:
        options["mme_parse"] = mme_parse
    return options
