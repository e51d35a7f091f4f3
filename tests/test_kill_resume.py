"""Killing a 2-rank run midway and re-running gives the uninterrupted predictions exactly."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import prediction_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def args_for(out):
    return ["--model", "llava", "--model_name", "tiny", "--dataset_name", "iWISDM",
            "--dataset_config", os.path.join(ROOT, "configs/datasets/iwisdm_low.yaml"),
            "--dataset_subsample", "60", "--max_new_tokens", "16", "--output_dir", str(out), "--seed", "3"]


def torchrun_cmd(out):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            os.path.join(ROOT, "run_eval.py"), *args_for(out)]


def shard_lines(out):
    n = 0
    for path in glob.glob(os.path.join(out, ".shards_*", "*.jsonl")):
        with open(path, "rb") as f:
            n += f.read().count(b"\n")
    return n


def descendants(pid):
    """All descendant pids (torchrun starts its workers in sessions of their own)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid):
    for p in [pid] + descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_and_kill_midway(cmd, out, min_lines, env):
    """Start ``cmd`` (a torchrun line), SIGKILL its whole tree once ``min_lines`` records are in
    the shards, and return how many complete records survived."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while shard_lines(out) < min_lines and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    kill_tree(proc.pid)
    proc.wait()
    time.sleep(0.5)
    return shard_lines(out)


@pytest.mark.slow  # (multi-process; the quick subset keeps a lighter test of the same path)
def test_kill_two_ranks_then_resume(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    reference = tmp_path / "reference"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), *args_for(reference)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "killed"
    partial = run_and_kill_midway(torchrun_cmd(out), out, 4, env)
    assert not prediction_files(out), "the run finished before the kill"
    assert 4 <= partial < 60, partial  # killed midway, with work already on disk
    again = subprocess.run(torchrun_cmd(out), cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already done" in open(os.path.join(out, "log.txt")).read()
    ref_file = prediction_files(reference)
    new_file = prediction_files(out)
    assert len(ref_file) == len(new_file) == 1
    assert os.path.basename(ref_file[0]) == os.path.basename(new_file[0])
    ref, new = json.load(open(ref_file[0])), json.load(open(new_file[0]))
    assert len(new) == 60 and len({(r["sample_id"], r["dup_index"]) for r in new}) == 60
    assert new == ref
    assert not glob.glob(os.path.join(out, ".shards_*"))
