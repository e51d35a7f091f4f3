"""Generation for ``HFBaseInterface``: greedy or sampled, left-padded batches, per-row seeds.

Sampling with ``seeds`` is batched and batch-invariant (``models.sampling``: Gumbel-max keyed
by the row's seed and step). Every text goes through ``models.outputs.finish_text`` (the
normalisation the API path shares) and carries its generated token count.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence

import torch
from PIL import Image

from .hf_state import HFState
from .outputs import GenText, finish_text
from .sampling import SeededGumbelSampler
from ..utils.errors import ReformError

logger = logging.getLogger(__name__)

#: generation keyword arguments understood by ``raw_batch_generate``
GEN_KEYS = ("temperature", "max_new_tokens", "seeds", "top_p", "top_k", "num_beams")


class HFGenerationMixin(HFState):
    """``raw_batch_generate`` of ``HFBaseInterface``."""

    config: Dict[str, Any]

    @torch.inference_mode()
    def raw_batch_generate(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                           **gen_kwargs: Any) -> List[str]:
        """Greedy (temperature 0/None) or sampled generation; the prompt is stripped.

        Sampling with ``seeds`` (one int per prompt) runs batched and batch-invariant: each
        row draws its tokens from its own generator (``models.sampling``: Gumbel-max keyed by
        the row's seed and the step, after temperature/top-k/top-p), so a sample's output
        never depends on its batch neighbours or padding. Beam sampling with seeds runs each
        prompt alone under its own seed (rows of a beam search are not one sample each).
        """
        unknown = set(gen_kwargs) - set(GEN_KEYS)
        if unknown:
            logger.debug("ignoring generation arguments %s", sorted(unknown))
        temperature = float(gen_kwargs.get("temperature") or 0.0)
        max_new = int(gen_kwargs.get("max_new_tokens") or self.config.get("max_new_tokens") or 30)
        seeds = gen_kwargs.get("seeds")
        hf_kwargs: Dict[str, Any] = {"max_new_tokens": max_new,
                                     "pad_token_id": self.tokenizer.pad_token_id}
        if temperature > 0:
            hf_kwargs.update(do_sample=True, temperature=temperature)
            for k in ("top_p", "top_k"):
                if gen_kwargs.get(k) is not None:
                    hf_kwargs[k] = gen_kwargs[k]
        else:
            hf_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if gen_kwargs.get("num_beams"):
            hf_kwargs["num_beams"] = int(gen_kwargs["num_beams"])

        texts, images = [], []
        for i, (ims, p) in enumerate(zip(images_list, prompts)):
            text = self.render(p, i)
            imgs = self._images(ims, i)
            self._check_images(text, len(imgs), i)
            texts.append(text)
            images.append(imgs)

        if temperature > 0 and seeds is not None:
            if len(seeds) != len(texts):
                raise ReformError(f"model {self.label}: {len(seeds)} seeds for {len(texts)} prompts")
            if int(hf_kwargs.get("num_beams") or 1) == 1:
                return self._by_groups(self.batch_groups(images), lambda g: self._generate(
                    [texts[i] for i in g], [images[i] for i in g],
                    self._seeded_kwargs(hf_kwargs, [seeds[i] for i in g], temperature, gen_kwargs)))
            outs: List[str] = []
            for i, (t, ims, seed) in enumerate(zip(texts, images, seeds)):
                devices = [self.device] if self.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(int(seed))
                    outs.extend(self._generate([t], [ims], hf_kwargs, offset=i))
            return outs
        return self._by_groups(self.batch_groups(images), lambda g: self._generate(
            [texts[i] for i in g], [images[i] for i in g], hf_kwargs))

    def _seeded_kwargs(self, hf_kwargs: Dict[str, Any], seeds: Sequence[int], temperature: float,
                       gen_kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """``generate`` arguments for per-row seeded sampling: greedy decoding over the
        logits as warped by ``SeededGumbelSampler``. top-k / top-p / min-p come from the call,
        else from the checkpoint's generation config (what ``do_sample=True`` would use)."""
        from transformers import LogitsProcessorList

        gc = getattr(self.model, "generation_config", None)
        warp = {k: gen_kwargs[k] if gen_kwargs.get(k) is not None else getattr(gc, k, None)
                for k in ("top_k", "top_p", "min_p")}
        unsupported = [k for k in ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
                       if getattr(gc, k, None) not in (None, 0.0, 1.0)]
        if unsupported:
            logger.warning("seeded sampling ignores the checkpoint's generation-config %s", ", ".join(unsupported))
        kwargs = {k: v for k, v in hf_kwargs.items() if k not in ("do_sample", "temperature", "top_p", "top_k")}
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None, min_p=None,
                      logits_processor=LogitsProcessorList([SeededGumbelSampler(seeds, temperature, **warp)]))
        return kwargs

    def _generate(self, texts: List[str], images: List[List[Image.Image]], hf_kwargs: Dict[str, Any],
                  offset: int = 0) -> List[GenText]:
        enc = self._encode(texts, [im for ims in images for im in ims])
        length = enc["input_ids"].shape[1]
        for i in range(len(texts)):
            n = int(enc["attention_mask"][i].sum()) if "attention_mask" in enc else length
            self._check_context(n + hf_kwargs["max_new_tokens"], offset + i, "prompt + max_new_tokens")
        out = self.model.generate(**enc, **hf_kwargs)
        return self.decode_generated(out[:, length:])

    def decode_generated(self, new_ids: torch.Tensor) -> List[GenText]:
        """Generated token rows (prompt removed) as ``finish_text`` texts carrying their token
        counts: a row's tokens up to and including its first EOS (later positions are the
        padding of a row that finished early)."""
        texts = self.tokenizer.batch_decode(new_ids, skip_special_tokens=True)
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        eos_ids = torch.tensor([e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None],
                               dtype=new_ids.dtype, device=new_ids.device)
        width = new_ids.shape[1]
        counts = []
        for row in new_ids:
            hits = torch.nonzero(torch.isin(row, eos_ids)).flatten() if len(eos_ids) else row[:0]
            counts.append(int(hits[0]) + 1 if len(hits) else width)
        return [finish_text(t, tokens=n) for t, n in zip(texts, counts)]
