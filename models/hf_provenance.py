"""What a Hugging Face model was really given: the run's provenance and each sample's trace.

Why: "my score differs from the paper / the other harness" is almost always a difference in
the system line or template, BOS, the image processor and its backend, dtype or attention
kernel (issue 27). Each of these is recorded where it is known for certain, here at the point
the processor's output goes into the model, never guessed: per run (``provenance``) and per
sample (``take_traces``: the rendered prompt's hash and token count, whether it starts with
BOS, and a hash of the pictures the model received for the sample, without batch padding).
"""
from __future__ import annotations

import dataclasses
import hashlib
from importlib import metadata
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from .hf_state import HFState


def text_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _array(value: Any) -> Optional[np.ndarray]:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").contiguous().numpy() if value.dtype != torch.bfloat16 else \
            value.detach().to("cpu").float().contiguous().numpy()
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value)
    return None


def pixel_rows(enc: Any, counts: Sequence[int], tiles: Optional[Sequence[int]] = None) -> List[Optional[str]]:
    """A hash of each row's pixel tensors: the pictures its images became, in order, without the
    padding a processor adds to batch them, so a sample hashes the same alone or in any batch
    (what the family's image processor makes of the sample's images alone). Layouts: one picture per image (LLaVA, BLIP-2, PaliGemma);
    Qwen2-VL's patch grid (``image_grid_thw``: each image's rows of patches); tiles stacked over
    the batch (InternVL: ``num_patches`` per image, or ``tiles`` per row from the interface);
    tiles per image padded with zero tiles to the batch's most (LLaVA-NeXT, OneVision: trailing
    all-zero tiles dropped); images per row padded in count and size (Idefics3:
    ``pixel_attention_mask``) or in count and tiles (Mllama: ``aspect_ratio_mask``). None for a
    row without images, and for every row of a layout that is not one of these (never a hash
    that would change with the batch)."""
    n_rows = len(counts)
    pv = _array(enc.get("pixel_values")) if hasattr(enc, "get") else None
    if pv is None or not sum(counts):
        return [None] * n_rows
    pictures = _pictures_by_row(enc, pv, list(counts), tiles)
    if pictures is None:
        return [None] * n_rows
    return [_hash(p) if c else None for p, c in zip(pictures, counts)]


def _pictures_by_row(enc: Any, pv: np.ndarray, counts: List[int],
                     tiles: Optional[Sequence[int]]) -> Optional[List[List[np.ndarray]]]:
    """Each row's pictures (arrays the vision tower takes one by one), padding removed; None
    for a layout this cannot split."""
    n_rows, n_images = len(counts), sum(counts)
    grid = _array(enc.get("image_grid_thw"))
    if grid is not None:  # Qwen2-VL: each image is prod(t, h, w) rows of patches
        sizes = [int(np.prod(g)) for g in grid]
        return _split(pv, sizes, counts) if len(sizes) == n_images else None
    if tiles is None and enc.get("num_patches") is not None:  # InternVL's image processor
        tiles = [int(t) for t in np.asarray(enc.get("num_patches")).reshape(-1)]
    if tiles is not None:
        if len(tiles) == n_images:
            return _split(pv, list(tiles), counts)
        return _split(pv, list(tiles), [1] * n_rows) if len(tiles) == n_rows else None
    pmask = _array(enc.get("pixel_attention_mask"))
    if pmask is not None and pv.ndim == 5 and pv.shape[0] == n_rows:  # Idefics3: (row, image, C, H, W)
        return [[_crop(pv[r, j], pmask[r, j]) for j in range(pv.shape[1]) if pmask[r, j].any()]
                for r in range(n_rows)]
    amask = _array(enc.get("aspect_ratio_mask"))
    if amask is not None and pv.ndim == 6 and pv.shape[0] == n_rows:  # Mllama: (row, image, tile, C, H, W)
        return [[pv[r, j, t] for j in range(counts[r]) for t in range(pv.shape[2]) if amask[r, j, t]]
                for r in range(n_rows)]
    if pv.ndim == 5 and pv.shape[0] == n_images:  # LLaVA-NeXT / OneVision: (image, tile, C, H, W)
        per_image = [_unpadded_tiles(pv[k]) for k in range(n_images)]
        out, k = [], 0
        for c in counts:
            out.append([t for im in per_image[k:k + c] for t in im])
            k += c
        return out
    if pv.ndim == 4 and pv.shape[0] == n_images:  # one picture per image
        return _split(pv, [1] * n_images, counts)
    return None


def _split(pv: np.ndarray, sizes: List[int], counts: List[int]) -> Optional[List[List[np.ndarray]]]:
    """``pv``'s first axis cut into ``sizes`` consecutive blocks, blocks grouped by ``counts``;
    for stacked tiles (4-D) every tile is its own picture, a Qwen2-VL block (2-D) one picture."""
    if sum(sizes) != pv.shape[0] or len(sizes) != sum(counts):
        return None
    starts = np.cumsum([0] + sizes)
    blocks = [pv[starts[k]:starts[k + 1]] for k in range(len(sizes))]
    pictures = [list(b) if pv.ndim == 4 else [b] for b in blocks]
    out, k = [], 0
    for c in counts:
        out.append([p for b in pictures[k:k + c] for p in b])
        k += c
    return out


def _unpadded_tiles(tiles: np.ndarray) -> List[np.ndarray]:
    """An image's tiles without the all-zero tiles the processor appends to reach the batch's
    largest tile count (a real trailing tile that is exactly zero everywhere, which a normalized
    picture practically never is, is dropped alone and in a batch alike)."""
    n = tiles.shape[0]
    while n > 1 and not tiles[n - 1].any():
        n -= 1
    return list(tiles[:n])


def _crop(picture: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A (C, H, W) picture cut to its real area (the processor pads at the bottom and right)."""
    return picture[:, :int(mask.any(axis=1).sum()), :int(mask.any(axis=0).sum())]


def _sizes_by_row(images: Sequence[Any], counts: Sequence[int]) -> List[Optional[List[List[int]]]]:
    """Each row's images' [width, height], in order; None for a row without images, or when the
    images do not add up to the rows' placeholders (a layout this cannot split)."""
    if not images or sum(counts) != len(images):
        return [None] * len(counts)
    out, k = [], 0
    for c in counts:
        out.append([[int(v) for v in getattr(im, "size", (0, 0))] for im in images[k:k + c]] if c else None)
        k += c
    return out


def _hash(arrays: Sequence[np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def versions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for pkg in ("torch", "transformers", "accelerate"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def image_processor_info(processor: Any, backend: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The image processor's class, its backend (transformers 5 names a PIL-backed processor
    ``*Pil`` and a torchvision-backed one ``*Fast`` or plain; ``backend``: the one an engine is
    told to use) and its output size settings, in plain JSON types (one shape for every engine:
    in process, vLLM's copy of the processor, a reader's)."""
    ip = getattr(processor, "image_processor", None)
    if ip is None:
        return None
    name = type(ip).__name__
    if backend is None:
        backend = "pil" if name.endswith("Pil") else "torchvision" if name.endswith("Fast") or \
            getattr(ip, "is_fast", False) else None
    size = {}
    for key in ("size", "crop_size", "min_pixels", "max_pixels", "patch_size"):
        value = _plain(getattr(ip, key, None))
        if value is not None:
            size[key] = value
    return {"class": name, "backend": backend, "output_size": size or None,
            "resample": str(getattr(ip, "resample", None)) if getattr(ip, "resample", None) is not None else None}


def _plain(value: Any) -> Any:
    """A processor setting as JSON (transformers' ``SizeDict`` is a dataclass; unset fields dropped)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if hasattr(value, "items"):
        out = {str(k): _plain(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None} or None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


class HFProvenanceMixin(HFState):
    """``provenance`` and ``take_traces`` of ``HFBaseInterface``; ``trace_encoded`` is called by
    ``_encode`` with every processor output that goes into the model."""

    config: Dict[str, Any]
    _traces: Optional[List[Dict[str, Any]]] = None

    def pixel_tiles(self, enc: Any, counts: Sequence[int]) -> Optional[List[int]]:
        """How many pictures (tiles) of the stacked ``pixel_values`` each row owns, for a
        processor that stacks every image's tiles and does not return the count (hook:
        InternVL); None where ``pixel_rows`` reads the layout itself."""
        return None

    def trace_encoded(self, texts: Sequence[str], enc: Any, images: Sequence[Any] = (),
                      counts: Optional[Sequence[int]] = None) -> None:
        """Remember each row's trace (rows in ``texts`` order; ``_by_groups`` puts them back in
        the batch's order). ``enc``: the processor's output as the model gets it, before it is
        moved to the model's device and dtype. ``images``: the batch's decoded images in row
        order, for each row's ``image_sizes`` (width, height as given to the processor: a
        dataset at another resolution differs here, while the processor's output size may
        not). ``counts``: each row's image count, where the text's placeholders do not say it."""
        ids = enc.get("input_ids")
        if ids is None:
            return
        ids = torch.as_tensor(ids)
        mask = enc.get("attention_mask")
        mask = torch.as_tensor(mask) if mask is not None else torch.ones_like(ids)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if counts is None:
            token = getattr(self, "image_token", None)
            counts = [t.count(token) if token else 0 for t in texts]
        counts = list(counts)
        pixels = pixel_rows(enc, counts, self.pixel_tiles(enc, counts))
        sizes = _sizes_by_row(images, counts)
        rows = []
        for r, text in enumerate(texts):
            real = torch.nonzero(mask[r]).flatten()
            first = int(ids[r, int(real[0])]) if len(real) else None
            rows.append({"prompt_sha": text_sha(text), "prompt_text": text, "prompt_tokens": int(len(real)),
                         "bos": (first == bos) if bos is not None and first is not None else None,
                         "pixel_sha": pixels[r], "image_sizes": sizes[r]})
        if self._traces is None:
            self._traces = []
        self._traces.extend(rows)

    def take_traces(self) -> Optional[List[Dict[str, Any]]]:
        out, self._traces = self._traces, None
        return out

    def provenance(self) -> Dict[str, Any]:
        tok = self.tokenizer
        template = getattr(self.processor, "chat_template", None) or getattr(tok, "chat_template", None)
        if isinstance(template, dict):  # several named templates
            template = "\n".join(f"{k}:{v}" for k, v in sorted(template.items()))
        pre = getattr(self, "preprocessor", None)
        adds = getattr(self, "adds_bos", None)
        try:  # what the tokenizer adds to a rendered prompt, as the run's processor calls ask it
            first = tok("a", add_special_tokens=adds() if adds else True)["input_ids"][0]
        except Exception:  # noqa: BLE001 - a tokenizer that cannot say is recorded as unknown
            first = None
        bos_id = getattr(tok, "bos_token_id", None)
        return {"engine": "transformers", "model_class": type(self.model).__name__,
                "dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device),
                "attn_implementation": getattr(getattr(self.model, "config", None), "_attn_implementation", None),
                "chat_template_sha": text_sha(str(template)) if template else None,
                "preprocessor": type(pre).__name__ if pre is not None else None,
                "system_line": getattr(pre, "system_msg", None),
                "bos_token": getattr(tok, "bos_token", None),
                "adds_bos": (first == bos_id) if first is not None and bos_id is not None else None,
                "image_processor": image_processor_info(self.processor), "versions": versions()}
