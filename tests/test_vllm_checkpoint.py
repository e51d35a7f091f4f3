"""The checkpoint vLLM loads (models.vllm_checkpoint): transformers 5 tower names renamed in a cached
copy keyed by content, tensors byte for byte the same; a checkpoint vLLM reads as it is is not copied.
(No engine needed: vLLM loading the copy is tests/test_vllm_engine.py.)"""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from reform_eval.models.tiny import tiny_model_path
from reform_eval.models.vllm_checkpoint import renamed_key, vllm_checkpoint


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REFORM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _checkpoint(folder, tensors, tower="clip_vision_model", index=False):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "llava", "vision_config": {"model_type": tower}}, f)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write("{}")
    if index:  # two shards and their index, as large checkpoints come
        names = sorted(tensors)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for shard, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, os.path.join(folder, shard), metadata={"format": "pt"})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}, f)
    else:
        save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return str(folder)


TENSORS = {
    "vision_tower.embeddings.patch_embedding.weight": torch.arange(12.0).reshape(3, 4),
    "vision_tower.encoder.layers.0.mlp.fc1.bias": torch.ones(5, dtype=torch.float16),
    "model.vision_tower.post_layernorm.weight": torch.full((3,), 2.0),
    "multi_modal_projector.linear_1.weight": torch.eye(3),
    "language_model.model.embed_tokens.weight": torch.zeros(7, 2),
    "lm_head.weight": torch.ones(7, 2),
}


def test_key_renaming():
    assert renamed_key("vision_tower.embeddings.x") == "vision_tower.vision_model.embeddings.x"
    assert renamed_key("model.vision_tower.encoder.y") == "model.vision_tower.vision_model.encoder.y"
    for unchanged in ("vision_tower.vision_model.embeddings.x", "model.vision_tower.vision_model.z",
                      "multi_modal_projector.linear_1.weight", "language_model.model.layers.0.w"):
        assert renamed_key(unchanged) == unchanged


@pytest.mark.parametrize("index", [False, True])
def test_renamed_copy_has_the_same_tensors(tmp_path, cache, index):
    src = _checkpoint(tmp_path / "ck", TENSORS, index=index)
    out = vllm_checkpoint(src)
    assert out != src and out.startswith(str(cache / "vllm-checkpoints"))
    got = {}
    for name in os.listdir(out):
        if name.endswith(".safetensors"):
            got.update(load_file(os.path.join(out, name)))
    assert sorted(got) == sorted(renamed_key(k) for k in TENSORS)
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in got
    for k, v in TENSORS.items():
        assert torch.equal(got[renamed_key(k)], v) and got[renamed_key(k)].dtype == v.dtype
    assert open(os.path.join(out, "tokenizer.json")).read() == "{}"
    if index:
        weight_map = json.load(open(os.path.join(out, "model.safetensors.index.json")))["weight_map"]
        assert sorted(weight_map) == sorted(got)
    # converted once: the same call returns the same copy; new content under the same path is a new copy
    assert vllm_checkpoint(src) == out
    shutil.rmtree(src)
    _checkpoint(tmp_path / "ck", dict(TENSORS, **{"lm_head.weight": torch.zeros(7, 2)}), index=index)
    again = vllm_checkpoint(src)
    assert again != out
    got = {}
    for name in os.listdir(again):
        if name.endswith(".safetensors"):
            got.update(load_file(os.path.join(again, name)))
    assert torch.equal(got["lm_head.weight"], torch.zeros(7, 2))


def test_checkpoints_vllm_reads_as_they_are_are_not_copied(tmp_path, cache):
    old_style = {renamed_key(k): v for k, v in TENSORS.items()}  # transformers 4 names (llava-hf releases)
    assert vllm_checkpoint(_checkpoint(tmp_path / "a", old_style)) == str(tmp_path / "a")
    other_tower = _checkpoint(tmp_path / "b", TENSORS, tower="pixtral")  # no vision_model level in vLLM
    assert vllm_checkpoint(other_tower) == other_tower
    assert not (cache / "vllm-checkpoints").exists()


def test_the_shipped_checkpoints_need_it(cache):
    """tiny-trained (transformers 5.24) is saved without the level: the copy exists and renames it."""
    src = tiny_model_path("llava", size="trained")
    out = vllm_checkpoint(src)
    names = load_file(os.path.join(out, "model.safetensors"))
    assert any(k.startswith("vision_tower.vision_model.") for k in names)
    assert not any(k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model.") for k in names)


def test_a_missing_engine_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """``--model vllm`` in a Python without vLLM: one line naming both ways to get it, exit 2,
    before the data is built or anything is written (it was an internal error after the build)."""
    import importlib.util

    from reform_eval import run_eval
    from reform_eval.evaluation import plan

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] == "vllm" else real(name, *a, **k))
    built = []
    monkeypatch.setattr(plan, "build_dataset", lambda *a, **k: built.append(a) or [])
    out = tmp_path / "out"
    rc = run_eval.main(["--model", "vllm", "--model_name", "tiny-trained", "--dataset_name", "iWISDM",
                        "--dataset_config", "iwisdm_identify_category", "--dataset_option", "n_trials=2",
                        "--output_dir", str(out)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, lines)
    assert 'pip install ".[vllm]"' in lines[0] and "commands/vllm_env.sh" in lines[0], lines[0]
    assert "internal error" not in lines[0] and not built and not out.exists()
