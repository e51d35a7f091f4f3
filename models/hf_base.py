"""Shared Hugging Face interface for image-text-to-text models.

Why one base: every HF LMM family loads the same way (``AutoProcessor`` +
``AutoModelForImageTextToText`` on a local directory or the offline HF cache), batches
prompts the same way (left padding) and scores candidates the same way (one prefix pass,
KV cache shared by all candidates). A family file only says which ``model_type`` values it
accepts, how ``IMAGE_TOKEN`` is written for it, and which preprocessor it uses.

``HFBaseInterface`` is assembled from one mixin per concept, each read in one sitting:

* ``models.hf_loading``: path resolution, the family check, dtype, big-model placement;
* ``models.hf_inputs``: prompt rendering, images, processor inputs, context length, batch groups;
* ``models.hf_generation``: greedy and seeded sampled generation (``raw_batch_generate``);
* ``models.hf_likelihood``: prefix-shared candidate scoring (``raw_batch_predict``) and the
  naive reference ``score_full_sequence``;
* ``models.hf_provenance``: the run's provenance and each sample's trace (what the model got).

Each mixin derives from ``models.hf_state.HFState``, which declares the state they share and the
methods one calls on another (declarations only), so each is read and type-checked on its own.

The names other modules import from here stay importable here.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

import torch

from .hf_compat import allow_video_processors_without_torchvision
from .hf_generation import GEN_KEYS, HFGenerationMixin
from .hf_inputs import HFInputsMixin
from .hf_likelihood import HFLikelihoodMixin
from .hf_provenance import HFProvenanceMixin
from .hf_loading import (_DTYPES, DEVICE_MAP_STRATEGIES, HFLoadingMixin, _device_name, _is_path_like,
                               _one_line, _parse_mapping, gpu_group)
from .interfaces.base_interface import BaseInterface
from ..utils.errors import ReformError

logger = logging.getLogger(__name__)

__all__ = ["HFBaseInterface", "GEN_KEYS", "DEVICE_MAP_STRATEGIES", "allow_video_processors_without_torchvision",
           "gpu_group", "_DTYPES", "_device_name", "_is_path_like", "_one_line", "_parse_mapping"]


class HFBaseInterface(HFLoadingMixin, HFInputsMixin, HFGenerationMixin, HFLikelihoodMixin, HFProvenanceMixin,
                      BaseInterface):
    """Base for Hugging Face image-text-to-text families.

    Config keys: ``model_name`` (local dir, HF id in the offline cache, or ``tiny``),
    ``model_type``, ``half_evaluation``, ``dtype``, ``device``, ``trust_remote_code``,
    ``attn_implementation``, ``candidate_batch_size`` (candidates scored per pass, default
    all), ``max_new_tokens`` (default 30), ``tiny_size`` (``tiny`` | ``bench``); big models:
    ``device_map``, ``max_memory``, ``offload_folder``, ``gpus_per_rank``, ``tp_plan`` (see
    ``_placement_kwargs``); ``max_context_tokens`` (a context limit tighter than the model's).
    """

    def __init__(self, config: Optional[Dict[str, Any]] = None, load_weights: bool = True) -> None:
        """``load_weights=False``: the checkpoint's processor and prompt rendering only (its
        ``render``, ``make_preprocessor``, ``candidate_ids``), for an engine that runs the
        weights itself (``models.interfaces.vllm_interface``): its prompts are then this
        family's, not a copy."""
        super().__init__(config)
        cfg = self.config
        self.device = torch.device(cfg.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = self._pick_dtype(cfg)
        if not cfg.get("model_name"):
            # never fall back to the random tiny model silently: its scores would pass for a result
            raise ReformError(f"model '{self.name or self.family}': give --model_name (a checkpoint directory, "
                              "an HF id in the offline cache, or 'tiny' for the random test model)")
        self.model_path = self._resolve_path(str(cfg["model_name"]))
        self.chat_response_prefix: Optional[str] = None
        self._sample_ids: Optional[List[Any]] = None
        if load_weights:
            self._load()
        else:
            self._load_processor()

    # ---------------------------------------------------------------------------- dispatch
    def forward(self, inference_method: str, samples: Sequence[Dict[str, Any]], prompts: Sequence[Any],
                **gen_kwargs: Any) -> List[Any]:
        """As ``BaseInterface.forward``; remembers sample ids so errors can name them."""
        self._sample_ids = [s.get("sample_id") for s in samples]
        self._traces = None
        try:
            with torch.inference_mode():
                return super().forward(inference_method, samples, prompts, **gen_kwargs)
        finally:
            self._sample_ids = None

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update(model_path=self.model_path, dtype=str(self.dtype).replace("torch.", ""))
        snapshot = getattr(self, "hub_snapshot", None)
        if snapshot is not None:  # a hub id: the commit actually loaded
            d["checkpoint_source"] = snapshot.record()
        return d
