"""From a prompt to model inputs: rendering (dialogue string or chat template), image decoding,
the processor call, context-length checks and counts, and the batch grouping hooks.

Why its own module: generation and likelihood both start here, so a prompt becomes the same
tokens on both paths, and every error names the sample (``self._sample_ids``).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from .hf_loading import _one_line
from .hf_state import HFState
from ..utils.errors import ReformError
from ..utils.run_images import open_run_image
from ..utils.schema import IMAGE_TOKEN

logger = logging.getLogger(__name__)


class HFInputsMixin(HFState):
    """Prompts, images, processor inputs and context length of ``HFBaseInterface``."""

    option_names: Tuple[str, ...] = ("max_context_tokens", "add_bos")
    #: what the processor returns (``return_tensors``): ``pt``, or ``np`` for a processor that
    #: post-processes its own outputs with numpy (PaliGemma), which warns on torch tensors
    processor_tensors: str = "pt"
    config: Dict[str, Any]
    chat_response_prefix: Optional[str]
    _sample_ids: Optional[List[Any]]

    # ---------------------------------------------------------------------------- context
    def max_context_tokens(self) -> Optional[int]:
        """``max_position_embeddings`` of the text model, or config ``max_context_tokens``."""
        return self.max_context

    def count_prompt_tokens(self, images: Sequence[Any], prompt: Any) -> Optional[int]:
        """Length of the processor's ``input_ids`` for this prompt (image tokens expanded)."""
        text = self.render(prompt)
        imgs = self._images(images, 0)
        kwargs: Dict[str, Any] = {"text": [text], "return_tensors": self.processor_tensors, **self._bos_kwargs()}
        if imgs:
            kwargs["images"] = imgs
        enc = self.processor(**kwargs)
        return int(enc["input_ids"].shape[1])

    def answer_reserve_tokens(self, inference_method: str, sample: Dict[str, Any],
                              gen_kwargs: Dict[str, Any]) -> int:
        """``max_new_tokens`` (as ``raw_batch_generate`` resolves it), or the longest candidate."""
        if inference_method == "likelihood":
            cands = sample.get("candidates") or []
            return max((len(self.tokenizer(" " + str(c), add_special_tokens=False)["input_ids"]) + 1
                        for c in cands), default=0)
        return int(gen_kwargs.get("max_new_tokens") or self.config.get("max_new_tokens") or 30)

    def adds_bos(self) -> bool:
        """Whether the tokenizer adds its special tokens (BOS) to the rendered prompt: config
        ``add_bos`` (default true). ``add_bos=false`` gives the model the rendered text's tokens
        alone, as a server that tokenizes a templated prompt without BOS does (vLLM's completions
        endpoint), so such a run can be reproduced in-process (docs/provenance.md)."""
        value = self.config.get("add_bos", True)
        if not isinstance(value, bool):
            raise ReformError(f"model {self.label}: --model_option add_bos must be true or false, got {value!r}")
        return value

    def _bos_kwargs(self) -> Dict[str, Any]:
        return {} if self.adds_bos() else {"add_special_tokens": False}

    # ---------------------------------------------------------------------------- prompts
    @property
    def image_token(self) -> str:
        """The family's image placeholder as its processor expects it in text."""
        return getattr(self.processor, "image_token", IMAGE_TOKEN)

    def image_prompt_text(self) -> str:
        """What one neutral ``IMAGE_TOKEN`` becomes in a dialogue string (override per family)."""
        return self.image_token

    def _sid(self, i: int) -> str:
        ids = self._sample_ids
        return f"sample {ids[i]}" if ids is not None and i < len(ids) else f"prompt #{i}"

    def render(self, prompt: Any, i: int = 0) -> str:
        """Dialogue string with family image tokens: strings get ``IMAGE_TOKEN`` translated;
        chat messages go through the processor's chat template (generation prompt added)."""
        if isinstance(prompt, str):
            text = prompt
            if self.image_prompt_text() != IMAGE_TOKEN:
                text = text.replace(IMAGE_TOKEN, self.image_prompt_text())
            return text
        if isinstance(prompt, list):
            try:
                text = self.processor.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            except Exception as e:  # noqa: BLE001 - template errors are user-facing config errors
                raise ReformError(f"model {self.label}: {self._sid(i)}: chat template failed: {_one_line(e)}") from None
            if self.chat_response_prefix:
                text = text + self.chat_response_prefix
            return text
        raise ReformError(f"model {self.label}: {self._sid(i)}: prompt must be a string or chat messages, "
                          f"got {type(prompt).__name__}")

    def _images(self, images: Iterable[Any], i: int) -> List[Image.Image]:
        """Decode images (paths or PIL) to RGB; errors name the sample and image index."""
        out = []
        for j, im in enumerate(images or []):
            if isinstance(im, str):
                try:
                    out.append(open_run_image(im))  # the file as the run fingerprinted it
                except ReformError as e:
                    raise ReformError(f"model {self.label}: {self._sid(i)}: image {j}: {_one_line(e)}") from None
            elif isinstance(im, Image.Image):
                try:
                    im.load()  # decode now, so a truncated file fails here with its sample named
                    out.append(im if im.mode == "RGB" else im.convert("RGB"))
                except OSError as e:
                    raise ReformError(f"model {self.label}: {self._sid(i)}: image {j} cannot be decoded ({_one_line(e)})") from None
            else:
                raise ReformError(f"model {self.label}: {self._sid(i)}: image {j} is a {type(im).__name__}, "
                                  "expected a PIL image or a file path")
        return out

    def _check_images(self, text: str, n_images: int, i: int) -> None:
        n_tok = text.count(self.image_token)
        if n_tok != n_images:
            raise ReformError(f"model {self.label}: {self._sid(i)}: prompt has {n_tok} image placeholders "
                              f"but {n_images} images were given")

    def _check_context(self, length: int, i: int, what: str) -> None:
        if self.max_context is not None and length > self.max_context:
            raise ReformError(f"model {self.label}: {self._sid(i)}: {what} is {length} tokens, longer than the "
                              f"model context of {self.max_context} tokens (fewer images or shorter history?)")

    def _encode(self, texts: List[str], images: List[Image.Image]) -> Dict[str, torch.Tensor]:
        """Processor call (left padding), moved to the model's device and dtype."""
        kwargs: Dict[str, Any] = {"text": texts, "return_tensors": self.processor_tensors, "padding": True,
                                  **self._bos_kwargs()}
        if images:
            kwargs["images"] = images
        enc = self.processor(**kwargs)
        self.trace_encoded(texts, enc, images)  # what the model is given, per row (models.hf_provenance)
        return self.to_model_inputs(enc)

    def to_model_inputs(self, enc: Any) -> Dict[str, Any]:
        """Processor outputs as a dict on the model's device, floating tensors in its dtype."""
        out: Dict[str, Any] = {}
        for k, v in enc.items():
            if isinstance(v, np.ndarray):
                v = torch.from_numpy(v)
            if isinstance(v, torch.Tensor):
                v = v.to(self.device)
                if v.is_floating_point():
                    v = v.to(self.dtype)
            out[k] = v
        return out

    # ---------------------------------------------------------------------------- batches
    def batch_groups(self, images_list: Sequence[Sequence[Any]]) -> List[List[int]]:
        """How the rows of a batch may run together so that no row's result depends on the
        others (hook): one group by default (left padding is neutral); Mllama groups rows by
        image count (padded image slots change its logits)."""
        return [list(range(len(images_list)))]

    def _by_groups(self, groups: List[List[int]], run: Any) -> List[Any]:
        """``run(group)`` per group of row indices, results put back in row order; errors
        raised inside name the group's samples."""
        if len(groups) == 1:
            return run(groups[0])
        out: List[Any] = [None] * sum(len(g) for g in groups)
        traces: List[Any] = [None] * len(out)
        ids = self._sample_ids
        try:
            for g in groups:
                self._sample_ids = [ids[i] if ids is not None and i < len(ids) else f"#{i}" for i in g]
                before = len(self._traces or [])
                for i, r in zip(g, run(g)):
                    out[i] = r
                for i, t in zip(g, (self._traces or [])[before:]):
                    traces[i] = t
        finally:
            self._sample_ids = ids
        self._traces = traces if any(t is not None for t in traces) else None
        return out
