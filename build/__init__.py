"""Dataset builders and the unified-sample loader.

``load_reform_dataset`` is the public data loader: it returns an indexable, DataLoader-ready
dataset of unified samples (see ``utils.schema``) for any registered benchmark.
"""
from __future__ import annotations

if not __name__.startswith("reform_eval."):  # this folder reached under its short name: one copy only
    from reform_eval import refuse_short_name
    refuse_short_name(__name__)

import importlib
import logging
from typing import Any, Callable, Dict, List, Optional, Union

from .ablation import IMAGE_ABLATIONS, ablate_images
from .reformulation import Reformulator
from .registry import (BUILDERS, Builder, caller_paths_absolute, get_builder_class, load_config,
                            register_builder, resolve_config)
from ..utils.errors import ReformError, unknown_name
from ..utils.images import SyntheticImage
from ..utils.run_images import open_run_image
from ..utils.predictions import image_ids
from ..utils.schema import FORMULATIONS, IMAGE_TOKEN, Sample
from ..utils.seeding import rng_for

logger = logging.getLogger(__name__)

#: Modules that register builders; a benchmark whose module is absent is simply not offered.
BUILDER_MODULES = ("reform_eval.build.custom", "reform_eval.build.iwisdm", "reform_eval.build.mme", "reform_eval.build.mmmt_if")

for _mod in BUILDER_MODULES:
    try:
        importlib.import_module(_mod)
    except ModuleNotFoundError as e:  # only the module itself may be missing
        if e.name != _mod:
            raise

#: reformulation defaults shared by the command line (evaluation.config reads them) and by
#: ``build_dataset`` / ``load_reform_dataset``: one place, so a sample built in Python is the sample
#: the CLI builds (zero-shot unless asked)
LOAD_DEFAULTS: Dict[str, Any] = {"in_context_sample": False, "random_instruct": True, "data_duplication": 1,
                                 "shuffle_options": True, "option_mark": "upper"}
_D = LOAD_DEFAULTS

__all__ = ["BUILDERS", "IMAGE_ABLATIONS", "LOAD_DEFAULTS", "Builder", "ReformDataset", "build_dataset", "load_reform_dataset",
           "register_builder", "IMAGE_TOKEN", "Sample"]


def _load_image(image: Any, record: Any = None) -> Any:
    if isinstance(image, str):  # at the sample's turn: the file must be what the run fingerprinted
        return open_run_image(image, record=record)
    if isinstance(image, SyntheticImage):
        return image.to_pil()
    return image


class ReformDataset:
    """A list of unified samples; loads image paths lazily unless ``lazy_images``.

    With ``lazy_images`` an item keeps its image paths (every file was checked as an image when
    the run's fingerprint read it, ``utils.file_hashes``).

    A map-style dataset (``__len__``, ``__getitem__``), which torch's DataLoader takes as it is;
    it does not derive from torch's ``Dataset`` so that building samples never imports torch.

    With a ``preprocessor``, each item also carries ``prompt`` (the model's input text).
    The blank and noise images of ``--image_ablation`` are made into pixels per item either way
    (they are no files a caller could open later).
    """

    def __init__(self, samples: List[Dict[str, Any]], builder: Builder,
                 preprocessor: Optional[Callable[[Dict[str, Any]], Any]] = None,
                 lazy_images: bool = False) -> None:
        self.samples = samples
        self.builder = builder
        self.preprocessor = preprocessor
        self.lazy_images = lazy_images

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> Dict[str, Any]:
        sample = dict(self.samples[idx])
        sample["image_ids"] = image_ids(sample)
        if not self.lazy_images:
            sample["images"] = [_load_image(im, sample["sample_id"]) for im in sample["images"]]
        elif any(isinstance(im, SyntheticImage) for im in sample["images"]):
            sample["images"] = [im.to_pil() if isinstance(im, SyntheticImage) else im for im in sample["images"]]
        if self.preprocessor is not None:
            sample["prompt"] = self.preprocessor(sample)
        return sample

    @property
    def build_log(self) -> List[str]:
        return self.builder.build_log


def build_dataset(dataset_name: str, formulation: str, dataset_config: Union[str, Dict[str, Any], None] = None,
                  inference_method: str = "generation", in_context_sample: bool = _D["in_context_sample"],
                  random_instruct: bool = _D["random_instruct"], data_duplication: int = _D["data_duplication"],
                  shuffle_options: bool = _D["shuffle_options"], option_mark: str = _D["option_mark"],
                  seed: int = 0, subsample: Optional[int] = None,
                  extra_options: Optional[Dict[str, Any]] = None, image_ablation: Optional[str] = None,
                  image_required: bool = False, **builder_options: Any) -> tuple:
    """Build the unified samples; returns ``(samples, builder)``.

    ``dataset_config`` is a YAML path, the name of a shipped config (``"mme"``, ``"iwisdm_high"``, as
    ``--dataset_config`` takes) or a dict; ``builder_options`` (or the ``extra_options`` dict, for
    keys that share a name with this function's parameters, such as the trial ``seed``) override
    its keys.
    ``subsample`` keeps a seeded random subset of that many *groups* (``Builder.subsample_key``:
    an MME image with both questions, an MMMT-IF chat with all its turns, an iWISDM trial);
    dataset order is kept.
    ``image_ablation`` (``none``, ``blank``, ``noise``, ``shuffle``; ``build.ablation``) takes the
    images away from the built samples, seeded by ``seed``; with ``image_required`` (a model that
    cannot run without an image) ``none`` becomes ``blank``. What was done is in
    ``builder.build_info["image_ablation"]`` and in each sample's ``image_ablation``.
    """
    cls = get_builder_class(dataset_name)
    if image_ablation is not None and image_ablation not in IMAGE_ABLATIONS:
        raise unknown_name("image_ablation", image_ablation, IMAGE_ABLATIONS)
    if formulation not in FORMULATIONS:
        raise unknown_name("formulation", formulation, FORMULATIONS)
    if formulation not in cls.formulations:
        raise ReformError(f"dataset '{cls.name}' supports formulations {', '.join(cls.formulations)}, "
                          f"not '{formulation}'")
    if isinstance(dataset_config, dict):
        cfg, cfg_path = dict(dataset_config), None
    else:
        cfg, cfg_path = load_config(resolve_config(dataset_config, cls.name))
    builder = cls(cfg, cfg_path, **{**builder_options, **(extra_options or {})})
    items = builder.build_items(formulation, inference_method, seed)
    if subsample is not None:
        if isinstance(subsample, bool) or not isinstance(subsample, int) or subsample < 1:
            raise ReformError(f"subsample must be a whole number >= 1, got {subsample!r}")
        items = subsample_groups(items, builder, subsample, seed)
    if not items:
        raise ReformError(f"dataset '{cls.name}' ({cfg_path or 'options'}): the build holds no samples; "
                          "check the data file and the options that select items")
    seen = set()
    for i, it in enumerate(items):
        sid = str(it["sample_id"])
        if sid in seen:
            raise ReformError(f"dataset '{cls.name}' ({cfg_path or 'options'}): duplicate sample_id '{sid}' "
                              f"(item {i}); every item needs its own id")
        seen.add(sid)
    ref = Reformulator(cls.name, formulation, inference_method, in_context_sample=in_context_sample,
                       random_instruct=random_instruct, data_duplication=data_duplication,
                       shuffle_options=shuffle_options, option_mark=option_mark, seed=seed,
                       instruction_pool=builder.instruction_pool(formulation, inference_method),
                       in_context_example=builder.in_context_example(formulation))
    samples = [s for it in items for s in ref.expand(it)]
    if image_ablation is not None:
        samples, info = ablate_images(samples, image_ablation, seed, builder.group_key, image_required, cls.name)
        builder.build_info = {**(getattr(builder, "build_info", None) or {}), "image_ablation": info}
        builder.build_log.append(f"--image_ablation {image_ablation}: {info['images_replaced']} image(s) of "
                                 f"{info['samples']} sample(s) " + ("removed" if info["applied"] == "none" else
                                                                   f"replaced ({info['applied']})"))
    for line in builder.build_log:
        logger.info("%s build: %s", cls.name, line)
    return samples, builder


def subsample_groups(items: List[Dict[str, Any]], builder: Builder, n: int, seed: int) -> List[Dict[str, Any]]:
    """A seeded subset of ``n`` whole groups (all items of a drawn group kept, dataset order kept)."""
    keys: List[str] = []
    seen = set()
    for it in items:
        k = builder.subsample_key(it)
        if k not in seen:
            seen.add(k)
            keys.append(k)
    if n >= len(keys):
        if n > len(keys):
            logger.warning("%s: subsample %d is larger than the data (%d to draw from); all %d are used",
                           builder.name, n, len(keys), len(keys))
        return items
    chosen = set(rng_for(seed, builder.name, "subsample").sample(keys, n))
    return [it for it in items if builder.subsample_key(it) in chosen]


def load_reform_dataset(dataset_name: str, formulation: str, dataset_config: Union[str, Dict[str, Any], None] = None,
                        inference_method: str = "generation", in_context_sample: bool = _D["in_context_sample"],
                        random_instruct: bool = _D["random_instruct"], data_duplication: int = _D["data_duplication"],
                        shuffle_options: bool = _D["shuffle_options"], option_mark: str = _D["option_mark"],
                        seed: int = 0,
                        preprocessor: Optional[Callable[[Dict[str, Any]], Any]] = None,
                        lazy_images: bool = False, subsample: Optional[int] = None,
                        image_ablation: Optional[str] = None, image_required: bool = False,
                        **builder_options: Any) -> ReformDataset:
    """Load a benchmark as an indexable dataset of unified samples.

    Its defaults are the command line's (``LOAD_DEFAULTS``: zero-shot, shuffled options marked (A)).
    Same arguments and seed give identical samples on every rank and every run. Use it with
    ``torch.utils.data.DataLoader(ds, collate_fn=list)`` (samples are dicts with PIL images).
    ``image_ablation``: ``none``, ``blank``, ``noise`` or ``shuffle`` (``build_dataset``).
    """
    builder_options = caller_paths_absolute(get_builder_class(dataset_name), builder_options)
    samples, builder = build_dataset(dataset_name, formulation, dataset_config, inference_method,
                                     in_context_sample, random_instruct, data_duplication,
                                     shuffle_options, option_mark, seed, subsample,
                                     image_ablation=image_ablation, image_required=image_required,
                                     **builder_options)
    return ReformDataset(samples, builder, preprocessor=preprocessor, lazy_images=lazy_images)
