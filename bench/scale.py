"""Memory and speed of a whole run as the data grows: the ``random`` baseline with ``--do_eval``.

Why: execution memory must not grow with the number of samples (samples are streamed and
records written as they finish), and scoring and the report must use a small constant per
sample (issue 24: 50,000 custom samples peaked at 2.8 GB, about 55 KB a sample). The bench
writes N custom-format samples (a question, four options, one small PNG each, the PNGs shared
by groups of samples as datasets reuse images), runs ``run_eval --model random --do_eval`` in a
child process, and reads the child's peak resident memory. A second, smaller run gives the
fixed cost, so the per-sample cost is (peak - fixed peak) / (N - n).

Usage: python bench/scale.py [--samples 50000] [--small 5000]
       python bench/scale.py --smoke        (tiny sizes, seconds)
Prints: samples=... peak_rss_mb=... kb_per_sample=... samples_per_s=...
Target (issue 24): peak_rss_mb <= 600 at 50,000 samples.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_dataset(directory: str, n: int, images: int = 500) -> str:
    """n SingleChoice items over ``images`` distinct 16x16 PNGs; returns the YAML path."""
    from PIL import Image
    os.makedirs(directory, exist_ok=True)
    colours = ["red", "green", "blue", "yellow"]
    rgb = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}
    for k in range(min(images, n)):
        Image.new("RGB", (16, 16), rgb[colours[k % 4]]).save(os.path.join(directory, f"img{k}.png"))
    with open(os.path.join(directory, "items.jsonl"), "w", encoding="utf-8") as f:
        for i in range(n):
            k = i % min(images, n)
            f.write(json.dumps({"sample_id": f"q{i}", "images": [f"img{k}.png"],
                                "question": f"Which colour fills image number {i}?",
                                "answer_options": colours, "answer": k % 4,
                                "meta": {"colour": colours[k % 4], "group": f"g{i % 10}"}}) + "\n")
    with open(os.path.join(directory, "custom.yaml"), "w", encoding="utf-8") as f:
        f.write("data_file: items.jsonl\n")
    return os.path.join(directory, "custom.yaml")


def run(cfg: str, out: str) -> Tuple[float, float]:
    """(peak RSS in MB, wall seconds) of one run_eval child."""
    code = ("import resource, runpy, sys; sys.argv = sys.argv[1:]; "
            "rc = 0\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as e:\n"
            "    rc = e.code or 0\nprint('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(rc)")
    argv = [sys.executable, "-c", code, os.path.join(ROOT, "run_eval.py"), "--model", "random",
            "--dataset_name", "custom", "--dataset_config", cfg, "--output_dir", out, "--do_eval", "--no_cache"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONDONTWRITEBYTECODE=""))
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"run_eval failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    peak = [ln for ln in done.stderr.splitlines() if ln.startswith("PEAK_KB")]
    return int(peak[-1].split()[1]) / 1024.0, wall


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Last line: samples peak_rss_mb kb_per_sample samples_per_s")
    p.add_argument("--samples", type=int, default=50000)
    p.add_argument("--small", type=int, default=5000, help="the smaller run that gives the fixed cost")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): checks the bench runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.samples, args.small = 400, 100
    with tempfile.TemporaryDirectory() as tmp:
        small_peak, _ = run(write_dataset(os.path.join(tmp, "small"), args.small), os.path.join(tmp, "out-small"))
        peak, wall = run(write_dataset(os.path.join(tmp, "big"), args.samples), os.path.join(tmp, "out-big"))
    per_sample_kb = max(0.0, peak - small_peak) * 1024.0 / max(1, args.samples - args.small)
    print(f"{args.small} samples: peak {small_peak:.0f} MB; {args.samples} samples: peak {peak:.0f} MB in {wall:.1f} s")
    print(f"samples={args.samples} peak_rss_mb={peak:.0f} kb_per_sample={per_sample_kb:.2f} "
          f"samples_per_s={args.samples / wall:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
