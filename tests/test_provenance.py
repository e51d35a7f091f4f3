"""Full provenance in every run (issue 27 part 1): per run, what can change an answer (engine,
model class, dtype, device, attention, template hash, system line, BOS, image processor and its
backend and size, versions); per sample, the hash and token count of the exact rendered prompt,
whether it starts with BOS, and a hash of the pixel tensor the model got."""
from __future__ import annotations

import hashlib
import json

import pytest

from reform_eval import run_eval
from tests.conftest import prediction_files

TRIALS = ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_identify_category", "--dataset_subsample", "6"]


def _run(out, *extra: str) -> tuple:
    assert run_eval.main(["--model", "llava", "--model_name", "tiny-trained", *TRIALS, "--output_dir", str(out),
                          *extra]) == 0
    pred = prediction_files(out)[0]
    info = pred[:-len(".json")] + ".run.json"
    return json.load(open(pred)), json.load(open(info))


def test_a_transformers_run_records_what_the_model_was_given(tmp_path):
    recs, info = _run(tmp_path / "lik", "--infer_method", "likelihood")
    p = info["provenance"]
    assert p["engine"] == "transformers" and p["model_class"] == "LlavaForConditionalGeneration"
    assert p["dtype"] == "float32" and p["device"] == "cpu" and p["attn_implementation"]
    assert p["preprocessor"] == "ChatTemplateProcessor" and p["system_line"] == ""
    assert len(p["chat_template_sha"]) == 16
    assert p["bos_token"] == "<s>" and p["adds_bos"] is True
    ip = p["image_processor"]
    assert ip["class"] == "LlavaImageProcessorPil" and ip["backend"] == "pil"
    assert ip["output_size"]["size"] == {"shortest_edge": 64}
    assert p["versions"]["torch"] and p["versions"]["transformers"]
    assert "USER:" in p["prompt_example"] and "ASSISTANT:" in p["prompt_example"]
    assert len(recs) == 6
    for r in recs:
        t = r["trace"]
        assert t["bos"] is True and t["prompt_tokens"] > 16  # the 16 image tokens of a 64-px frame and the text
        assert len(t["prompt_sha"]) == 16 and len(t["pixel_sha"]) == 16
        assert len(t["image_sha"]) == 16  # the images' content, as the run fingerprinted them
    # the first record's rendered prompt is the recorded example: its hash is the record's
    assert recs[0]["trace"]["prompt_sha"] == hashlib.sha256(p["prompt_example"].encode()).hexdigest()[:16]
    # six trials, six images, six different pixel tensors; the prompts share the template
    assert len({r["trace"]["pixel_sha"] for r in recs}) == 6
    assert len({r["trace"]["image_sha"] for r in recs}) == 6
    assert json.loads(json.dumps(p)) == p  # plain JSON types at the source (no repr strings of objects)


@pytest.mark.slow
def test_generation_traces_match_likelihood_traces_and_survive_the_cache(tmp_path, monkeypatch):
    """The same item asked by generation renders the same prompt and pixels as by likelihood
    (``models.hf_inputs`` is their one path); an answer served from the response cache keeps the
    trace of the call that made it."""
    lik, _ = _run(tmp_path / "lik", "--infer_method", "likelihood")
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)
    cache = str(tmp_path / "cache")
    gen, _ = _run(tmp_path / "gen", "--cache_dir", cache)
    again, info = _run(tmp_path / "again", "--cache_dir", cache)
    assert info["response_cache"]["hits"] == 6 and info["response_cache"]["misses"] == 0
    by_id = {r["sample_id"]: r for r in lik}
    for g, a in zip(gen, again):
        assert g["trace"] == a["trace"]
        assert g["trace"]["pixel_sha"] == by_id[g["sample_id"]]["trace"]["pixel_sha"]


@pytest.mark.slow
@pytest.mark.parametrize("option,field,value", [("system_msg=You are terse.", "system_line", "You are terse."),
                                                 ("dtype=bfloat16", "dtype", "bfloat16")])
def test_a_changed_setting_shows_in_the_provenance(tmp_path, option, field, value):
    _, info = _run(tmp_path / "out", "--infer_method", "likelihood", "--model_option", option)
    assert info["provenance"][field] == value


def _sample(sid: str, question: str, images: list) -> dict:
    return {"sample_id": sid, "formulation": "Generation", "question": question, "history": [], "images": images}


def _traces(family: str, samples: list, builder: str = "") -> tuple:
    """(interface, traces) of one generation forward of ``samples`` on the tiny ``family``."""
    import torch

    from reform_eval.models import get_model
    from reform_eval.models.tiny import tiny_model_path

    torch.set_num_threads(1)
    it, pre = get_model(family, {"model_name": tiny_model_path(builder or family), "device": "cpu"})
    it.forward("generation", samples, [pre(s) for s in samples], max_new_tokens=2, temperature=0.0,
               seeds=[0] * len(samples))
    return it, it.take_traces()


@pytest.mark.parametrize("family", ["llava_next", "llava_onevision", "idefics3", "internvl", "mllama", "qwen2_vl"])
def test_pixel_sha_of_a_sample_does_not_depend_on_its_batch(family):
    """Processors pad across a batch: LLaVA-NeXT and OneVision pad each image's tiles with zero
    tiles to the batch's most, Idefics3 and Mllama pad each row's images (count, tiles, size),
    InternVL stacks every image's tiles. ``pixel_rows`` hashed the padded slices (the same image
    hashed differently at batch size 1 and 3, so ``explain`` between runs that differ only in
    --per_gpu_eval_batch_size blamed the pixels), and InternVL's rows got None in a batch. Now a
    sample's pictures are hashed without padding, the same alone and in any batch."""
    from reform_eval.utils.images import noise_image

    a, b, c = noise_image(1, (40, 32)), noise_image(2, (40, 32)), noise_image(3, (64, 48))
    _, alone = _traces(family, [_sample("x", "What colour?", [a])])
    _, batch = _traces(family, [_sample("y", "Same?", [b, c]), _sample("x", "What colour?", [a]),
                                _sample("z", "What colour is it?", [c])])
    assert alone[0]["pixel_sha"] is not None and alone[0]["pixel_sha"] == batch[1]["pixel_sha"]
    assert len({t["pixel_sha"] for t in batch}) == 3


def _tiny_builders() -> list:
    from reform_eval.models.tiny import tiny_families
    return tiny_families()


@pytest.mark.parametrize("builder", _tiny_builders())
def test_every_hf_family_traces_the_pixels_of_the_sample_alone(builder):
    """Every in-process family reports a trace (Mllama, BLIP-2 and InstructBLIP build their
    inputs in their own ``_encode`` and reported none), and its ``pixel_sha`` is the hash of the
    family's image processor output for the sample's images alone (no batch padding), taken from
    the encoding the model got (no second processor run)."""
    from reform_eval.models.hf_provenance import pixel_rows
    from reform_eval.utils.images import noise_image

    family = builder[:-3] if builder.endswith("_t5") else builder
    images = [noise_image(1, (40, 32))] if family in ("blip2", "instructblip", "paligemma") else \
        [noise_image(1, (40, 32)), noise_image(3, (64, 48))]
    it, traces = _traces(family, [_sample("x", "What colour?", images)], builder)
    t = traces[0]
    assert len(t["prompt_sha"]) == 16 and t["prompt_tokens"] > 0 and t["bos"] is not None
    assert t["image_sizes"] == [[40, 32], [64, 48]][:len(images)]
    alone = pixel_rows(it.processor.image_processor(images=list(images), return_tensors="np"), [len(images)])[0]
    assert t["pixel_sha"] is not None and t["pixel_sha"] == alone
