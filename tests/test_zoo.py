"""The model zoo on tiny random-weight checkpoints of each family's real architecture.

Per family (parametrised over ``FAMILIES``):
* prefix-cached candidate scores equal full-sequence scores within 1e-4 (multi-image,
  multi-turn prompt, candidates of different token lengths, chunked candidate passes too);
* greedy outputs are identical at batch size 1 and 4 (mixed image counts, left padding);
* a 10-image prompt runs for both generation and likelihood;
* ``run_eval`` end to end with ``--model_name tiny`` in both inference methods.
Each family's tiny checkpoint is built once into a private cache and loaded through
``from_pretrained``, exactly as a real checkpoint is.
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import prediction_files
import torch

from reform_eval.utils.schema import IMAGE_TOKEN
from reform_eval.utils.images import noise_image

#: registry name -> keyword overrides for the sample images (sizes exercise tiling/resizing)
FAMILIES = ["llava_next", "idefics3", "qwen2_vl", "llava_onevision", "internvl", "blip2", "instructblip",
            "paligemma", "mllama"]

CANDIDATES = ["yes", "no", "a red circle left of the blue square", "(B)", "three dogs"]


_LOADED: dict = {}


@pytest.fixture(params=FAMILIES)
def zoo(request, cache_dir):
    """(family, interface, preprocessor), loaded once per family for the module."""
    from reform_eval.models import get_model
    torch.set_num_threads(1)
    fam = request.param
    if fam not in _LOADED:
        _LOADED.clear()  # keep one family in memory at a time
        _LOADED[fam] = get_model(fam, {"model_name": "tiny", "device": "cpu"})
    return (fam, *_LOADED[fam])


def _sample(n_images: int, question: str, sid: str = "s0", history=None) -> dict:
    return {"sample_id": sid, "formulation": "SingleChoice", "inference_method": "likelihood",
            "images": [noise_image(100 + i, (40 + 8 * i, 30)) for i in range(n_images)],
            "instruct": "Answer the question.", "question": question, "history": history or []}


def _close(fast, slow, tol=1e-4):
    assert [c.num_tokens for c in fast] == [c.num_tokens for c in slow]
    diffs = [abs(f.logprob - g.logprob) for f, g in zip(fast, slow)]
    assert max(diffs) <= tol, diffs


def test_prefix_cache_matches_full_sequence(zoo):
    fam, interface, pre = zoo
    history = [{"from": "human", "value": f"{IMAGE_TOKEN}What is in the first image?"},
               {"from": "assistant", "value": "A red circle."}]
    s = _sample(2, f"{IMAGE_TOKEN}And in the second one?", history=history)
    prompt = pre(s)
    fast = interface.raw_predict(s["images"], prompt, CANDIDATES)
    slow = interface.score_full_sequence(s["images"], prompt, CANDIDATES)
    assert len({c.num_tokens for c in fast}) >= 3
    _close(fast, slow)
    assert len({round(c.logprob, 3) for c in fast}) > 1  # scores are not degenerate
    interface.config["candidate_batch_size"] = 2
    try:
        _close(interface.raw_predict(s["images"], prompt, CANDIDATES), fast)
    finally:
        interface.config.pop("candidate_batch_size")


def test_greedy_same_at_batch_1_and_4(zoo):
    fam, interface, pre = zoo
    samples = [_sample(1, "Is there a cat?", "a"), _sample(2, "What colour are the two objects?", "b"),
               _sample(1, "Count to three, please.", "c"), _sample(3, "Which image shows a square? Answer.", "d")]
    prompts = [pre(s) for s in samples]
    images = [s["images"] for s in samples]
    single = [interface.raw_generate(im, p, max_new_tokens=6) for im, p in zip(images, prompts)]
    batch = interface.raw_batch_generate(images, prompts, max_new_tokens=6)
    assert single == batch
    assert any(single)


def test_ten_image_prompt(zoo):
    fam, interface, pre = zoo
    s = _sample(10, "Which of the ten images shows a star?")
    s["images"] = [noise_image(200 + i, (32, 32)) for i in range(10)]
    prompt = pre(s)
    scores = interface.raw_predict(s["images"], prompt, ["yes", "(J)"])
    assert len(scores) == 2 and all(c.num_tokens >= 1 for c in scores)
    assert isinstance(interface.raw_generate(s["images"], prompt, max_new_tokens=2), str)


@pytest.mark.parametrize("method", ["generation", "likelihood"])
def test_run_eval_end_to_end(zoo, method, tmp_path):
    from reform_eval import run_eval
    from tests.conftest import write_custom_dataset
    fam, interface, _ = zoo
    cfg = write_custom_dataset(str(tmp_path / "data"), n=3)
    out = tmp_path / "out"
    args = ["--model", fam, "--model_name", "tiny", "--dataset_name", "custom", "--dataset_config", cfg,
            "--formulation", "SingleChoice", "--infer_method", method, "--output_dir", str(out),
            "--per_gpu_eval_batch_size", "2", "--max_new_tokens", "4", "--do_eval"]
    assert run_eval.main(args) == 0
    preds = prediction_files(out)
    records = json.load(open(preds[0]))
    assert len(records) == 3
    if method == "likelihood":
        assert all(isinstance(r["prediction"], int) for r in records)
    else:
        assert all(isinstance(r["prediction"], str) for r in records)


def test_family_checkpoint_mismatch_is_clear(cache_dir):
    from reform_eval.models import get_model
    from reform_eval.models.tiny import tiny_model_path
    from reform_eval.utils.errors import ReformError
    from reform_eval import models
    models._load_all()
    path = tiny_model_path("llava_next")
    with pytest.raises(ReformError, match="'llava_next' model.*expects 'idefics3' or 'smolvlm'"):
        get_model("idefics3", {"model_name": path, "device": "cpu"})


@pytest.mark.parametrize("fam,variant", [("blip2", "blip2_t5"), ("instructblip", "instructblip_t5")])
def test_blip_encoder_decoder_scores_on_the_decoder(cache_dir, fam, variant):
    """Flan-T5 style BLIP-2 / InstructBLIP: candidates scored on the decoder against one
    shared encoder pass equal one full forward per candidate; greedy batch 1 == batch 4."""
    from reform_eval import models
    from reform_eval.models import get_model
    from reform_eval.models.tiny import tiny_model_path
    models._load_all()
    torch.set_num_threads(1)
    interface, pre = get_model(fam, {"model_name": tiny_model_path(variant), "device": "cpu"})
    assert interface.seq2seq
    history = [{"from": "human", "value": f"{IMAGE_TOKEN}What is in the first image?"},
               {"from": "assistant", "value": "A red circle."}]
    s = _sample(2, f"{IMAGE_TOKEN}And in the second one?", history=history)
    prompt = pre(s)
    fast = interface.raw_predict(s["images"], prompt, CANDIDATES)
    _close(fast, interface.score_full_sequence(s["images"], prompt, CANDIDATES))
    assert len({c.num_tokens for c in fast}) >= 3 and len({round(c.logprob, 3) for c in fast}) > 1
    interface.config["candidate_batch_size"] = 2
    _close(interface.raw_predict(s["images"], prompt, CANDIDATES), fast)
    samples = [_sample(1, "Is there a cat?", "a"), _sample(2, "What colour are the two objects?", "b"),
               _sample(1, "Count to three, please.", "c"), _sample(3, "Which image shows a square?", "d")]
    prompts, images = [pre(x) for x in samples], [x["images"] for x in samples]
    single = [interface.raw_generate(im, p, max_new_tokens=4) for im, p in zip(images, prompts)]
    assert single == interface.raw_batch_generate(images, prompts, max_new_tokens=4)


def test_blip2_layout_and_imageless_prompt(cache_dir):
    """Images go in front of the prompt (BLIP-2's layout: query tokens, then BOS); a prompt
    without an image is a clear error."""
    from reform_eval.models import get_model
    from reform_eval.utils.errors import ReformError
    interface, pre = get_model("blip2", {"model_name": "tiny", "device": "cpu"})
    s = _sample(2, "Which image is brighter?")
    prompt = pre(s)
    assert prompt.startswith(IMAGE_TOKEN * 2 + "Question: ") and prompt.endswith("Answer:")
    enc = interface._encode([interface.render(prompt)], s["images"])
    nq = interface.model.config.num_query_tokens
    ids = enc["input_ids"][0].tolist()
    assert ids[:2 * nq] == [interface._image_token_id()] * (2 * nq)
    assert ids[2 * nq] == interface.tokenizer.bos_token_id and enc["pixel_values"].shape[0] == 2
    with pytest.raises(ReformError, match="at least one image"):
        interface.raw_generate([], "Question: Is there a cat? Answer:", max_new_tokens=2)


def test_paligemma_prefix_lm_split(cache_dir):
    """PaliGemma: the prefix (images + prompt + newline) is bidirectional, candidates are the
    causal suffix. Cached scores match a full forward whose candidate tokens have
    token_type_ids 1, and differ from one that puts them in the bidirectional prefix."""
    from reform_eval.models import get_model
    interface, pre = get_model("paligemma", {"model_name": "tiny", "device": "cpu"})
    s = _sample(2, "What colour are the two objects? Count them.")
    prompt = pre(s)
    assert prompt.startswith(IMAGE_TOKEN * 2) and prompt.count(IMAGE_TOKEN) == 2
    text = interface.render(prompt)
    enc = interface._encode([text], s["images"])
    assert "labels" not in enc and int(enc["token_type_ids"].sum()) == 0
    assert enc["input_ids"][0, -1].item() == interface.tokenizer.convert_tokens_to_ids("\u010a")  # "\n"
    full = interface.tokenizer(text + "\nyes")["input_ids"]
    assert interface.candidate_ids(text, "yes") == full[len(interface.tokenizer(text + "\n")["input_ids"]):]
    fast = interface.raw_predict(s["images"], prompt, CANDIDATES)
    _close(fast, interface.score_full_sequence(s["images"], prompt, CANDIDATES))
    interface.candidate_token_type = lambda key: 0  # candidates wrongly inside the prefix
    try:
        wrong = interface.score_full_sequence(s["images"], prompt, CANDIDATES)
    finally:
        del interface.candidate_token_type
    assert max(abs(f.logprob - w.logprob) for f, w in zip(fast, wrong)) > 1e-3


def test_mllama_candidates_use_the_cross_attention_mask(cache_dir):
    """Mllama: candidates read the cached vision states through the prompt's last
    cross-attention mask row; scoring them unmasked (padded tiles visible) differs."""
    from reform_eval.models import get_model
    interface, pre = get_model("mllama", {"model_name": "tiny", "device": "cpu"})
    history = [{"from": "human", "value": f"{IMAGE_TOKEN}What is in the first image?"},
               {"from": "assistant", "value": "A red circle."}]
    s = _sample(2, f"{IMAGE_TOKEN}And in the second one?", history=history)
    s["images"][1] = noise_image(7, (32, 32))  # one tile of two: the second tile is padding
    prompt = pre(s)
    xmask = interface._encode([interface.render(prompt)], s["images"])["cross_attention_mask"]
    assert xmask[0, -1].tolist() == [[0, 0], [1, 0]]  # last token: second image, its one tile
    fast = interface.raw_predict(s["images"], prompt, CANDIDATES)
    _close(fast, interface.score_full_sequence(s["images"], prompt, CANDIDATES))
    interface.candidate_model = lambda: interface.model  # no mask for the candidate pass
    try:
        unmasked = interface.raw_predict(s["images"], prompt, CANDIDATES)
    finally:
        del interface.candidate_model
    assert max(abs(f.logprob - u.logprob) for f, u in zip(fast, unmasked)) > 1e-4
