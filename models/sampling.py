"""Batch-invariant seeded sampling for ``generate``: per-row Gumbel-max.

Why: sampling through ``generate(do_sample=True)`` draws every row of a batch from one
global generator, so a sample's tokens depend on its batch neighbours (how many rows came
before it, how long they ran). Here each row draws from its own generator instead:
softmax sampling is ``argmax(logits / T + G)`` with ``G`` i.i.d. standard Gumbel noise, so
the processor adds noise keyed only by the row's seed and the decoding step and lets greedy
decoding take the argmax. The row seed comes from ``run_eval`` as
``derive_seed(seed, sample_id, dup_index, response_index)``; the noise of step ``t`` is drawn
from a generator seeded with ``derive_seed(row_seed, "gumbel", t)``. Batch size, batch
neighbours and left padding never change a row's draw.

Filtering warpers (temperature, then top-k, top-p, min-p, in ``generate``'s order) run
before the noise, per row, so filtered tokens stay at ``-inf`` and the argmax samples from
exactly the renormalised filtered distribution. The noise is drawn on the logits' device by that
device's generator (no per-step host-to-device copy; CPU and CUDA runs draw different
streams, as their logits differ anyway).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from ..utils.seeding import derive_seed


def gumbel_noise(row_seed: int, step: int, width: int, device: Any = "cpu") -> torch.Tensor:
    """Standard Gumbel noise of ``width`` values on ``device``, a function of (row_seed, step)
    and the device type only (CPU and CUDA generators give different streams)."""
    gen = torch.Generator(device=device).manual_seed(derive_seed(int(row_seed), "gumbel", int(step)))
    u = torch.rand(width, generator=gen, dtype=torch.float64, device=device)
    u = u.clamp_(min=torch.finfo(torch.float64).tiny)
    return -torch.log(-torch.log(u))


class SeededGumbelSampler:
    """A ``generate`` logits processor that turns greedy decoding into per-row seeded sampling.

    Use with ``do_sample=False``: it returns ``warped_logits + gumbel_noise(seed_row, step)``,
    whose argmax is a draw from ``softmax(warped_logits)`` under the row's own generator.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, min_p: Optional[float] = None) -> None:
        from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                            TopKLogitsWarper, TopPLogitsWarper)
        if temperature <= 0:
            raise ValueError("SeededGumbelSampler needs a temperature > 0")
        self.seeds: List[int] = [int(s) for s in seeds]
        self.warpers: list = []
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(float(temperature)))
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k=int(top_k)))
        if top_p is not None and float(top_p) < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=float(top_p)))
        if min_p is not None:
            self.warpers.append(MinPLogitsWarper(min_p=float(min_p)))
        self._start: Optional[int] = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.seeds):
            raise ValueError(f"{scores.shape[0]} rows but {len(self.seeds)} seeds (beam search is not supported)")
        if self._start is None:  # the first call is step 0, whatever the prompt (or decoder) length
            self._start = input_ids.shape[1]
        step = input_ids.shape[1] - self._start
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        noise = torch.stack([gumbel_noise(s, step, scores.shape[-1], scores.device) for s in self.seeds])
        # float64, so adding the noise rounds no near-tie away; greedy only takes the argmax
        return scores.double() + noise  # type: ignore[return-value]  # float64 on purpose (above); the hook's stub says FloatTensor
