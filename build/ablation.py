"""``--image_ablation``: what the image adds, measured by taking it away.

A transformation of the built samples (after reformulation, so every rank, the sample
fingerprint and the run identity see the ablated samples), seeded and deterministic:

* ``none``: the images leave the sample, and their ``<image>`` placeholders leave its text
  (question, options line, instruction, history);
* ``blank``: each image becomes a black image of its size;
* ``noise``: each image becomes uniform noise of its size, drawn from
  ``derive_seed(seed, "image_ablation", group, k)``;
* ``shuffle``: each image comes from another sample of the same build, never from the sample
  itself (see ``shuffle_map``).

Images are replaced per *group*, the unit at which the benchmark shares its images
(``Builder.group_key``: an MME image with its two questions, an MMMT-IF chat, an iWISDM trial;
duplicates of a sample share its group), so two questions about one image still see one image.
File images stay lazy: a blank or noise image is a ``utils.images.SyntheticImage`` whose size is
read from the file's header, made into pixels only when the sample is loaded.

Every ablated sample carries ``image_ablation`` = {``mode``: what was done, ``requested`` when
that differs, ``intact_item_sha``: the item hash (``utils.fingerprint``) the same sample has
without the ablation}. That hash is how a comparison pairs an ablated item with its intact item
and nothing else: the ablated item's own hash cannot match (its images differ).
"""
from __future__ import annotations

import logging
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..utils.errors import ReformError, unknown_name
from ..utils.fingerprint import image_token, sample_digests
from ..utils.images import SyntheticImage, image_size
from ..utils.schema import IMAGE_TOKEN
from ..utils.seeding import derive_seed, rng_for

logger = logging.getLogger(__name__)

IMAGE_ABLATIONS = ("none", "blank", "noise", "shuffle")

#: a placeholder and the spacing after it (``"<image>\n"``, ``"<image> "``): removed together
_PLACEHOLDER_RE = re.compile(re.escape(IMAGE_TOKEN) + r"[ \t]*\n?")

#: the sample fields whose text reaches the prompt (and so may hold placeholders)
TEXT_FIELDS = ("question", "question_with_option", "instruct")


def strip_placeholders(text: str) -> str:
    """``text`` without its image placeholders (each with the spacing that followed it)."""
    return _PLACEHOLDER_RE.sub("", text) if IMAGE_TOKEN in text else text


def applied_mode(mode: Optional[str], image_required: bool) -> Optional[str]:
    """What is done for a requested ``mode``: a model that cannot run without an image
    (``image_required``) gets the blank in place of ``none``."""
    if mode is not None and mode not in IMAGE_ABLATIONS:
        raise unknown_name("image_ablation", mode, IMAGE_ABLATIONS)
    return "blank" if mode == "none" and image_required else mode


def ablate_images(samples: Sequence[Dict[str, Any]], mode: str, seed: int, group_key: Callable[[Dict[str, Any]], str],
                  image_required: bool = False, benchmark: str = "") -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """(the ablated samples, what was done: {requested, applied, samples, images_replaced}).

    ``samples`` are not modified; samples without images are returned as they are, marked."""
    applied = applied_mode(mode, image_required)
    if applied != mode:
        logger.warning("--image_ablation %s: this model cannot run without an image, so each image is replaced by "
                       "a blank of its size instead (the results record image_ablation.applied = blank)", mode)
    digest_cache: Dict[int, str] = {}
    groups = [str(group_key(s)) for s in samples]
    own = _group_images(samples, groups, digest_cache)
    if applied == "shuffle":
        replace = shuffle_map(own, seed, benchmark)
    elif applied in ("blank", "noise"):
        replace = _synthetic_map(own, applied, seed, samples, groups)
    else:
        replace = {}
    out: List[Dict[str, Any]] = []
    replaced = 0
    for s, g in zip(samples, groups):
        intact_item = sample_digests(s, digest_cache)[1][:16]
        new = dict(s)
        if applied == "none":
            new["images"] = []
            for f in TEXT_FIELDS:
                if isinstance(new.get(f), str):
                    new[f] = strip_placeholders(new[f])
            new["history"] = [{**t, "value": strip_placeholders(t["value"])} if isinstance(t.get("value"), str)
                              else t for t in s.get("history", [])]
        else:
            new["images"] = [replace[(g, image_token(im, digest_cache))] for im in s.get("images", [])]
        replaced += len(s.get("images", []))
        new["image_ablation"] = {"mode": applied, **({"requested": mode} if applied != mode else {}),
                                 "intact_item_sha": intact_item}
        out.append(new)
    info = {"requested": mode, "applied": applied, "samples": len(out), "images_replaced": replaced}
    if applied != mode:
        info["reason"] = "the model cannot run without an image"
    return out, info


def _group_images(samples: Sequence[Dict[str, Any]], groups: Sequence[str], cache: Dict[int, str]
                  ) -> Dict[str, List[Tuple[str, Any]]]:
    """group -> its distinct images as (token, image), in order of first appearance."""
    out: Dict[str, List[Tuple[str, Any]]] = {}
    for s, g in zip(samples, groups):
        images = out.setdefault(g, [])
        seen = {t for t, _ in images}
        for im in s.get("images", []):
            tok = image_token(im, cache)
            if tok not in seen:
                seen.add(tok)
                images.append((tok, im))
    return out


def _synthetic_map(own: Dict[str, List[Tuple[str, Any]]], kind: str, seed: int, samples: Sequence[Dict[str, Any]],
                   groups: Sequence[str]) -> Dict[Tuple[str, str], Any]:
    """(group, image token) -> a blank or noise image of that image's size; the k-th image of a
    group draws its noise from (seed, group, k), so it depends on nothing else in the build."""
    first: Dict[Any, Any] = {}
    for s, g in zip(samples, groups):
        first.setdefault(g, s.get("sample_id"))
    out: Dict[Tuple[str, str], Any] = {}
    for g, images in own.items():
        for k, (tok, im) in enumerate(images):
            size = image_size(im, record=first[g])
            out[(g, tok)] = SyntheticImage(kind, size, derive_seed(seed, "image_ablation", g, k)
                                           if kind == "noise" else None)
    return out


def shuffle_map(own: Dict[str, List[Tuple[str, Any]]], seed: int, benchmark: str = ""
                ) -> Dict[Tuple[str, str], Any]:
    """(group, image token) -> an image of *another* group, never one the group holds itself.

    The groups that have images are put in a seeded random order (``rng_for(seed,
    "image_ablation", benchmark)``) and read as a cycle: a group takes its images, in order, from
    the groups after it, skipping any image it holds itself (an iWISDM delay frame, or a picture
    that two items share, is the same token in both) and any it has already taken. A group that
    needs more images than the rest of the build holds reuses those it took. So every image is
    replaced, by a donor image that is never the sample's own, whatever the group sizes."""
    order = sorted(g for g, ims in own.items() if ims)
    rng_for(seed, "image_ablation", benchmark, "shuffle").shuffle(order)
    out: Dict[Tuple[str, str], Any] = {}
    n = len(order)
    for pos, g in enumerate(order):
        mine = {t for t, _ in own[g]}
        need = len(own[g])
        taken: List[Any] = []
        took = set()
        for step in range(1, n):
            for tok, im in own[order[(pos + step) % n]]:
                if tok not in mine and tok not in took:
                    took.add(tok)
                    taken.append(im)
                    if len(taken) == need:
                        break
            if len(taken) == need:
                break
        if not taken:
            raise ReformError(f"--image_ablation shuffle: group {g!r} has no image of another sample to take (the "
                              f"build holds {n} group(s) with images, all of them the same images); shuffle needs "
                              "images from at least two different samples")
        for k, (tok, _) in enumerate(own[g]):
            out[(g, tok)] = taken[k % len(taken)]
    return out
