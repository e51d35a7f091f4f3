"""The iWISDM dataset builder (``--dataset_name iWISDM``).

Why trials are turned into items here and nowhere else: the same function formats trials
generated in memory and trials read back from ``trial_dir``, so both give identical samples.

Config keys (YAML or builder options): ``preset`` (required unless ``trial_dir``), ``n_trials``
(100), ``seed`` (trial seed; default the run seed), ``stim_dir`` (original-format stimulus
directory; default the built-in procedural set), ``stim_split``, ``n_distractors`` (0),
``fixation`` (false), ``n_delay`` (DMS presets: int or list for a sweep), ``n_frames``
(override), ``features`` (e.g. [location]), ``n_examples`` (worked examples in the
Generation prompt, 0..3), ``trial_dir`` (read trials written by ``write_trials``).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from build.iwisdm.io import generate_trials, read_trials
from build.iwisdm.presets import PRESETS, answer_vocabulary, get_preset
from build.iwisdm.stimuli import LOCATIONS, StimulusSet, load_stimuli
from build.iwisdm.trial import Trial
from build.registry import Builder, register_builder
from build.schema import IMAGE_TOKEN
from utils.errors import input_error

logger = logging.getLogger(__name__)

CHANCE_SPACE = {"bool": 2, "location": len(LOCATIONS)}

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


@register_builder("iWISDM")
class IWISDMBuilder(Builder):
    """Procedurally generated multi-frame instruction-following trials (iWISDM)."""

    default_metric = {"SingleChoice": "iwisdm", "Generation": "iwisdm"}

    def _stim(self) -> StimulusSet:
        stim_dir = self.config.get("stim_dir")
        if stim_dir not in (None, "", "procedural", "builtin"):
            stim_dir = self.resolve_path(stim_dir)
        return load_stimuli(stim_dir, self.config.get("stim_split"))

    def _trials(self, seed: int, stim: StimulusSet) -> Tuple[str, List[Tuple[str, Any, Trial, Optional[List[str]]]]]:
        where = self.config_path or "<options>"
        if self.config.get("trial_dir"):
            index, rows = read_trials(self.resolve_path(self.config["trial_dir"]))
            preset = str(index.get("preset", self.config.get("preset", "custom")))
            n = self.config.get("n_trials")
            rows = rows[: int(n)] if n else rows
            return preset, [(tid, None, tr, paths) for tid, tr, paths in rows]
        preset = str(self.require("preset"))
        get_preset(preset, where)
        n = self.config.get("n_trials", 100)
        if not isinstance(n, int) or n < 1:
            raise input_error(f"n_trials must be a positive integer, got {n!r}", file=where, field="n_trials")
        trials = generate_trials(preset, n, int(self.config.get("seed", seed)), stim,
                                 n_delay=self.config.get("n_delay"),
                                 n_distractors=int(self.config.get("n_distractors", 0)),
                                 fixation=bool(self.config.get("fixation", False)),
                                 features=self.config.get("features"), n_frames=self.config.get("n_frames"))
        return preset, [(tid, task, tr, None) for tid, task, tr in trials]

    def build_items(self, formulation: str, inference_method: str, seed: int) -> List[Dict[str, Any]]:
        stim = self._stim()
        preset_name, rows = self._trials(seed, stim)
        preset = PRESETS.get(preset_name)
        vocab = answer_vocabulary(preset, stim) if preset else self._vocab_from(rows, stim)
        single = bool(rows) and all(len(r[2].frames) == 1 for r in rows)
        description = describe(stim, vocab, single)
        examples, example_images = self._examples(stim, int(self.config.get("n_examples", 0)))
        items = []
        for tid, task, trial, paths in rows:
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
                         "chance": 1.0 / CHANCE_SPACE.get(trial.response_type, len(stim.categories)),
                         "answer_vocabulary": list(vocab), "n_example_frames": len(example_images)})
            item: Dict[str, Any] = {"sample_id": tid, "images": images, "question": question, "meta": meta}
            if trial.answer not in vocab:
                raise input_error(f"answer {trial.answer!r} is not in the answer vocabulary", record=tid,
                                  field="answer")
            if formulation == "SingleChoice":
                item["answer_options"] = list(vocab)
                item["answer"] = vocab.index(trial.answer)
                item["instruct"] = description + "\nChoose the option with the correct answer."
            else:
                item["answer"] = trial.answer
                item["instruct"] = description
                item["candidates"] = list(vocab)
                item["answer_index"] = vocab.index(trial.answer)
            items.append(item)
        self.build_log.append(f"{len(items)} trials of preset '{preset_name}' with {stim.source} stimuli")
        return items

    @staticmethod
    def _vocab_from(rows: Sequence[Tuple], stim: StimulusSet) -> List[str]:
        types = {r[2].response_type for r in rows}
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
        specs = [("single_frame_location", "location"), ("dms_category", "category"), ("dms_identity", "identity")]
        text, images = "", []
        for preset, feat in specs[:n]:
            (_, _, trial), = generate_trials(preset, 1, EXAMPLE_SEED, stim)
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
