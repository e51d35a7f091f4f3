"""Benchmark iWISDM trial generation: trials/s per preset, in memory and with PNG writing.

Usage: python bench/iwisdm_gen.py [--seconds 2] [--orig-python /tmp/iwisdm_venv/bin/python]

Measures, single process, per CPU-second (per core), for every preset: graph + trial + rendered frames in memory, and the
same plus writing PNGs/JSON. If ``--orig-python`` names an interpreter with ``iwisdm==0.1.3``
installed, it also times the original package on the built-in stimuli exported in its
directory format, counting only trials that meet the preset (rejection, as its benchmarking
script does) and prints the speed-up. Without it the speed-ups are reported as 'n/a'.
The last line is always:
``speedup_low=<r> speedup_medium=<r> speedup_high=<r> min_trials_per_s=<n>``.
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
from typing import Dict, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from build.iwisdm.io import write_trials  # noqa: E402
from build.iwisdm.presets import PRESETS, PresetSampler  # noqa: E402
from build.iwisdm.stimuli import procedural_set  # noqa: E402
from utils.seeding import rng_for  # noqa: E402

logger = logging.getLogger(__name__)

#: preset -> (frames, min and/or, max and/or, switches) for the original's rejection filter
ORIG_FILTER = {"low": (6, 1, 1, 0), "medium": (8, 1, 1, 1), "high": (9, 1, 2, 1)}


def rate_in_memory(preset: str, seconds: float) -> float:
    """Trials per CPU-second of this process (per core; robust to other load on the machine):
    task graph + trial + rendered frames (PIL images) in memory."""
    stim = procedural_set()
    sampler = PresetSampler(PRESETS[preset], stim)
    picker = sampler.balanced_picker(rng_for(0, "bench", preset))
    for i in range(20):  # warm the stimulus cache
        sampler.trial(rng_for(1, preset, i), picker=picker)[1].render(stim)
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        _, tr = sampler.trial(rng_for(0, preset, n), picker=picker)
        tr.render(stim)
        n += 1
    return n / (time.process_time() - t0)


def rate_with_png(preset: str, seconds: float) -> float:
    """Trials/s including writing PNG frames and the trial JSON."""
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


ORIG_SCRIPT = r'''
import json, sys, time
cfg = json.loads(sys.argv[1])
try:
    import iwisdm
    from iwisdm import make, read_write
except Exception as e:
    print(json.dumps({"error": f"import iwisdm failed: {type(e).__name__}: {e}"})); sys.exit(0)
out = {}
try:
    env = make(env_id="shapenet", dataset_fp=cfg["stim_dir"])
    for preset, (frames, lo, hi, sw) in cfg["filters"].items():
        space = env.generate_tasks  # probe the API surface
        t0 = time.perf_counter(); acc = 0; tot = 0
        while time.perf_counter() - t0 < cfg["seconds"]:
            tasks = env.generate_tasks(1, mode="random")
            for _, (_, task) in tasks if isinstance(tasks, dict) else tasks:
                tot += 1
                imgs, ins, ans = env.generate_trial(task)
                n_bool = ins.count(" and ") + ins.count(" or ")
                if len(imgs) == frames and lo <= n_bool <= hi and ins.count("if ") == sw:
                    acc += 1
        out[preset] = {"accepted_per_s": acc / (time.perf_counter() - t0), "tried": tot, "accepted": acc}
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
'''


def run_original(python: str, seconds: float) -> Dict[str, object]:
    """Time the original package in its own interpreter (separate venv: numpy<2, opencv, torch)."""
    with tempfile.TemporaryDirectory() as d:
        procedural_set().export(d, "train")
        cfg = {"stim_dir": d, "seconds": seconds, "filters": ORIG_FILTER}
        try:
            res = subprocess.run([python, "-c", ORIG_SCRIPT, json.dumps(cfg)], capture_output=True, text=True,
                                 timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"could not run {python}: {e}"}
        lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
        if not lines:
            return {"error": f"no result (rc={res.returncode}): {res.stderr.strip()[-300:]}"}
        return json.loads(lines[-1])


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    ap.add_argument("--orig-python", default=os.environ.get("IWISDM_ORIG_PYTHON", "/tmp/iwisdm_venv/bin/python"))
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    args = ap.parse_args(argv)
    mem: Dict[str, float] = {}
    print(f"{'preset':24s} {'in-memory/s':>12s} {'with PNG/s':>12s}")
    for p in args.presets:
        mem[p] = rate_in_memory(p, args.seconds)
        png = rate_with_png(p, args.seconds / 2)
        print(f"{p:24s} {mem[p]:12.0f} {png:12.0f}")
    speed: Dict[str, str] = {p: "n/a" for p in ORIG_FILTER}
    if os.path.exists(args.orig_python):
        orig = run_original(args.orig_python, args.seconds * 5)
        if "error" in orig:
            print(f"original iwisdm: NOT MEASURED ({orig['error']})")
        for p in ORIG_FILTER:
            r = orig.get(p)
            if isinstance(r, dict) and r.get("accepted_per_s", 0) > 0 and p in mem:
                speed[p] = f"{mem[p] / r['accepted_per_s']:.1f}"
                print(f"original {p}: {r['accepted_per_s']:.2f} accepted trials/s ({r['accepted']}/{r['tried']})")
            elif isinstance(r, dict):
                print(f"original {p}: 0 accepted trials in the time budget ({r.get('tried', 0)} tried)")
    else:
        print(f"original iwisdm: NOT MEASURED (no interpreter at {args.orig_python}; install iwisdm==0.1.3 "
              "in a separate venv and pass --orig-python)")
    print(f"speedup_low={speed['low']} speedup_medium={speed['medium']} speedup_high={speed['high']} "
          f"min_trials_per_s={min(mem.values()):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
