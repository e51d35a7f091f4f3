"""Shared Hugging Face interface for image-text-to-text models.

Why one base: every HF LMM family loads the same way (``AutoProcessor`` +
``AutoModelForImageTextToText`` on a local directory or the offline HF cache), batches
prompts the same way (left padding) and scores candidates the same way (one prefix pass,
KV cache shared by all candidates). A family file only says which ``model_type`` values it
accepts, how ``IMAGE_TOKEN`` is written for it, and which preprocessor it uses.

Likelihood (``raw_batch_predict``), per sample:

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

``score_full_sequence`` is the naive reference (one full forward per candidate, images
included), used by tests and ``bench/likelihood.py``.
"""
from __future__ import annotations

import copy
import logging
import os
import shutil
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from PIL import Image

from build.schema import IMAGE_TOKEN
from models.checkpoint_files import check_checkpoint_dir
from models.interfaces.base_interface import BaseInterface, CandidateScore
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
        kwargs: Dict[str, Any] = {"text": [text], "return_tensors": "pt"}
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
        kwargs: Dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True}
        if images:
            kwargs["images"] = images
        return self.to_model_inputs(self.processor(**kwargs))

    def to_model_inputs(self, enc: Any) -> Dict[str, Any]:
        """Processor outputs as a dict on the model's device, floating tensors in its dtype."""
        out: Dict[str, Any] = {}
        for k, v in enc.items():
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
                           **gen_kwargs: Any) -> List[str]:
        """Greedy (temperature 0/None) or sampled generation; the prompt is stripped.

        Sampling with ``seeds`` (one int per prompt) runs each prompt alone under its own
        seed, so a sample's output never depends on its batch neighbours.
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
            outs = []
            for i, (t, ims, seed) in enumerate(zip(texts, images, seeds)):
                devices = [self.device] if self.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(int(seed))
                    outs.extend(self._generate([t], [ims], hf_kwargs, offset=i))
            return outs
        return self._generate(texts, images, hf_kwargs)

    def _generate(self, texts: List[str], images: List[List[Image.Image]], hf_kwargs: Dict[str, Any],
                  offset: int = 0) -> List[str]:
        enc = self._encode(texts, [im for ims in images for im in ims])
        length = enc["input_ids"].shape[1]
        for i in range(len(texts)):
            n = int(enc["attention_mask"][i].sum()) if "attention_mask" in enc else length
            self._check_context(n + hf_kwargs["max_new_tokens"], offset + i, "prompt + max_new_tokens")
        out = self.model.generate(**enc, **hf_kwargs)
        return [s.strip() for s in self.tokenizer.batch_decode(out[:, length:], skip_special_tokens=True)]

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
        """Prefix-shared scoring: one image+prompt pass per sample, then all candidates from
        the shared KV cache. Summed log-probs; normalisation is the metrics' job."""
        return [self._predict_one(ims, p, c, i)
                for i, (ims, p, c) in enumerate(zip(images_list, prompts, candidates_list))]

    def _predict_one(self, images: Sequence[Any], prompt: Any, candidates: Sequence[str],
                     i: int) -> List[CandidateScore]:
        text, imgs, cand_ids = self._prepare(images, prompt, candidates, i)
        enc = self._encode([text], imgs)
        p_len = enc["input_ids"].shape[1]
        max_c = max(len(c) for c in cand_ids)
        self._check_context(p_len + max_c, i, "prompt + longest candidate")
        out = self.model(**enc, use_cache=True, logits_to_keep=1)
        first_lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        prefix_cache = self.prefix_cache(out)
        del out

        k = len(cand_ids)
        chunk = int(self.config.get("candidate_batch_size") or k)
        strategy = self.strategy()
        scores: List[CandidateScore] = []
        n_chunks = (k + chunk - 1) // chunk
        for start in range(0, k, chunk):
            ids_chunk = cand_ids[start:start + chunk]
            cache = prefix_cache if n_chunks == 1 else copy.deepcopy(prefix_cache)
            if strategy == "packed":
                scores.extend(self._score_packed(cache, first_lp, ids_chunk, p_len))
            else:
                scores.extend(self._score_chunk(cache, first_lp, ids_chunk))
        return scores

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
        return out.past_key_values

    def candidate_model(self) -> Any:
        """The module that runs candidate tokens against the prefix cache (hook): the full
        model by default; families whose forward always needs the images (BLIP-2's
        ``pixel_values``) return their text model, which reads the same cache."""
        return self.model

    def strategy(self) -> str:
        """``packed`` or ``expand`` (see the class docstring); flash attention cannot take the
        custom 4D mask that packing needs, so it always expands."""
        name = str(self.config.get("likelihood_strategy") or self.likelihood_strategy)
        if name not in ("packed", "expand"):
            raise ReformError(f"model {self.label}: unknown likelihood_strategy '{name}'; valid names: expand, packed")
        if name == "packed" and str(self.config.get("attn_implementation") or "").startswith("flash"):
            return "expand"
        return name

    def _score_packed(self, cache: Any, first_lp: torch.Tensor, cand_ids: List[List[int]],
                      p_len: int) -> List[CandidateScore]:
        """All candidates in ONE batch-1 row after the prefix, each seeing the prefix and only
        its own earlier tokens (block-diagonal causal 4D mask, positions restarting at the
        prefix length). No cache copies and no padding; the cache is consumed."""
        lengths = [len(c) for c in cand_ids]
        total = [float(first_lp[c[0]]) for c in cand_ids]
        feed = [c[:-1] for c in cand_ids]  # the last token of a candidate predicts nothing we need
        n_tok = sum(len(f) for f in feed)
        if n_tok:
            dev = self.device
            ids = torch.tensor([[t for f in feed for t in f]], dtype=torch.long, device=dev)
            pos = torch.tensor([[p_len + j for f in feed for j in range(len(f))]], dtype=torch.long, device=dev)
            seg = torch.tensor([r for r, f in enumerate(feed) for _ in f], device=dev)
            idx = torch.arange(n_tok, device=dev)
            allowed = torch.ones(n_tok, p_len + n_tok, dtype=torch.bool, device=dev)
            allowed[:, p_len:] = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
            mask = torch.zeros(1, 1, n_tok, p_len + n_tok, dtype=self.dtype, device=dev)
            mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
            out = self.candidate_model()(input_ids=ids, position_ids=pos, attention_mask=mask,
                             past_key_values=cache, use_cache=True)
            lp = torch.log_softmax(out.logits[0].float(), dim=-1)
            off = 0
            for r, c in enumerate(cand_ids):
                m = len(feed[r])
                if m:
                    tgt = torch.tensor(c[1:], dtype=torch.long, device=dev)
                    total[r] += float(lp[off:off + m].gather(-1, tgt[:, None]).sum())
                off += m
        return [CandidateScore(s, n) for s, n in zip(total, lengths)]

    def _score_chunk(self, cache: Any, first_lp: torch.Tensor, cand_ids: List[List[int]]) -> List[CandidateScore]:
        """Score candidates from a (batch-1) prefix cache repeated K times (right-padded
        candidate rows); the cache is consumed."""
        n = len(cand_ids)
        lengths = torch.tensor([len(c) for c in cand_ids], device=self.device)
        max_len = int(lengths.max())
        pad = self.tokenizer.pad_token_id or 0
        targets = torch.full((n, max_len), pad, dtype=torch.long, device=self.device)
        for r, c in enumerate(cand_ids):
            targets[r, :len(c)] = torch.tensor(c, dtype=torch.long)
        total = first_lp[targets[:, 0]]
        if max_len > 1:
            cache.batch_repeat_interleave(n)
            # feed tokens 0..L-2; the logits at step t predict token t+1. Right padding is
            # harmless: causal attention keeps real tokens from seeing later pad tokens.
            out = self.candidate_model()(input_ids=targets[:, :-1], past_key_values=cache, use_cache=True)
            lp = torch.log_softmax(out.logits.float(), dim=-1)
            tok_lp = lp.gather(-1, targets[:, 1:, None]).squeeze(-1)
            mask = torch.arange(1, max_len, device=self.device)[None, :] < lengths[:, None]
            total = total + (tok_lp * mask).sum(-1)
        return [CandidateScore(float(s), int(l)) for s, l in zip(total.tolist(), lengths.tolist())]

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
