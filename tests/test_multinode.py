"""Multi-node (issue 12 section 5): two torchrun "nodes" on this machine, one process each,
joined by c10d rendezvous on 127.0.0.1, writing into one shared output directory; the
merged predictions equal a single-process run record for record."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import prediction_files, write_custom_dataset
from reform_eval.utils.ports import unused_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def _eval_args(cfg: str, out: str):
    return ["--model", "llava", "--model_name", "tiny", "--dataset_name", "custom", "--dataset_config", cfg,
            "--formulation", "SingleChoice", "--max_new_tokens", "6", "--per_gpu_eval_batch_size", "2",
            "--output_dir", out]


def _predictions(out: str):
    files = prediction_files(out)
    assert len(files) == 1, files
    return files[0], json.load(open(files[0]))


@pytest.mark.slow
def test_two_nodes_equal_one_process(tmp_path):
    cfg = write_custom_dataset(str(tmp_path / "data"), n=10)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=ROOT)
    single = str(tmp_path / "single")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), *_eval_args(cfg, single)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    shared = str(tmp_path / "shared")  # the "shared filesystem" both nodes write to
    port = unused_port()
    nodes = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node_rank}",
               "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
               "--rdzv_id=reform-multinode-test", os.path.join(ROOT, "run_eval.py"), *_eval_args(cfg, shared)]
        nodes.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outputs = []
    for p in nodes:
        try:
            out, err = p.communicate(timeout=600)
        finally:
            if p.poll() is None:
                p.kill()
        outputs.append((p.returncode, err))
    for rc, err in outputs:
        assert rc == 0, err[-3000:]

    single_file, single_recs = _predictions(single)
    multi_file, multi_recs = _predictions(shared)
    assert os.path.basename(single_file) == os.path.basename(multi_file)  # same run identity
    assert [(r["sample_id"], r["dup_index"]) for r in multi_recs] == \
        [(r["sample_id"], r["dup_index"]) for r in single_recs]
    assert len(multi_recs) == 10
    for a, b in zip(single_recs, multi_recs):
        assert a == b
    # both nodes really worked: rank 1's shard held part of the samples before the merge
    log = open(os.path.join(shared, "log.txt")).read()
    assert "on 2 rank(s)" in log
