"""Benchmark presets: the paper's complexity levels, single-frame tasks and DMS delay sweeps.

Why presets generate by construction: AutoTask samples graphs within the preset's task space
(bounded retries on the And/Or count), and the frame layout places exactly ``n_frames``
frames (merging Selects or adding delays), so no preset relies on open-ended rejection.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from build.iwisdm.graph import AutoTask, Task, TaskSpace, dms
from build.iwisdm.stimuli import StimulusSet
from build.iwisdm.trial import Trial, TrialGenerator
from utils.errors import ReformError, unknown_name

logger = logging.getLogger(__name__)

BOOL_OPS = ("IsSame", "NotSame", "And", "Or")
GETTER_OF = {"location": "GetLocation", "category": "GetCategory", "identity": "GetIdentity"}


@dataclass
class Preset:
    """How trials of one benchmark level are made."""

    name: str
    n_frames: Optional[int] = None
    space: Optional[TaskSpace] = None
    #: for hand-made presets: the DMS feature
    dms_feature: Optional[str] = None
    response_types: Tuple[str, ...] = ("bool",)
    merge_prob: float = 0.2
    description: str = ""


def _space(**kw: Any) -> TaskSpace:
    ops = ("IsSame", "NotSame", "And", "Or", "GetCategory", "GetLocation", "GetIdentity", "Select", "CONST", "Switch")
    return TaskSpace(ops=kw.pop("ops", ops), **kw)


PRESETS: Dict[str, Preset] = {
    "low": Preset("low", 6, _space(root_ops=("And", "Or"), bool_ops=(1, 1), max_depth=3, max_op=15),
                  description="6 frames, exactly one And/Or, no Switch, boolean answers"),
    "medium": Preset("medium", 8, _space(min_switch=1, max_switch=1, root_ops=BOOL_OPS, bool_ops=(1, 1),
                                         max_depth=4, max_op=30),
                     description="8 frames, one And/Or, one Switch, boolean answers"),
    "high": Preset("high", 9, _space(min_switch=1, max_switch=1, root_ops=BOOL_OPS,
                                     branch_ops=BOOL_OPS + ("GetLocation", "GetCategory"), bool_ops=(1, 2),
                                     max_depth=5, max_op=40),
                   response_types=("bool", "location", "category"),
                   description="9 frames, one or two And/Or, one Switch, answers true/false, locations, categories"),
    "single_frame_location": Preset(
        "single_frame_location", 1,
        _space(ops=("IsSame", "NotSame", "GetLocation", "Select", "CONST"), root_ops=("IsSame", "NotSame"),
               const_prob=1.0, max_depth=2, max_op=5),
        description="one frame, location of the object compared with a location"),
    "single_frame_category": Preset(
        "single_frame_category", 1,
        _space(ops=("IsSame", "NotSame", "GetCategory", "Select", "CONST"), root_ops=("IsSame", "NotSame"),
               const_prob=1.0, max_depth=2, max_op=5),
        description="one frame, category of the object compared with a category"),
    "dms_location": Preset("dms_location", dms_feature="location", description="delayed match to sample: location"),
    "dms_category": Preset("dms_category", dms_feature="category", description="delayed match to sample: category"),
    "dms_identity": Preset("dms_identity", dms_feature="identity", description="delayed match to sample: identity"),
}


def get_preset(name: str, where: Optional[str] = None) -> Preset:
    if name not in PRESETS:
        err = unknown_name("iWISDM preset", name, PRESETS)
        if where:
            raise ReformError(f"{where}: field 'preset': {err}")
        raise err
    return PRESETS[name]


def restrict_features(preset: Preset, features: Optional[Sequence[str]]) -> Preset:
    """The preset limited to some object features (e.g. location-only), as in the paper's variants."""
    if not features or preset.space is None:
        return preset
    bad = [f for f in features if f not in GETTER_OF]
    if bad:
        raise ReformError(f"unknown iWISDM feature(s) {bad}; valid: {', '.join(GETTER_OF)}")
    drop = {g for f, g in GETTER_OF.items() if f not in features}
    space = replace(preset.space, ops=tuple(o for o in preset.space.ops if o not in drop),
                    branch_ops=None if preset.space.branch_ops is None else
                    tuple(o for o in preset.space.branch_ops if o not in drop))
    return replace(preset, space=space)


def answer_vocabulary(preset: Preset, stim: StimulusSet) -> List[str]:
    """The preset's answer words, in the paper's order (true, false, locations, categories)."""
    out = ["true", "false"]
    if "location" in preset.response_types:
        out += ["bottom right", "bottom left", "top left", "top right"]
    if "category" in preset.response_types:
        out += list(stim.categories)
    return out


class PresetSampler:
    """Draws (task, trial) pairs of a preset; one instance caches the AutoTask sampler."""

    def __init__(self, preset: Preset, stim: StimulusSet, n_delay: Any = None, n_distractors: int = 0,
                 fixation: bool = False, n_frames: Optional[int] = None) -> None:
        self.preset = preset
        self.gen = TrialGenerator(stim)
        self.auto = AutoTask(preset.space) if preset.space is not None else None
        self.n_frames = n_frames or preset.n_frames
        delays = n_delay if n_delay is not None else [1]
        self.delays = [int(d) for d in (delays if isinstance(delays, (list, tuple)) else [delays])]
        if any(d < 0 for d in self.delays):
            raise ReformError(f"n_delay must be >= 0, got {self.delays}")
        self.n_distractors = int(n_distractors)
        self.fixation = bool(fixation)
        self._dms = {d: dms(preset.dms_feature, d) for d in self.delays} if preset.dms_feature else {}
        self._decks: Dict[str, List[Any]] = {}
        self._deck_rng: Optional[random.Random] = None

    def balanced_picker(self, seed_rng: random.Random):
        """Answer values drawn from per-type shuffled decks, so every value of a response type
        occurs equally often (up to one deck) - the paper's forced balance, without rejection."""
        self._deck_rng = seed_rng

        def pick(kind: str, space: Sequence[Any]) -> Any:
            deck = self._decks.get(kind)
            if not deck:
                deck = list(space)
                self._deck_rng.shuffle(deck)
                self._decks[kind] = deck
            return deck.pop()
        return pick

    def task(self, rng: random.Random, name: str = "") -> Task:
        if self.auto is not None:
            return self.auto.sample(rng, name=name)
        return self._dms[rng.choice(self.delays)]

    def trial(self, rng: random.Random, name: str = "", picker: Optional[Any] = None) -> Tuple[Task, Trial]:
        """One trial; ``picker`` (e.g. ``balanced_picker``) chooses the answer values."""
        task = self.task(rng, name)
        trial = self.gen.instantiate(task, rng, n_frames=self.n_frames, merge_prob=self.preset.merge_prob,
                                     n_distractors=self.n_distractors, fixation=self.fixation, picker=picker)
        trial.meta["preset"] = self.preset.name
        return task, trial
