"""Benchmark presets: the paper's complexity levels, single-frame tasks and DMS delay sweeps.

Why presets generate by construction: AutoTask samples graphs within the preset's task space
(bounded retries on the And/Or count), and the frame layout places exactly ``n_frames``
frames, so no preset relies on open-ended rejection of whole trials.

Why a ``Shape``: by default trials are shaped as the paper and the original ``iwisdm`` 0.1.3
under the upstream benchmark configs (And/Or in separate clauses, one object per getter, one
"delay" per run of blank frames, constants on either side, the original's delay process); the
earlier shape of this generator stays available by name (``shape: legacy``) or per field.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .graph import AutoTask, Task, TaskSpace, dms
from .operators import BOOL
from .stimuli import StimulusSet
from .trial import DELAY_WORDINGS, DelayProcess, Trial, TrialGenerator
from ...utils.errors import ReformError, input_error, unknown_name
from ...utils.seeding import rng_for

logger = logging.getLogger(__name__)

BOOL_OPS = ("IsSame", "NotSame", "And", "Or")
GETTER_OF = {"location": "GetLocation", "category": "GetCategory", "identity": "GetIdentity"}


@dataclass(frozen=True)
class Shape:
    """How trials are shaped; the defaults are the paper's / iwisdm 0.1.3's (docs/iwisdm.md, "Shape")."""

    #: "subtasks": the original's AutoTask (And/Or in separate clauses); "nested": the earlier
    #: recursive sampler, which nests And/Or ("(A and B) or C")
    structure: str = "subtasks"
    #: "run": one "delay" per run of blank frames; "per_frame": "delay, delay, delay"
    delays: str = "run"
    #: "either": a constant is written first or second with equal probability, as the original;
    #: "second": always second ("category of object 1 not equals couches")
    const_position: str = "either"
    #: False: one object per getter and the original's delay process; True: Selects may share an
    #: object (the preset's ``merge_prob``) and delays fall uniformly between first and last frame
    object_reuse: bool = False


SHAPE_CHOICES: Dict[str, Tuple[Any, ...]] = {"structure": ("subtasks", "nested"), "delays": DELAY_WORDINGS,
                                             "const_position": ("either", "second"), "object_reuse": (False, True)}
#: named shapes: the default, and this generator's earlier behaviour
SHAPES: Dict[str, Shape] = {"original": Shape(),
                            "legacy": Shape(structure="nested", delays="per_frame", const_position="second",
                                            object_reuse=True)}


def resolve_shape(spec: Any = None, where: Optional[str] = None) -> Shape:
    """A Shape from None (the default), a name in SHAPES, a Shape, or a dict of fields
    (optionally with ``base``: a name in SHAPES), validated with errors naming the field."""
    if spec is None:
        return SHAPES["original"]
    if isinstance(spec, Shape):
        return spec
    if isinstance(spec, str):
        if spec not in SHAPES:
            raise input_error(f"unknown shape '{spec}'; valid: {', '.join(SHAPES)}", file=where, field="shape")
        return SHAPES[spec]
    if not isinstance(spec, dict):
        raise input_error(f"shape must be a name ({', '.join(SHAPES)}) or a mapping, got {spec!r}",
                          file=where, field="shape")
    spec = dict(spec)
    base = resolve_shape(spec.pop("base", "original"), where)
    names = {f.name for f in fields(Shape)}
    for k, v in spec.items():
        if k not in names:
            raise input_error(f"unknown key; valid: base, {', '.join(sorted(names))}", file=where,
                              field=f"shape.{k}")
        if v not in SHAPE_CHOICES[k] or type(v) is not type(SHAPE_CHOICES[k][0]):
            raise input_error(f"{v!r} is not one of {', '.join(map(str, SHAPE_CHOICES[k]))}", file=where,
                              field=f"shape.{k}")
    return replace(base, **spec)


@dataclass
class Preset:
    """How trials of one benchmark level are made."""

    name: str
    n_frames: Optional[int] = None
    #: the task space of the default shape (structure "subtasks")
    space: Optional[TaskSpace] = None
    #: the task space of structure "nested" (the earlier recursive sampler); None: ``space``
    nested_space: Optional[TaskSpace] = None
    #: for hand-made presets: the DMS feature
    dms_feature: Optional[str] = None
    response_types: Tuple[str, ...] = ("bool",)
    #: probability that two Selects share an object (shape ``object_reuse`` only)
    merge_prob: float = 0.2
    #: the original's delay process: a delay before each further object with ``delay_prob``,
    #: at most ``max_delay`` (upstream benchmark: delay_prob 0.5, max_delay 4/6/7)
    delay_prob: float = 0.5
    max_delay: int = 0
    description: str = ""


def _space(**kw: Any) -> TaskSpace:
    ops = ("IsSame", "NotSame", "And", "Or", "GetCategory", "GetLocation", "GetIdentity", "Select", "CONST", "Switch")
    return TaskSpace(ops=kw.pop("ops", ops), **kw)


def _orig(**kw: Any) -> TaskSpace:
    """A task space as iwisdm 0.1.3 samples under the upstream configs (compare_const_prob 0.2)."""
    return _space(style="subtasks", const_prob=0.2, const_first_prob=0.5, **kw)


PRESETS: Dict[str, Preset] = {
    "low": Preset("low", 6, _orig(root_ops=("And", "Or"), bool_ops=(1, 1)),
                  _space(root_ops=("And", "Or"), bool_ops=(1, 1), max_depth=3, max_op=15), max_delay=4,
                  description="6 frames, exactly one And/Or, no Switch, boolean answers"),
    "medium": Preset("medium", 8, _orig(min_switch=1, max_switch=1, root_ops=BOOL_OPS, bool_ops=(1, 1)),
                     _space(min_switch=1, max_switch=1, root_ops=BOOL_OPS, bool_ops=(1, 1), max_depth=4, max_op=30),
                     max_delay=6, description="8 frames, one And/Or, one Switch, boolean answers"),
    "high": Preset("high", 9, _orig(min_switch=1, max_switch=1, root_ops=BOOL_OPS,
                                    branch_ops=BOOL_OPS + ("GetLocation", "GetCategory"), bool_ops=(1, 2)),
                   _space(min_switch=1, max_switch=1, root_ops=BOOL_OPS,
                          branch_ops=BOOL_OPS + ("GetLocation", "GetCategory"), bool_ops=(1, 2),
                          max_depth=5, max_op=40),
                   response_types=("bool", "location", "category"), max_delay=7,
                   description="9 frames, one or two And/Or, one Switch, answers true/false, locations, categories"),
    "single_frame_location": Preset(
        "single_frame_location", 1,
        _space(ops=("IsSame", "NotSame", "GetLocation", "Select", "CONST"), root_ops=("IsSame", "NotSame"),
               const_prob=1.0, const_first_prob=0.5, max_depth=2, max_op=5),
        _space(ops=("IsSame", "NotSame", "GetLocation", "Select", "CONST"), root_ops=("IsSame", "NotSame"),
               const_prob=1.0, max_depth=2, max_op=5),
        description="one frame, location of the object compared with a location"),
    "single_frame_category": Preset(
        "single_frame_category", 1,
        _space(ops=("IsSame", "NotSame", "GetCategory", "Select", "CONST"), root_ops=("IsSame", "NotSame"),
               const_prob=1.0, const_first_prob=0.5, max_depth=2, max_op=5),
        _space(ops=("IsSame", "NotSame", "GetCategory", "Select", "CONST"), root_ops=("IsSame", "NotSame"),
               const_prob=1.0, max_depth=2, max_op=5),
        description="one frame, category of the object compared with a category"),
    # identification (the known-skill model's core skill, docs/models.md): name the one object's feature
    "identify_category": Preset(
        "identify_category", 1, _space(ops=("GetCategory", "Select"), root_ops=("GetCategory",), max_depth=2, max_op=3),
        response_types=("category",), description="one frame, the category of the object (8 answers)"),
    "identify_location": Preset(
        "identify_location", 1, _space(ops=("GetLocation", "Select"), root_ops=("GetLocation",), max_depth=2, max_op=3),
        response_types=("location",), description="one frame, the location of the object (4 answers)"),
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

    def keep(space: Optional[TaskSpace]) -> Optional[TaskSpace]:
        if space is None:
            return None
        return replace(space, ops=tuple(o for o in space.ops if o not in drop),
                       branch_ops=None if space.branch_ops is None else
                       tuple(o for o in space.branch_ops if o not in drop))
    return replace(preset, space=keep(preset.space), nested_space=keep(preset.nested_space))


def answer_vocabulary(preset: Preset, stim: StimulusSet) -> List[str]:
    """The preset's answer words, in the paper's order (true, false, locations, categories)."""
    out = ["true", "false"]
    if "location" in preset.response_types:
        out += ["bottom right", "bottom left", "top left", "top right"]
    if "category" in preset.response_types:
        out += list(stim.categories)
    return out


class PresetSampler:
    """Draws (task, trial) pairs of a preset; one instance caches the AutoTask sampler.

    With the default shape, a task with N objects is kept with probability proportional to the
    chance that the original's delay process gives exactly ``n_frames`` frames for N objects -
    the upstream benchmark keeps only trials of the preset's length, which weighs tasks so - and
    its frames are then drawn from that process. A user ``n_frames`` beyond the preset's raises
    ``max_delay`` by the difference.
    """

    def __init__(self, preset: Preset, stim: StimulusSet, n_delay: Any = None, n_distractors: int = 0,
                 fixation: Any = True, n_frames: Optional[int] = None, shape: Any = None) -> None:
        self.preset = preset
        self.shape = resolve_shape(shape)
        self.gen = TrialGenerator(stim)
        space = preset.nested_space if self.shape.structure == "nested" and preset.nested_space else preset.space
        if space is not None:
            space = replace(space, const_first_prob=0.5 if self.shape.const_position == "either" else 0.0)
        self.auto = AutoTask(space) if space is not None else None
        self.n_frames = n_frames or preset.n_frames
        self.merge_prob = preset.merge_prob if self.shape.object_reuse else 0.0
        self.process: Optional[DelayProcess] = None
        self._keep: List[float] = []
        if self.auto is not None and not self.shape.object_reuse:
            assert self.n_frames is not None  # an AutoTask preset has n_frames (PRESETS)
            extra = max(0, self.n_frames - preset.n_frames) if preset.n_frames else 0
            self.process = DelayProcess(preset.delay_prob, preset.max_delay + extra)
            w = [self.process.prob(n, self.n_frames - n) for n in range(self.n_frames + 1)]
            top = max(w)
            self._keep = [x / top if top > 0 else 0.0 for x in w]
        delays = n_delay if n_delay is not None else [1]
        self.delays = [int(d) for d in (delays if isinstance(delays, (list, tuple)) else [delays])]
        if any(d < 0 for d in self.delays):
            raise ReformError(f"n_delay must be >= 0, got {self.delays}")
        self.n_distractors = int(n_distractors)
        self.fixation = fixation
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
                seed_rng.shuffle(deck)
                self._decks[kind] = deck
            return deck.pop()
        return pick

    def task(self, rng: random.Random, name: str = "") -> Task:
        if self.auto is None:
            return self._dms[rng.choice(self.delays)]
        if self.process is None:
            return self.auto.sample(rng, name=name)
        weights = self._keep

        def keep(n: int) -> bool:
            w = weights[n] if n < len(weights) else 0.0
            return w >= 1.0 or (w > 0.0 and rng.random() < w)
        try:
            return self.auto.sample(rng, name=name, keep=keep)
        except ReformError:
            raise ReformError(f"preset {self.preset.name}: no task fits {self.n_frames} frames "
                              f"(max_delay {self.process.max_delay}); choose another n_frames") from None

    def trial(self, rng: random.Random, name: str = "", picker: Optional[Any] = None) -> Tuple[Task, Trial]:
        """One trial; ``picker`` (e.g. ``balanced_picker``) chooses the answer values."""
        task = self.task(rng, name)
        trial = self.gen.instantiate(task, rng, n_frames=self.n_frames, merge_prob=self.merge_prob,
                                     n_distractors=self.n_distractors, fixation=self.fixation, picker=picker,
                                     delays=self.process, delay_wording=self.shape.delays)
        trial.meta["preset"] = self.preset.name
        return task, trial


#: worked examples of the Generation prompt: (preset, feature explained)
EXAMPLE_SPECS = (("single_frame_location", "location"), ("dms_category", "category"), ("dms_identity", "identity"))
EXAMPLE_SEED = 7919


def example_trials(stim: StimulusSet, n: int, seed: int = EXAMPLE_SEED, shape: Any = None
                   ) -> List[Tuple[str, Trial]]:
    """``n`` (<= 3) worked examples as (feature, trial); their answers alternate true, false, true,
    so the examples never all share one answer."""
    out = []
    for i, (preset, feat) in enumerate(EXAMPLE_SPECS[:n]):
        want = i % 2 == 0
        rng = rng_for(seed, "iWISDM example", preset)
        sampler = PresetSampler(PRESETS[preset], stim, shape=shape, fixation=False)

        def pick(kind: str, space: Sequence[Any], want: bool = want, rng: random.Random = rng) -> Any:
            return want if kind == BOOL else rng.choice(list(space))
        out.append((feat, sampler.trial(rng, name=f"example_{i}", picker=pick)[1]))
    return out
