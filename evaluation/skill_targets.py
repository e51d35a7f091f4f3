"""What a known-skill training sample teaches besides its answer: probe targets and frame labels.

Why: a yes/no or true/false question whose answer is "does this word name what the image
shows" is an equality. Neither input alone says anything about the answer, so the gradient of
the answer's loss with respect to reading the word, or to reading the image, is zero on
average, and a small model trained on the answer alone sits at chance (round 1 of the
known-skill model, docs/models.md). The recipe (``evaluation.training``) therefore adds
auxiliary losses, used in training only and never shipped:

* *probes*: linear heads on the language model's hidden state that must name the operands of
  the comparison (the word in the question and the attribute in the image) at the positions
  that answer. Each operand alone is a first-order target, so attention learns to bring both to
  the answer, after which the comparison itself has a gradient (Llama's gated MLP multiplies
  its inputs, a bilinear form, so equality of two present features is a first-order fit);
* *frame labels*: what each frame shows (object category, identity and location; colour and
  shape of the synthetic MME images), for pretraining the vision tower as a classifier before
  it is frozen, so its features separate the values the questions name.

Pure Python (no torch): the labels come from each sample's ``meta`` (iWISDM frames, the two-frame
set's categories) and, for the synthetic MME set, from the image's "Yes" question.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..build.iwisdm.stimuli import LOCATIONS
from ..build.mme_synthetic import COLOURS, SHAPES

#: the procedural iWISDM categories, in a fixed order (probe and frame classes)
CATEGORIES: Tuple[str, ...] = ("benches", "boats", "cars", "chairs", "couches", "lighting", "planes", "tables")
COLOUR_NAMES: Tuple[str, ...] = tuple(c for c, _ in COLOURS)
LOCATION_NAMES: Tuple[str, ...] = tuple(LOCATIONS)

SAME: Tuple[str, ...] = ("different", "same")
TRUTH: Tuple[str, ...] = ("false", "true")
#: what an operand of a 'low' comparison can be: a category, a location, or one object (category/identity)
OPERANDS: Tuple[str, ...] = CATEGORIES + LOCATION_NAMES + tuple(f"{c}/{i}" for c in CATEGORIES for i in range(8))

#: probe name -> (its classes, whether it names a word of the question). Question probes are asked
#: from the word on to the answer (every later position), so the word is carried forward by
#: short hops first; image probes are asked where the answer is predicted.
PROBES: Dict[str, Tuple[Tuple[str, ...], bool]] = {
    "img_cat": (CATEGORIES, False), "img_loc": (LOCATION_NAMES, False),
    "q_cat": (CATEGORIES, True), "q_loc": (LOCATION_NAMES, True), "neg": (("equals", "not equals"), True),
    "o1_cat": (CATEGORIES, False), "o2_cat": (CATEGORIES, False),
    "o1_loc": (LOCATION_NAMES, False), "o2_loc": (LOCATION_NAMES, False),
    "img_col": (COLOUR_NAMES, False), "img_shape": (SHAPES, False),
    "q_col": (COLOUR_NAMES, True), "q_shape": (SHAPES, True),
    "match": (SAME, False), "colour_match": (SAME, False), "shape_match": (SAME, False),
    "clause1": (TRUTH, False), "clause2": (TRUTH, False),
    "c1a": (OPERANDS, False), "c1b": (OPERANDS, False), "c2a": (OPERANDS, False), "c2b": (OPERANDS, False),
}
#: the probes that say whether two operands are equal; they are read one layer above the others
#: (the operands must be present before their equality can be computed)
MATCH_PROBES: Tuple[str, ...] = ("match", "colour_match", "shape_match", "c1a", "c1b", "c2a", "c2b")
#: the truth of each comparison of a 'low' trial, read one layer above its operands
CLAUSE_PROBES: Tuple[str, ...] = ("clause1", "clause2")

#: a frame label: ("object", category, identity, location), ("blank",), ("drawn", colour, shape), or None
FrameLabel = Optional[Tuple[Any, ...]]


def _one(words: Sequence[str], text: str) -> Optional[str]:
    """The single word of ``words`` that ``text`` names (whole words), or None (none or several)."""
    found = [w for w in words if re.search(rf"\b{re.escape(w)}\b", text)]
    return found[0] if len(found) == 1 else None


def _image_key(sample: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    meta = sample.get("meta") or {}
    if "image" not in meta or "official_question" not in meta:
        return None
    return os.path.dirname(str(meta.get("source_file", ""))), str(meta["image"])


def drawn_truth(samples: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, str], Tuple[str, str]]:
    """(colour, shape) of each synthetic MME image, read from its "Yes" question (the set's
    questions name the drawn colour and shape exactly when the answer is Yes)."""
    truth: Dict[Tuple[str, str], Tuple[str, str]] = {}
    for s in samples:
        key = _image_key(s)
        if key is None or str(s.get("answer")) != "Yes":
            continue
        colour, shape = _one(COLOUR_NAMES, s["question"]), _one(SHAPES, s["question"])
        if colour and shape:
            truth[key] = (colour, shape)
    return truth


def _objects(meta: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The objects of an iWISDM trial in order ("object k" is the k-th non-blank frame's)."""
    return [f[0] for f in meta.get("frames") or [] if f]


def probe_targets(sample: Dict[str, Any], truth: Dict[Tuple[str, str], Tuple[str, str]]) -> Dict[str, str]:
    """Probe name -> the value it must name, for the probes this sample teaches (maybe none)."""
    meta = sample.get("meta") or {}
    out: Dict[str, str] = {}
    if "instruction" in meta:
        ins, objs = str(meta["instruction"]), _objects(meta)
        if len(meta.get("frames") or []) == 1 and len(objs) == 1:  # one frame: identify, or compare with a word
            out["img_cat"], out["img_loc"] = objs[0]["category"], objs[0]["location"]
            if " equals " in ins:
                out["neg"] = "not equals" if " not equals " in ins else "equals"
                cat, loc = _one(CATEGORIES, ins), _one(LOCATION_NAMES, ins)
                if cat:
                    out["q_cat"], out["match"] = cat, _same(cat, objs[0]["category"])
                if loc:
                    out["q_loc"], out["match"] = loc, _same(loc, objs[0]["location"])
        else:
            dms = re.fullmatch(r".*(category|location) of object 1 (?:not )?equals \1 of object 2\?", ins)
            if dms and len(objs) == 2:  # a delayed match: the two objects' features, and whether the asked one agrees
                for k, obj in enumerate(objs, 1):
                    out[f"o{k}_cat"], out[f"o{k}_loc"] = obj["category"], obj["location"]
                out["match"] = _same(objs[0][dms.group(1)], objs[1][dms.group(1)])
            else:  # a 'low' trial: two comparisons joined by and / or; the truth of each
                for k, (a, b, value) in enumerate(clauses(ins, objs), 1):
                    out[f"clause{k}"], out[f"c{k}a"], out[f"c{k}b"] = TRUTH[int(value)], a, b
    elif "categories" in meta and len(meta["categories"]) == 2:  # build.frame_order
        out["o1_cat"], out["o2_cat"] = meta["categories"]
    else:
        key = _image_key(sample)
        if key in truth:
            out["img_col"], out["img_shape"] = truth[key]
            colour, shape = _one(COLOUR_NAMES, sample["question"]), _one(SHAPES, sample["question"])
            if colour:
                out["q_col"], out["colour_match"] = colour, _same(colour, truth[key][0])
            if shape:
                out["q_shape"], out["shape_match"] = shape, _same(shape, truth[key][1])
    return out


_TERM = r"(?:(category|location|identity) of object (\d+)|([a-z]+(?: [a-z]+)?))"
_CLAUSE = re.compile(rf"{_TERM} (not )?equals {_TERM}")


def _term(feature: Optional[str], index: Optional[str], word: Optional[str], objs: List[Dict[str, Any]],
          other: Optional[str]) -> Optional[str]:
    if feature:
        k = int(index or 0) - 1  # the pattern gives an index with every feature
        if not 0 <= k < len(objs):
            return None
        # an identity is one of a category's 8 objects: equal identities are the same object
        return f"{objs[k]['category']}/{objs[k]['identity']}" if feature == "identity" else str(objs[k][feature])
    return word if other in ("category", "location") else None


def clause_truths(instruction: str, objs: List[Dict[str, Any]]) -> List[bool]:
    """The truth of each of the two comparisons of "..., A and B?" / "..., A or B?" (no
    if/then), or [] when the instruction is not of that shape."""
    return [value for _a, _b, value in clauses(instruction, objs)]


def clauses(instruction: str, objs: List[Dict[str, Any]]) -> List[Tuple[str, str, bool]]:
    """(left operand, right operand, truth) of each of the two comparisons of "..., A and B?" /
    "..., A or B?" (no if/then), or [] when the instruction is not of that shape."""
    m = re.fullmatch(r".*?, ((?:(?!if )[^,])+) (?:and|or) ([^,?]+)\?", instruction)
    if not m or " if " in instruction:
        return []
    out = []
    for part in m.groups():
        c = _CLAUSE.fullmatch(part.split(", ")[-1].strip())
        if not c:
            return []
        a = _term(c.group(1), c.group(2), c.group(3), objs, c.group(5))
        b = _term(c.group(5), c.group(6), c.group(7), objs, c.group(1))
        if a is None or b is None:
            return []
        if a not in OPERANDS or b not in OPERANDS:
            return []
        out.append((a, b, (a == b) != bool(c.group(4))))
    return out


def _same(a: Any, b: Any) -> str:
    return SAME[int(a == b)]


def frame_labels(sample: Dict[str, Any], truth: Dict[Tuple[str, str], Tuple[str, str]]) -> List[FrameLabel]:
    """One label per image of the sample (None where it is not known)."""
    meta = sample.get("meta") or {}
    n = len(sample.get("images") or [])
    frames = meta.get("frames")
    if "instruction" in meta and frames is not None and len(frames) == n:
        return [("blank",) if not f else ("object", f[0]["category"], int(f[0]["identity"]), f[0]["location"])
                if len(f) == 1 else None for f in frames]
    key = _image_key(sample)
    if key in truth and n == 1:
        return [("drawn",) + truth[key]]
    return [None] * n
