"""Text that UTF-8 cannot hold: lone surrogates (``"\\ud800"``), as a JSON reply may carry.

Why: a model's reply is decoded from JSON, where ``"\\ud800"`` is legal syntax for a code point
that no UTF-8 file can store; written as it is, it stops the shard writer (and our own input
boundary refuses it when the file is read back). The rule, in one place: every lone surrogate is
stored as U+FFFD (the replacement character) and counted; a proper pair written as two escapes
becomes the one character it stands for.
"""
from __future__ import annotations

import re
from typing import Any, Tuple

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_surrogates(text: str) -> Tuple[str, int]:
    """(``text`` with every lone surrogate replaced by U+FFFD, how many were replaced)."""
    if not _SURROGATE.search(text):
        return text, 0
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")  # pairs -> characters
    return joined, joined.count(REPLACEMENT) - text.count(REPLACEMENT)


def clean_surrogates(value: Any) -> Tuple[Any, int]:
    """A JSON value (strings, lists, dicts, keys too) with lone surrogates replaced; the count."""
    if isinstance(value, str):
        return replace_surrogates(value)
    if isinstance(value, (list, tuple)):
        n = 0
        items = []
        for v in value:
            v, k = clean_surrogates(v)
            items.append(v)
            n += k
        return items, n
    if isinstance(value, dict):
        n = 0
        out = {}
        for key, v in value.items():
            if isinstance(key, str):
                key, k = replace_surrogates(key)
                n += k
            v, k = clean_surrogates(v)
            out[key] = v
            n += k
        return out, n
    return value, 0
