"""No FutureWarning / DeprecationWarning from our calls into transformers, torch or accelerate
(issue 15 section 5), and generated texts carry their token counts (issue 19 section 3b).

For every tiny family (each registered tiny builder, the Flan-T5 variants of BLIP-2 and
InstructBLIP included), loading, batched likelihood, greedy generation and seeded sampling run
with those warnings turned into errors. transformers also announces some deprecations on its
logger (``past_key_values`` became ``cache``: one ``warning_once`` line), so the test listens
there too, with the once-cache cleared so an earlier test cannot hide the line.
"""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

from reform_eval.utils.images import noise_image

def _tiny_families() -> list:
    from reform_eval.models.tiny import tiny_families
    return sorted(tiny_families())  # read from the interfaces' sources, nothing imported


class _Deprecations(logging.Handler):
    """Collects transformers' logged deprecation notices."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list = []

    def emit(self, record: logging.LogRecord) -> None:
        if "deprecat" in record.getMessage().lower():
            self.messages.append(record.getMessage())


def _sample(sid: str, question: str, n_images: int) -> dict:
    return {"sample_id": sid, "formulation": "Generation", "question": question, "history": [],
            "images": [noise_image(7 + i, (40, 32)) for i in range(n_images)]}


def test_every_tiny_family_is_covered():
    """The list follows the registry: a new family's builder is checked without editing this file."""
    names = _tiny_families()
    assert {"llava", "qwen2_vl", "mllama", "blip2_t5", "instructblip_t5"} <= set(names)


@pytest.mark.parametrize("builder", _tiny_families())
def test_no_deprecation_warnings_from_our_calls(builder):
    from reform_eval.models import get_model
    from reform_eval.models.tiny import tiny_model_path
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    family = builder[:-3] if builder.endswith("_t5") else builder
    path = tiny_model_path(builder)  # building the checkpoint is not under test here
    handler = _Deprecations()
    tf_logger = logging.getLogger("transformers")
    tf_logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            interface, pre = get_model(family, {"model_name": path, "device": "cpu"})
            samples = [_sample("a", "What colour is the square?", 1), _sample("b", "Are these the same?", 2)]
            if family == "mllama":  # batches of mixed image counts are split; keep both paths busy
                samples[1] = _sample("b", "Are these the same?", 1)
            prompts = [pre(s) for s in samples]
            images = [s["images"] for s in samples]
            scores = interface.raw_batch_predict(images, prompts, [["yes", "no", "a red square"]] * 2)
            greedy = interface.raw_batch_generate(images, prompts, max_new_tokens=4)
            sampled = interface.raw_batch_generate(images, prompts, max_new_tokens=4, temperature=1.0, seeds=[1, 2])
    finally:
        tf_logger.removeHandler(handler)
    assert handler.messages == []
    assert [len(s) for s in scores] == [3, 3]
    for text in greedy + sampled:
        assert 1 <= text.tokens <= 4  # GenText: the count travels with the text


def test_generated_token_count_stops_at_eos(cache_dir):
    """A row's count is its tokens up to and including its first EOS (not the padding a
    finished row gets in a batch); without EOS it is max_new_tokens."""
    from reform_eval.models import get_model

    torch.set_num_threads(1)
    interface, pre = get_model("llava", {"model_name": "tiny", "device": "cpu"})
    s = _sample("a", "What colour is the square?", 1)
    prompt = pre(s)
    free = interface.raw_generate(s["images"], prompt, max_new_tokens=8)
    assert free.tokens == 8 and free == free.strip()
    # make the 3rd generated token the end of sequence: greedy decoding then stops there
    enc = interface._encode([interface.render(prompt)], interface._images(s["images"], 0))
    out = interface.model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=interface.tokenizer.pad_token_id)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    stop = new[2]
    first = new.index(stop)  # the stop token may already occur earlier
    gc = interface.model.generation_config
    old = gc.eos_token_id
    gc.eos_token_id = stop
    try:
        short = interface.raw_generate(s["images"], prompt, max_new_tokens=8)
        other = _sample("b", "Tell me a long story about three dogs and a cat, please.", 2)
        batch = interface.raw_batch_generate([s["images"], other["images"]], [prompt, pre(other)], max_new_tokens=8)
    finally:
        gc.eos_token_id = old
    assert short.tokens == first + 1
    assert batch[0].tokens == short.tokens and str(batch[0]) == str(short)


def test_loading_prints_no_progress_bars(capfd):
    """Loading a model prints nothing of transformers' own (no "Loading weights" bars) unless
    -v asks for INFO; the global progress-bar setting is left as it was (issue 17)."""
    from reform_eval.models import get_model
    from reform_eval.models.tiny import tiny_model_path
    from transformers.utils import logging as hf_logging

    path = tiny_model_path("llava")
    capfd.readouterr()
    before = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # as in a fresh process (another test may have turned them off)
    logger = logging.getLogger("reform_eval.models.hf_loading")
    old = logger.level
    try:
        logger.setLevel(logging.WARNING)  # no -v (an earlier test may have configured logging)
        get_model("llava", {"model_name": path, "device": "cpu"})
        assert "Loading weights" not in capfd.readouterr().err
        assert hf_logging.is_progress_bar_enabled()
        logger.setLevel(logging.INFO)
        get_model("llava", {"model_name": path, "device": "cpu"})
        assert "Loading weights" in capfd.readouterr().err
    finally:
        logger.setLevel(old)
        if not before:
            hf_logging.disable_progress_bar()
