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
    for batch in _random_batches(["<image>", "<s>", "</s>", "<pad>", "<unk>", "<imag", "e>"]):
        assert bt.ids(batch) == tokenizer(batch, add_special_tokens=True)["input_ids"], batch
    assert bt.ids([]) == []


def _random_batches(tokens: List[str], n: int = 300) -> List[List[str]]:
    """``n`` batches of 1-5 random texts of characters (spaces, newlines, digits, accents, CJK) and
    ``tokens`` (added tokens and parts of them)."""
    rnd = random.Random(0)
    alphabet = list("ab <>\n\t.,!é漢A7'▁") + ["  ", "12"] + list(tokens)
    return [["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 30))) for _ in range(rnd.randrange(1, 6))]
            for _ in range(n)]


#: Qwen2's (and Qwen2-VL's, Qwen2.5-VL's) pre-tokenizer regex, from its tokenizer.json
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]
LLAMA_SPECIAL = ["<unk>", "<s>", "</s>"]


def _corpus() -> List[str]:
    from reform_eval.models.tiny import TINY_CORPUS
    return list(TINY_CORPUS) * 4 + [INSTRUCTION] * 4


def _qwen2_like() -> Any:
    """Qwen2-VL's pipeline as its tokenizer.json sets it (NFC; the regex Split, then ByteLevel
    without its own regex; ByteLevel post-processor and decoder; no BOS), a BPE trained here."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_SPECIAL])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def _llama_like(pre_tokenizer: Any = None) -> Any:
    """A Llama/Vicuna tokenizer as LLaVA-1.5 ships it ("legacy" conversion: ``Prepend("▁")`` and
    ``Replace(" ", "▁")`` normalizers, no pre-tokenizer, BPE with byte fallback, ``<s>`` added
    before), with ``<image>`` added; or, given ``pre_tokenizer``, that one and no normalizer (the
    newer conversion's ``Metaspace``)."""
    import json

    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if pre_tokenizer is None:
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=500, special_tokens=LLAMA_SPECIAL, show_progress=False))
    spec = json.loads(backend.to_str())  # the byte-fallback tokens <0x00>..<0xFF>, as Llama's vocabulary has them
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    backend = Tokenizer.from_str(json.dumps(spec))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", backend.token_to_id("<s>"))])
    backend.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _qwen2_prompts(n: int) -> List[str]:
    """The fixture prompts as Qwen2-VL's chat template renders them."""
    return ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            + p.replace("USER: ", "").replace("<image>", "<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>")
            .replace(" ASSISTANT:", "<|im_end|>\n<|im_start|>assistant\n") for p in _prompts(16)]


@pytest.mark.parametrize("kind", ["qwen2", "llama_legacy"])
def test_real_pipelines_are_tokenized_by_pieces(kind):
    """Qwen2-VL's and LLaVA-1.5's tokenizer pipelines act on each piece between added tokens apart
    (as the library itself runs them): tokenized piece by piece, the ids the tokenizer's own."""
    tok = _qwen2_like() if kind == "qwen2" else _llama_like()
    bt = BatchTokenizer(tok)
    assert bt.by_pieces
    texts = _qwen2_prompts(16) if kind == "qwen2" else _prompts(16)
    own = tok(texts, add_special_tokens=True)["input_ids"]
    assert bt.ids(texts) == own
    if kind == "llama_legacy":
        assert own[0][0] == tok.bos_token_id
        after = own[0][own[0].index(tok.convert_tokens_to_ids("<image>")) + 1]
        assert tok.convert_ids_to_tokens(after).startswith("▁")  # "legacy": the piece after <image> gets "▁" too
    specials = QWEN2_SPECIAL if kind == "qwen2" else LLAMA_SPECIAL + ["<image>"]
    for batch in _random_batches(specials + ["<|im_", "_end|>", "<imag", "e>"]):
        assert bt.ids(batch) == tok(batch, add_special_tokens=True)["input_ids"], batch


@pytest.mark.parametrize("scheme,pieces", [("first", False), ("always", True), ("never", True)])
def test_llama_metaspace_by_its_prepend_scheme(scheme, pieces):
    """The newer Llama conversion's ``Metaspace(prepend_scheme="first")`` prepends "▁" to the text's
    first piece only: the tokenizer's own call. "always" and "never" act on each piece apart."""
    from tokenizers import pre_tokenizers
    tok = _llama_like(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False))
    bt = BatchTokenizer(tok)
    assert bt.by_pieces is pieces
    texts = _prompts(16)
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    for batch in _random_batches(LLAMA_SPECIAL + ["<image>", "<imag", "e>"], n=100):
        assert bt.ids(batch) == tok(batch, add_special_tokens=True)["input_ids"], batch


@pytest.mark.parametrize("pre", ["metaspace_first", "byte_level_prefix_space", "unicode_scripts"])
def test_an_unknown_pipeline_is_tokenized_by_the_tokenizers_own_call(pre):
    """A pre-tokenizer that treats the text's first piece apart (Metaspace "first"), one with a
    setting not on the list, one not on the list at all: no pieces, the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "<image>": 2, "▁": 3, "▁a": 4, "a": 5, "b": 6, "▁b": 7, "Ġa": 8}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = {"metaspace_first": pre_tokenizers.Metaspace(prepend_scheme="first"),
                             "byte_level_prefix_space": pre_tokenizers.ByteLevel(add_prefix_space=True),
                             "unicode_scripts": pre_tokenizers.UnicodeScripts()}[pre]
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


@pytest.mark.parametrize("kind", ["strip_lowercase_nfkc", "whitespace_digits_punctuation", "nfd_metaspace_always"])
def test_other_admitted_components_give_the_tokenizers_own_ids(kind):
    """Each other component the allow-list admits (``Strip``, ``Lowercase``, ``NFKC``,
    ``StripAccents``, ``Whitespace``, ``Digits``, ``Punctuation``, ``WhitespaceSplit``,
    ``Metaspace`` "always"): tokenized by pieces, the tokenizer's own ids on 300 random batches."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre
    from transformers import PreTrainedTokenizerFast
    normalizer, pre_tokenizer = {
        "strip_lowercase_nfkc": (normalizers.Sequence([normalizers.Strip(), normalizers.Lowercase(), normalizers.NFKC(),
                                                       normalizers.StripAccents()]), pre.ByteLevel(add_prefix_space=False)),
        "whitespace_digits_punctuation": (None, pre.Sequence([pre.Whitespace(), pre.Digits(individual_digits=True),
                                                              pre.Punctuation()])),
        "nfd_metaspace_always": (normalizers.NFD(), pre.Sequence([pre.WhitespaceSplit(),
                                                                  pre.Metaspace(prepend_scheme="always")])),
    }[kind]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    backend.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"],
                                                               show_progress=False))
    backend.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    bt = BatchTokenizer(tok)
    assert bt.by_pieces
    for batch in [_prompts(16)] + _random_batches(["<image>", "<unk>", "<imag", "e>"]):
        assert bt.ids(batch) == tok(batch, add_special_tokens=True)["input_ids"], batch


@pytest.mark.parametrize("normalizer", [False, True])
def test_normalized_added_tokens(normalizer):
    """Added tokens matched after normalizing (PaliGemma's ``<loc0000>``...): the library cuts at
    them in a second pass inside each piece the others left. Without a normalizer that is the text
    as written: by pieces, in two passes (``<image>x`` is never matched, ``<image>`` is cut first);
    with one: the tokenizer's own call."""
    from reform_eval.models.tiny import train_tiny_tokenizer
    tok = _llama_like() if normalizer else train_tiny_tokenizer(vocab_size=400)
    tok.add_tokens(["<loc0000>", "<loc0001>", "<image>x", "ab"])
    assert tok.backend_tokenizer.get_added_tokens_decoder()[tok.convert_tokens_to_ids("ab")].normalized
    bt = BatchTokenizer(tok)
    assert bt.by_pieces is not normalizer
    texts = [p.replace("<image>", "<image>x<loc0001>ab") for p in _prompts(16)]
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    for batch in _random_batches(["<image>", "<s>", "<loc0000>", "<loc0001>", "<image>x", "<loc00", "x", "b"]):
        assert bt.ids(batch) == tok(batch, add_special_tokens=True)["input_ids"], batch


def _with_added(tokens: List[str], dropout: Any = None, **kw: Any) -> Any:
    """A byte-level BPE trained here, ``<s>`` put before each text, ``tokens`` added as special."""
    import json

    from tokenizers import AddedToken, Tokenizer, models, processors, trainers
    from tokenizers import pre_tokenizers as pre
    from transformers import PreTrainedTokenizerFast
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=400, special_tokens=LLAMA_SPECIAL,
                                                               show_progress=False))
    if dropout is not None:
        spec = json.loads(backend.to_str())
        spec["model"]["dropout"] = dropout
        backend = Tokenizer.from_str(json.dumps(spec))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", **kw)


def test_bpe_dropout_is_the_tokenizers_own_call():
    """BPE with dropout drops merges at random, so no two calls agree: never by pieces, however
    small the rate (0.001 passed the probe texts by chance, and was admitted), nor when it is
    set on the model after the batch tokenizer was made."""
    assert not BatchTokenizer(_with_added(["<image>"], dropout=0.001)).by_pieces
    tok = _with_added(["<image>"])
    bt = BatchTokenizer(tok)
    assert bt.by_pieces
    tok.backend_tokenizer.model.dropout = 0.5
    bt.ids(["a<image>b"])
    assert not bt.by_pieces


def test_a_tokenizer_changed_after_it_was_made_is_checked_again():
    """The batch tokenizer is made once per interface; the tokenizer may change after (a family
    adding its image token, ``split_special_tokens``, a new post-processor as ``add_bos_token``
    writes): the next batch is cut by the tokenizer as it is then, the ids its own. Before, the
    old cut matched ``<ima`` inside a later ``<image>`` and the old ``<s>`` was put first."""
    tok = _with_added(["<ima"])
    bt = BatchTokenizer(tok)
    texts = ["x<image>y", "<image><ima", "a <ima ge>"]
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    assert bt.by_pieces
    tok.split_special_tokens = True  # "<ima" and "<image>" are then text like any other
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    tok.split_special_tokens = False
    from tokenizers import processors
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    assert bt.ids(texts)[0][-1] == 2 and bt.by_pieces
    from tokenizers import AddedToken
    tok.backend_tokenizer.add_special_tokens([AddedToken("<image>", special=True, normalized=False, lstrip=True)])
    texts = ["a <image>", "x  <image> y"]  # the same token, now taking the spaces before it
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    assert not bt.by_pieces


def test_a_custom_component_is_the_tokenizers_own_call():
    """A pre-tokenizer written in Python cannot be serialized (``__getstate__`` raises a bare
    ``Exception``): the tokenizer's own call, not a crash when the batch tokenizer is made."""
    from tokenizers.pre_tokenizers import PreTokenizer

    class WholeText:
        def pre_tokenize(self, pretok: Any) -> None:
            pretok.split(lambda i, s: [s])
    tok = _with_added(["<image>"])
    tok.backend_tokenizer.pre_tokenizer = PreTokenizer.custom(WholeText())
    bt = BatchTokenizer(tok)
    assert not bt.by_pieces
    texts = ["a<image>b", "<image> x"]
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]


def test_add_bos_and_eos_token_set_after_it_was_made():
    """``add_eos_token`` / ``add_bos_token`` set on the tokenizer rewrite its post-processor
    (transformers' ``update_post_processor``): the next batch has the new fixed tokens, not the
    ones read when the batch tokenizer was made (before: no EOS, then BOS still first)."""
    tok = _with_added(["<image>"], add_bos_token=True)
    bt = BatchTokenizer(tok)
    texts = ["a<image>b", "<image>"]
    tok.add_eos_token = True
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    assert bt.ids(texts)[1] == [1, tok.convert_tokens_to_ids("<image>"), 2]
    tok.add_bos_token = False
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    assert bt.ids(texts)[1] == [tok.convert_tokens_to_ids("<image>"), 2] and bt.by_pieces


def test_a_tokenizer_class_with_its_own_call_is_the_tokenizers_own_call():
    """A tokenizer class that overrides a step of its call (CodeLlama's infilling, LayoutLM's
    boxes; here one that ends long texts with a full stop) may hand the backend other text than
    given, which short probe texts need not show: the tokenizer's own call, never by pieces."""
    from transformers import PreTrainedTokenizerFast

    class Stopping(PreTrainedTokenizerFast):
        def _encode_plus(self, text: Any, *a: Any, **k: Any) -> Any:
            text = [t + "." if len(t) > 200 else t for t in text] if isinstance(text, list) else text
            return super()._encode_plus(text, *a, **k)
    tok = Stopping(tokenizer_object=_with_added(["<image>"]).backend_tokenizer, bos_token="<s>", unk_token="<unk>")
    bt = BatchTokenizer(tok)
    assert not bt.by_pieces
    texts = _prompts(2) + ["x" * 300 + "<image>"]
    assert bt.ids(texts) == tok(texts, add_special_tokens=True)["input_ids"]
    assert BatchTokenizer(_with_added(["<image>"])).by_pieces
