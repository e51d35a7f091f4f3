"""Generating trial sets and writing / reading them on disk.

Why a fixed on-disk layout: trials written once can be shared and re-read by the builder
(``trial_dir``) and give exactly the samples generated in memory. Layout::

    <dir>/index.json                  preset, options, stimulus source, trial ids
    <dir>/<trial_id>/trial.json       instruction, per-frame objects, actions, answer, meta, task
    <dir>/<trial_id>/frame_<k>.png    one PNG per frame (224x224 RGB)
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from build.iwisdm.graph import Task
from build.iwisdm.presets import PresetSampler, get_preset, restrict_features
from build.iwisdm.stimuli import StimulusSet, load_stimuli
from build.iwisdm.trial import Trial
from utils.errors import input_error
from utils.seeding import rng_for

logger = logging.getLogger(__name__)

INDEX = "index.json"
TRIAL_JSON = "trial.json"


def trial_id(preset: str, i: int) -> str:
    return f"iwisdm_{preset}_{i:05d}"


def generate_trials(preset: str, n_trials: int, seed: int = 0, stim: Optional[StimulusSet] = None,
                    n_delay: Any = None, n_distractors: int = 0, fixation: bool = False,
                    features: Optional[Sequence[str]] = None, n_frames: Optional[int] = None,
                    balance: bool = True) -> List[Tuple[str, Task, Trial]]:
    """``n_trials`` trials of a preset, deterministic for (seed, preset, options).

    With ``balance`` the answer values come from per-response-type decks, so each answer of a
    type occurs equally often; without it each trial depends only on (seed, preset, index).
    """
    stim = stim or load_stimuli()
    sampler = PresetSampler(restrict_features(get_preset(preset), features), stim, n_delay=n_delay,
                            n_distractors=n_distractors, fixation=fixation, n_frames=n_frames)
    picker = sampler.balanced_picker(rng_for(seed, "iWISDM", preset, "balance")) if balance else None
    out = []
    for i in range(n_trials):
        tid = trial_id(preset, i)
        task, trial = sampler.trial(rng_for(seed, "iWISDM", preset, i), name=tid, picker=picker)
        out.append((tid, task, trial))
    return out


def write_trials(out_dir: str, trials: Sequence[Tuple[str, Task, Trial]], stim: StimulusSet,
                 info: Optional[Dict[str, Any]] = None) -> List[str]:
    """Write (id, task, trial) triples: PNG frames + one JSON per trial + index.json; returns trial dirs."""
    os.makedirs(out_dir, exist_ok=True)
    dirs = []
    for tid, task, trial in trials:
        d = os.path.join(out_dir, tid)
        os.makedirs(d, exist_ok=True)
        for k, im in enumerate(trial.render(stim)):
            im.save(os.path.join(d, f"frame_{k:02d}.png"), compress_level=1)
        rec = trial.to_dict()
        rec["id"] = tid
        rec["task"] = task.to_dict() if task is not None else None
        with open(os.path.join(d, TRIAL_JSON), "w", encoding="utf-8") as f:
            json.dump(rec, f, sort_keys=True)
        dirs.append(d)
    index = {"format": "iwisdm-trials/1", "stimuli": stim.source, "categories": list(stim.categories),
             "trials": [t[0] for t in trials], **(info or {})}
    with open(os.path.join(out_dir, INDEX), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    return dirs


def read_trials(trial_dir: str) -> Tuple[Dict[str, Any], List[Tuple[str, Trial, List[str]]]]:
    """Read a directory written by ``write_trials``: (index, [(id, trial, frame paths)])."""
    trial_dir = os.path.abspath(trial_dir)
    ipath = os.path.join(trial_dir, INDEX)
    if not os.path.isfile(ipath):
        raise input_error("no index.json: not a directory written by write_trials", file=trial_dir,
                          field="trial_dir")
    with open(ipath, "r", encoding="utf-8") as f:
        try:
            index = json.load(f)
        except json.JSONDecodeError as e:
            raise input_error(f"invalid JSON ({e})", file=ipath) from None
    out = []
    for i, tid in enumerate(index.get("trials", [])):
        tpath = os.path.join(trial_dir, str(tid), TRIAL_JSON)
        if not os.path.isfile(tpath):
            raise input_error("trial file missing", file=tpath, record=i, field="trials")
        with open(tpath, "r", encoding="utf-8") as f:
            rec = json.load(f)
        for key in ("instruction", "frames", "actions", "answer", "response_type"):
            if key not in rec:
                raise input_error("missing", file=tpath, field=key)
        trial = Trial.from_dict(rec)
        paths = [os.path.join(trial_dir, str(tid), f"frame_{k:02d}.png") for k in range(len(trial.frames))]
        for p in paths:
            if not os.path.isfile(p):
                raise input_error("frame image missing", file=p, field="frames")
        out.append((str(tid), trial, paths))
    return index, out
