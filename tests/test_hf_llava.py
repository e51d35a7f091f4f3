"""The shared HF interface on the tiny LLaVA checkpoint (built locally, random weights)."""
from __future__ import annotations

import os
import threading

import pytest
import torch

from reform_eval.utils.schema import IMAGE_TOKEN
from reform_eval.utils.errors import ReformError
from reform_eval.utils.images import noise_image


@pytest.fixture(scope="module")
def llava(cache_dir):
    from reform_eval.models import get_model
    torch.set_num_threads(1)
    return get_model("llava", {"model_name": "tiny", "device": "cpu", "preprocessor": "conv"})


def _sample(n_images: int, question: str, sid: str = "s0", history=None) -> dict:
    return {"sample_id": sid, "formulation": "SingleChoice", "inference_method": "likelihood",
            "images": [noise_image(100 + i) for i in range(n_images)], "instruct": "Answer the question.",
            "question": question, "history": history or []}


CANDIDATES = ["yes", "no", "a red circle left of the blue square", "(B)", "three dogs"]


@pytest.mark.parametrize("n_images,question", [
    (1, "Is there a cat in the picture?"),
    (2, "Are the two objects the same colour?"),
    (3, "Which image shows a square?"),
])
def test_prefix_cache_matches_full_forward(llava, n_images, question):
    interface, pre = llava
    s = _sample(n_images, question)
    prompt = pre(s)
    assert prompt.count(IMAGE_TOKEN) == n_images
    fast = interface.raw_predict(s["images"], prompt, CANDIDATES)
    slow = interface.score_full_sequence(s["images"], prompt, CANDIDATES)
    assert [c.num_tokens for c in fast] == [c.num_tokens for c in slow]
    assert len({c.num_tokens for c in fast}) >= 3  # candidates of different token lengths
    for f, g in zip(fast, slow):
        assert abs(f.logprob - g.logprob) <= 1e-4, (f, g)
    # both cache-sharing strategies, chunked or not, give the same scores
    for extra in ({"candidate_batch_size": 2}, {"likelihood_strategy": "expand"},
                  {"likelihood_strategy": "expand", "candidate_batch_size": 2}):
        interface.config.update(extra)
        try:
            other = interface.raw_predict(s["images"], prompt, CANDIDATES)
        finally:
            for key in extra:
                interface.config.pop(key)
        for f, g in zip(fast, other):
            assert f.num_tokens == g.num_tokens and abs(f.logprob - g.logprob) <= 1e-4, extra


def test_candidate_tokens_are_the_suffix(llava):
    interface, pre = llava
    prompt = pre(_sample(1, "Is it red?"))
    tok = interface.tokenizer
    for cand in CANDIDATES:
        ids = interface.candidate_ids(prompt, cand)
        joint = tok(prompt + " " + cand)["input_ids"]
        assert joint[-len(ids):] == ids and tok.decode(ids) == " " + cand


def test_chat_template_prompt_scores(llava):
    interface, _ = llava
    pre = interface.make_preprocessor({"preprocessor": "chat_template"})
    s = _sample(2, "What colour is it?")
    msgs = pre(s)
    fast = interface.raw_predict(s["images"], msgs, CANDIDATES[:3])
    slow = interface.score_full_sequence(s["images"], msgs, CANDIDATES[:3])
    assert max(abs(f.logprob - g.logprob) for f, g in zip(fast, slow)) <= 1e-4


def test_greedy_generation_same_at_batch_1_and_4(llava):
    interface, pre = llava
    samples = [_sample(1, "Is there a cat?", "a"), _sample(2, "What colour are the two objects in the images?", "b"),
               _sample(0, "Count to three.", "c"), _sample(3, "Which image shows a square? Answer.", "d")]
    prompts = [pre(s) for s in samples]
    images = [s["images"] for s in samples]
    single = [interface.raw_generate(im, p, max_new_tokens=6) for im, p in zip(images, prompts)]
    batch = interface.raw_batch_generate(images, prompts, max_new_tokens=6)
    assert single == batch
    assert all(isinstance(t, str) for t in batch)


def test_sampling_with_seeds_is_reproducible(llava):
    interface, pre = llava
    s = _sample(1, "Describe the image.")
    p = pre(s)
    a = interface.raw_batch_generate([s["images"]] * 2, [p, p], max_new_tokens=6, temperature=1.0, seeds=[3, 4])
    b = interface.raw_batch_generate([s["images"]], [p], max_new_tokens=6, temperature=1.0, seeds=[4])
    assert a[1] == b[0]


def test_ten_image_prompt(llava):
    interface, pre = llava
    s = _sample(10, "Which of the ten images shows a star?")
    prompt = pre(s)
    assert prompt.count(IMAGE_TOKEN) == 10
    scores = interface.raw_predict(s["images"], prompt, ["yes", "no", "(J)"])
    assert len(scores) == 3 and all(c.num_tokens >= 1 for c in scores)
    assert isinstance(interface.raw_generate(s["images"], prompt, max_new_tokens=3), str)


def test_saved_and_reloaded_model_gives_identical_logits(llava, tmp_path):
    from reform_eval.models.interfaces.llava_interface import LlavaInterface
    interface, pre = llava
    interface.model.save_pretrained(tmp_path)
    interface.processor.save_pretrained(tmp_path)
    again = LlavaInterface({"model_name": str(tmp_path), "device": "cpu"})
    s = _sample(2, "Is it red?")
    text = again.render(pre(s))
    enc_a = interface._encode([text], s["images"])
    enc_b = again._encode([text], s["images"])
    assert torch.equal(enc_a["input_ids"], enc_b["input_ids"])
    with torch.inference_mode():
        la = interface.model(**enc_a).logits
        lb = again.model(**enc_b).logits
    assert torch.equal(la, lb)


def test_missing_model_path_is_a_clear_error(cache_dir, tmp_path):
    from reform_eval.models import get_model
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ReformError, match="no_such_model.*does not exist"):
        get_model("llava", {"model_name": missing, "device": "cpu"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReformError, match="no config.json"):
        get_model("llava", {"model_name": str(tmp_path / "empty"), "device": "cpu"})
    # a checkpoint directory missing its weights / its tokenizer
    import shutil
    from reform_eval.models.tiny import tiny_model_path
    for missing_files, message in ((("model.safetensors",), "cannot load weights"),
                                   (("tokenizer.json", "tokenizer_config.json"), "cannot load the processor")):
        broken = tmp_path / ("broken_" + missing_files[0])
        shutil.copytree(tiny_model_path("llava"), broken)
        for f in missing_files:
            (broken / f).unlink()
        with pytest.raises(ReformError, match=f"{broken.name}.*{message}"):
            get_model("llava", {"model_name": str(broken), "device": "cpu"})


def test_family_mismatch_is_a_clear_error(cache_dir, tmp_path):
    from transformers import LlamaConfig
    from reform_eval.models import get_model
    LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                vocab_size=50).save_pretrained(tmp_path)
    with pytest.raises(ReformError, match="'llama' model.*expects 'llava'"):
        get_model("llava", {"model_name": str(tmp_path), "device": "cpu"})


def test_bad_inputs_name_the_sample(llava, tmp_path):
    interface, pre = llava
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    s = _sample(1, "Is it red?", sid="bad-image")
    s["images"] = [str(bad)]
    s["candidates"] = ["yes", "no"]
    with pytest.raises(ReformError, match="bad-image.*broken.png"):
        interface.forward("likelihood", [s], [pre(s)])
    s2 = _sample(2, "Is it red?", sid="long-one")
    s2["candidates"] = ["yes"]
    old = interface.max_context
    interface.max_context = 20
    try:
        with pytest.raises(ReformError, match="long-one.*longer than the model context"):
            interface.forward("likelihood", [s2], [pre(s2)])
    finally:
        interface.max_context = old
    with pytest.raises(ReformError, match="1 image placeholders but 2 images"):
        interface.raw_predict(s2["images"], pre(_sample(1, "x")), ["yes"])


def test_tiny_builder_is_race_safe(cache_dir):
    from reform_eval.models.tiny import register_tiny_builder, tiny_model_path

    def build(out_dir: str, size: str) -> None:
        from safetensors.torch import save_file
        for i in range(20):
            with open(os.path.join(out_dir, f"part{i}.txt"), "w") as f:
                f.write(size)
        # the cache only publishes a checkpoint that loads: a config and complete weights
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{}")
        save_file({"w": torch.zeros(3)}, os.path.join(out_dir, "model.safetensors"))

    register_tiny_builder("fake_race", build, version="7")
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(tiny_model_path("fake_race"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and len(paths) == 4
    assert paths[0].endswith(os.path.join("tiny", "fake_race", "tiny-v7"))
    assert len([f for f in os.listdir(paths[0]) if f.startswith("part")]) == 20
    assert os.listdir(os.path.dirname(paths[0])) == ["tiny-v7"]  # no temp debris


def test_half_evaluation_uses_bf16_on_cpu(llava, cache_dir):
    """--half_evaluation loads bf16 weights on CPU; scores stay close to fp32 ones."""
    from reform_eval.models import get_model
    half, pre = get_model("llava", {"model_name": "tiny", "device": "cpu", "half_evaluation": True})
    assert half.model.dtype == torch.bfloat16
    fp32, _ = llava
    sample = {"sample_id": "h", "formulation": "Generation", "inference_method": "likelihood",
              "images": [noise_image(3)], "instruct": "", "question": "Is there a cat?", "history": []}
    cands = ["yes", "no", "a red circle"]
    a = fp32.raw_predict(sample["images"], pre(sample), cands)
    b = half.raw_predict(sample["images"], pre(sample), cands)
    assert [x.num_tokens for x in a] == [x.num_tokens for x in b]
    assert max(abs(x.logprob - y.logprob) for x, y in zip(a, b)) < 0.25
    assert a != b  # really a different precision


def test_model_name_is_required():
    """No silent fall-back to the random tiny model."""
    from reform_eval.models import get_model
    with pytest.raises(ReformError, match="give --model_name"):
        get_model("llava", {"device": "cpu"})
