"""Tiny random-weight checkpoints of real LMM architectures, built locally, no network.

Why: tests and the demo must exercise the exact code path a real checkpoint takes
(``AutoProcessor`` / ``AutoModelForImageTextToText.from_pretrained`` on a directory), but no
weights can be downloaded. A family registers a *builder* that writes a complete checkpoint
directory (config, random weights, a tokenizer trained here with the ``tokenizers`` library,
image processor, processor with chat template) via ``save_pretrained``; ``tiny_model_path``
builds it once into a cache directory and returns the path.

A builder may serve one extra size only (``size=...``): the trained ``llava`` checkpoint
(``--model_name tiny-trained``, built by ``evaluation.training``) is one. Such a checkpoint may be
shipped in ``models/checkpoints/``: ``tiny_model_path`` returns the shipped directory when every
file's SHA-256 matches ``models/checkpoints/manifest.json`` (and the builder's version, when one
is registered), and otherwise builds it into the cache like any other.

Cache layout: ``$REFORM_CACHE/tiny/<family>/<size>-v<version>`` (default root
``~/.cache/reform_eval``). One process builds (under a lock file) into a temporary sibling
directory, verifies it and renames it into place; the marker lists every file and its size,
so a half-built or truncated cache is detected and rebuilt (see ``tiny_model_path``).

Public API::

    register_tiny_builder(family, fn, version="1", size=None)   # fn(out_dir: str, size: str) -> None
    tiny_model_path(family, size="tiny") -> str
    shipped_checkpoint(family, size) -> str | None     # a checkpoint shipped in models/checkpoints
    train_tiny_tokenizer(vocab_size=..., extra_special=(...)) -> PreTrainedTokenizerFast
    TINY_CORPUS                                        # the built-in training text
"""
from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from .checkpoint_files import check_checkpoint_dir, check_safetensors, file_manifest, weight_files
from .registry_sources import tiny_builder_modules
from .tiny_zoo import save_checkpoint, seeded_model
from ..utils.errors import ReformError
from ..utils.paths import cache_root  # noqa: F401  (re-exported)
from ..utils.runlock import FileLock

logger = logging.getLogger(__name__)

#: name of the marker file written last into a finished checkpoint directory
_DONE = "REFORM_TINY_OK"

#: sizes every builder should understand: "tiny" (tests, demo) and "bench" (~50M params)
SIZES = ("tiny", "bench")


@dataclass(frozen=True)
class _Builder:
    #: the builder, or ``"module:function"`` imported when a checkpoint is first built: a trainer
    #: that needs torch and transformers registers by name, so registering costs no import
    fn: Union[Callable[[str, str], None], str]
    version: str

    def run(self, out_dir: str, size: str) -> None:
        fn = self.fn
        if isinstance(fn, str):
            module, _, attr = fn.partition(":")
            fn = getattr(importlib.import_module(module), attr)
        fn(out_dir, size)


#: builders by (family, size); size "*" serves every size in SIZES
_BUILDERS: Dict[Tuple[str, str], _Builder] = {}
#: where shipped checkpoints live, and the file holding their expected hashes
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints")
SHIPPED_MANIFEST = os.path.join(SHIPPED_DIR, "manifest.json")
#: the recipe version each shipped checkpoint must carry (the trainer, evaluation/training.py,
#: registers its builder under the same version); a shipped copy of another version is not used
SHIPPED_VERSIONS: Dict[str, str] = {"llava/trained": "2"}
#: the built-in name of the known-skill checkpoint (``--model_name tiny-trained``)
TRAINED_NAME = "tiny-trained"


def register_tiny_builder(family: str, fn: Union[Callable[[str, str], None], str], version: str = "1",
                          size: Optional[str] = None) -> None:
    """Register ``fn(out_dir, size)`` that writes a complete tiny checkpoint of ``family``
    (of every size in SIZES, or of ``size`` only).

    Bump ``version`` whenever the builder's output changes, so stale caches are not reused.
    """
    _BUILDERS[(family, size or "*")] = _Builder(fn, str(version))


def tiny_families() -> list:
    """Families with a tiny builder: registered, or declared by an interface module not yet
    imported (``models.registry_sources``; asking for its checkpoint imports the module)."""
    return sorted({f for f, _ in _BUILDERS} | set(tiny_builder_modules()))


def _import_builders(family: str) -> None:
    """Import the interface module that registers ``family``'s builder (a family's module is
    imported only when that family is asked for: ``models``)."""
    module = tiny_builder_modules().get(family)
    if module is not None:
        importlib.import_module(module)


def has_tiny_size(family: str, size: str) -> bool:
    """Whether ``family`` has a ``size`` checkpoint: a builder for it, or a shipped copy."""
    return _builder(family, size) is not None or f"{family}/{size}" in read_shipped_manifest()


def _builder(family: str, size: str) -> Optional[_Builder]:
    _import_builders(family)
    if (family, size) in _BUILDERS:
        return _BUILDERS[(family, size)]
    return _BUILDERS.get((family, "*")) if size in SIZES else None


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_shipped_manifest() -> Dict[str, Any]:
    """``models/checkpoints/manifest.json``: ``{"<family>/<size>": {"dir", "version", "sha256": {file: hex}}}``;
    {} (with a warning) when it is missing or unreadable, so a damaged manifest never stops the
    other tiny models."""
    if not os.path.isfile(SHIPPED_MANIFEST):
        return {}
    try:
        with open(SHIPPED_MANIFEST, "r", encoding="utf-8") as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
        return manifest
    except (OSError, UnicodeDecodeError, ValueError) as e:
        logger.warning("%s cannot be read (%s); shipped checkpoints are ignored (restore it with "
                       "`git checkout models/checkpoints`)", SHIPPED_MANIFEST, e)
        return {}


def shipped_checkpoint(family: str, size: str) -> Optional[str]:
    """The shipped checkpoint directory of ``family``/``size`` when its files match the manifest's
    hashes exactly (no file missing, none extra) and its recipe version is the current one
    (``SHIPPED_VERSIONS``); else None, with a warning naming what differs."""
    key = f"{family}/{size}"
    entry = read_shipped_manifest().get(key)
    if not entry:
        return None
    restore = "restore it with `git checkout models/checkpoints`; meanwhile it is built into the cache"
    try:
        directory = os.path.join(SHIPPED_DIR, str(entry["dir"]))
        expected = dict(entry["sha256"])
        version = str(entry["version"])
    except (KeyError, TypeError, ValueError):
        logger.warning("%s: entry %s lacks dir, version or sha256; %s", SHIPPED_MANIFEST, key, restore)
        return None
    if version != SHIPPED_VERSIONS.get(key, version):
        logger.warning("shipped %s checkpoint is recipe version %s, the code's is %s; %s", key, version,
                       SHIPPED_VERSIONS[key], restore)
        return None
    present = set(os.listdir(directory)) if os.path.isdir(directory) else set()
    if present != set(expected):
        missing, extra = sorted(set(expected) - present), sorted(present - set(expected))
        logger.warning("shipped %s checkpoint in %s: %s%s; %s", key, directory,
                       f"missing {', '.join(missing)}" if missing else "",
                       f"{'; ' if missing else ''}unexpected {', '.join(extra)}" if extra else "", restore)
        return None
    for name, digest in sorted(expected.items()):
        if sha256_file(os.path.join(directory, name)) != digest:
            logger.warning("shipped %s checkpoint: %s does not match its SHA-256 in %s; %s", key, name,
                           SHIPPED_MANIFEST, restore)
            return None
    return directory


def builtin_checkpoint(family: str, name: Optional[str], options: Dict[str, Any]) -> Optional[str]:
    """The directory of a built-in checkpoint name (``tiny``: built on first use; ``tiny-trained``:
    the shipped known-skill checkpoint, or trained on first use), or None for any other name.
    The run identity fingerprints this directory's files (evaluation.plan), so new weights
    under the same name are a new run."""
    if name == "tiny":
        return tiny_model_path(family, size=str(options.get("tiny_size", "tiny")))
    if name == TRAINED_NAME:
        if options.get("tiny_size") not in (None, "trained"):
            raise ReformError(f"--model_option tiny_size applies to --model_name tiny, not {TRAINED_NAME} "
                              "(one size, trained here)")
        if not has_tiny_size(family, "trained"):
            raise ReformError(f"--model_name {TRAINED_NAME} is the known-skill LLaVA: it exists for --model llava "
                              f"only, not --model {family} (use --model_name tiny for a random {family})")
        return tiny_model_path(family, size="trained")
    return None


def tiny_model_path(family: str, size: str = "tiny") -> str:
    """Path of the tiny ``family`` checkpoint of ``size``, built on first use.

    Safe under concurrency (torchrun ranks on an empty cache): one process builds, under a
    lock file, into a private temp dir, with saving forced on (transformers otherwise writes
    weights on distributed rank 0 only), verifies that the checkpoint loads, writes a marker
    listing every file and its size, and renames the directory into place. A cache whose
    marker is missing or whose files do not match it (half-built, truncated) is rebuilt.
    """
    shipped = shipped_checkpoint(family, size)
    if shipped is not None:
        return shipped
    _import_builders(family)
    if family not in {f for f, _ in _BUILDERS}:
        raise ReformError(f"no tiny model builder for family '{family}'; "
                          f"families with one: {', '.join(tiny_families()) or '(none)'}")
    builder = _builder(family, size)
    if builder is None:
        if f"{family}/{size}" in read_shipped_manifest():
            raise ReformError(f"the shipped {family}/{size} checkpoint is not usable (see the warning above) and its "
                              "trainer is not loaded: `from reform_eval import evaluation` (run_eval does) trains it, or restore the "
                              "files with `git checkout models/checkpoints`")
        extra = sorted(s for f, s in _BUILDERS if f == family and s != "*")
        raise ReformError(f"unknown tiny model size '{size}' for family '{family}'; "
                          f"valid sizes: {', '.join(list(SIZES) + extra)}")
    parent = os.path.join(cache_root(), "tiny", family)
    final = os.path.join(parent, f"{size}-v{builder.version}")
    if cache_problem(final) is None:
        return final
    os.makedirs(parent, exist_ok=True)
    with _build_lock(final + ".lock"):
        problem = cache_problem(final)
        if problem is None:  # another process built it while we waited
            return final
        if os.path.lexists(final):
            logger.warning("tiny checkpoint at %s is not usable (%s); rebuilding", final, problem)
            stale = tempfile.mkdtemp(prefix=f".stale-{size}-", dir=parent)
            os.rename(final, os.path.join(stale, "old"))
            shutil.rmtree(stale, ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=f".{size}-v{builder.version}-", dir=parent)
        try:
            t0 = time.perf_counter()
            builder.run(tmp, size)
            verify_checkpoint(tmp)
            marker = {"family": family, "size": size, "version": builder.version,
                      "files": file_manifest(tmp)}
            with open(os.path.join(tmp, _DONE), "w", encoding="utf-8") as f:
                json.dump(marker, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
            logger.info("built tiny %s (%s) in %.1fs at %s", family, size, time.perf_counter() - t0, final)
        finally:
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
    problem = cache_problem(final)
    if problem is not None:
        raise ReformError(f"tiny checkpoint {final}: {problem} right after building it")
    return final


def cache_problem(directory: str) -> Optional[str]:
    """Why the cached checkpoint ``directory`` cannot be trusted, or None when it can:
    the marker must exist and list every file with its size, and weights must be complete."""
    marker = os.path.join(directory, _DONE)
    if not os.path.isfile(marker):
        return "no completion marker" if os.path.lexists(directory) else "not built"
    try:
        with open(marker, "r", encoding="utf-8") as f:
            files = json.load(f)["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return "marker without a file list (older or broken cache)"
    for name, size in files.items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            return f"missing {name}"
        if os.path.getsize(path) != size:
            return f"{name} has {os.path.getsize(path)} bytes, expected {size}"
    if "config.json" not in files or not any(n.endswith(".safetensors") for n in files):
        return "no config.json or no weights"
    try:
        check_checkpoint_dir(directory)
    except ReformError as e:
        return str(e)
    return None


def verify_checkpoint(directory: str) -> None:
    """A freshly built checkpoint loads: config parses, every weight file is complete and
    its tensors read back. Raises ReformError naming what is missing."""
    from safetensors import safe_open

    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise ReformError(f"tiny checkpoint build in {directory} wrote no config.json")
    with open(os.path.join(directory, "config.json"), "r", encoding="utf-8") as f:
        json.load(f)
    files = weight_files(directory)
    if not files:
        raise ReformError(f"tiny checkpoint build in {directory} wrote no weights (*.safetensors)")
    n = 0
    for path in files:
        check_safetensors(path)
        with safe_open(path, framework="pt") as st:
            for key in st.keys():
                st.get_tensor(key)
                n += 1
    if n == 0:
        raise ReformError(f"tiny checkpoint build in {directory} wrote weight files without tensors")


def _build_lock(path: str, timeout_s: float = 1800.0, poll_s: float = 0.2) -> Any:
    """The build lock (``utils.runlock.FileLock``): a live builder is waited for up to
    ``timeout_s``; a lock left by a dead process on this host is taken over."""
    return FileLock(path, "the tiny-model build", wait_s=timeout_s, poll_s=poll_s)


# ----------------------------------------------------------------------------------------
# tokenizer shared by all tiny families

#: Built-in corpus: the words prompts and answers use (roles, yes/no, option marks, colours,
#: objects, counting, instructions), so the trained BPE has whole-word tokens for them.
TINY_CORPUS: Sequence[str] = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions.",
    "USER: What is in the image? ASSISTANT: The answer is (A) a red circle.",
    "USER: Is there a cat in the picture? Please answer yes or no. ASSISTANT: yes",
    "USER: Are the two objects the same colour? ASSISTANT: no",
    "Options: (A) yes; (B) no; (C) true; (D) false; (E) maybe; (F) none.",
    "Options: (a) red; (b) green; (c) blue; (d) yellow; (e) purple; (f) orange.",
    "Options: (1) one; (2) two; (3) three; (4) four; (5) five; (6) six; (7) seven; (8) eight; (9) nine; (10) ten.",
    "Take the following question as a single choice question and answer with the option mark.",
    "Select the correct option from the choices given below. Answer the question directly.",
    "Look at the images and choose the best answer. Choose from the options below.",
    "Which image shows a square? Which object is left of the triangle? What shape is on the right?",
    "colour color red green blue yellow black white gray grey purple orange pink brown cyan",
    "object shape circle square triangle star cross heart diamond car dog cat bird person tree house",
    "location left right top bottom above below center middle first second third last previous",
    "true false yes no correct incorrect same different both neither and or not",
    "count number how many more less than equal zero one two three four five six seven eight nine ten",
    "image images picture photo frame scene view the a an of in on at with is are was were be",
    "Describe the image in detail. Give a short answer. Answer with a single word.",
    "The answer is A. The answer is B. The answer is C. The answer is D.",
    "A B C D E F G H I J K L M N O P a b c d e f g h 0 1 2 3 4 5 6 7 8 9 ( ) ; : . , ? !",
)


def train_tiny_tokenizer(vocab_size: int = 600,
                         extra_special: Sequence[str] = ("<image>",),
                         corpus: Sequence[str] = TINY_CORPUS):
    """A byte-level BPE tokenizer trained here on ``corpus`` (default ``TINY_CORPUS``), as a fast HF tokenizer.

    Why byte-level: any text (accents, emoji) encodes without ``<unk>``, decode is lossless,
    and spaces attach to the following word, so ``prompt + " " + answer`` splits at the
    boundary the same way real Llama-style tokenizers usually do. BOS ``<s>`` is prepended
    like Llama's; ``</s>`` is EOS; ``<pad>`` pads; ``extra_special`` (the image token) are
    single tokens never split or merged.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>", *extra_special]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    # repeat the corpus a little so frequent words reach whole-word merges
    tok.train_from_iterator(list(corpus) * 4, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", additional_special_tokens=list(extra_special),
        padding_side="left", model_max_length=2048)
    return fast


# ----------------------------------------------------------------------------------------
# LLaVA-1.5

#: llava-1.5 style chat template (system line, "USER: ... ASSISTANT:"), images in place
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %} "
    "{% else %}"
    "{{ message['role'].upper() }}: "
    "{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<image>\n{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}"
    "{% if message['role'] == 'assistant' %}</s>{% else %} {% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

LLAVA_SIZES = {
    # text: hidden, layers, heads, kv heads, mlp; vision: hidden, layers, heads, mlp, image, patch; vocab
    "tiny": dict(t_hidden=64, t_layers=2, t_heads=4, t_kv=2, t_mlp=128,
                 v_hidden=32, v_layers=2, v_heads=2, v_mlp=64, image=32, patch=8, vocab=600),
    "bench": dict(t_hidden=512, t_layers=10, t_heads=8, t_kv=8, t_mlp=1536,
                  v_hidden=384, v_layers=6, v_heads=6, v_mlp=1536, image=112, patch=14, vocab=2000),
    # the known-skill model (evaluation.training): 64-pixel frames in 16-pixel patches (16 tokens
    # per frame, 2x2 per iWISDM quadrant), a vocabulary trained on the prompts it reads; three
    # layers (operands, their match, the answer) of 4 heads of 32 (vLLM's CPU attention needs 32 or 64)
    "trained": dict(t_hidden=128, t_layers=3, t_heads=4, t_kv=2, t_mlp=256,
                    v_hidden=96, v_layers=3, v_heads=4, v_mlp=192, image=64, patch=16, vocab=1200),
}


def llava_parts(size: str, tokenizer: Any) -> Tuple[Any, Any]:
    """(LlavaConfig, LlavaProcessor) of a tiny LLaVA of ``size`` (a ``LLAVA_SIZES`` key) around
    ``tokenizer``; shared by the random builder below and the trained one (``evaluation.training``)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    s = LLAVA_SIZES[size]
    vocab = len(tokenizer)
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    text_cfg = LlamaConfig(vocab_size=vocab, hidden_size=s["t_hidden"], intermediate_size=s["t_mlp"],
                           num_hidden_layers=s["t_layers"], num_attention_heads=s["t_heads"],
                           num_key_value_heads=s["t_kv"], max_position_embeddings=2048,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    vision_cfg = CLIPVisionConfig(hidden_size=s["v_hidden"], intermediate_size=s["v_mlp"],
                                  num_hidden_layers=s["v_layers"], num_attention_heads=s["v_heads"],
                                  image_size=s["image"], patch_size=s["patch"], projection_dim=s["v_hidden"])
    config = LlavaConfig(vision_config=vision_cfg, text_config=text_cfg, image_token_id=image_token_id,  # type: ignore[call-arg]  # transformers' config stubs omit what its **kwargs take
                         vision_feature_select_strategy="default", vision_feature_layer=-2,
                         projector_hidden_act="gelu", pad_token_id=tokenizer.pad_token_id)
    image_processor = LlavaImageProcessorPil(size={"shortest_edge": s["image"]},
                                             crop_size={"height": s["image"], "width": s["image"]})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer,
                               patch_size=s["patch"], vision_feature_select_strategy="default",
                               chat_template=LLAVA_CHAT_TEMPLATE, image_token="<image>",
                               num_additional_image_tokens=1)
    return config, processor


def build_tiny_llava(out_dir: str, size: str = "tiny") -> None:
    """Write a random LlavaForConditionalGeneration (CLIP vision tower + Llama text model)
    with a locally trained tokenizer, a CLIP-style image processor and a LlavaProcessor."""
    from transformers import LlavaForConditionalGeneration

    tokenizer = train_tiny_tokenizer(vocab_size=LLAVA_SIZES[size]["vocab"], extra_special=("<image>",))
    config, processor = llava_parts(size, tokenizer)
    # weights depend only on the family/size/version, never on global RNG state; the output
    # head is rescaled so greedy decoding and scores are discriminative (see seeded_model)
    model = seeded_model(lambda: LlavaForConditionalGeneration(config), size)
    save_checkpoint(model, processor, tokenizer, out_dir)


register_tiny_builder("llava", build_tiny_llava, version="1")
