"""Fingerprints of built samples: what makes a run's identity cover the data itself.

A prediction file is reused only when the samples that would be run now are the samples it
was made from. The fingerprint covers every field of every sample (question, options, answer,
history, meta, ...) and the content of every image: a file image by a hash of its bytes (never
its path or modification time: the same data moved, copied or touched is the same sample),
remembered under the file's stat key so 100k files are read once per machine
(``utils.file_hashes``); an in-memory image (iWISDM frames) by a hash of its pixels.

The image's place in the sample is part of the sample's JSON body as written (a path string);
only the image token is content-based. So that a moved dataset keeps its identity, the body
that is hashed holds each image as its content token, not its path.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .errors import input_error
from .file_hashes import file_digest
from .images import unreadable


def image_token(image: Any, cache: Dict[int, str], record: Any = None) -> str:
    """A short stable description of one image's content: a file's bytes hash, or a pixel hash
    for PIL images. A file is checked as an image when it is first read (``utils.file_hashes``):
    a missing, irregular, corrupt or oversized file is refused in one line naming ``record``."""
    if isinstance(image, str):
        try:
            return "file:" + file_digest(image, record=record)
        except (OSError, ValueError) as e:
            raise unreadable(image, record, e) from None
    key = id(image)
    if key not in cache:
        cache[key] = "pixels:" + pixel_digest(image)
    return cache[key]


def pixel_digest(image: Any) -> str:
    """The identity of an in-memory image (32 hex digits): a hash of its mode, its size and its
    pixel bytes. Why all three: the bytes alone are the same for a 40x30 and a 30x40 blank (and
    for an RGB and a 3-band image of other sizes); every place that names an in-memory image by
    its content (run identity, saved image files, the API client's encoded-image memo) uses this
    one function, so no two pictures share a name anywhere."""
    tobytes = getattr(image, "tobytes", None)
    if tobytes is None:
        raise input_error(f"an image of type {type(image).__name__} cannot be fingerprinted", field="images")
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{getattr(image, 'mode', '')}:{getattr(image, 'size', '')}".encode())
    h.update(tobytes())
    return h.hexdigest()


def item_fields(body: Dict[str, Any]) -> Dict[str, Any]:
    """The sample without how the model is asked: its ``inference_method`` always, and for a
    SingleChoice sample its ``candidates`` (the options, written as that method scores them; the
    options themselves stay). So one item asked by generation and by likelihood is one item in a
    comparison, while Generation samples with other candidate lists are other items."""
    drop = {"inference_method"} | ({"candidates"} if body.get("formulation") == "SingleChoice" else set())
    return {k: v for k, v in body.items() if k not in drop}


def _digest(body: Dict[str, Any], images: List[str]) -> str:
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256((blob + "\x00" + "\x00".join(images)).encode("utf-8")).hexdigest()


def sample_digests(sample: Dict[str, Any], cache: Dict[int, str],
                   images_out: Optional[List[Optional[str]]] = None) -> Tuple[str, str]:
    """(hash of the whole sample: every JSON field plus its images' tokens; hash of the item:
    the same without how it is asked, ``item_fields``). The first guards reuse of predictions;
    the second pairs runs that asked the same item another way. ``images_out``: gets the
    sample's ``images_digest`` appended (the images' content, hashed once here for the run)."""
    body = {k: v for k, v in sample.items() if k != "images"}
    images = [image_token(im, cache, sample.get("sample_id")) for im in sample.get("images", [])]
    if images_out is not None:
        images_out.append(images_digest(images))
    return _digest(body, images), _digest(item_fields(body), images)


def images_digest(tokens: List[str]) -> Optional[str]:
    """sha256[:16] of a sample's image tokens in order (what each image is, by content, never by
    path); None without images. A record's ``trace.image_sha``: the pictures as given to the
    model's processor or sent to a server, the same for every engine (docs/provenance.md)."""
    if not tokens:
        return None
    return hashlib.sha256("\x00".join(tokens).encode("utf-8")).hexdigest()[:16]


def sample_digest(sample: Dict[str, Any], cache: Dict[int, str]) -> str:
    """Hash of one sample: every JSON field plus its images' tokens."""
    return sample_digests(sample, cache)[0]


def samples_fingerprint(samples: Iterable[Dict[str, Any]], images_out: Optional[List[Optional[str]]] = None
                        ) -> Tuple[str, List[str], List[str]]:
    """(fingerprint of the whole build, per-sample digests in order, per-item digests in order);
    ``images_out`` gets each sample's ``images_digest``, in order."""
    cache: Dict[int, str] = {}
    digests, items = [], []
    for s in samples:
        try:
            full, item = sample_digests(s, cache, images_out)
        except (RecursionError, UnicodeEncodeError, ValueError) as e:
            raise input_error(f"cannot be fingerprinted ({type(e).__name__}: nested too deeply or invalid text)",
                              record=f"sample {s.get('sample_id')!r}") from None
        digests.append(full)
        items.append(item)
    total = hashlib.sha256("\n".join(digests).encode("ascii")).hexdigest()
    return total, digests, items
