"""Batched and batch-invariant inference on the tiny checkpoints.

* Sampled generation (temperature 1, N=4 responses per sample, per-row seeds as run_eval
  derives them): outputs at batch sizes 1, 3 and 8 are identical, the N responses of a
  sample differ, and top-k 1 reduces sampling to greedy decoding.
* Batched likelihood (one left-padded prefix pass for the batch, then all candidates): per
  family, scores equal the one-sample path within 1e-4 (mixed image counts, multi-turn).
"""
from __future__ import annotations

from typing import Dict, List

import pytest
import torch

from reform_eval.utils.schema import IMAGE_TOKEN
from reform_eval.utils.images import noise_image
from reform_eval.utils.seeding import derive_seed

QUESTIONS = ["Is there a cat?", "What colour are the two objects?", "Count to three, please.",
             "Which image shows a square? Answer.", "Describe the scene.", "Is it daytime?",
             "What is left of the circle?", "Name the largest shape."]
CANDIDATES = ["yes", "no", "a red circle left of the blue square", "(B)", "three dogs"]

_LOADED: Dict[str, tuple] = {}


def _model(fam: str):
    """``fam`` or ``fam:variant`` (a tiny checkpoint of another builder, e.g. ``blip2:blip2_t5``)."""
    from reform_eval import models
    from reform_eval.models import get_model
    from reform_eval.models.tiny import tiny_model_path
    torch.set_num_threads(1)
    if fam not in _LOADED:
        _LOADED.clear()  # one family in memory at a time
        name, _, variant = fam.partition(":")
        models._load_all()
        path = tiny_model_path(variant) if variant else "tiny"
        _LOADED[fam] = get_model(name, {"model_name": path, "device": "cpu"})
    return _LOADED[fam]


def _samples(n: int = 8) -> List[dict]:
    """Samples with 1-3 images of different sizes (different prompt lengths: left padding)."""
    out = []
    for i in range(n):
        n_img = 1 + i % 3
        out.append({"sample_id": f"s{i}", "formulation": "SingleChoice", "inference_method": "likelihood",
                    "images": [noise_image(50 + 7 * i + j, (36 + 8 * j, 30 + 4 * i)) for j in range(n_img)],
                    "instruct": "Answer the question.", "question": QUESTIONS[i % len(QUESTIONS)],
                    "history": []})
    return out


def _sampled(interface, prompts, images, batch: int, n_resp: int = 4, **kw) -> List[List[str]]:
    """run_eval's loop: N passes over the data in batches, row seeds (seed, sample, dup, j)."""
    per_sample: List[List[str]] = [[] for _ in prompts]
    for j in range(n_resp):
        for start in range(0, len(prompts), batch):
            idx = list(range(start, min(start + batch, len(prompts))))
            seeds = [derive_seed(7, f"s{i}", 0, j) for i in idx]
            outs = interface.raw_batch_generate([images[i] for i in idx], [prompts[i] for i in idx],
                                                max_new_tokens=8, temperature=1.0, seeds=seeds, **kw)
            for i, o in zip(idx, outs):
                per_sample[i].append(o)
    return per_sample


@pytest.mark.parametrize("fam", ["llava", "qwen2_vl", "llava_onevision", "mllama"])
def test_sampled_generation_is_batch_invariant(fam):
    """Samples have 1-3 images; mllama batches only rows of equal image count (its padded
    image slots are not neutral), the others batch everything."""
    interface, pre = _model(fam)
    samples = _samples()
    prompts, images = [pre(s) for s in samples], [s["images"] for s in samples]
    b1 = _sampled(interface, prompts, images, 1)
    assert _sampled(interface, prompts, images, 3) == b1
    assert _sampled(interface, prompts, images, 8) == b1
    # the 4 responses of a sample are different draws, and different samples differ too
    assert all(len(set(r)) == 4 for r in b1), b1
    assert len({r[0] for r in b1}) == len(b1)


def test_seeded_sampling_respects_top_k():
    """top_k=1 leaves one token per step: the draw is the greedy output whatever the seed."""
    interface, pre = _model("llava")
    samples = _samples(3)
    prompts, images = [pre(s) for s in samples], [s["images"] for s in samples]
    greedy = interface.raw_batch_generate(images, prompts, max_new_tokens=8)
    top1 = interface.raw_batch_generate(images, prompts, max_new_tokens=8, temperature=1.0,
                                        seeds=[1, 2, 3], top_k=1)
    assert top1 == greedy and any(greedy)
    free = interface.raw_batch_generate(images, prompts, max_new_tokens=8, temperature=1.0, seeds=[1, 2, 3])
    assert free != greedy


def test_gumbel_noise_depends_on_seed_and_step_only():
    from reform_eval.models.sampling import gumbel_noise
    a = gumbel_noise(11, 0, 1000)
    assert torch.equal(a, gumbel_noise(11, 0, 1000))
    assert not torch.equal(a, gumbel_noise(11, 1, 1000)) and not torch.equal(a, gumbel_noise(12, 0, 1000))
    # standard Gumbel: mean = Euler-Mascheroni constant, variance pi^2/6 (loose bounds, n=20000)
    big = gumbel_noise(3, 0, 20000)
    assert abs(float(big.mean()) - 0.5772) < 0.05 and abs(float(big.var()) - 1.6449) < 0.1


LIKELIHOOD_FAMILIES = ["llava", "llava_next", "idefics3", "qwen2_vl", "llava_onevision", "internvl", "blip2",
                       "instructblip", "paligemma", "mllama", "blip2:blip2_t5", "instructblip:instructblip_t5"]


def _likelihood_batch(pre, n: int = 5):
    """n samples, 1-3 images, one multi-turn, candidate lists of different sizes and lengths."""
    samples = _samples(n)
    samples[1]["history"] = [{"from": "human", "value": f"{IMAGE_TOKEN}What is in the first image?"},
                             {"from": "assistant", "value": "A red circle."}]
    samples[1]["question"] = f"{IMAGE_TOKEN}And in the second one?"
    samples[1]["images"] = samples[1]["images"][:2]
    prompts = [pre(s) for s in samples]
    cands = [CANDIDATES[i % 2:] for i in range(n)]  # 5 or 4 candidates per sample
    return [s["images"] for s in samples], prompts, cands


@pytest.mark.parametrize("fam", LIKELIHOOD_FAMILIES)
def test_batched_likelihood_equals_one_sample_path(fam):
    interface, pre = _model(fam)
    images, prompts, cands = _likelihood_batch(pre)
    single = [interface.raw_predict(im, p, c) for im, p, c in zip(images, prompts, cands)]
    for extra in ({}, {"candidate_batch_size": 2}):
        interface.config.update(extra)
        try:
            batched = interface.raw_batch_predict(images, prompts, cands)
        finally:
            for key in extra:
                interface.config.pop(key)
        assert [[c.num_tokens for c in s] for s in batched] == [[c.num_tokens for c in s] for s in single]
        diff = max(abs(a.logprob - b.logprob) for s, t in zip(single, batched) for a, b in zip(s, t))
        assert diff <= 1e-4, (fam, extra, diff)
    assert len({round(c.logprob, 3) for s in single for c in s}) > 5  # not degenerate


def test_batched_likelihood_is_the_batched_path():
    """The batched path really runs: one prefix pass for the batch, and switching it off
    (``batched_likelihood: false``) runs one prefix pass per sample."""
    interface, pre = _model("llava")
    images, prompts, cands = _likelihood_batch(pre, 3)
    calls = []
    handle = interface.model.register_forward_pre_hook(lambda mod, args, kw: calls.append(kw["input_ids"].shape[0]),
                                                       with_kwargs=True)
    try:
        interface.raw_batch_predict(images, prompts, cands)
        assert calls == [3, 3]  # prefix pass, packed candidate pass
        calls.clear()
        interface.config["batched_likelihood"] = False
        interface.raw_batch_predict(images, prompts, cands)
        assert calls == [1, 1] * 3
    finally:
        handle.remove()
        interface.config.pop("batched_likelihood", None)


def test_mllama_groups_rows_by_image_count():
    """Mllama: a prompt's logits change next to a prompt with more images (so its batches
    are split by image count); with equal counts the rows agree."""
    interface, pre = _model("mllama")
    samples = _samples(4)  # image counts 1, 2, 3, 1
    assert interface.batch_groups([s["images"] for s in samples]) == [[0, 3], [1], [2]]
    texts = [interface.render(pre(s)) for s in samples]

    def last_logits(idx):
        enc = interface._encode([texts[i] for i in idx], [im for i in idx for im in samples[i]["images"]])
        with torch.inference_mode():
            return interface.model(**enc).logits[0, -1]
    alone = last_logits([0])
    assert (alone - last_logits([0, 3])).abs().max() < 1e-4
    assert (alone - last_logits([0, 1])).abs().max() > 1e-2  # why the groups exist


def test_qwen2_vl_text_only_prompts_after_an_image_prompt():
    """Qwen2-VL keeps the M-RoPE offset of its last image pass; a text-only prompt scored
    after it (alone or batched) must use offset 0: packed and batched scores equal the naive
    full-sequence scores."""
    interface, pre = _model("qwen2_vl")
    img = _samples(1)[0]
    interface.raw_predict(img["images"], pre(img), CANDIDATES)  # leaves a non-zero rope_deltas
    texts = [dict(_samples(1)[0], images=[], question=q) for q in ("Is it daytime?", "Name two colours, please.")]
    prompts = [pre(s) for s in texts]
    slow = [interface.score_full_sequence([], p, CANDIDATES) for p in prompts]
    for got in ([interface.raw_predict([], p, CANDIDATES) for p in prompts],
                interface.raw_batch_predict([[], []], prompts, [CANDIDATES, CANDIDATES])):
        assert max(abs(a.logprob - b.logprob) for s, t in zip(slow, got) for a, b in zip(s, t)) <= 1e-4


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.7, None, 0.8), (1.3, 3, None)])
def test_seeded_sampler_draws_from_the_warped_softmax(temperature, top_k, top_p):
    """20000 rows, one seed each, one step: the argmax frequencies match softmax(logits / T)
    restricted to the top-k / top-p set (filtered tokens never drawn)."""
    from reform_eval.models.sampling import SeededGumbelSampler
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])
    probs = torch.softmax(logits / temperature, -1)
    keep = torch.ones(6, dtype=torch.bool)
    if top_k:
        keep[top_k:] = False
    if top_p:  # smallest set whose mass reaches top_p (logits are sorted)
        keep &= (torch.cumsum(probs, -1) - probs) < top_p
    expected = torch.where(keep, probs, torch.zeros(6))
    expected = expected / expected.sum()
    n = 20000
    sampler = SeededGumbelSampler(range(n), temperature, top_k=top_k, top_p=top_p)
    draws = sampler(torch.zeros(n, 3, dtype=torch.long), logits.repeat(n, 1)).argmax(-1)
    freq = torch.bincount(draws, minlength=6).double() / n
    assert float((freq - expected).abs().max()) < 0.015, (freq, expected)
    assert bool((freq[~keep] == 0).all())
