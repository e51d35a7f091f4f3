"""What a Hugging Face model was really given: the run's provenance and each sample's trace.

Why: "my score differs from the paper / the other harness" is almost always a difference in
the system line or template, BOS, the image processor and its backend, dtype or attention
kernel (issue 27). Each of these is recorded where it is known for certain, here at the point
the processor's output goes into the model, never guessed: per run (``provenance``) and per
sample (``take_traces``: the rendered prompt's hash and token count, whether it starts with
BOS, and a hash of the pixel tensor the model received).
"""
from __future__ import annotations

import dataclasses
import hashlib
from importlib import metadata
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch


def text_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _array(value: Any) -> Optional[np.ndarray]:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").contiguous().numpy() if value.dtype != torch.bfloat16 else \
            value.detach().to("cpu").float().contiguous().numpy()
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value)
    return None


def pixel_rows(enc: Any, counts: Sequence[int]) -> List[Optional[str]]:
    """A hash of each row's pixel tensor (its images' slices of ``pixel_values``, in order):
    one slice per image, per row (a tensor batched by row), or by Qwen2-VL's patch grid
    (``image_grid_thw``). None for a row without images, or where the layout is not one of these."""
    n_rows = len(counts)
    pv = _array(enc.get("pixel_values")) if hasattr(enc, "get") else None
    if pv is None or not sum(counts):
        return [None] * n_rows
    grid = _array(enc.get("image_grid_thw"))
    per_image: Optional[List[np.ndarray]] = None
    if grid is not None and len(grid) == sum(counts):
        sizes = [int(np.prod(g)) for g in grid]
        if sum(sizes) == pv.shape[0]:
            starts = np.cumsum([0] + sizes)
            per_image = [pv[starts[k]:starts[k + 1]] for k in range(len(sizes))]
    elif pv.shape[0] == sum(counts):
        per_image = [pv[k] for k in range(pv.shape[0])]
    elif pv.shape[0] == n_rows:
        return [_hash([pv[r]]) if counts[r] else None for r in range(n_rows)]
    if per_image is None:
        return [_hash([pv]) if n_rows == 1 else None for _ in range(n_rows)]
    out, k = [], 0
    for c in counts:
        out.append(_hash(per_image[k:k + c]) if c else None)
        k += c
    return out


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


def image_processor_info(processor: Any) -> Optional[Dict[str, Any]]:
    """The image processor's class, its backend (transformers 5 names a PIL-backed processor
    ``*Pil`` and a torchvision-backed one ``*Fast`` or plain) and its output size settings."""
    ip = getattr(processor, "image_processor", None)
    if ip is None:
        return None
    name = type(ip).__name__
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
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if hasattr(value, "items"):
        out = {str(k): _plain(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None} or None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


class HFProvenanceMixin:
    """``provenance`` and ``take_traces`` of ``HFBaseInterface``; ``trace_encoded`` is called by
    ``_encode`` with every processor output that goes into the model."""

    config: Dict[str, Any]
    _traces: Optional[List[Dict[str, Any]]] = None

    def trace_encoded(self, texts: Sequence[str], enc: Any, images: Sequence[Any] = ()) -> None:
        """Remember each row's trace (rows in ``texts`` order; ``_by_groups`` puts them back in
        the batch's order). ``images``: the batch's decoded images in row order, for each row's
        ``image_sizes`` (width, height as given to the processor: a dataset at another
        resolution differs here, while the processor's output size may not)."""
        ids = enc.get("input_ids")
        if ids is None:
            return
        ids = torch.as_tensor(ids)
        mask = enc.get("attention_mask")
        mask = torch.as_tensor(mask) if mask is not None else torch.ones_like(ids)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        token = getattr(self, "image_token", None)
        counts = [t.count(token) if token else 0 for t in texts]
        pixels = pixel_rows(enc, counts)
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
