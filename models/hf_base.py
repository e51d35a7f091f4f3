"""Shared Hugging Face interface for image-text-to-text models.

Why one base: every HF LMM family loads the same way (``AutoProcessor`` +
``AutoModelForImageTextToText`` on a local directory or the offline HF cache), batches
prompts the same way (left padding) and scores candidates the same way (one prefix pass,
KV cache shared by all candidates). A family file only says which ``model_type`` values it
accepts, how ``IMAGE_TOKEN`` is written for it, and which preprocessor it uses.

Likelihood (``raw_batch_predict``), per sample (all samples of a batch together, below):

1. render the prompt (dialogue string, or chat messages through the processor's template),
   encode images + prompt once with ``use_cache=True``; keep the last logits and the cache;
2. candidate tokens = ``tokens(prompt + joiner + candidate)[len(tokens(prompt)):]`` when the
   prompt's tokens are a prefix of the joint tokens (else ``tokens(joiner + candidate)``
   without special tokens); ``joiner`` is one space unless the prompt ends in whitespace;
3. run only the candidate tokens against the shared cache (in chunks of
   ``candidate_batch_size``), with one of two strategies:
   ``expand``: repeat the cache over the K candidates, one right-padded row each (causal
   attention means padding never affects the real tokens); ``packed``: all candidates in
   one row after the prefix with a block-diagonal causal 4D mask and positions restarting
   at the prefix length (no cache copies, no padding; ~10x cheaper on CPU).
   Sum the log-probabilities. Returns ``CandidateScore(logprob, num_tokens)``.

Batches (``_predict_batch``; one sample is a batch of one): step 1 runs once for all samples
of a batch, left-padded, with each row's positions counted over its real tokens (hooks
``prefix_position_inputs``, ``candidate_positions``), so every row computes what it computes
alone; step 3 then runs each candidate chunk of all samples in one pass. ``batch_groups``
splits a batch for families whose rows are not independent of padding (Mllama: by image
count).

Sampling with per-row seeds is batched and batch-invariant (``models.sampling``).

``score_full_sequence`` is the naive reference (one full forward per candidate, images
included), used by tests and ``bench/likelihood.py``.
"""
from __future__ import annotations

import copy
import logging
import os
import shutil
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from utils.schema import IMAGE_TOKEN
from models.checkpoint_files import check_checkpoint_dir
from models.interfaces.base_interface import BaseInterface, CandidateScore
from models.outputs import GenText, finish_text
from utils.errors import ReformError
from utils.images import open_image

logger = logging.getLogger(__name__)

#: generation keyword arguments understood by ``raw_batch_generate``
GEN_KEYS = ("temperature", "max_new_tokens", "seeds", "top_p", "top_k", "num_beams")

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def _one_line(e: BaseException, limit: int = 300) -> str:
    """A wrapped library error as one short line (the CLI prints errors on one line)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def allow_video_processors_without_torchvision() -> None:
    """Let processors that carry a video processor (Qwen2-VL, LLaVA-OneVision, InternVL)
    be built and loaded when ``torchvision`` is absent.

    Why: transformers only exports ``VideoProcessorMixin`` when torchvision is installed, so
    such processors fail their class check even for image-only use. With the name exported,
    a checkpoint whose video processor is the plain mixin (our tiny ones) loads; a real
    checkpoint's torchvision video processor still needs ``pip install torchvision``.
    No-op when torchvision is installed.
    """
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        return
    import transformers
    from transformers import processing_utils
    from transformers.video_processing_utils import VideoProcessorMixin

    for module in (transformers, processing_utils.transformers_module):
        if not hasattr(module, "VideoProcessorMixin"):
            setattr(module, "VideoProcessorMixin", VideoProcessorMixin)


def _is_path_like(name: str) -> bool:
    """A name the user meant as a filesystem path (not an ``org/model`` hub id)."""
    return (os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\"))
            or name.count("/") > 1 or os.path.exists(name))


#: accelerate's automatic placement strategies
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def gpu_group(local_rank: int, gpus_per_rank: int) -> List[int]:
    """The GPUs of one torchrun rank: ``local_rank*K .. local_rank*K+K-1`` (must exist)."""
    group = list(range(local_rank * gpus_per_rank, (local_rank + 1) * gpus_per_rank))
    have = torch.cuda.device_count()
    if group[-1] >= have:
        raise ReformError(f"gpus_per_rank={gpus_per_rank}: local rank {local_rank} needs GPUs "
                          f"{group[0]}..{group[-1]} but this node has {have}; use --nproc_per_node <= "
                          f"{max(1, have // gpus_per_rank)}")
    return group


def _parse_mapping(value: Any, key: str, label: str) -> Any:
    """A ``--model_option`` value that may be a mapping: dicts pass, JSON/YAML text is parsed,
    plain names (``auto``) stay strings."""
    if value is None or isinstance(value, dict):
        return value
    text = str(value).strip()
    if text.startswith("{"):
        import yaml
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ReformError(f"model {label}: {key} is not a valid mapping: {_one_line(e)}") from None
        if not isinstance(parsed, dict):
            raise ReformError(f"model {label}: {key} must be a {{name: value}} mapping")
        return parsed
    if key == "max_memory":
        raise ReformError(f"model {label}: max_memory must be a mapping like {{0: 20GiB, cpu: 64GiB}}")
    return text


def _device_name(d: Any, group: Optional[List[int]], label: str, key: str, allow_disk: bool = True) -> Any:
    """Normalise one device of a device_map / max_memory: GPU index (relative to the rank's
    GPU group when ``gpus_per_rank`` is set), ``cuda:i``, ``cpu`` or ``disk``."""
    text = str(d).strip().lower()
    if text.startswith("cuda:"):
        text = text[5:]
    if text.isdigit():
        idx = int(text)
        if group is not None:
            if idx >= len(group):
                raise ReformError(f"model {label}: {key} names GPU {idx}, but gpus_per_rank gives each rank "
                                  f"{len(group)} GPUs (indices are relative to the rank's group)")
            idx = group[idx]
        if not torch.cuda.is_available() or idx >= torch.cuda.device_count():
            raise ReformError(f"model {label}: {key} names GPU {idx}, but {torch.cuda.device_count()} GPUs "
                              "are visible")
        return idx
    valid = ("cpu", "disk") if allow_disk else ("cpu",)
    if text in valid:
        return text
    raise ReformError(f"model {label}: {key}: unknown device '{d}'; valid: a GPU index, cuda:N, "
                      f"{', '.join(valid)}")


class HFBaseInterface(BaseInterface):
    """Base for Hugging Face image-text-to-text families.

    Config keys: ``model_name`` (local dir, HF id in the offline cache, or ``tiny``),
    ``model_type``, ``half_evaluation``, ``dtype``, ``device``, ``trust_remote_code``,
    ``attn_implementation``, ``candidate_batch_size`` (candidates scored per pass, default
    all), ``max_new_tokens`` (default 30), ``tiny_size`` (``tiny`` | ``bench``); big models:
    ``device_map``, ``max_memory``, ``offload_folder``, ``gpus_per_rank``, ``tp_plan`` (see
    ``_placement_kwargs``); ``max_context_tokens`` (a context limit tighter than the model's).
    """

    #: tiny-builder family name and the accepted ``config.model_type`` values
    family: str = ""
    model_types: Tuple[str, ...] = ()
    #: model class; None => AutoModelForImageTextToText
    model_class: Any = None
    #: how candidates share the prefix cache: ``expand`` (repeat the cache over K rows; works
    #: for every family) or ``packed`` (one row, block-diagonal 4D mask, explicit 1D
    #: positions; needs a family whose text model takes plain position_ids and custom
    #: 4D masks). Config ``likelihood_strategy`` overrides.
    likelihood_strategy: str = "expand"
    option_names = ("dtype", "trust_remote_code", "attn_implementation", "candidate_batch_size",
                    "likelihood_strategy", "tiny_size", "device_map", "max_memory", "gpus_per_rank", "tp_plan",
                    "offload_folder", "batched_likelihood", "max_context_tokens")
    #: whether likelihood may run a batch's prefixes as one left-padded pass
    batch_prefix: bool = True
    #: positions of a left-padded pass: ``mask`` (explicit position_ids, a row's real tokens
    #: counted from ``position_offset``) or ``model`` (the model derives them from the mask)
    position_source: str = "mask"
    position_offset: int = 0
    #: what the processor returns (``return_tensors``): ``pt``, or ``np`` for a processor that
    #: post-processes its own outputs with numpy (PaliGemma), which warns on torch tensors
    processor_tensors: str = "pt"

    def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(config)
        cfg = self.config
        self.device = torch.device(cfg.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = self._pick_dtype(cfg)
        if not cfg.get("model_name"):
            # never fall back to the random tiny model silently: its scores would pass for a result
            raise ReformError(f"model '{self.name or self.family}': give --model_name (a checkpoint directory, "
                              "an HF id in the offline cache, or 'tiny' for the random test model)")
        self.model_path = self._resolve_path(str(cfg["model_name"]))
        self.chat_response_prefix: Optional[str] = None
        self._sample_ids: Optional[List[Any]] = None
        self._load()

    # ---------------------------------------------------------------------------- loading
    def _pick_dtype(self, cfg: Dict[str, Any]) -> torch.dtype:
        """fp32 unless asked; half precision is fp16 on GPU and bf16 on CPU (CPU fp16 is slow)."""
        if cfg.get("dtype"):
            name = str(cfg["dtype"]).replace("torch.", "")
            if name not in _DTYPES:
                raise ReformError(f"model '{cfg.get('model_name')}': unknown dtype '{cfg['dtype']}'; "
                                  f"valid names: {', '.join(sorted(_DTYPES))}")
            return _DTYPES[name]
        if cfg.get("half_evaluation"):
            return torch.float16 if self.device.type == "cuda" else torch.bfloat16
        return torch.float32

    @property
    def label(self) -> str:
        """How errors name this model."""
        return f"{self.name or type(self).__name__} ({self.config.get('model_name')})"

    def _resolve_path(self, name: str) -> str:
        """``tiny`` => the built tiny checkpoint; a path must exist with a config.json; any
        other name is an HF id looked up in the offline cache by ``from_pretrained``."""
        if name == "tiny":
            from models.tiny import tiny_model_path
            return tiny_model_path(self.family, size=str(self.config.get("tiny_size", "tiny")))
        if _is_path_like(name):
            path = os.path.expanduser(name)
            if not os.path.isdir(path):
                raise ReformError(f"model '{self.name or self.family}': model path '{name}' does not exist "
                                  "(give a checkpoint directory, an HF id in the local cache, or 'tiny')")
            if not os.path.isfile(os.path.join(path, "config.json")):
                present = ", ".join(sorted(os.listdir(path))[:10]) or "(empty)"
                raise ReformError(f"model '{self.name or self.family}': model path '{name}' has no config.json "
                                  f"(files: {present}); is it a Hugging Face checkpoint directory?")
            return path
        return name

    def _load(self) -> None:
        """Load config, processor and model, offline; check the checkpoint's family."""
        from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

        allow_video_processors_without_torchvision()
        trust = bool(self.config.get("trust_remote_code", False))
        try:
            hf_config = AutoConfig.from_pretrained(self.model_path, local_files_only=True, trust_remote_code=trust)
        except (OSError, ValueError) as e:
            raise ReformError(f"model {self.label}: cannot load '{self.model_path}' offline "
                              f"(not a local checkpoint and not in the HF cache): {_one_line(e)}") from None
        if self.model_types and hf_config.model_type not in self.model_types:
            raise ReformError(f"model {self.label}: checkpoint '{self.model_path}' is a '{hf_config.model_type}' "
                              f"model, but interface '{self.name or self.family}' expects "
                              f"{' or '.join(repr(t) for t in self.model_types)}")
        try:
            self.processor = AutoProcessor.from_pretrained(self.model_path, local_files_only=True,
                                                           trust_remote_code=trust)
        except (OSError, ValueError, TypeError) as e:
            raise ReformError(f"model {self.label}: cannot load the processor from '{self.model_path}' "
                              f"(tokenizer / preprocessor files missing?): {_one_line(e)}") from None
        cls = self.model_class or AutoModelForImageTextToText
        kwargs: Dict[str, Any] = {"dtype": self.dtype, "local_files_only": True, "trust_remote_code": trust}
        if self.config.get("attn_implementation"):
            kwargs["attn_implementation"] = self.config["attn_implementation"]
        placement = self._placement_kwargs()
        kwargs.update(placement)
        if os.path.isdir(self.model_path):
            check_checkpoint_dir(self.model_path)  # a truncated weight file: one line naming it
        try:
            self.model = cls.from_pretrained(self.model_path, **kwargs)
        except (OSError, ValueError, RuntimeError) as e:
            raise ReformError(f"model {self.label}: cannot load weights from '{self.model_path}': {_one_line(e)}") from None
        except Exception as e:  # noqa: BLE001 - safetensors' Rust errors have no Python base class
            if "safetensor" not in type(e).__name__.lower():
                raise
            raise ReformError(f"model {self.label}: corrupt weights in '{self.model_path}': {_one_line(e)}") from None
        if "device_map" in placement or "distributed_config" in placement or "tp_plan" in placement:
            self.device = self._input_device()
            self._check_offload()
        else:
            self.model.to(self.device)
        self.model.eval()
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        text_cfg = self.model.config.get_text_config()
        self.max_context: Optional[int] = getattr(text_cfg, "max_position_embeddings", None)
        if self.config.get("max_context_tokens"):  # a tighter limit (long-context quality, memory)
            self.max_context = int(self.config["max_context_tokens"])
        logger.info("loaded %s from %s (%s, %s, %.1fM params)", self.name or self.family, self.model_path,
                    self.device, self.dtype, sum(p.numel() for p in self.model.parameters()) / 1e6)

    # ---------------------------------------------------------------------------- placement
    def _placement_kwargs(self) -> Dict[str, Any]:
        """``from_pretrained`` arguments for big checkpoints (issue 12 section 1).

        * ``device_map`` (``auto``, ``balanced``, ``balanced_low_0``, ``sequential`` or an
          explicit ``{module: device}`` map, devices being GPU indices, ``cuda:i``, ``cpu`` or
          ``disk``) with optional ``max_memory`` (``{device: "20GiB"}``) and
          ``offload_folder``: accelerate's big-model path; inputs go to the first device,
          accelerate's top-level hook brings the outputs back there.
        * ``gpus_per_rank=K`` under torchrun: local rank r owns GPUs r*K .. r*K+K-1; GPU
          indices in ``device_map``/``max_memory`` are then relative to that group.
        * ``tp_plan=auto``: transformers tensor parallelism over the torchrun ranks.
        """
        cfg = self.config
        device_map = _parse_mapping(cfg.get("device_map"), "device_map", self.label)
        max_memory = _parse_mapping(cfg.get("max_memory"), "max_memory", self.label)
        k = cfg.get("gpus_per_rank")
        tp_plan = cfg.get("tp_plan")
        if tp_plan is not None:
            if str(tp_plan) != "auto":
                raise ReformError(f"model {self.label}: tp_plan must be 'auto', got '{tp_plan}'")
            if device_map is not None or k is not None:
                raise ReformError(f"model {self.label}: tp_plan=auto splits the model over the torchrun ranks; "
                                  "it cannot be combined with device_map or gpus_per_rank")
            if int(os.environ.get("WORLD_SIZE", "1")) < 2:
                raise ReformError(f"model {self.label}: tp_plan=auto needs torchrun with --nproc_per_node >= 2")
            try:
                from transformers.distributed import DistributedConfig
                return {"distributed_config": DistributedConfig(tp_plan="auto")}
            except ImportError:  # older transformers
                return {"tp_plan": "auto"}
        group: Optional[List[int]] = None
        if k is not None:
            try:
                k = int(k)
            except (TypeError, ValueError):
                k = 0
            if k < 1:
                raise ReformError(f"model {self.label}: gpus_per_rank must be an integer >= 1, got "
                                  f"'{cfg.get('gpus_per_rank')}'")
            group = gpu_group(int(os.environ.get("LOCAL_RANK", "0")), k)
            torch.cuda.set_device(group[0])
            if device_map is None:
                if k == 1:
                    self.device = torch.device(f"cuda:{group[0]}")
                    return {}
                device_map = "auto"
        if device_map is None:
            if max_memory is not None or cfg.get("offload_folder"):
                raise ReformError(f"model {self.label}: max_memory / offload_folder need device_map "
                                  "(auto, balanced, sequential or an explicit map)")
            return {}
        out: Dict[str, Any] = {}
        if isinstance(device_map, str):
            if device_map not in DEVICE_MAP_STRATEGIES:
                raise ReformError(f"model {self.label}: unknown device_map '{device_map}'; valid: "
                                  f"{', '.join(DEVICE_MAP_STRATEGIES)} or an explicit {{module: device}} map")
            out["device_map"] = device_map
        else:
            out["device_map"] = {str(m): _device_name(d, group, self.label, "device_map") for m, d in device_map.items()}
        if max_memory is not None:
            out["max_memory"] = {_device_name(d, group, self.label, "max_memory", allow_disk=False): str(v)
                                 for d, v in max_memory.items()}
        elif group is not None:
            out["max_memory"] = {g: torch.cuda.get_device_properties(g).total_memory for g in group}
        values = list(out["device_map"].values()) if isinstance(out["device_map"], dict) else []
        if "disk" in values or isinstance(out["device_map"], str):
            folder = cfg.get("offload_folder")
            if not folder:
                import atexit
                import tempfile
                folder = tempfile.mkdtemp(prefix="reform-offload-")
                atexit.register(shutil.rmtree, folder, True)
            out["offload_folder"] = str(folder)
        return out

    def _check_offload(self) -> None:
        """Refuse offloaded modules that accelerate cannot run: ``nn.MultiheadAttention``
        reads its projection weights directly instead of calling the hooked sub-layer, so
        offloaded (disk, or cpu under a GPU main device) they stay on the meta device and
        the forward fails deep inside torch."""
        device_map = getattr(self.model, "hf_device_map", None) or {}
        offloaded = {"disk"} | ({"cpu"} if self.device.type != "cpu" else set())
        for name, module in self.model.named_modules():
            if not isinstance(module, torch.nn.MultiheadAttention):
                continue
            keys = [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]
            where = device_map[max(keys, key=len)] if keys else None
            if where in offloaded:
                owner = max(keys, key=len) or "(the whole model)"
                raise ReformError(f"model {self.label}: device_map offloads '{owner}' to {where}, but it holds "
                                  f"'{name}' (nn.MultiheadAttention), which accelerate cannot run offloaded; "
                                  "map that module to a GPU (or cpu when no GPU is used), or give more max_memory")

    def _input_device(self) -> torch.device:
        """Where inputs go for a dispatched model: accelerate's main device (the first
        device of the map that is not cpu/disk, else cpu); for tensor parallelism, the
        device of the input embeddings."""
        device_map = getattr(self.model, "hf_device_map", None)
        if device_map:
            for d in device_map.values():
                if d not in ("cpu", "disk", "meta"):
                    return torch.device(f"cuda:{d}" if isinstance(d, int) else d)
            return torch.device("cpu")
        return self.model.get_input_embeddings().weight.device

    # ---------------------------------------------------------------------------- context
    def max_context_tokens(self) -> Optional[int]:
        """``max_position_embeddings`` of the text model, or config ``max_context_tokens``."""
        return self.max_context

    def count_prompt_tokens(self, images: Sequence[Any], prompt: Any) -> Optional[int]:
        """Length of the processor's ``input_ids`` for this prompt (image tokens expanded)."""
        text = self.render(prompt)
        imgs = self._images(images, 0)
        kwargs: Dict[str, Any] = {"text": [text], "return_tensors": self.processor_tensors}
        if imgs:
            kwargs["images"] = imgs
        enc = self.processor(**kwargs)
        return int(enc["input_ids"].shape[1])

    def answer_reserve_tokens(self, inference_method: str, sample: Dict[str, Any],
                              gen_kwargs: Dict[str, Any]) -> int:
        """``max_new_tokens`` (as ``raw_batch_generate`` resolves it), or the longest candidate."""
        if inference_method == "likelihood":
            cands = sample.get("candidates") or []
            return max((len(self.tokenizer(" " + str(c), add_special_tokens=False)["input_ids"]) + 1
                        for c in cands), default=0)
        return int(gen_kwargs.get("max_new_tokens") or self.config.get("max_new_tokens") or 30)

    # ---------------------------------------------------------------------------- prompts
    @property
    def image_token(self) -> str:
        """The family's image placeholder as its processor expects it in text."""
        return getattr(self.processor, "image_token", IMAGE_TOKEN)

    def image_prompt_text(self) -> str:
        """What one neutral ``IMAGE_TOKEN`` becomes in a dialogue string (override per family)."""
        return self.image_token

    def _sid(self, i: int) -> str:
        ids = self._sample_ids
        return f"sample {ids[i]}" if ids is not None and i < len(ids) else f"prompt #{i}"

    def render(self, prompt: Any, i: int = 0) -> str:
        """Dialogue string with family image tokens: strings get ``IMAGE_TOKEN`` translated;
        chat messages go through the processor's chat template (generation prompt added)."""
        if isinstance(prompt, str):
            text = prompt
            if self.image_prompt_text() != IMAGE_TOKEN:
                text = text.replace(IMAGE_TOKEN, self.image_prompt_text())
            return text
        if isinstance(prompt, list):
            try:
                text = self.processor.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            except Exception as e:  # noqa: BLE001 - template errors are user-facing config errors
                raise ReformError(f"model {self.label}: {self._sid(i)}: chat template failed: {_one_line(e)}") from None
            if self.chat_response_prefix:
                text = text + self.chat_response_prefix
            return text
        raise ReformError(f"model {self.label}: {self._sid(i)}: prompt must be a string or chat messages, "
                          f"got {type(prompt).__name__}")

    def _images(self, images: Iterable[Any], i: int) -> List[Image.Image]:
        """Decode images (paths or PIL) to RGB; errors name the sample and image index."""
        out = []
        for j, im in enumerate(images or []):
            if isinstance(im, str):
                try:
                    out.append(open_image(im))
                except ReformError as e:
                    raise ReformError(f"model {self.label}: {self._sid(i)}: image {j}: {_one_line(e)}") from None
            elif isinstance(im, Image.Image):
                try:
                    im.load()  # decode now, so a truncated file fails here with its sample named
                    out.append(im if im.mode == "RGB" else im.convert("RGB"))
                except OSError as e:
                    raise ReformError(f"model {self.label}: {self._sid(i)}: image {j} cannot be decoded ({_one_line(e)})") from None
            else:
                raise ReformError(f"model {self.label}: {self._sid(i)}: image {j} is a {type(im).__name__}, "
                                  "expected a PIL image or a file path")
        return out

    def _check_images(self, text: str, n_images: int, i: int) -> None:
        n_tok = text.count(self.image_token)
        if n_tok != n_images:
            raise ReformError(f"model {self.label}: {self._sid(i)}: prompt has {n_tok} image placeholders "
                              f"but {n_images} images were given")

    def _check_context(self, length: int, i: int, what: str) -> None:
        if self.max_context is not None and length > self.max_context:
            raise ReformError(f"model {self.label}: {self._sid(i)}: {what} is {length} tokens, longer than the "
                              f"model context of {self.max_context} tokens (fewer images or shorter history?)")

    def _encode(self, texts: List[str], images: List[Image.Image]) -> Dict[str, torch.Tensor]:
        """Processor call (left padding), moved to the model's device and dtype."""
        kwargs: Dict[str, Any] = {"text": texts, "return_tensors": self.processor_tensors, "padding": True}
        if images:
            kwargs["images"] = images
        return self.to_model_inputs(self.processor(**kwargs))

    def to_model_inputs(self, enc: Any) -> Dict[str, Any]:
        """Processor outputs as a dict on the model's device, floating tensors in its dtype."""
        out: Dict[str, Any] = {}
        for k, v in enc.items():
            if isinstance(v, np.ndarray):
                v = torch.from_numpy(v)
            if isinstance(v, torch.Tensor):
                v = v.to(self.device)
                if v.is_floating_point():
                    v = v.to(self.dtype)
            out[k] = v
        return out

    # ---------------------------------------------------------------------------- dispatch
    def forward(self, inference_method: str, samples: Sequence[Dict[str, Any]], prompts: Sequence[Any],
                **gen_kwargs: Any) -> List[Any]:
        """As ``BaseInterface.forward``; remembers sample ids so errors can name them."""
        self._sample_ids = [s.get("sample_id") for s in samples]
        try:
            return super().forward(inference_method, samples, prompts, **gen_kwargs)
        finally:
            self._sample_ids = None

    # ---------------------------------------------------------------------------- generation
    @torch.inference_mode()
    def raw_batch_generate(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                           **gen_kwargs: Any) -> List[GenText]:
        """Greedy (temperature 0/None) or sampled generation; the prompt is stripped.

        Sampling with ``seeds`` (one int per prompt) runs batched and batch-invariant: each
        row draws its tokens from its own generator (``models.sampling``: Gumbel-max keyed by
        the row's seed and the step, after temperature/top-k/top-p), so a sample's output
        never depends on its batch neighbours or padding. Beam sampling with seeds runs each
        prompt alone under its own seed (rows of a beam search are not one sample each).
        """
        unknown = set(gen_kwargs) - set(GEN_KEYS)
        if unknown:
            logger.debug("ignoring generation arguments %s", sorted(unknown))
        temperature = float(gen_kwargs.get("temperature") or 0.0)
        max_new = int(gen_kwargs.get("max_new_tokens") or self.config.get("max_new_tokens") or 30)
        seeds = gen_kwargs.get("seeds")
        hf_kwargs: Dict[str, Any] = {"max_new_tokens": max_new,
                                     "pad_token_id": self.tokenizer.pad_token_id}
        if temperature > 0:
            hf_kwargs.update(do_sample=True, temperature=temperature)
            for k in ("top_p", "top_k"):
                if gen_kwargs.get(k) is not None:
                    hf_kwargs[k] = gen_kwargs[k]
        else:
            hf_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if gen_kwargs.get("num_beams"):
            hf_kwargs["num_beams"] = int(gen_kwargs["num_beams"])

        texts, images = [], []
        for i, (ims, p) in enumerate(zip(images_list, prompts)):
            text = self.render(p, i)
            imgs = self._images(ims, i)
            self._check_images(text, len(imgs), i)
            texts.append(text)
            images.append(imgs)

        if temperature > 0 and seeds is not None:
            if len(seeds) != len(texts):
                raise ReformError(f"model {self.label}: {len(seeds)} seeds for {len(texts)} prompts")
            if int(hf_kwargs.get("num_beams") or 1) == 1:
                return self._by_groups(self.batch_groups(images), lambda g: self._generate(
                    [texts[i] for i in g], [images[i] for i in g],
                    self._seeded_kwargs(hf_kwargs, [seeds[i] for i in g], temperature, gen_kwargs)))
            outs = []
            for i, (t, ims, seed) in enumerate(zip(texts, images, seeds)):
                devices = [self.device] if self.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(int(seed))
                    outs.extend(self._generate([t], [ims], hf_kwargs, offset=i))
            return outs
        return self._by_groups(self.batch_groups(images), lambda g: self._generate(
            [texts[i] for i in g], [images[i] for i in g], hf_kwargs))

    def batch_groups(self, images_list: Sequence[Sequence[Any]]) -> List[List[int]]:
        """How the rows of a batch may run together so that no row's result depends on the
        others (hook): one group by default (left padding is neutral); Mllama groups rows by
        image count (padded image slots change its logits)."""
        return [list(range(len(images_list)))]

    def _by_groups(self, groups: List[List[int]], run: Any) -> List[Any]:
        """``run(group)`` per group of row indices, results put back in row order; errors
        raised inside name the group's samples."""
        if len(groups) == 1:
            return run(groups[0])
        out: List[Any] = [None] * sum(len(g) for g in groups)
        ids = self._sample_ids
        try:
            for g in groups:
                self._sample_ids = [ids[i] if ids is not None and i < len(ids) else f"#{i}" for i in g]
                for i, r in zip(g, run(g)):
                    out[i] = r
        finally:
            self._sample_ids = ids
        return out

    def _seeded_kwargs(self, hf_kwargs: Dict[str, Any], seeds: Sequence[int], temperature: float,
                       gen_kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """``generate`` arguments for per-row seeded sampling: greedy decoding over the
        logits as warped by ``SeededGumbelSampler``. top-k / top-p / min-p come from the call,
        else from the checkpoint's generation config (what ``do_sample=True`` would use)."""
        from transformers import LogitsProcessorList

        from models.sampling import SeededGumbelSampler

        gc = getattr(self.model, "generation_config", None)
        warp = {k: gen_kwargs[k] if gen_kwargs.get(k) is not None else getattr(gc, k, None)
                for k in ("top_k", "top_p", "min_p")}
        unsupported = [k for k in ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
                       if getattr(gc, k, None) not in (None, 0.0, 1.0)]
        if unsupported:
            logger.warning("seeded sampling ignores the checkpoint's generation-config %s", ", ".join(unsupported))
        kwargs = {k: v for k, v in hf_kwargs.items() if k not in ("do_sample", "temperature", "top_p", "top_k")}
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None, min_p=None,
                      logits_processor=LogitsProcessorList([SeededGumbelSampler(seeds, temperature, **warp)]))
        return kwargs

    def _generate(self, texts: List[str], images: List[List[Image.Image]], hf_kwargs: Dict[str, Any],
                  offset: int = 0) -> List[GenText]:
        enc = self._encode(texts, [im for ims in images for im in ims])
        length = enc["input_ids"].shape[1]
        for i in range(len(texts)):
            n = int(enc["attention_mask"][i].sum()) if "attention_mask" in enc else length
            self._check_context(n + hf_kwargs["max_new_tokens"], offset + i, "prompt + max_new_tokens")
        out = self.model.generate(**enc, **hf_kwargs)
        return self.decode_generated(out[:, length:])

    def decode_generated(self, new_ids: torch.Tensor) -> List[GenText]:
        """Generated token rows (prompt removed) as ``finish_text`` texts carrying their token
        counts: a row's tokens up to and including its first EOS (later positions are the
        padding of a row that finished early)."""
        texts = self.tokenizer.batch_decode(new_ids, skip_special_tokens=True)
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        eos_ids = torch.tensor([e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None],
                               dtype=new_ids.dtype, device=new_ids.device)
        width = new_ids.shape[1]
        counts = []
        for row in new_ids:
            hits = torch.nonzero(torch.isin(row, eos_ids)).flatten() if len(eos_ids) else row[:0]
            counts.append(int(hits[0]) + 1 if len(hits) else width)
        return [finish_text(t, tokens=n) for t, n in zip(texts, counts)]

    # ---------------------------------------------------------------------------- likelihood
    def candidate_ids(self, prompt_text: str, candidate: str) -> List[int]:
        """The tokens ``candidate`` adds after the rendered prompt (see module docstring)."""
        joiner = "" if (not prompt_text or prompt_text[-1].isspace() or candidate[:1].isspace()) else " "
        p = self.tokenizer(prompt_text, add_special_tokens=True)["input_ids"]
        j = self.tokenizer(prompt_text + joiner + candidate, add_special_tokens=True)["input_ids"]
        if len(j) > len(p) and j[:len(p)] == p:
            return list(j[len(p):])
        logger.debug("prompt tokens are not a prefix of prompt+candidate for %r; encoding it alone", candidate)
        return list(self.tokenizer(joiner + candidate, add_special_tokens=False)["input_ids"])

    def _prepare(self, images: Sequence[Any], prompt: Any, candidates: Sequence[str], i: int
                 ) -> Tuple[str, List[Image.Image], List[List[int]]]:
        text = self.render(prompt, i)
        imgs = self._images(images, i)
        self._check_images(text, len(imgs), i)
        if not candidates:
            raise ReformError(f"model {self.label}: {self._sid(i)}: no candidates to score")
        cand_ids = []
        for c in candidates:
            ids = self.candidate_ids(text, str(c))
            if not ids:
                raise ReformError(f"model {self.label}: {self._sid(i)}: candidate {c!r} has no tokens")
            cand_ids.append(ids)
        return text, imgs, cand_ids

    @torch.inference_mode()
    def raw_batch_predict(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                          candidates_list: Sequence[Sequence[str]]) -> List[List[CandidateScore]]:
        """Prefix-shared scoring: one image+prompt pass, then all candidates from the shared
        KV cache. Batched (``batched_likelihood()``): one left-padded prefix pass for the whole
        batch and one candidate pass per chunk; else one prefix pass per sample. Summed
        log-probs; normalisation is the metrics' job."""
        if len(prompts) > 1 and self.batched_likelihood():
            def run(g: List[int]) -> List[List[CandidateScore]]:
                if len(g) == 1:
                    return [self._predict_one(images_list[g[0]], prompts[g[0]], candidates_list[g[0]], 0)]
                return self._predict_batch([images_list[i] for i in g], [prompts[i] for i in g],
                                           [candidates_list[i] for i in g])
            return self._by_groups(self.batch_groups(images_list), run)
        return [self._predict_one(ims, p, c, i)
                for i, (ims, p, c) in enumerate(zip(images_list, prompts, candidates_list))]

    def batched_likelihood(self) -> bool:
        """Whether a batch's prefixes run as one left-padded pass (per ``batch_groups``; config
        ``batched_likelihood``, default on)."""
        return self.batch_prefix and bool(self.config.get("batched_likelihood", True))

    # -- batched likelihood ----------------------------------------------------------------
    def prefix_position_inputs(self, enc: Dict[str, Any], mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Position inputs of a left-padded prefix pass (hook): each real token at its index
        among the row's real tokens (+ ``position_offset``), exactly as in the unpadded
        one-sample pass; nothing when the model derives positions from the attention mask
        (``position_source = "model"``: Qwen2-VL's M-RoPE, OPT's learned positions)."""
        if self.position_source == "model":
            return {}
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0) + self.position_offset
        return {"position_ids": pos}

    def candidate_positions(self, pos: torch.Tensor, index: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Position inputs of candidate tokens (hook). ``pos`` (rows, length): each token's
        index in its sample's unpadded sequence (real prefix length + offset in its
        candidate); row r belongs to sample ``index[r]`` of the prefix pass. Default:
        ``pos + position_offset``, or nothing when the model derives positions from the mask;
        Qwen2-VL adds the sample's M-RoPE offset."""
        if self.position_source == "model":
            return {}
        return {"position_ids": pos + self.position_offset}

    def _predict_batch(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                       candidates_list: Sequence[Sequence[str]], offset: int = 0) -> List[List[CandidateScore]]:
        """All prefixes in one left-padded pass (explicit positions, so every row sees what
        its one-sample pass sees), then each chunk of every sample's candidates in one
        candidate pass over the batch cache (``packed``: one row per sample; ``expand``: one
        row per candidate, cache rows selected per candidate)."""
        preps = [self._prepare(ims, p, c, offset + i)
                 for i, (ims, p, c) in enumerate(zip(images_list, prompts, candidates_list))]
        enc = self._encode([t for t, _, _ in preps], [im for _, ims, _ in preps for im in ims])
        ids = enc["input_ids"]
        mask = enc.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(ids)
        real = mask.long().sum(-1)
        for i, (_, _, cand_ids) in enumerate(preps):
            self._check_context(int(real[i]) + max(len(c) for c in cand_ids), offset + i,
                                "prompt + longest candidate")
        out = self.model(**enc, **self.prefix_position_inputs(enc, mask), use_cache=True, logits_to_keep=1)
        first_lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        self.after_prefix(out, enc)
        prefix_cache = self.prefix_cache(out)
        del out

        cand_lists = [c for _, _, c in preps]
        k_max = max(len(c) for c in cand_lists)
        chunk = int(self.config.get("candidate_batch_size") or k_max)
        strategy = self.strategy()
        scores: List[List[CandidateScore]] = [[] for _ in preps]
        n_chunks = (k_max + chunk - 1) // chunk
        for start in range(0, k_max, chunk):
            pieces = [c[start:start + chunk] for c in cand_lists]
            cache = prefix_cache if n_chunks == 1 else copy.deepcopy(prefix_cache)
            if strategy == "packed":
                got = self._score_packed(cache, first_lp, pieces, mask, real)
            else:
                got = self._score_expand(cache, first_lp, pieces, mask, real)
            for b, g in enumerate(got):
                scores[b].extend(g)
        return scores

    def select_candidate_rows(self, index: torch.Tensor) -> None:
        """Expand per-sample state of the batched prefix pass to candidate rows (hook; row r
        belongs to sample ``index[r]``; Mllama's last cross-attention mask row). Default: nothing."""

    def after_prefix(self, out: Any, enc: Dict[str, Any]) -> None:
        """Read per-row state the candidate pass needs from a prefix pass (hook; Qwen2-VL's
        ``rope_deltas``). Default: nothing."""

    def _score_packed(self, cache: Any, first_lp: torch.Tensor, pieces: List[List[List[int]]],
                            mask: torch.Tensor, real: torch.Tensor) -> List[List[CandidateScore]]:
        """``packed``: row b holds all of sample b's candidates after its (left-padded)
        prefix, each seeing the real prefix tokens and only its own earlier tokens (4D mask;
        positions restart at the real prefix length). No cache copies; rows are right-padded
        (a pad token sees only itself). The cache is consumed."""
        dev = self.device
        totals = [[float(first_lp[b, c[0]]) for c in cands] for b, cands in enumerate(pieces)]
        feeds = [[c[:-1] for c in cands] for cands in pieces]
        n_row = [sum(len(f) for f in fs) for fs in feeds]
        n = max(n_row)
        if n:
            bsz, p_len = mask.shape
            pad = self.tokenizer.pad_token_id or 0
            ids = torch.full((bsz, n), pad, dtype=torch.long, device=dev)
            pos = torch.zeros((bsz, n), dtype=torch.long, device=dev)
            seg = torch.full((bsz, n), -1, dtype=torch.long, device=dev)
            for b, fs in enumerate(feeds):
                flat = [t for f in fs for t in f]
                if not flat:
                    continue
                ids[b, :len(flat)] = torch.tensor(flat, dtype=torch.long)
                pos[b, :len(flat)] = torch.tensor([j for f in fs for j in range(len(f))], dtype=torch.long)
                seg[b, :len(flat)] = torch.tensor([r for r, f in enumerate(fs) for _ in f], dtype=torch.long)
            pos = pos + real[:, None].to(dev)
            idx = torch.arange(n, device=dev)
            causal = idx[None, :] <= idx[:, None]
            same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
            own = (seg[:, :, None] < 0) & torch.eye(n, dtype=torch.bool, device=dev)[None]
            allowed = torch.cat([mask.bool()[:, None, :].expand(bsz, n, p_len) & (seg[:, :, None] >= 0),
                                 (same & causal[None]) | own], dim=-1)
            mask4d = torch.zeros(bsz, 1, n, p_len + n, dtype=self.dtype, device=dev)
            mask4d.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)
            out = self.candidate_model()(input_ids=ids, attention_mask=mask4d, cache=cache, use_cache=True,
                                         **self.candidate_positions(pos, torch.arange(bsz, device=dev)))
            lp = torch.log_softmax(out.logits.float(), dim=-1)
            for b, cands in enumerate(pieces):
                off = 0
                for r, c in enumerate(cands):
                    m = len(c) - 1
                    if m:
                        tgt = torch.tensor(c[1:], dtype=torch.long, device=dev)
                        totals[b][r] += float(lp[b, off:off + m].gather(-1, tgt[:, None]).sum())
                    off += m
        return [[CandidateScore(s, len(c)) for s, c in zip(tot, cands)] for tot, cands in zip(totals, pieces)]

    def _score_expand(self, cache: Any, first_lp: torch.Tensor, pieces: List[List[List[int]]],
                            mask: torch.Tensor, real: torch.Tensor) -> List[List[CandidateScore]]:
        """``expand``: one right-padded row per candidate over a copy of its sample's cache
        row (causal attention keeps real tokens from seeing later pads; the attention mask
        hides the prefix's left padding). The cache is consumed."""
        dev = self.device
        rows = [(b, c) for b, cands in enumerate(pieces) for c in cands]
        if not rows:
            return [[] for _ in pieces]
        index = torch.tensor([b for b, _ in rows], dtype=torch.long, device=dev)
        lengths = torch.tensor([len(c) for _, c in rows], device=dev)
        max_len = int(lengths.max())
        pad = self.tokenizer.pad_token_id or 0
        targets = torch.full((len(rows), max_len), pad, dtype=torch.long, device=dev)
        for r, (_, c) in enumerate(rows):
            targets[r, :len(c)] = torch.tensor(c, dtype=torch.long)
        total = first_lp[index, targets[:, 0]]
        if max_len > 1:
            cache.batch_select_indices(index)
            self.select_candidate_rows(index)
            am = torch.cat([mask[index].to(dev), torch.ones(len(rows), max_len - 1, dtype=mask.dtype, device=dev)], 1)
            out = self.candidate_model()(input_ids=targets[:, :-1], attention_mask=am, cache=cache,
                                         use_cache=True,
                                         **self.candidate_positions(
                                             real.to(dev)[index][:, None] + torch.arange(max_len - 1, device=dev)[None],
                                             index))
            lp = torch.log_softmax(out.logits.float(), dim=-1)
            tok_lp = lp.gather(-1, targets[:, 1:, None]).squeeze(-1)
            keep = torch.arange(1, max_len, device=dev)[None, :] < lengths[:, None]
            total = total + (tok_lp * keep).sum(-1)
        flat = [CandidateScore(float(s), int(n)) for s, n in zip(total.tolist(), lengths.tolist())]
        out_lists: List[List[CandidateScore]] = []
        k = 0
        for cands in pieces:
            out_lists.append(flat[k:k + len(cands)])
            k += len(cands)
        return out_lists

    def _predict_one(self, images: Sequence[Any], prompt: Any, candidates: Sequence[str],
                     i: int) -> List[CandidateScore]:
        """One sample: the batched path with a batch of one (``i`` names it in errors)."""
        return self._predict_batch([images], [prompt], [candidates], offset=i)[0]

    def candidate_token_type(self, key: str) -> int:
        """Value of the per-token input ``key`` for candidate tokens in the full-sequence
        reference (hook): 0 (text); PaliGemma's suffix tokens are ``token_type_ids`` 1."""
        return 0

    def extend_full_inputs(self, full: Dict[str, Any], enc: Dict[str, Any], n_new: int) -> Dict[str, Any]:
        """Grow other inputs of the full-sequence reference by ``n_new`` candidate tokens
        (hook; Mllama's 4D ``cross_attention_mask``). Default: unchanged."""
        return full

    def prefix_cache(self, out: Any) -> Any:
        """The KV cache of the prefix pass's output (hook; BLIP-2 nests it in
        ``language_model_outputs``)."""
        return out.cache

    def candidate_model(self) -> Any:
        """The module that runs candidate tokens against the prefix cache (hook): the full
        model by default; families whose forward always needs the images (BLIP-2's
        ``pixel_values``) return their text model, which reads the same cache."""
        return self.model

    def strategy(self) -> str:
        """``packed`` or ``expand`` (see the class docstring); flash attention cannot take the
        custom 4D mask that packing needs, and packing needs explicit candidate positions
        (a family whose model derives them, like OPT, must expand): both then expand."""
        name = str(self.config.get("likelihood_strategy") or self.likelihood_strategy)
        if name not in ("packed", "expand"):
            raise ReformError(f"model {self.label}: unknown likelihood_strategy '{name}'; valid names: expand, packed")
        if name == "packed" and str(self.config.get("attn_implementation") or "").startswith("flash"):
            return "expand"
        if name == "packed" and not self.candidate_positions(torch.zeros(1, 1, dtype=torch.long),
                                                             torch.zeros(1, dtype=torch.long)):
            return "expand"
        return name

    @torch.inference_mode()
    def score_full_sequence(self, images: Sequence[Any], prompt: Any,
                            candidates: Sequence[str]) -> List[CandidateScore]:
        """Naive reference: one full forward (images included) per candidate, scoring the
        same candidate tokens as ``raw_predict``. Slow; for tests and benchmarks."""
        text, imgs, cand_ids = self._prepare(images, prompt, candidates, 0)
        enc = self._encode([text], imgs)
        p_len = enc["input_ids"].shape[1]
        scores = []
        for ids in cand_ids:
            full = dict(enc)
            c = torch.tensor([ids], dtype=torch.long, device=self.device)
            full["input_ids"] = torch.cat([enc["input_ids"], c], dim=1)
            if "attention_mask" in enc:
                full["attention_mask"] = torch.ones_like(full["input_ids"])
            # other per-token inputs (Qwen2-VL's mm_token_type_ids, token_type_ids) grow with
            # the candidate; its tokens are text, type 0 unless the family says otherwise
            for key, val in enc.items():
                if key not in ("input_ids", "attention_mask") and isinstance(val, torch.Tensor) \
                        and val.shape == enc["input_ids"].shape:
                    fill = self.candidate_token_type(key)
                    full[key] = torch.cat([val, val.new_full((1, len(ids)), fill)], dim=1)
            full = self.extend_full_inputs(full, enc, len(ids))
            logits = self.model(**full, use_cache=False).logits[0, p_len - 1:-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, c[0, :, None]).sum()
            scores.append(CandidateScore(float(lp), len(ids)))
        return scores

    def describe(self) -> Dict[str, Any]:
        d = super().describe()
        d.update(model_path=self.model_path, dtype=str(self.dtype).replace("torch.", ""))
        return d
