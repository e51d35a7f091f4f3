"""Token usage and cost of a run, from its prediction records.

Each ``openai_api`` record keeps the server's ``usage`` (prompt and completion tokens) and every
generating model's record keeps ``generated_tokens`` (``models.outputs.generation_stats``).
The scoring layer adds these totals to the results per model (and per benchmark, by calling
it on that benchmark's records); with a price table (``prompt_price`` / ``completion_price``,
per million tokens, the ``openai_api`` model options of the same names) it gives the cost.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

#: the ``usage`` fields that are added up
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


def usage_totals(records: Iterable[Dict[str, Any]], prompt_price: Optional[float] = None,
                 completion_price: Optional[float] = None) -> Dict[str, Any]:
    """``{"records", "records_with_usage", "prompt_tokens", "completion_tokens", "total_tokens",
    "generated_tokens"[, "records_from_cache", "cost"]}`` over ``records``: the tokens this run
    spent (an answer served from the response cache has no ``usage``; it counts in
    ``records_from_cache``, at no cost). ``cost`` (in the price's currency) is there only when a
    price is given and every record has its usage or came from the cache: a partial sum would
    understate it. ``generated_tokens`` (the answers' lengths) is there only when every record has it."""
    n = with_usage = with_tokens = from_cache = 0
    sums = {k: 0 for k in USAGE_FIELDS}
    generated = 0
    for r in records:
        n += 1
        usage = r.get("usage")
        if not isinstance(usage, dict) and r.get("cached_responses"):
            from_cache += 1  # answered from the response cache: nothing spent by this run
        if isinstance(usage, dict):
            with_usage += 1
            for k in USAGE_FIELDS:
                v = usage.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    sums[k] += int(v)
            if not isinstance(usage.get("total_tokens"), (int, float)):
                sums["total_tokens"] += int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
        if isinstance(r.get("generated_tokens"), int):
            with_tokens += 1
            generated += r["generated_tokens"]
    out: Dict[str, Any] = {"records": n, "records_with_usage": with_usage, **sums}
    if from_cache:
        out["records_from_cache"] = from_cache
    if n and with_tokens == n:
        out["generated_tokens"] = generated
    if (prompt_price is not None or completion_price is not None) and n and with_usage + from_cache == n:
        out["cost"] = round(sums["prompt_tokens"] * float(prompt_price or 0) / 1e6
                            + sums["completion_tokens"] * float(completion_price or 0) / 1e6, 6)
    return out
