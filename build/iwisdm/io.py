"""Generating trial sets and writing / reading them on disk, in our layout or the original's.

Why a fixed on-disk layout: trials written once can be shared and re-read by the builder
(``trial_dir``) and give exactly the samples generated in memory. Our layout::

    <dir>/index.json                  preset, options, stimulus source, trial ids
    <dir>/<trial_id>/trial.json       instruction, per-frame objects, actions, answer, meta, task
    <dir>/<trial_id>/frame_<k>.png    one PNG per frame (224x224 RGB)

Why the original's layout too: benchmark sets made with iwisdm 0.1.3 (or released with the
paper) can be evaluated here, and our trials can be fed to tools written for the original::

    <dir>/trial_<k>/frames/epoch<i>.png       one PNG per frame
    <dir>/trial_<k>/frames/task_info.json     epochs, objects (grid cell, integer codes), instruction,
                                              answers (one per frame, "null" where none is due)
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .graph import Task
from .presets import PresetSampler, get_preset, restrict_features
from .stimuli import LOCATIONS, StimulusSet, load_stimuli
from .trial import Trial
from ...utils.errors import ReformError, input_error
from ...utils.inputs import check_name, list_dir, read_json
from ...utils.seeding import rng_for

logger = logging.getLogger(__name__)

INDEX = "index.json"
TRIAL_JSON = "trial.json"


def trial_id(preset: str, i: int) -> str:
    return f"iwisdm_{preset}_{i:05d}"


def generate_trials(preset: str, n_trials: int, seed: int = 0, stim: Optional[StimulusSet] = None,
                    n_delay: Any = None, n_distractors: int = 0, fixation: Any = True,
                    features: Optional[Sequence[str]] = None, n_frames: Optional[int] = None,
                    balance: bool = True, shape: Any = None) -> List[Tuple[str, Task, Trial]]:
    """``n_trials`` trials of a preset, deterministic for (seed, preset, options).

    With ``balance`` the answer values come from per-response-type decks, so each answer of a
    type occurs equally often; without it each trial depends only on (seed, preset, index).
    """
    stim = stim or load_stimuli()
    sampler = PresetSampler(restrict_features(get_preset(preset), features), stim, n_delay=n_delay,
                            n_distractors=n_distractors, fixation=fixation, n_frames=n_frames, shape=shape)
    picker = sampler.balanced_picker(rng_for(seed, "iWISDM", preset, "balance")) if balance else None
    out = []
    for i in range(n_trials):
        tid = trial_id(preset, i)
        task, trial = sampler.trial(rng_for(seed, "iWISDM", preset, i), name=tid, picker=picker)
        out.append((tid, task, trial))
    return out


FORMATS = ("reform", "original")
ORIGINAL_INFO = "task_info.json"
#: ``trial_<k>`` (iwisdm's write_trial examples) or ``trial<k>`` (its benchmarking/create_bench.py)
ORIGINAL_TRIAL = re.compile(r"^trial_?(\d+)$")
#: the original's 2x2 grid: ``space`` = [column, row]; ``location`` = the cell's centre (x, y)
GRID_CELL = {"top left": (0, 0), "top right": (1, 0), "bottom left": (0, 1), "bottom right": (1, 1)}
CELL_LOCATION = {cell: loc for loc, cell in GRID_CELL.items()}


def write_trials(out_dir: str, trials: Sequence[Tuple[str, Task, Trial]], stim: StimulusSet,
                 info: Optional[Dict[str, Any]] = None, format: str = "reform") -> List[str]:
    """Write (id, task, trial) triples; returns the trial folders.

    ``format="reform"``: PNG frames + one JSON per trial + index.json (read back exactly).
    ``format="original"``: iwisdm 0.1.3's ``trial_<k>/frames/{epoch<i>.png, task_info.json}``.
    """
    if format not in FORMATS:
        raise ReformError(f"unknown trial format {format!r}; valid: {', '.join(FORMATS)}")
    if format == "original":
        return write_original_trials(out_dir, trials, stim)
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


def is_original_dir(trial_dir: str) -> bool:
    """True when ``trial_dir`` holds the original's ``trial_<k>/frames/task_info.json`` folders."""
    if not os.path.isdir(trial_dir) or os.path.isfile(os.path.join(trial_dir, INDEX)):
        return False
    return any(ORIGINAL_TRIAL.match(d) and os.path.isfile(os.path.join(trial_dir, d, "frames", ORIGINAL_INFO))
               for d in list_dir(trial_dir, "trial folder"))


def read_trials(trial_dir: str, stim: Optional[StimulusSet] = None
                ) -> Tuple[Dict[str, Any], List[Tuple[str, Trial, List[str]]]]:
    """Read a trial folder in either layout: (index, [(id, trial, frame paths)]).

    ``stim`` names the original's integer category/object/view codes (default: the built-in set,
    whose codes are those of ``StimulusSet.export``); our own layout does not need it.
    """
    trial_dir = os.path.abspath(check_name(trial_dir, "trial folder"))
    if is_original_dir(trial_dir):
        return read_original_trials(trial_dir, stim or load_stimuli())
    ipath = os.path.join(trial_dir, INDEX)
    if not os.path.isfile(ipath):
        raise input_error("neither index.json (trials written by write_trials) nor trial_<k>/frames/task_info.json "
                          "folders (the original iwisdm's trials)", file=trial_dir, field="trial_dir")
    index = read_json(ipath, "trial index")
    names = index.get("trials", []) if isinstance(index, dict) else None
    if not isinstance(names, list) or \
            not all(isinstance(t, str) and t and os.sep not in t and t not in (".", "..") for t in names):
        raise input_error("index.json must be an object whose 'trials' lists trial folder names", file=ipath,
                          field="trials")
    out = []
    for i, tid in enumerate(index.get("trials", [])):
        tpath = os.path.join(trial_dir, str(tid), TRIAL_JSON)
        if not os.path.isfile(tpath):
            raise input_error("trial file missing", file=tpath, record=i, field="trials")
        rec = read_json(tpath, "trial file")
        if not isinstance(rec, dict):
            raise input_error("a trial file must hold a JSON object", file=tpath)
        trial = Trial.from_dict(check_trial_record(rec, tpath))
        paths = [os.path.join(trial_dir, str(tid), f"frame_{k:02d}.png") for k in range(len(trial.frames))]
        for p in paths:
            if not os.path.isfile(p):
                raise input_error("frame image missing", file=p, field="frames")
        out.append((str(tid), trial, paths))
    return index, out


OBJECT_KEYS: Dict[str, type] = {"category": str, "identity": int, "view": int, "location": str}
RESPONSE_TYPES = ("bool", "location", "category")


def check_trial_record(rec: Dict[str, Any], path: str) -> Dict[str, Any]:
    """Types of one ``trial.json`` (one line naming file, frame record and field on a mismatch)."""
    for key, kind in (("instruction", str), ("frames", list), ("actions", list), ("answer", str),
                      ("response_type", str)):
        if key not in rec:
            raise input_error("missing", file=path, field=key)
        if not isinstance(rec[key], kind):
            raise input_error(f"must be a {kind.__name__}, got {type(rec[key]).__name__}", file=path, field=key)
    if not isinstance(rec.get("meta", {}), dict):
        raise input_error(f"must be an object, got {type(rec['meta']).__name__}", file=path, field="meta")
    if rec["response_type"] not in RESPONSE_TYPES:
        raise input_error(f"must be one of {', '.join(RESPONSE_TYPES)}, got {rec['response_type']!r}", file=path,
                          field="response_type")
    if len(rec["actions"]) != len(rec["frames"]) or not all(a is None or isinstance(a, str) for a in rec["actions"]):
        raise input_error(f"must hold one answer string or null per frame ({len(rec['frames'])})", file=path,
                          field="actions")
    for i, objs in enumerate(rec["frames"]):
        if not isinstance(objs, list) or not all(isinstance(o, dict) for o in objs):
            raise input_error("a frame must be a list of objects", file=path, record=f"frame {i}", field="frames")
        for o in objs:
            for key, want in OBJECT_KEYS.items():
                if not isinstance(o.get(key), want) or isinstance(o.get(key), bool):
                    raise input_error(f"object needs {key} ({want.__name__}), got {o.get(key)!r}", file=path,
                                      record=f"frame {i}", field=key)
            if o["location"] not in LOCATIONS:
                raise input_error(f"unknown location {o['location']!r}", file=path, record=f"frame {i}",
                                  field="location")
    return rec


# ---------------------------------------------------------------------------------------------
# The original iwisdm 0.1.3 layout
# ---------------------------------------------------------------------------------------------
def write_original_trials(out_dir: str, trials: Sequence[Tuple[str, Any, Trial]], stim: StimulusSet) -> List[str]:
    """Write trials as iwisdm 0.1.3 does (``write_trial``): ``trial_<k>/frames/epoch<i>.png`` + task_info.json.

    Objects carry the original's integer codes (``stim.codes``: the ``ctg_mod``/``obj_mod``/``ang_mod``
    of ``stim.export``), the grid cell ``space`` = [column, row] and the cell centre as ``location``.
    """
    os.makedirs(out_dir, exist_ok=True)
    dirs = []
    for k, (_, _, trial) in enumerate(trials):
        frames_dir = os.path.join(out_dir, f"trial_{k}", "frames")
        os.makedirs(frames_dir, exist_ok=True)
        for i, im in enumerate(trial.render(stim)):
            im.save(os.path.join(frames_dir, f"epoch{i}.png"), compress_level=1)
        with open(os.path.join(frames_dir, ORIGINAL_INFO), "w", encoding="utf-8") as f:
            json.dump(original_task_info(trial, stim), f, indent=4)
        dirs.append(os.path.dirname(frames_dir))
    return dirs


def original_task_info(trial: Trial, stim: StimulusSet) -> Dict[str, Any]:
    """The original's ``task_info.json`` content of one trial."""
    objects = []
    count = 0
    for epoch, objs in enumerate(trial.frames):
        if objs:
            count += 1
        for o in objs:
            ctg, obj, ang = stim.codes(o["category"], o["identity"], o["view"])
            col, row = GRID_CELL[o["location"]]
            objects.append({"count": count,
                            "obj": {"location": f"({0.25 + 0.5 * col}, {0.25 + 0.5 * row})", "space": [col, row],
                                    "category": ctg, "object": obj, "view angle": ang, "epochs": epoch,
                                    "is_distractor": bool(o.get("distractor", False))},
                            "tasks": [0], "attended_attr": {}})
    return {"epochs": len(trial.frames), "objects": objects, "instruction": trial.instruction,
            "answers": ["null" if a is None else str(a) for a in trial.actions]}


def read_original_trials(trial_dir: str, stim: StimulusSet
                         ) -> Tuple[Dict[str, Any], List[Tuple[str, Trial, List[str]]]]:
    """Import the original's trial folders (sorted by k); the answers are the original's own."""
    found = [m for m in map(ORIGINAL_TRIAL.match, list_dir(trial_dir, "trial folder", kind="dir")) if m]
    names = [m.string for m in sorted(found, key=lambda m: (int(m.group(1)), m.string))]
    out = []
    for name in names:
        path = os.path.join(trial_dir, name, "frames", ORIGINAL_INFO)
        if not os.path.isfile(path):
            raise input_error("missing (an original trial folder holds frames/task_info.json)", file=path)
        trial = original_trial(read_json(path, "trial file"), stim, path)
        paths = [os.path.join(trial_dir, name, "frames", f"epoch{i}.png") for i in range(len(trial.frames))]
        for p in paths:
            if not os.path.isfile(p):
                raise input_error("frame image missing", file=p, field="epochs")
        out.append((name, trial, paths))
    index = {"format": "iwisdm-original", "stimuli": stim.source, "categories": list(stim.categories),
             "trials": [r[0] for r in out]}
    return index, out


def _location(obj: Dict[str, Any], path: str, rec: int) -> str:
    """Quadrant of an original object: its grid cell ``space``, else the centre ``location`` "(x, y)"."""
    space = obj.get("space")
    if isinstance(space, list) and len(space) == 2 and all(isinstance(v, int) for v in space):
        loc = CELL_LOCATION.get((space[0], space[1]))
        if loc is None:
            raise input_error(f"grid cell {space} is outside the 2x2 grid", file=path, record=rec, field="space")
        return loc
    m = re.fullmatch(r"\s*[(\[]\s*([-\d.eE+]+)\s*,\s*([-\d.eE+]+)\s*[)\]]\s*", str(obj.get("location", "")))
    if not m:
        raise input_error("needs 'space' [column, row] or 'location' \"(x, y)\"", file=path, record=rec,
                          field="location")
    return CELL_LOCATION[(int(float(m.group(1)) >= 0.5), int(float(m.group(2)) >= 0.5))]


def _int_field(obj: Dict[str, Any], key: str, path: str, rec: int) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise input_error(f"must be an integer code, got {v!r}", file=path, record=rec, field=key)
    return v


def original_trial(info: Any, stim: StimulusSet, path: str) -> Trial:
    """A ``Trial`` from one original ``task_info.json`` (records named by their index in ``objects``)."""
    if not isinstance(info, dict):
        raise input_error("task_info.json must hold a JSON object", file=path)
    for key, kind in (("epochs", int), ("objects", list), ("instruction", str), ("answers", list)):
        if not isinstance(info.get(key), kind) or isinstance(info.get(key), bool):
            raise input_error(f"missing or not a {kind.__name__}", file=path, field=key)
    n = info["epochs"]
    if n < 1 or len(info["answers"]) != n:
        raise input_error(f"{len(info['answers'])} answers for {n} epochs", file=path, field="answers")
    frames: List[List[Dict[str, Any]]] = [[] for _ in range(n)]
    for rec, entry in enumerate(info["objects"]):
        obj = entry.get("obj", entry) if isinstance(entry, dict) else None
        if not isinstance(obj, dict):
            raise input_error("an object entry must be a JSON object", file=path, record=rec, field="objects")
        codes = tuple(_int_field(obj, k, path, rec) for k in ("category", "object", "view angle"))
        named = stim.from_codes(*codes)
        if named is None:
            raise input_error(f"(category, object, view angle) codes {codes} are not in the stimulus set "
                              f"{stim.source!r} ({len(stim.categories)} categories x {stim.n_identities} objects x "
                              f"{stim.n_views} views); set stim_dir to the stimuli the trials were made with",
                              file=path, record=rec, field="category")
        epochs = obj.get("epochs")
        epochs = epochs if isinstance(epochs, list) else [epochs]
        if not epochs or not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < n for e in epochs):
            raise input_error(f"epochs {obj.get('epochs')!r} outside 0..{n - 1}", file=path, record=rec, field="epochs")
        o = {"category": named[0], "identity": named[1], "view": named[2], "location": _location(obj, path, rec)}
        if obj.get("is_distractor"):
            o["distractor"] = True
        for e in epochs:
            frames[e].append(dict(o))
    actions = [None if a in (None, "null") else str(a) for a in info["answers"]]
    due = [a for a in actions if a is not None]
    if not due:
        raise input_error("no answer is due in any epoch (all 'null')", file=path, field="answers")
    answer = due[-1]
    if actions[-1] is None:
        raise input_error("the last epoch has no answer ('null'): not a benchmark trial", file=path, field="answers")
    rtype = "bool" if answer in ("true", "false") else ("location" if answer in LOCATIONS else "category")
    if rtype == "category" and answer not in stim.categories:
        raise input_error(f"answer {answer!r} is neither true/false, a location nor a category of the stimulus set",
                          file=path, field="answers")
    return Trial(info["instruction"], frames, actions, answer, rtype, original_meta(info["instruction"], frames))


def original_meta(instruction: str, frames: Sequence[Sequence[Dict[str, Any]]]) -> Dict[str, Any]:
    """Breakdown fields of an imported trial, counted from its instruction and frames.

    Every operator is written once in the instruction ("and", "or", "equals", "not equals",
    "exists", "if ... then"), so the counts equal those of the generating graph.
    """
    q = " " + instruction + " "
    n_not = len(re.findall(r" not equals ", q))
    n_obj = sum(1 for f in frames if any(not o.get("distractor") for o in f))
    return {"n_frames": len(frames), "n_stimuli": n_obj, "n_delay": len(frames) - n_obj,
            "n_distractors": sum(1 for f in frames for o in f if o.get("distractor")),
            "n_and": len(re.findall(r" and ", q)), "n_or": len(re.findall(r" or ", q)),
            "n_is_same": len(re.findall(r" equals ", q)) - n_not, "n_not_same": n_not,
            "n_switch": len(re.findall(r"(?:^|[ (])if ", instruction)),
            "features": sorted(set(re.findall(r"\b(location|category|identity) of object \d+", instruction))),
            "source": "original"}
