"""How an answer's text is compared: one normalisation for the scorers (``metrics``) and for the
builders that must refuse options the scorers could not tell apart."""
from __future__ import annotations

import string
from typing import Dict, Optional, Sequence

_PUNCT_TABLE = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation, collapse whitespace."""
    return " ".join(str(text).lower().translate(_PUNCT_TABLE).split())


def option_collision(options: Sequence[str]) -> Optional[str]:
    """Why these options cannot be scored by their text, or None: one that normalises to nothing
    (``"?"``), or two equal after ``normalize_text`` (``"Yes"`` and ``"yes!"``): a response
    naming one would be scored as naming the other."""
    seen: Dict[str, int] = {}
    for i, opt in enumerate(options):
        norm = normalize_text(opt)
        if not norm:
            return f"option {i} {str(opt)!r} is empty once lower-cased without punctuation (how answers are compared)"
        if norm in seen:
            j = seen[norm]
            return (f"options {j} {str(options[j])!r} and {i} {str(opt)!r} are equal once lower-cased without "
                    "punctuation (how answers are compared); a response could not tell them apart")
        seen[norm] = i
    return None
