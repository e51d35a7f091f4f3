"""Benchmark iWISDM trial generation: trials/s per preset, and the speed-up over the original package.

Usage::

    python bench/iwisdm_gen.py [--seconds 2] [--orig-seconds 20] [--orig-python VENV/bin/python] [--no-setup-orig]
    python bench/iwisdm_gen.py --smoke   # ours only, 0.2 s per measurement: checks that it runs

1. For every preset, single process, per CPU-second of this process (= per core, robust to
   other load on the machine): task graph + trial + rendered frames (PIL images) in memory, and
   the same plus writing PNGs/JSON (per wall-clock second).
2. The original ``iwisdm==0.1.3`` package, run in its OWN interpreter (a separate venv: it pins
   numpy<2 and needs pandas and opencv) through a small driver script that this bench writes
   to a temporary folder and runs with ``python -I`` (so neither venv sees the other). It is fed
   the built-in procedural stimuli exported in its directory format
   (``StimulusSet.export``) and configured like its own benchmark runs (``benchmarking/README.md``
   and ``configs/{low,medium,high}_complexity_all.json`` of the upstream repository: AutoTask
   config, ``max_delay``, ``delay_prob=0.5``). Like its ``create_bench.py`` it generates a random
   task, rejects it unless ``task.n_frames`` equals the preset's frame count, renders the trial
   and rejects it unless the number of `` and ``/`` or `` in the instruction and the delay count
   (``n_frames - instruction.count('observe')``) are in the preset's range. Only accepted
   trials count; time spent on rejected ones counts as well.
3. Our trials are put through the same acceptance test (frame count, and/or count, delay count
   read from the instruction text) and the ratio is taken between accepted trials per
   CPU-second on each side.

Without an interpreter that can import ``iwisdm`` the speed-ups are ``n/a`` and the reason is
printed. ``min_trials_per_s`` is the lowest in-memory rate over all presets.

Prints: speedup_low=<r> speedup_medium=<r> speedup_high=<r> min_trials_per_s=<n>

The original runs in a separate venv (no torch needed: 0.1.3 imports numpy, pandas, cv2 and
networkx only). Unless ``--orig-python`` names one, the bench creates it once, from the package
index, under ``$REFORM_CACHE/iwisdm_orig_venv`` (``--no-setup-orig`` turns that off)::

    python3 -m venv $REFORM_CACHE/iwisdm_orig_venv
    $REFORM_CACHE/iwisdm_orig_venv/bin/pip install iwisdm==0.1.3 'numpy<2' pandas opencv-python-headless
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reform_eval.build.iwisdm.io import write_trials  # noqa: E402
from reform_eval.build.iwisdm.presets import PRESETS, PresetSampler  # noqa: E402
from reform_eval.build.iwisdm.stimuli import procedural_set  # noqa: E402
from reform_eval.utils.paths import cache_root  # noqa: E402
from reform_eval.utils.seeding import rng_for  # noqa: E402

logger = logging.getLogger(__name__)

#: The acceptance test of the original's benchmark runs (its benchmarking/README.md):
#: exact frame count, and/or count range, delay count range (min_delay=0, max_delay=4/6/7).
ACCEPT: Dict[str, Dict[str, int]] = {
    "low": {"frames": 6, "min_bool": 1, "max_bool": 1, "min_delay": 0, "max_delay": 4},
    "medium": {"frames": 8, "min_bool": 1, "max_bool": 1, "min_delay": 0, "max_delay": 6},
    "high": {"frames": 9, "min_bool": 1, "max_bool": 2, "min_delay": 0, "max_delay": 7},
}

_BOOL_ROOTS = ["IsSame", "And", "Or", "NotSame"]
_CMP_CHILDREN = ["GetLoc", "GetCategory", "GetObject"]
#: AutoTask settings of the original's configs/{low,medium,high}_complexity_all.json, applied on
#: top of the package's default config (which supplies the operator table and the CONST keys).
#: ``cmp_children``/``cmp_dist``: the IsSame/NotSame child operators and their sampling weights.
ORIG_CONFIG: Dict[str, Dict[str, Any]] = {
    "low": {"root_ops": _BOOL_ROOTS, "max_op": 15, "max_depth": 5, "max_switch": 0, "switch_threshold": 0,
            "select_limit": False, "compare_const_prob": 0.2, "cmp_children": _CMP_CHILDREN, "cmp_dist": None},
    "medium": {"root_ops": _BOOL_ROOTS, "max_op": 15, "max_depth": 7, "max_switch": 1, "switch_threshold": 1,
               "select_limit": False, "compare_const_prob": 0.2, "cmp_children": _CMP_CHILDREN, "cmp_dist": None},
    # The upstream high config lists CONST as a sampled IsSame/NotSame child (weights 4/15, 4/15,
    # 4/15, 1/5) with same_children_op, so 0.1.3 draws two constants and raises "attr1 and attr2
    # cannot both be Attribute instances" on ~half of the candidates. Those failures would count
    # against the original, so high uses 0.1.3's own constant mechanism (compare_const_prob, as
    # in low/medium) instead: the original's most favourable setting.
    "high": {"root_ops": _BOOL_ROOTS + ["GetLoc", "GetCategory"], "max_op": 15, "max_depth": 8, "max_switch": 1,
             "switch_threshold": 1, "select_limit": False, "compare_const_prob": 0.2, "cmp_children": _CMP_CHILDREN,
             "cmp_dist": None},
}


def accepted(instruction: str, n_frames: int, rule: Dict[str, int]) -> bool:
    """The original benchmark's acceptance test, read from the instruction text."""
    n_bool = instruction.count(" and ") + instruction.count(" or ")
    n_delay = n_frames - instruction.count("observe")
    return (n_frames == rule["frames"] and rule["min_bool"] <= n_bool <= rule["max_bool"]
            and rule["min_delay"] <= n_delay <= rule["max_delay"])


def rate_in_memory(preset: str, seconds: float) -> Tuple[float, float, int, int]:
    """(trials, accepted trials) per CPU-second of this process: task graph + trial + rendered
    frames (PIL images) in memory; 'accepted' applies ``ACCEPT[preset]`` where defined."""
    stim = procedural_set()
    sampler = PresetSampler(PRESETS[preset], stim)
    picker = sampler.balanced_picker(rng_for(0, "bench", preset))
    rule = ACCEPT.get(preset)
    for i in range(20):  # warm the stimulus cache
        sampler.trial(rng_for(1, preset, i), picker=picker)[1].render(stim)
    n, ok, t0 = 0, 0, time.process_time()
    while time.process_time() - t0 < seconds:
        _, tr = sampler.trial(rng_for(0, preset, n), picker=picker)
        frames = tr.render(stim)
        n += 1
        if rule is None or accepted(tr.instruction, len(frames), rule):
            ok += 1
    dt = time.process_time() - t0
    return n / dt, ok / dt, n, ok


def rate_with_png(preset: str, seconds: float) -> float:
    """Trials/s (wall clock) including writing PNG frames and the trial JSON."""
    stim = procedural_set()
    sampler = PresetSampler(PRESETS[preset], stim)
    picker = sampler.balanced_picker(rng_for(0, "bench-png", preset))
    with tempfile.TemporaryDirectory() as d:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            task, tr = sampler.trial(rng_for(2, preset, n), picker=picker)
            write_trials(d, [(f"t{n:06d}", task, tr)], stim)
            n += 1
        return n / (time.perf_counter() - t0)


# The driver runs inside the original's venv. It only calls the package's public entry points
# (make, init_env_spec/set_env_spec, generate_tasks, generate_trials) and prints one JSON line.
ORIG_DRIVER = r'''
import copy, json, random, signal, sys, time, traceback

cfg = json.load(open(sys.argv[1]))
out = {}
try:
    import numpy as np
    import iwisdm
    from iwisdm import make
    out["versions"] = {"iwisdm": getattr(iwisdm, "__version__", None), "numpy": np.__version__}
    try:
        from importlib.metadata import version
        out["versions"]["iwisdm"] = version("iwisdm")
    except Exception:
        pass
except Exception as e:
    print(json.dumps({"error": "import iwisdm failed: %s: %s" % (type(e).__name__, e)}))
    sys.exit(0)

class Budget(Exception):
    pass

def on_alarm(signum, frame):
    raise Budget()

signal.signal(signal.SIGALRM, on_alarm)

def tree(op):
    """[class name, children]: operators only; a constant compared by IsSame/NotSame is ["CONST", []]."""
    from iwisdm.core import Attribute, Operator
    name, kids = type(op).__name__, []
    for c in op.child:
        if isinstance(c, Attribute):
            if name in ("IsSame", "NotSame"):
                kids.append(["CONST", []])
        elif isinstance(c, Operator):
            kids.append(tree(c))
    return [name, kids]

dump = open(cfg["dump"], "a") if cfg.get("dump") else None
random.seed(cfg["seed"]); np.random.seed(cfg["seed"])
try:
    env = make(env_id="ShapeNet", dataset_fp=cfg["stim_dir"])
    default_gen = env.init_env_spec().auto_gen_config
except Exception as e:
    print(json.dumps({"error": "iwisdm.make on the exported stimuli failed: %s: %s\n%s"
                      % (type(e).__name__, e, traceback.format_exc(limit=3))}))
    sys.exit(0)

for preset, p in cfg["presets"].items():
    rule, conf = p["accept"], dict(p["config"])
    gen = copy.deepcopy(default_gen)
    children, dist = conf.pop("cmp_children"), conf.pop("cmp_dist")
    gen.update(conf)
    for op in ("IsSame", "NotSame"):
        gen["op_dict"][op]["downstream"] = list(children)
        gen["op_dict"][op].pop("sample_dist", None)
        if dist:
            gen["op_dict"][op]["sample_dist"] = list(dist)
    gen["op_dict"]["Select"]["same_children_op"] = True
    res = {"tried": 0, "accepted": 0, "rejected_frames": 0, "rejected_bool": 0, "rejected_delay": 0,
           "errors": 0, "first_error": None, "example": None, "stopped": "budget"}
    try:
        env.set_env_spec(env.init_env_spec(max_delay=rule["max_delay"], delay_prob=0.5,
                                           add_fixation_cue=False, auto_gen_config=gen))
    except Exception as e:
        res["first_error"] = "init_env_spec: %s: %s" % (type(e).__name__, e)
        out[preset] = res
        continue
    # wall-clock guard against a stalled call; the budget itself is CPU time of this process
    signal.alarm(int(cfg["max_seconds"] * 3 + 60))
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        while True:
            used = time.process_time() - c0
            if used >= cfg["max_seconds"] or (used >= cfg["seconds"] and res["accepted"] >= cfg["min_accepted"]):
                break
            res["tried"] += 1
            try:
                _, (_, task) = env.generate_tasks(1)[0]
                if task.n_frames != rule["frames"]:
                    res["rejected_frames"] += 1
                    continue
                imgs, _, info = env.generate_trials(tasks=[task], mode="train", **cfg.get("trial_kwargs", {}))[0]
            except Budget:
                raise
            except Exception as e:
                res["errors"] += 1
                if res["first_error"] is None:
                    res["first_error"] = "%s: %s" % (type(e).__name__, e)
                continue
            ins = info["instruction"]
            n_bool = ins.count(" and ") + ins.count(" or ")
            n_delay = task.n_frames - ins.count("observe")
            if not rule["min_bool"] <= n_bool <= rule["max_bool"]:
                res["rejected_bool"] += 1
            elif not rule["min_delay"] <= n_delay <= rule["max_delay"]:
                res["rejected_delay"] += 1
            elif len(imgs) != rule["frames"]:
                res["rejected_frames"] += 1
            else:
                res["accepted"] += 1
                if dump is not None:
                    dump.write(json.dumps({"preset": preset, "instruction": ins, "answers": info["answers"],
                                           "epochs": len(imgs), "tree": tree(task._operator),
                                           "objects": [dict(o["obj"], count=o["count"]) for o in info["objects"]]},
                                          default=str) + "\n")
                    dump.flush()
                if res["example"] is None:
                    res["example"] = {"instruction": ins, "answer": info["answers"][-1], "frames": len(imgs)}
    except Budget:
        res["stopped"] = "wall-clock guard (a call stalled)"
    signal.alarm(0)
    res["cpu_s"] = time.process_time() - c0
    res["wall_s"] = time.perf_counter() - w0
    res["accepted_per_cpu_s"] = res["accepted"] / res["cpu_s"]
    out[preset] = res
print(json.dumps(out))
'''


def run_original(python: str, seconds: float, max_seconds: float, min_accepted: int,
                 presets=tuple(ACCEPT), seed: int = 0, dump: Optional[str] = None,
                 trial_kwargs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Time the original package in its own interpreter (separate venv) on the exported stimuli.

    ``dump``: a JSON-lines file to which every accepted trial is appended (instruction, per-frame
    answers, frame count, objects and the operator tree), e.g. for bench/iwisdm_shape.py;
    ``trial_kwargs`` go to its ``generate_trials`` (e.g. ``add_distractor_frame``)."""
    with tempfile.TemporaryDirectory(prefix="iwisdm_orig_") as d:
        stim_dir = os.path.join(d, "stimuli")
        procedural_set().export(stim_dir, "train")
        cfg = {"stim_dir": stim_dir, "seconds": seconds, "max_seconds": max_seconds, "min_accepted": min_accepted,
               "seed": seed, "dump": os.path.abspath(dump) if dump else None,
               "trial_kwargs": trial_kwargs or {},
               "presets": {p: {"accept": ACCEPT[p], "config": ORIG_CONFIG[p]} for p in presets}}
        cfg_path, driver = os.path.join(d, "config.json"), os.path.join(d, "orig_driver.py")
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        with open(driver, "w", encoding="utf-8") as f:
            f.write(ORIG_DRIVER)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
        try:
            res = subprocess.run([python, "-I", driver, cfg_path], capture_output=True, text=True, cwd=d, env=env,
                                 timeout=len(presets) * (max_seconds * 3 + 90) + 60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"could not run {python}: {type(e).__name__}: {e}"}
        lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
        if not lines:
            return {"error": f"driver gave no result (exit {res.returncode}): {res.stderr.strip()[-600:]}"}
        return json.loads(lines[-1])


ORIG_REQUIREMENTS = ("iwisdm==0.1.3", "numpy<2", "pandas", "opencv-python-headless")


def default_orig_venv() -> str:
    return os.path.join(cache_root(), "iwisdm_orig_venv")


def ensure_orig_venv(venv: str) -> Optional[str]:
    """Create the original package's venv if missing; returns why it could not be made, or None."""
    import subprocess
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python):
        return None
    print(f"creating {venv} for the original iwisdm ({' '.join(ORIG_REQUIREMENTS)}) ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, text=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *ORIG_REQUIREMENTS], check=True,
                       capture_output=True, text=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        import shutil
        shutil.rmtree(venv, ignore_errors=True)
        return f"could not create {venv}: {detail.strip().splitlines()[-1] if detail.strip() else e}"
    return None


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per in-memory measurement of ours")
    ap.add_argument("--no-setup-orig", action="store_true",
                    help="do not create the original's venv when it is missing")
    ap.add_argument("--orig-python", default=os.environ.get("IWISDM_ORIG_PYTHON"),
                    help="interpreter of a venv with iwisdm==0.1.3 installed")
    ap.add_argument("--orig-seconds", type=float, default=20.0,
                    help="CPU seconds per preset for the original (more if fewer than --orig-min-accepted)")
    ap.add_argument("--orig-max-seconds", type=float, default=60.0)
    ap.add_argument("--orig-min-accepted", type=int, default=50)
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    ap.add_argument("--no-orig", action="store_true", help="skip the original package")
    ap.add_argument("--smoke", action="store_true", help="ours only (--no-orig), 0.2 s per measurement: checks "
                    "that the bench runs (seconds), measures nothing")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seconds, args.no_orig = 0.2, True

    mem: Dict[str, float] = {}
    acc: Dict[str, float] = {}
    print(f"{'preset':24s} {'in-memory/cpu-s':>16s} {'with PNG/s':>11s} {'accepted/cpu-s':>15s}")
    for p in args.presets:
        mem[p], acc[p], n, ok = rate_in_memory(p, args.seconds)
        png = rate_with_png(p, args.seconds / 2)
        extra = f"{acc[p]:15.0f}  ({ok}/{n} meet the original's test)" if p in ACCEPT else f"{'':15s}"
        print(f"{p:24s} {mem[p]:16.0f} {png:11.0f} {extra}")

    speed: Dict[str, str] = {p: "n/a" for p in ACCEPT}
    compared = [p for p in ACCEPT if p in mem]
    setup_error = None
    if args.orig_python is None and compared and not args.no_orig:
        if not args.no_setup_orig:
            setup_error = ensure_orig_venv(default_orig_venv())
        args.orig_python = os.path.join(default_orig_venv(), "bin", "python")
    if args.no_orig:
        print("original iwisdm: NOT MEASURED (--no-orig)")
    elif not compared:
        print("original iwisdm: NOT MEASURED (none of low/medium/high in --presets)")
    elif setup_error:
        print(f"original iwisdm: NOT MEASURED ({setup_error})")
    elif not os.path.exists(args.orig_python):
        print(f"original iwisdm: NOT MEASURED (no interpreter at {args.orig_python}; "
              f"create it with: python3 -m venv DIR && DIR/bin/pip install {' '.join(ORIG_REQUIREMENTS)}, "
              "and pass --orig-python DIR/bin/python)")
    else:
        print(f"original iwisdm via {args.orig_python} (AutoTask + rejection, built-in stimuli exported "
              f"in its directory format; >= {args.orig_seconds:g} CPU-s per preset) ...", flush=True)
        orig = run_original(args.orig_python, args.orig_seconds, args.orig_max_seconds, args.orig_min_accepted,
                            presets=compared)
        if "error" in orig:
            print(f"original iwisdm: NOT MEASURED ({orig['error']})")
        else:
            print(f"original versions: {orig.get('versions')}")
        for p in compared:
            r = orig.get(p)
            if not isinstance(r, dict):
                continue
            line = (f"original {p:6s}: {r['accepted']} accepted of {r['tried']} tried in {r.get('cpu_s', 0):.1f} "
                    f"CPU-s (rejected: frames {r['rejected_frames']}, and/or {r['rejected_bool']}, "
                    f"delays {r['rejected_delay']}; errors {r['errors']})")
            if r.get("first_error"):
                line += f"; first error: {r['first_error']}"
            if r.get("stopped") != "budget":
                line += f"; stopped by {r['stopped']}"
            print(line)
            if r["accepted"] > 0 and r.get("cpu_s"):
                ratio = acc[p] / r["accepted_per_cpu_s"]
                speed[p] = f"{ratio:.1f}"
                print(f"  {r['accepted_per_cpu_s']:.1f} accepted/CPU-s vs ours {acc[p]:.0f}: {ratio:.1f}x"
                      f"  e.g. {r['example']['instruction']!r} -> {r['example']['answer']}")
            else:
                print("  no accepted trial: speed-up not measurable (n/a)")
    print(f"speedup_low={speed['low']} speedup_medium={speed['medium']} speedup_high={speed['high']} "
          f"min_trials_per_s={min(mem.values()):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
