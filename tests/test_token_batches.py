"""A batch's prompts tokenized piece by piece (models/token_batches.py, issue 35): the ids are the
tokenizer's own, and the text prompts share is tokenized once per batch, on the ``--model vllm``
path too (without vLLM: the engine call is replaced, the request it is handed is checked)."""
from __future__ import annotations

import os
import random
import sys
import types
from typing import Any, Dict, List

import pytest
from PIL import Image

from reform_eval.models.token_batches import BatchTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "models", "checkpoints", "llava-tiny-trained")
INSTRUCTION = ("In this task we will show you an image. The objects within the task will ALWAYS be from one of "
               "8 categories: benches, boats, cars, chairs, couches, lighting, planes, and tables.\n")
OPTIONS = ["benches", "boats", "cars", "chairs", "couches", "lighting", "planes", "tables"]


def _prompts(n: int) -> List[str]:
    """iWISDM-like prompts: a long shared instruction, the image, then options in a per-prompt order."""
    rnd = random.Random(7)
    out = []
    for _ in range(n):
        opts = rnd.sample(OPTIONS, len(OPTIONS))
        out.append("USER: " + INSTRUCTION + "Here are the frames ...<image>\nWhat is the answer? Options: "
                   + "; ".join(f"({chr(65 + k)}) {o}" for k, o in enumerate(opts)) + ". ASSISTANT:")
    return out


class CountingBackend:
    """A tokenizers.Tokenizer that counts the characters it is handed to encode."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.chars = 0

    def _counted(self, name: str) -> Any:
        fn = getattr(self.inner, name)

        def call(inputs: Any, *a: Any, **k: Any) -> Any:
            self.chars += len(inputs) if isinstance(inputs, str) else sum(len(x) for x in inputs)
            return fn(inputs, *a, **k)
        return call

    def __getattr__(self, name: str) -> Any:
        if name in ("encode", "encode_batch", "encode_batch_fast"):
            return self._counted(name)
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(TINY, local_files_only=True)


def test_ids_are_the_tokenizers_own(tokenizer):
    bt = BatchTokenizer(tokenizer)
    assert bt.by_pieces  # the tiny LLaVA's byte-level BPE is one the pieces are trusted for
    texts = _prompts(16)
    assert bt.ids(texts) == tokenizer(texts, add_special_tokens=True)["input_ids"]
    assert bt.ids(texts)[0][0] == tokenizer.bos_token_id
    rnd = random.Random(0)
    alphabet = list("ab <>\n\t.,!é漢") + ["<image>", "<s>", "</s>", "<pad>", "<unk>", "<imag", "e>", "  "]
    for _ in range(300):
        batch = ["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 30))) for _ in range(rnd.randrange(1, 6))]
        assert bt.ids(batch) == tokenizer(batch, add_special_tokens=True)["input_ids"], batch
    assert bt.ids([]) == []


def test_an_unknown_pipeline_is_tokenized_by_the_tokenizers_own_call():
    """A Metaspace pre-tokenizer treats the text's first piece apart: no pieces, the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "<image>": 2, "▁": 3, "▁a": 4, "a": 5, "b": 6, "▁b": 7}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                  additional_special_tokens=["<image>"])
    bt = BatchTokenizer(tok)
    assert not bt.by_pieces
    texts = ["a<image>b", "a <image> b a"]
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]


def test_vllm_path_tokenizes_the_shared_instruction_once(monkeypatch):
    """The engine is handed the tokenizer's own ids for every prompt, and the instruction all
    prompts of the batch share is tokenized once, not once per prompt (it was 32 times)."""
    from reform_eval.models.interfaces.vllm_interface import VLLMInterface, family_of

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    renderer = family_of("llava")({"model_name": TINY}, load_weights=False)
    counting = CountingBackend(renderer.tokenizer._tokenizer)
    monkeypatch.setattr(renderer.tokenizer, "_tokenizer", counting)
    vi = VLLMInterface.__new__(VLLMInterface)
    vi.config, vi.max_images, vi.model_path, vi._traces = {}, 8, TINY, None
    vi.renderer, vi.tokenizer = renderer, renderer.tokenizer
    vi.batch_tokenizer = BatchTokenizer(renderer.tokenizer)
    handed: List[Dict[str, Any]] = []

    def engine(requests: List[Dict[str, Any]], params: Any) -> List[Any]:
        handed.extend(requests)
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[5, 6])],
                                      prompt_token_ids=r["prompt_token_ids"]) for r in requests]
    vi._generate = engine
    prompts = _prompts(32)
    image = Image.new("RGB", (8, 8), "red")
    counting.chars = 0
    vi.raw_batch_generate([[image]] * len(prompts), prompts, max_new_tokens=2)
    spent = counting.chars
    counting.chars = 0
    own = renderer.tokenizer([renderer.render(p) for p in prompts], add_special_tokens=True)["input_ids"]
    assert [r["prompt_token_ids"] for r in handed] == own
    assert counting.chars >= sum(len(p) for p in prompts)  # (the counter sees the tokenizer's own call)
    tails = sum(len(p.split("<image>")[1]) for p in prompts)
    assert spent <= len(prompts[0].split("<image>")[0]) + tails


def test_likelihood_candidates_share_the_prompts_tokens(monkeypatch):
    """A sample's candidates (in process and on the vLLM path, ``_prepare``): the same tokens as
    ``candidate_ids`` one by one, and the prompt's text before its last added token encoded
    once, not once per candidate (it was 1 + 8 times)."""
    from reform_eval.models.interfaces.vllm_interface import family_of

    renderer = family_of("llava")({"model_name": TINY}, load_weights=False)
    prompt = _prompts(1)[0]
    one_by_one = [renderer.candidate_ids(renderer.render(prompt), c) for c in OPTIONS]
    counting = CountingBackend(renderer.tokenizer._tokenizer)
    monkeypatch.setattr(renderer.tokenizer, "_tokenizer", counting)
    renderer._token_batches = BatchTokenizer(renderer.tokenizer)
    renderer._prompt_ids_memo = None
    counting.chars = 0  # (setting up tokenized its probe texts)
    text, imgs, cand_ids = renderer._prepare([Image.new("RGB", (8, 8), "red")], prompt, OPTIONS, 0)
    spent = counting.chars
    assert cand_ids == one_by_one
    assert renderer.prompt_ids(text) == renderer.tokenizer(text, add_special_tokens=True)["input_ids"]
    head, tail = text.split("<image>")
    assert spent <= len(head) + len(tail) + sum(len(tail) + 1 + len(c) for c in OPTIONS)
