"""Reasoning blocks (``<think>...</think>``) removed before scoring, for reasoning models.

A reasoning model writes its chain of thought before the answer; the checkers must read only
the answer. The raw response stays in the record (``raw_prediction``). One linear pass: an
opening tag without a closing tag drops the rest of the text (the model never answered).
"""
from __future__ import annotations

from typing import Any, Dict, List

TAGS = ("think", "thinking", "reasoning", "reflection")


def strip_reasoning(text: str) -> str:
    """``text`` without its reasoning blocks, stripped of surrounding whitespace."""
    low = text.lower()
    out: List[str] = []
    pos = 0
    nxt = {t: low.find(f"<{t}>") for t in TAGS}  # next opening of each tag; only moves forward
    while True:
        for t in TAGS:
            if 0 <= nxt[t] < pos:
                nxt[t] = low.find(f"<{t}>", pos)
        starts = [(i, t) for t, i in nxt.items() if i >= 0]
        if not starts:
            out.append(text[pos:])
            break
        i, tag = min(starts)
        out.append(text[pos:i])
        end = low.find(f"</{tag}>", i)
        if end < 0:  # unfinished reasoning: no answer follows
            break
        pos = end + len(tag) + 3
    # a closing tag whose opening was in the prompt (some chat templates open the block)
    joined = "".join(out)
    low = joined.lower()
    for tag in TAGS:
        k = low.rfind(f"</{tag}>")
        if k >= 0:
            joined, low = joined[k + len(tag) + 3:], low[k + len(tag) + 3:]
    return joined.strip()


def strip_reasoning_records(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Copies of generation records with reasoning removed from ``prediction`` / ``predictions``;
    the raw text kept as ``raw_prediction`` / ``raw_predictions``."""
    out = []
    for r in records:
        if isinstance(r.get("prediction"), str):
            r = dict(r, raw_prediction=r["prediction"], prediction=strip_reasoning(r["prediction"]))
            if isinstance(r.get("predictions"), list):
                r["raw_predictions"] = list(r["predictions"])
                r["predictions"] = [strip_reasoning(p) if isinstance(p, str) else p for p in r["predictions"]]
        out.append(r)
    return out
