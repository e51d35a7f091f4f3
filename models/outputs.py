"""What a model's generation returns: the text, plus what was counted while making it.

``GenText`` is a ``str`` (every caller that expects text keeps working) that also carries the
number of generated tokens and, for API models, the server's ``usage``. The engine copies
these into the prediction record; a plain ``str`` from an older interface simply has none.
"""
from __future__ import annotations

from typing import Any, Dict, Optional


class GenText(str):
    """Generated text with its token count (``tokens``) and the server's ``usage`` (API models)."""

    tokens: Optional[int]
    usage: Optional[Dict[str, Any]]

    def __new__(cls, text: str, tokens: Optional[int] = None, usage: Optional[Dict[str, Any]] = None
                ) -> "GenText":
        obj = super().__new__(cls, text)
        obj.tokens = tokens
        obj.usage = usage
        return obj

    def __reduce__(self) -> Any:
        return (GenText, (str(self), self.tokens, self.usage))


def generation_stats(text: Any) -> Dict[str, Any]:
    """The record fields of one generated text: ``generated_tokens`` and ``usage`` where known;
    an answer served from the response cache has no ``usage`` (this run spent nothing on it) but
    ``cached_responses`` and the original call's ``cached_usage``."""
    out: Dict[str, Any] = {}
    if getattr(text, "tokens", None) is not None:
        out["generated_tokens"] = int(text.tokens)
    if getattr(text, "usage", None):
        out["usage"] = dict(text.usage)
    if getattr(text, "cached", False):  # served from the response cache: no tokens spent now
        out["cached_responses"] = 1
        if getattr(text, "cached_usage", None):
            out["cached_usage"] = dict(text.cached_usage)
    return out


def finish_text(text: str, tokens: Optional[int] = None, usage: Optional[Dict[str, Any]] = None) -> GenText:
    """The one normalisation of generated text, shared by every generation path (in-process and
    API): surrounding whitespace stripped, then wrapped with what was counted.

    Why one function: MME's official parse is whitespace-sensitive, so two paths that strip
    differently score the same greedy model differently (issue 15).
    """
    return GenText(str(text).strip(), tokens=tokens, usage=usage)
