"""The iWISDM dataset builder (``--dataset_name iWISDM``).

Why trials are turned into items here and nowhere else: the same function formats trials
generated in memory and trials read back from ``trial_dir``, so both give identical samples.

Config keys (YAML or builder options; ``OPTION_SPECS`` checks their types): ``preset`` (a name or a
list such as [low, medium, high]; required unless ``trial_dir``), ``n_trials`` (100, per preset),
``seed`` (trial seed; default the run seed), ``stim_dir`` (original-format stimulus directory;
default the built-in procedural set), ``stim_split``, ``allow_pickle`` (false: a ``*.pkl`` metadata
file is refused, since unpickling can run code), ``n_distractors`` (0), ``fixation`` (true: every frame but the response frames; ``all``; false), ``shape``,
``n_delay`` (DMS presets: int or list for a sweep), ``n_frames`` (override), ``features`` (e.g.
[location]), ``n_examples`` (worked examples in the Generation prompt, 0..3), ``trial_dir`` (read
trials written by ``write_trials``, in our layout or the original iwisdm's), ``options``
(``applicable``: offer the answers the question allows; ``all``: the preset's whole vocabulary),
``check_answers`` (true: an imported original trial whose answer does not follow from its
instruction and objects is an error).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, cast

from .io import generate_trials, read_trials
from .instructions import InstructionError, InstructionParser
from .presets import GETTER_OF, PRESETS, answer_vocabulary, example_trials, get_preset, resolve_shape
from .stimuli import LOCATIONS, StimulusSet, load_stimuli
from .trial import Trial
from ..registry import Builder, register_builder
from ...utils.schema import IMAGE_TOKEN
from ...utils.errors import input_error

logger = logging.getLogger(__name__)

#: (trial id, task graph or None, trial, frame PNG paths or None: render in memory)
Row = Tuple[str, Any, Trial, Optional[List[str]]]

#: worked examples shown before the task when ``n_examples`` > 0 (fixed seeds, low complexity)
EXAMPLE_SEED = 7919


def feature_group(features: Sequence[str]) -> str:
    """location-only / category-only / identity-only / mixed (the paper's feature breakdown)."""
    fs = sorted(set(features))
    return f"{fs[0]}-only" if len(fs) == 1 else ("mixed" if fs else "none")


def describe(stim: StimulusSet, vocab: Sequence[str], single_frame: bool) -> str:
    """The task description that opens every prompt (after the paper's appendix A.3)."""
    cats = list(stim.categories)
    cat_text = ", ".join(cats[:-1]) + f", and {cats[-1]}" if len(cats) > 1 else cats[0]
    kind = "drawn object" if stim.source == "procedural" else "3D object"
    shown = ("In this task we will show you an image. The image will contain a " + kind + "."
             if single_frame else
             "In this task we will show you a series of frame images. Each frame will either be blank "
             f"(delay frame) or contain a {kind}.")
    return (f"{shown} The objects within the task will ALWAYS be from one of {len(cats)} categories: {cat_text}. "
            f"For each of these {len(cats)} categories, there are {stim.n_identities} unique objects that could be "
            "used in the task. Any object which is sampled will be displayed as an image taken from a random "
            "viewing angle. The objects will be placed in one of four locations: top left, top right, "
            "bottom left, and bottom right.\n\nA written instruction will be provided. Your goal is to follow "
            "the instructions and answer the question contained in the instruction. Answers will ALWAYS be "
            f"one of the following: {', '.join(vocab)}.")


def answer_request(vocab: Sequence[str]) -> str:
    return (f"What is the correct answer to this task? (respond EXACTLY and ONLY with one of the following "
            f"answers: {', '.join(vocab)}). Provide your answer here:")


def task_block(trial: Trial) -> str:
    frames = " ".join([IMAGE_TOKEN] * len(trial.frames))
    return f'Task instruction: "{trial.instruction}"\n\nHere are the corresponding frames ...{frames}\n\n'


#: ``options``: which answers a SingleChoice question offers (and Generation scores as candidates)
OPTION_SETS = ("applicable", "all")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: every config key the builder reads, with its type check and the expected form (for the error)
OPTION_SPECS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "preset": (lambda v: isinstance(v, str) or (isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v)),
               "a preset name or a non-empty list of preset names"),
    "n_trials": (lambda v: _is_int(v) and 1 <= v <= 10 ** 7, "a positive integer (at most 10000000)"),
    "seed": (lambda v: _is_int(v) and abs(v) < 2 ** 63, "an integer (of at most 64 bits)"),
    "stim_dir": (lambda v: isinstance(v, str), "a path (or 'procedural')"),
    "stim_split": (lambda v: isinstance(v, str), "a split folder name"),
    "allow_pickle": (lambda v: isinstance(v, bool), "true or false"),
    "n_distractors": (lambda v: _is_int(v) and 0 <= v <= 3, "an integer 0..3"),
    "fixation": (lambda v: isinstance(v, bool) or v == "all",
                 "true (every frame but the response frames), 'all' or false"),
    "shape": (lambda v: v is None or isinstance(v, (str, dict)), "'original', 'legacy' or a mapping of shape fields"),
    "n_delay": (lambda v: (_is_int(v) and 0 <= v <= 64) or (isinstance(v, list) and bool(v) and
                                                             all(_is_int(x) and 0 <= x <= 64 for x in v)),
                "an integer >= 0 (at most 64) or a list of them"),
    "n_frames": (lambda v: _is_int(v) and 1 <= v <= 64, "an integer 1..64"),
    "features": (lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v),
                 "a list such as [location] or [location, category]"),
    "n_examples": (lambda v: _is_int(v) and 0 <= v <= 3, "an integer 0..3"),
    "trial_dir": (lambda v: isinstance(v, str), "a path"),
    "options": (lambda v: v in OPTION_SETS, " or ".join(OPTION_SETS)),
    "check_answers": (lambda v: isinstance(v, bool), "true or false"),
}


def answer_types(instruction: str, parser: InstructionParser) -> List[str]:
    """Response types the final question of an instruction can have, read from its parse.

    A Switch can answer either branch, so its types are the union of both branches' types
    (reading "if ..., then location of object 5? else ...?" a guesser knows a location or
    true/false is due); a bare getter answers its attribute; everything else is boolean.
    """
    questions = [it[1] for it in parser.parse(instruction) if it[0] == "question"]
    if not questions:
        raise InstructionError("instruction contains no question")

    def walk(node: Any) -> set:
        if node[0] == "get":
            return {node[1]}
        if node[0] == "switch":
            return walk(node[2]) | walk(node[3])
        return {"bool"}
    return sorted(walk(questions[-1]))


def answer_type(word: str) -> str:
    return "bool" if word in ("true", "false") else ("location" if word in LOCATIONS else "category")


@register_builder("iWISDM")
class IWISDMBuilder(Builder):
    """Procedurally generated multi-frame instruction-following trials (iWISDM)."""

    default_metric = {"SingleChoice": "iwisdm", "Generation": "iwisdm"}
    option_names: ClassVar[Tuple[str, ...]] = tuple(OPTION_SPECS)

    def _check_options(self) -> None:
        """Wrong-typed values give one line naming the config and the key (before any work)."""
        where = self.config_path or "<options>"
        for key, (ok, form) in OPTION_SPECS.items():
            if self.config.get(key) is not None and not ok(self.config[key]):
                raise input_error(f"must be {form}, got {self.config[key]!r}", file=where, field=key)
        presets = self._presets()
        for name in presets:
            get_preset(name, where)
        if len(set(presets)) != len(presets):
            raise input_error(f"a preset is listed twice: {presets}", file=where, field="preset")
        if self.config.get("trial_dir") and len(presets) > 1:
            raise input_error("trial_dir reads one trial set; give one preset name (or none)", file=where,
                              field="preset")
        for f in self.config.get("features") or []:
            if f not in GETTER_OF:
                raise input_error(f"unknown feature {f!r}; valid: {', '.join(GETTER_OF)}", file=where,
                                  field="features")

    def _opt(self, key: str, default: Any) -> Any:
        """A config value; absent or null (``key:`` with no value in YAML) means the default."""
        v = self.config.get(key)
        return default if v is None else v

    def _presets(self) -> List[str]:
        p = self.config.get("preset")
        return [] if p is None else ([p] if isinstance(p, str) else list(p))

    def _stim(self) -> StimulusSet:
        stim_dir = self.config.get("stim_dir")
        if stim_dir not in (None, "", "procedural", "builtin"):
            stim_dir = self.resolve_path(stim_dir)
        return load_stimuli(stim_dir, self.config.get("stim_split"), self._opt("allow_pickle", False))

    def _trial_sets(self, seed: int, stim: StimulusSet) -> List[Tuple[str, List[Row]]]:
        """(preset name, rows) per preset: generated in memory, or one set read from ``trial_dir``."""
        if self.config.get("trial_dir"):
            index, rows = read_trials(self.resolve_path(self.config["trial_dir"]), stim)
            default = "original" if index.get("format") == "iwisdm-original" else "custom"
            preset = str(index.get("preset") or (self._presets() or [default])[0])
            n = self.config.get("n_trials")
            rows = rows[: int(n)] if n else rows
            if index.get("format") == "iwisdm-original" and self._opt("check_answers", True):
                self._check_answers(self.resolve_path(self.config["trial_dir"]), rows, stim)
            return [(preset, [(tid, None, tr, paths) for tid, tr, paths in rows])]
        self.require("preset")
        out = []
        for preset in self._presets():
            trials = generate_trials(preset, self._opt("n_trials", 100), self._opt("seed", seed), stim,
                                     n_delay=self.config.get("n_delay"),
                                     n_distractors=self._opt("n_distractors", 0),
                                     fixation=self._opt("fixation", True),
                                     features=self.config.get("features"), n_frames=self.config.get("n_frames"),
                                     shape=resolve_shape(self.config.get("shape"), self.config_path or "<options>"))
            out.append((preset, [(tid, task, tr, cast(Optional[List[str]], None)) for tid, task, tr in trials]))
        return out

    def build_items(self, formulation: str, inference_method: str, seed: int) -> List[Dict[str, Any]]:
        self._check_options()
        stim = self._stim()
        offer = self._opt("options", "applicable")
        parser = InstructionParser(stim.categories)
        examples, example_images = self._examples(stim, self._opt("n_examples", 0))
        items = []
        for preset_name, rows in self._trial_sets(seed, stim):
            preset = PRESETS.get(preset_name)
            types = {tid: self._types(tid, trial, parser) for tid, _, trial, _ in rows}
            vocab = answer_vocabulary(preset, stim) if preset else self._vocab_from(rows, types, stim)
            single = bool(rows) and all(len(r[2].frames) == 1 for r in rows)
            description = describe(stim, vocab, single)
            for tid, task, trial, paths in rows:
                if trial.answer not in vocab:
                    raise input_error(f"answer {trial.answer!r} is not in the answer vocabulary", record=tid,
                                      field="answer")
                offered = list(vocab) if offer == "all" else [v for v in vocab if answer_type(v) in types[tid]]
                if trial.answer not in offered:
                    raise input_error(f"answer {trial.answer!r} is not among the answers its instruction allows "
                                      f"({', '.join(types[tid])})", record=tid, field="answer")
                images: List[Any] = list(paths) if paths is not None else trial.render(stim)
                if formulation == "Generation":
                    question = examples + ("Now please solve the following new task...\n\n" if examples else "") + \
                        task_block(trial) + answer_request(vocab)
                    images = example_images + images
                else:
                    question = task_block(trial) + "What is the correct answer to this task?"
                meta = dict(trial.meta)
                meta.update({"preset": preset_name, "complexity": preset_name, "instruction": trial.instruction,
                             "frames": trial.frames, "actions": trial.actions, "response_type": trial.response_type,
                             "feature_group": feature_group(trial.meta.get("features", [])),
                             "applicable_answers": offered, "chance": 1.0 / len(offered),
                             "answer_vocabulary": list(vocab), "n_example_frames": len(example_images)})
                item: Dict[str, Any] = {"sample_id": tid, "images": images, "question": question, "meta": meta}
                if formulation == "SingleChoice":
                    item["answer_options"] = list(offered)
                    item["answer"] = offered.index(trial.answer)
                    item["instruct"] = description + "\nChoose the option with the correct answer."
                else:
                    item["answer"] = trial.answer
                    item["instruct"] = description
                    item["candidates"] = list(offered)
                    item["answer_index"] = offered.index(trial.answer)
                items.append(item)
            self.build_log.append(f"{len(rows)} trials of preset '{preset_name}' with {stim.source} stimuli")
        return items

    @staticmethod
    def _check_answers(path: str, rows: Sequence[Tuple[str, Trial, List[str]]], stim: StimulusSet) -> None:
        """Imported answers must follow from the instruction and the imported objects.

        Why: the original stores integer category/object codes; named through the wrong stimulus
        set they silently give other categories, and scores against answers no frame supports.
        """
        parser = InstructionParser(stim.categories)
        bad = []
        for tid, trial, _ in rows:
            try:
                got = parser.evaluate(trial.instruction, trial.frames)[-1]
            except InstructionError as e:
                raise input_error(f"instruction cannot be read on its frames: {e}", file=path, record=tid,
                                  field="instruction") from None
            if got != trial.answer:
                bad.append((tid, got, trial.answer))
        if bad:
            tid, got, want = bad[0]
            raise input_error(f"{len(bad)} of {len(rows)} imported trials have answers their instruction does not "
                              f"give on their objects (e.g. {tid}: {got!r}, the file says {want!r}); the integer "
                              f"codes probably name other stimuli: set stim_dir to the stimuli the trials were made "
                              f"with (or check_answers: false to keep the file's answers)", file=path, record=tid,
                              field="answers")

    @staticmethod
    def _types(tid: str, trial: Trial, parser: InstructionParser) -> List[str]:
        """Response types the trial's question allows (``answer_types``), as a one-line error if unreadable."""
        try:
            return answer_types(trial.instruction, parser)
        except InstructionError as e:
            raise input_error(f"instruction cannot be read: {e}", record=tid, field="instruction") from None

    @staticmethod
    def _vocab_from(rows: Sequence[Tuple], allowed: Dict[str, List[str]], stim: StimulusSet) -> List[str]:
        """A read trial set's vocabulary: every answer its questions allow (and every answer given)."""
        types = {r[2].response_type for r in rows} | {t for ts in allowed.values() for t in ts}
        vocab = ["true", "false"]
        if "location" in types:
            vocab += ["bottom right", "bottom left", "top left", "top right"]
        if "category" in types:
            vocab += list(stim.categories)
        return vocab

    @staticmethod
    def _examples(stim: StimulusSet, n: int) -> Tuple[str, List[Any]]:
        """Worked examples (a location constant, a category DMS, an identity DMS) with their frames."""
        if n <= 0:
            return "", []
        text, images = "", []
        for feat, trial in example_trials(stim, n):
            text += "Here is a simple example of the task...\n\n" + task_block(trial) + \
                f"Answer: {trial.answer}. This is because {_explain(trial, feat)}.\n\n"
            images += trial.render(stim)
        return text, images


def _explain(trial: Trial, feat: str) -> str:
    objs = [f[0] for f in trial.frames if f]
    if len(objs) == 1:
        return f"the {feat} of object 1 is {objs[0][feat]}"
    if feat == "identity":
        same = (objs[0]["category"], objs[0]["identity"]) == (objs[1]["category"], objs[1]["identity"])
        return "object 1 IS identical to object 2" if same else "object 1 is NOT the same object as object 2"
    return f"the {feat} of object 1 ({objs[0][feat]}) {'IS' if objs[0][feat] == objs[1][feat] else 'is NOT'} " \
           f"equal to the {feat} of object 2 ({objs[1][feat]})"
