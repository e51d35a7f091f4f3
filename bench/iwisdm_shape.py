"""Shape of our iWISDM trials against the original ``iwisdm==0.1.3``: total-variation distances.

Usage::

    python bench/iwisdm_shape.py [--n-ours 4000] [--n-orig 2000] [--shape original|legacy] [--no-setup-orig]
    python bench/iwisdm_shape.py --orig-shape tests/data/iwisdm_orig_shape.json   # the original's saved shape
    python bench/iwisdm_shape.py --smoke   # 200 of ours against the saved shape: checks that it runs

For the presets low / medium / high, under matched configs (ours: the preset; the original: the
upstream benchmark configs and acceptance test of bench/iwisdm_gen.py, run by its driver in the
original's own venv), it prints the total-variation distance (half the L1 distance between the
two empirical distributions) of each shape feature:

* ``frames``: frames per trial;  ``objects``: frames that show an object;
* ``and_or``: And/Or operators;  ``and_or_depth``: deepest chain of And/Or nested in And/Or
  (1: none nested; 2: "(A and B) or C");  ``switches``: Switch operators;
* ``delay_runs``: lengths of the runs of blank frames (pooled over trials);
* ``response``: response type (bool / location / category).

One set of functions (``shape_of``) computes the features on both sides from a common record
(operator tree, which frames show an object, final answer). The original's accepted trials
are cached under ``$REFORM_CACHE/iwisdm_shape/`` (it accepts about 5-120 trials per CPU-second),
keyed by preset, seed and a hash of its config, and topped up when more are asked for.
``--orig-shape FILE`` compares against the original's distributions saved by ``--write-fixtures``
instead (no venv, no run of the original). The ``tv_<preset>_<feature>=<d>`` lines come before the
last line.

Prints: max_tv=<d>
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.iwisdm_gen import (ACCEPT, ORIG_CONFIG, default_orig_venv, ensure_orig_venv,  # noqa: E402
                              run_original)
from reform_eval.build.iwisdm.graph import Task  # noqa: E402
from reform_eval.build.iwisdm.presets import PRESETS, PresetSampler  # noqa: E402
from reform_eval.build.iwisdm.stimuli import LOCATIONS, procedural_set  # noqa: E402
from reform_eval.build.iwisdm.trial import Trial  # noqa: E402
from reform_eval.utils.paths import cache_root  # noqa: E402
from reform_eval.utils.seeding import rng_for  # noqa: E402

FEATURES = ("frames", "objects", "and_or", "and_or_depth", "switches", "delay_runs", "response")
TARGET = 0.05


# -- one set of shape statistics for both sides --------------------------------------------------
def _and_or_depth(tree: Sequence[Any]) -> int:
    name, kids = tree
    inner = max((_and_or_depth(k) for k in kids), default=0)
    return inner + 1 if name in ("And", "Or") else inner


def _count(tree: Sequence[Any], names: Iterable[str]) -> int:
    name, kids = tree
    return (name in names) + sum(_count(k, names) for k in kids)


def response_type(answer: str) -> str:
    if answer in ("true", "false"):
        return "bool"
    return "location" if answer in LOCATIONS else "category"


def shape_of(tree: Sequence[Any], occupied: Sequence[bool], answer: str) -> Dict[str, Any]:
    """The shape features of one trial from its operator tree ``[name, [child trees]]`` (And, Or,
    Switch named as in either package), which frames show an object, and the final answer word."""
    runs, run = [], 0
    for occ in occupied:
        if occ:
            if run:
                runs.append(run)
            run = 0
        else:
            run += 1
    if run:
        runs.append(run)
    return {"frames": len(occupied), "objects": sum(bool(o) for o in occupied),
            "and_or": _count(tree, ("And", "Or")), "and_or_depth": _and_or_depth(tree),
            "switches": _count(tree, ("Switch",)), "delay_runs": runs, "response": response_type(answer)}


def ours_record(task: Task, trial: Trial) -> Dict[str, Any]:
    def tree(op: Any) -> List[Any]:
        return [op.name, [tree(c) for c in op.children]]
    occupied = [any(not o.get("distractor") for o in f) for f in trial.frames]
    return shape_of(tree(task.root), occupied, trial.answer)


def orig_record(rec: Dict[str, Any]) -> Dict[str, Any]:
    """From a line the driver of bench/iwisdm_gen.py dumps (``tree``, ``objects``, ``answers``)."""
    occupied = [False] * int(rec["epochs"])
    for o in rec["objects"]:
        if o.get("is_distractor"):
            continue
        ep = o["epochs"]
        for e in ([ep] if isinstance(ep, int) else ep):
            occupied[e] = True
    return shape_of(rec["tree"], occupied, rec["answers"][-1])


def distribution(records: Sequence[Dict[str, Any]], feature: str) -> Dict[Any, float]:
    values = [v for r in records for v in (r[feature] if isinstance(r[feature], list) else [r[feature]])]
    counts = Counter(values)
    n = sum(counts.values()) or 1
    return {k: c / n for k, c in counts.items()}


def tv_distance(p: Dict[Any, float], q: Dict[Any, float]) -> float:
    """Total-variation distance: half the L1 distance between two distributions."""
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


# -- the two sides ---------------------------------------------------------------------------------
def ours(preset: str, n: int, seed: int = 0, shape: Any = None) -> List[Dict[str, Any]]:
    """``n`` of our trials, generated as ``generate_trials`` does (balanced answers)."""
    sampler = PresetSampler(PRESETS[preset], procedural_set(), shape=shape)
    picker = sampler.balanced_picker(rng_for(seed, "iWISDM", preset, "balance"))
    return [ours_record(*sampler.trial(rng_for(seed, "iWISDM", preset, i), picker=picker)) for i in range(n)]


def cache_path(preset: str, seed: int) -> str:
    root = cache_root()
    key = json.dumps({"accept": ACCEPT[preset], "config": ORIG_CONFIG[preset],
                      "categories": list(procedural_set().categories)}, sort_keys=True)
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:10]
    return os.path.join(root, "iwisdm_shape", f"orig_{preset}_seed{seed}_{digest}.jsonl")


def _read_jsonl(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by an interrupted run
                break
    return out


def original(preset: str, n: int, python: str, seed: int = 1, max_seconds: float = 1800.0,
             raw: bool = False) -> List[Dict[str, Any]]:
    """``n`` accepted trials of the original (shape records; ``raw``: as dumped), from the cache,
    topped up by running it."""
    path = cache_path(preset, seed)
    rows = _read_jsonl(path)
    if len(rows) < n:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:  # drop a cut last line before appending
            f.writelines(json.dumps(r) + "\n" for r in rows)
        need = n - len(rows)
        print(f"running the original for {need} more {preset} trials (cache {path}) ...", flush=True)
        chunk_seed = seed if not rows else seed * 100003 + len(rows)  # a top-up draws new trials
        res = run_original(python, 0.0, max_seconds, need, presets=(preset,), seed=chunk_seed, dump=path)
        if "error" in res:
            raise RuntimeError(res["error"])
        rows = _read_jsonl(path)
    return rows[:n] if raw else [orig_record(r) for r in rows[:n]]


def write_fixtures(out_dir: str, python: str, n_orig: int, seed: int, n_sample: int = 30) -> None:
    """Test fixtures from the original: its shape distributions per preset (``iwisdm_orig_shape.json``)
    and a sample of its trials (``iwisdm_orig_trials.jsonl``: ``n_sample`` per preset, plus
    ``n_sample`` low trials with one distractor per frame, whose instructions name targets
    "with category: ..." / "at location: ...")."""
    os.makedirs(out_dir, exist_ok=True)
    ref: Dict[str, Any] = {"source": "iwisdm==0.1.3 via bench/iwisdm_gen.py (upstream configs, acceptance test)",
                           "presets": {}}
    sample: List[Dict[str, Any]] = []
    for preset in ACCEPT:
        raw = original(preset, n_orig, python, seed, raw=True)
        recs = [orig_record(r) for r in raw]
        ref["presets"][preset] = {"n": len(recs), **{f: {str(k): v for k, v in distribution(recs, f).items()}
                                                     for f in FEATURES}}
        sample += raw[:n_sample]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "distractors.jsonl")
        res = run_original(python, 0.0, 300.0, n_sample, presets=("low",), seed=seed, dump=path,
                           trial_kwargs={"add_distractor_frame": 1})
        if "error" in res:
            raise RuntimeError(res["error"])
        sample += [dict(r, preset="low+distractors") for r in _read_jsonl(path)[:n_sample]]
    with open(os.path.join(out_dir, "iwisdm_orig_shape.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, indent=1, sort_keys=True)
    with open(os.path.join(out_dir, "iwisdm_orig_trials.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in sample)
    print(f"wrote {out_dir}/iwisdm_orig_shape.json and {out_dir}/iwisdm_orig_trials.jsonl ({len(sample)} trials)")


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ours", type=int, default=4000)
    ap.add_argument("--n-orig", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0, help="seed of our trials")
    ap.add_argument("--orig-seed", type=int, default=1)
    ap.add_argument("--shape", default="original", help="our shape: original (default) or legacy")
    ap.add_argument("--presets", nargs="*", default=list(ACCEPT))
    ap.add_argument("--orig-python", default=os.environ.get("IWISDM_ORIG_PYTHON"))
    ap.add_argument("--no-setup-orig", action="store_true", help="do not create the original's venv when missing")
    ap.add_argument("--write-fixtures", metavar="DIR",
                    help="also write the test fixtures (the original's shape distributions and a trial sample)")
    ap.add_argument("--orig-shape", metavar="FILE",
                    help="the original's shape distributions saved by --write-fixtures (iwisdm_orig_shape.json), "
                         "used instead of running the original")
    ap.add_argument("--smoke", action="store_true", help="200 trials of ours against the saved shape "
                    "(tests/data/iwisdm_orig_shape.json): checks that the bench runs (seconds), measures nothing")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n_ours = 200
        args.orig_shape = args.orig_shape or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                          "tests", "data", "iwisdm_orig_shape.json")
    if args.orig_shape:
        with open(args.orig_shape, encoding="utf-8") as f:
            saved = json.load(f)["presets"]
        return compare(args, lambda preset: saved[preset])

    python = args.orig_python
    if python is None:
        if not args.no_setup_orig:
            err = ensure_orig_venv(default_orig_venv())
            if err:
                print(f"original iwisdm: NOT AVAILABLE ({err})")
                print("max_tv=n/a")
                return 1
        python = os.path.join(default_orig_venv(), "bin", "python")
    if not os.path.exists(python):
        print(f"original iwisdm: NOT AVAILABLE (no interpreter at {python}; see bench/iwisdm_gen.py)")
        print("max_tv=n/a")
        return 1
    if args.write_fixtures:
        write_fixtures(args.write_fixtures, python, args.n_orig, args.orig_seed)

    def run_original_shape(preset: str) -> Dict[str, Any]:
        theirs = original(preset, args.n_orig, python, args.orig_seed)
        return {"n": len(theirs), **{f: distribution(theirs, f) for f in FEATURES}}
    return compare(args, run_original_shape)


def compare(args: argparse.Namespace, theirs_of: Any) -> int:
    """Our trials' shape against the original's distributions (``theirs_of(preset)``: ``n`` and
    one distribution per feature); prints the table, the per-feature lines and ``max_tv``."""
    worst = 0.0
    lines = []
    print(f"{'preset':8s} " + " ".join(f"{f:>12s}" for f in FEATURES))
    for preset in args.presets:
        try:
            theirs = theirs_of(preset)
        except RuntimeError as e:
            print(f"original iwisdm: NOT MEASURED ({e})")
            print("max_tv=n/a")
            return 1
        mine = ours(preset, args.n_ours, args.seed, args.shape)
        # saved distributions have string keys (JSON): compare on strings
        p_of = {f: {str(k): v for k, v in distribution(mine, f).items()} for f in FEATURES}
        q_of = {f: {str(k): v for k, v in theirs[f].items()} for f in FEATURES}
        tvs = {f: tv_distance(p_of[f], q_of[f]) for f in FEATURES}
        worst = max(worst, *tvs.values())
        print(f"{preset:8s} " + " ".join(f"{tvs[f]:12.3f}" for f in FEATURES)
              + f"   (ours {len(mine)}, original {theirs['n']})")
        for f in FEATURES:
            lines.append(f"tv_{preset}_{f}={tvs[f]:.3f}")
            if tvs[f] > TARGET:
                p, q = p_of[f], q_of[f]
                keys = sorted(set(p) | set(q), key=lambda k: (len(k), k))
                print(f"  {f}: " + ", ".join(f"{k}: {p.get(k, 0):.3f} vs {q.get(k, 0):.3f}" for k in keys))
    for line in lines:
        print(line)
    print(f"max_tv={worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
