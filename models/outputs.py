"""What a model's generation returns: the text, plus what was counted while making it.

``GenText`` is a ``str`` (every caller that expects text keeps working) that also carries the
number of generated tokens and, for API models, the server's ``usage``. The engine copies
these into the prediction record; a plain ``str`` from an older interface simply has none.
"""
from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Dict, List, Optional, Sequence

from ..utils.errors import ReformError
from ..utils.surrogates import replace_surrogates

logger = logging.getLogger(__name__)


class GenText(str):
    """Generated text with its token count (``tokens``) and the server's ``usage`` (API models)."""

    tokens: Optional[int]
    usage: Optional[Dict[str, Any]]
    #: lone surrogates of the model's text stored as U+FFFD (``checked_outputs``)
    replaced_chars: int = 0
    #: set (both) on a reply served from the response cache (``evaluation.calls``); unset otherwise
    cached: bool
    cached_usage: Optional[Dict[str, Any]]

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
    if getattr(text, "replaced_chars", 0):  # lone surrogates stored as U+FFFD (utils.surrogates)
        out["replaced_chars"] = int(text.replaced_chars)
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


def model_label(interface: Any) -> str:
    """How errors name a model: its family and the checkpoint or served model it stands for."""
    cfg = getattr(interface, "config", None) or {}
    name = getattr(interface, "name", "") or type(interface).__name__
    given = cfg.get("model_name") if isinstance(cfg, dict) else None
    return f"'{name}' ({given})" if given else f"'{name}'"


_FIX = "nothing of this batch was saved"


def checked_outputs(model: str, method: str, samples: Sequence[Dict[str, Any]], outputs: Any) -> List[Any]:
    """A batch's outputs as they leave the model, checked: one per sample; generation text is a
    string (lone surrogates stored as U+FFFD and counted: ``utils.surrogates``) with a token count
    that is a whole number >= 0; likelihood scores are one (finite number, whole number >= 0) per
    candidate. Anything else is refused here, naming the model and the sample, before a file or
    the response cache sees it (not later, blaming the file)."""
    if not isinstance(outputs, (list, tuple)) or len(outputs) != len(samples):
        n = len(outputs) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
        first = samples[0].get("sample_id") if samples else None
        raise ReformError(f"model {model}: returned {n} outputs for a batch of {len(samples)} samples "
                          f"(first sample {first!r}); {_FIX}")
    checked = []
    for s, out in zip(samples, outputs):
        where = f"model {model}: sample {s.get('sample_id')!r} (duplicate {s.get('dup_index', 0)})"
        checked.append(_checked_text(where, out) if method == "generation"
                       else _checked_scores(where, out, s.get("candidates") or s.get("answer_options") or []))
    return checked


def _checked_text(where: str, out: Any) -> str:
    if not isinstance(out, str):
        raise ReformError(f"{where}: the model returned {type(out).__name__}, not text; {_FIX}")
    tokens = getattr(out, "tokens", None)
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, numbers.Integral) or tokens < 0):
        raise ReformError(f"{where}: generated token count {tokens!r} is not a whole number >= 0; {_FIX}")
    text, replaced = replace_surrogates(str(out))
    if not replaced and text == str(out):
        return out
    fixed = GenText(text, tokens=None if tokens is None else int(tokens), usage=getattr(out, "usage", None))
    fixed.replaced_chars = replaced
    if replaced:
        logger.warning("%s: %d lone surrogate(s) in the model's text stored as U+FFFD", where, replaced)
    return fixed


def _checked_scores(where: str, out: Any, candidates: Sequence[Any]) -> List[Any]:
    if not isinstance(out, (list, tuple)) or len(out) != len(candidates):
        n = len(out) if isinstance(out, (list, tuple)) else type(out).__name__
        raise ReformError(f"{where}: the model returned {n} scores for {len(candidates)} candidates; {_FIX}")
    for k, (cand, score) in enumerate(zip(candidates, out)):
        at = f"{where}: candidate {k} ({str(cand)[:40]!r})"
        if not isinstance(score, (list, tuple)) or len(score) != 2:
            raise ReformError(f"{at}: the model returned {type(score).__name__}, not (log-probability, tokens); {_FIX}")
        logprob, n = score
        if isinstance(logprob, bool) or not isinstance(logprob, numbers.Real):
            raise ReformError(f"{at}: log-probability {logprob!r} is a {type(logprob).__name__}, not a number; {_FIX}")
        if not math.isfinite(float(logprob)):
            raise ReformError(f"{at}: log-probability is {float(logprob)} (not a finite number): the model's output "
                              f"is refused, {_FIX}; a float16 overflow gives this (try --model_option dtype=bfloat16 "
                              "or float32), else check the checkpoint's weights")
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ReformError(f"{at}: scored token count {n!r} is not a whole number >= 0; {_FIX}")
    return list(out)
