"""``KEY=VALUE`` command-line options (``--dataset_option``, ``--model_option``, ``--metric_option``)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import yaml

from .errors import ReformError
from .inputs import plain_data_problem
from .secrets import is_secret_key, redact_text


def parse_kv(items: Sequence[str], flag: str) -> Dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML); a value that is
    not plain data (a recursive alias, too deep or too large) is refused here, in one line."""
    out: Dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ReformError(f"{flag} expects KEY=VALUE, got '{item}'")
        k, v = item.split("=", 1)
        if k.strip() in out:
            raise ReformError(f"{flag} {k.strip()}: given twice; give each key once")
        try:
            out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
        except (yaml.YAMLError, RecursionError):
            shown = "(a credential, not shown)" if is_secret_key(k) else repr(redact_text(v))
            raise ReformError(f"{flag}: cannot parse the value of {k.strip()} {shown}") from None
        problem = plain_data_problem(out[k.strip()])
        if problem:
            raise ReformError(f"{flag} {k.strip()}: the value holds {problem}; give plain data")
    return out


def metric_options(items: Sequence[str], mme_parse: Optional[str] = None,
                   strip_reasoning: bool = False) -> Dict[str, Any]:
    """``--metric_option`` pairs plus the named metric flags (``--mme_parse``, ``--strip_reasoning``)."""
    options = parse_kv(items, "--metric_option")
    if mme_parse:
        options["mme_parse"] = mme_parse
    if strip_reasoning:
        options["strip_reasoning"] = True
    return options
