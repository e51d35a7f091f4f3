"""Big checkpoints through accelerate (issue 12 section 1), on CPU.

A tiny model loaded with an explicit device map that keeps some layers on ``cpu`` and
offloads the others to ``disk`` must give exactly the generations and likelihood scores of
the plain load: placement is an implementation detail, never a source of different numbers.
"""
from __future__ import annotations

import os

import pytest

from tests.conftest import prediction_files

from reform_eval.models import get_model
from reform_eval.utils.errors import ReformError
from reform_eval.utils.images import noise_image

#: llava's modules, half kept on cpu and half offloaded to disk (weights read per forward)
LLAVA_SPLIT = {
    "model.vision_tower": "cpu",
    "model.multi_modal_projector": "disk",
    "model.language_model.embed_tokens": "cpu",
    "model.language_model.rotary_emb": "cpu",
    "model.language_model.layers.0": "cpu",
    "model.language_model.layers.1": "disk",
    "model.language_model.norm": "disk",
    "lm_head": "disk",
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    plain, prep = get_model("llava", {"model_name": "tiny", "device": "cpu"})
    folder = str(tmp_path_factory.mktemp("offload"))
    split, _ = get_model("llava", {"model_name": "tiny", "device_map": dict(LLAVA_SPLIT),
                                   "offload_folder": folder})
    return plain, split, prep, folder


def _samples():
    out = []
    for i in range(3):
        out.append({"sample_id": f"s{i}", "images": [noise_image(i, (32, 32))],
                    "question": ["What is in the image?", "Is there a cat?", "Which colour is it?"][i],
                    "instruct": "", "history": [], "formulation": "Generation",
                    "candidates": ["yes", "no", "a red circle", "blue"]})
    return out


def test_split_model_is_really_offloaded(pair):
    _, split, _, _ = pair
    assert split.model.hf_device_map["lm_head"] == "disk"
    lm = split.model.model.language_model
    # disk-offloaded weights stay on the meta device and are read from disk per forward
    assert split.model.lm_head.weight.device.type == "meta"
    assert lm.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert split.model.lm_head._hf_hook.offload is True
    assert lm.layers[0].self_attn.q_proj.weight.device.type == "cpu"
    assert str(split.device) == "cpu"


def test_device_map_generation_equals_plain_load(pair):
    plain, split, prep, _ = pair
    samples = _samples()
    prompts = [prep(s) for s in samples]
    a = plain.forward("generation", samples, prompts, max_new_tokens=8)
    b = split.forward("generation", samples, prompts, max_new_tokens=8)
    assert a == b and any(x for x in a)


def test_device_map_likelihood_equals_plain_load(pair):
    plain, split, prep, _ = pair
    samples = _samples()
    prompts = [prep(s) for s in samples]
    a = plain.forward("likelihood", samples, prompts)
    b = split.forward("likelihood", samples, prompts)
    for ra, rb in zip(a, b):
        assert [n for _, n in ra] == [n for _, n in rb]
        assert max(abs(x[0] - y[0]) for x, y in zip(ra, rb)) < 1e-5
    assert len({round(x[0], 4) for x in a[0]}) > 1  # the scores discriminate


def test_placement_options_are_validated():
    with pytest.raises(ReformError, match="unknown device_map 'everywhere'"):
        get_model("llava", {"model_name": "tiny", "device_map": "everywhere"})
    with pytest.raises(ReformError, match="names GPU 3"):
        get_model("llava", {"model_name": "tiny", "device_map": "{model: 3, lm_head: cpu}"})
    with pytest.raises(ReformError, match="max_memory / offload_folder need device_map"):
        get_model("llava", {"model_name": "tiny", "max_memory": "{cpu: 1GiB}"})
    with pytest.raises(ReformError, match="tp_plan=auto needs torchrun"):
        get_model("llava", {"model_name": "tiny", "tp_plan": "auto"})
    with pytest.raises(ReformError, match="gpus_per_rank: must be a whole number >= 1 and <= 4096, got 0"):
        get_model("llava", {"model_name": "tiny", "gpus_per_rank": 0})


def test_gpu_group_per_rank(monkeypatch):
    import torch

    from reform_eval.models.hf_base import gpu_group
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert gpu_group(0, 4) == [0, 1, 2, 3] and gpu_group(1, 4) == [4, 5, 6, 7]
    with pytest.raises(ReformError, match="needs GPUs 8..11 but this node has 8"):
        gpu_group(2, 4)


def test_rank_device_with_gpus_per_rank(monkeypatch):
    import torch

    from reform_eval.utils.distributed import DistInfo, default_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device(DistInfo(rank=1, world_size=2, local_rank=1)) == "cuda:1"
    assert default_device(DistInfo(rank=1, world_size=2, local_rank=1), gpus_per_rank=4) == "cuda:4"


def test_auto_map_with_max_memory_offloads_and_matches_for_qwen2_vl():
    """``device_map=auto`` with a CPU budget too small for the model: accelerate places what
    fits on cpu and offloads the rest to disk; outputs still equal the plain load."""
    plain, prep = get_model("qwen2_vl", {"model_name": "tiny", "device": "cpu"})
    split, _ = get_model("qwen2_vl", {"model_name": "tiny", "device_map": "auto", "max_memory": "{cpu: 300KB}"})
    assert set(split.model.hf_device_map.values()) == {"cpu", "disk"}
    samples = _samples()[:2]
    prompts = [prep(s) for s in samples]
    assert plain.forward("generation", samples, prompts, max_new_tokens=6) == \
        split.forward("generation", samples, prompts, max_new_tokens=6)
    for ra, rb in zip(plain.forward("likelihood", samples, prompts), split.forward("likelihood", samples, prompts)):
        assert max(abs(x[0] - y[0]) for x, y in zip(ra, rb)) < 1e-5


def test_offloading_a_multihead_attention_is_refused_up_front():
    """PaliGemma's SigLIP pooling head (nn.MultiheadAttention) cannot run offloaded: one line
    at load time instead of a meta-device traceback in the first forward."""
    with pytest.raises(ReformError, match=r"nn.MultiheadAttention.*cannot run offloaded") as e:
        get_model("paligemma", {"model_name": "tiny", "device_map": "auto", "max_memory": "{cpu: 300KB}"})
    assert "\n" not in str(e.value)


_TP_SCRIPT = """
import json, sys
import torch.distributed as dist
sys.path.insert(0, {root!r})
dist.init_process_group("gloo")
from reform_eval.models import get_model
from tests.test_big_models import _samples
model, prep = get_model("llava", {{"model_name": "tiny", "device": "cpu", "tp_plan": "auto"}})
samples = _samples()
prompts = [prep(s) for s in samples]
out = {{"sharded": type(model.model.lm_head.weight).__name__,
        "generation": model.forward("generation", samples, prompts, max_new_tokens=8),
        "likelihood": [[x[0] for x in r] for r in model.forward("likelihood", samples, prompts)]}}
with open({out!r} + str(dist.get_rank()), "w") as f:
    json.dump(out, f)
dist.barrier()  # leave together (utils.distributed.shutdown): a rank leaving early aborts under load
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_tensor_parallel_tp_plan_auto_equals_plain_load(tmp_path, pair):
    """tp_plan=auto over two torchrun ranks (gloo, CPU): the weights are really sharded
    (DTensor) and both ranks get the plain load's generations and scores."""
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "tp.py"
    script.write_text(_TP_SCRIPT.format(root=root, out=str(tmp_path / "rank")))
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    plain, _, prep, _ = pair
    samples = _samples()
    prompts = [prep(s) for s in samples]
    want_gen = plain.forward("generation", samples, prompts, max_new_tokens=8)
    want_lp = [[x[0] for x in r] for r in plain.forward("likelihood", samples, prompts)]
    for rank in (0, 1):
        got = json.load(open(tmp_path / f"rank{rank}"))
        assert got["sharded"] == "DTensor"
        assert got["generation"] == want_gen
        for a, b in zip(got["likelihood"], want_lp):
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


@pytest.mark.slow
def test_run_eval_with_tp_plan_equals_one_process(tmp_path):
    """run_eval under torchrun with tp_plan=auto: the two ranks form one tensor-parallel
    model running every sample; the merged predictions equal a single-process run."""
    import json
    import subprocess
    import sys

    from tests.conftest import write_custom_dataset
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = write_custom_dataset(str(tmp_path / "data"), n=6)
    args = ["--model", "llava", "--model_name", "tiny", "--dataset_name", "custom", "--dataset_config", cfg,
            "--infer_method", "likelihood", "--per_gpu_eval_batch_size", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    one = subprocess.run([sys.executable, os.path.join(root, "run_eval.py"), *args, "--output_dir",
                          str(tmp_path / "one")], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    tp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                         os.path.join(root, "run_eval.py"), *args, "--model_option", "tp_plan=auto",
                         "--output_dir", str(tmp_path / "tp")], cwd=root, env=env, capture_output=True,
                        text=True, timeout=600)
    assert tp.returncode == 0, tp.stderr[-3000:]
    a = json.load(open(prediction_files(tmp_path / "one")[0]))
    b = json.load(open(prediction_files(tmp_path / "tp")[0]))
    assert [r["sample_id"] for r in a] == [r["sample_id"] for r in b] and len(a) == 6
    for x, y in zip(a, b):
        assert x["prediction"] == y["prediction"]
        assert max(abs(p - q) for p, q in zip(x["candidate_logprobs"], y["candidate_logprobs"])) < 1e-4
