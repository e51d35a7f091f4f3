"""Loading and placing a Hugging Face checkpoint: path resolution (``tiny``, a local directory
or an HF id in the offline cache), the family check, dtype, and big-model placement
(``device_map`` / ``max_memory`` / ``offload_folder`` / ``gpus_per_rank`` / ``tp_plan``).

Why its own module: everything here runs once, before the first sample; the per-batch code
(``hf_inputs``, ``hf_generation``, ``hf_likelihood``) only reads ``self.model``,
``self.processor``, ``self.tokenizer``, ``self.device`` and ``self.dtype``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from .checkpoint_files import check_checkpoint_dir
from .hf_compat import allow_video_processors_without_torchvision
from .hf_state import HFState
from .hub_cache import HubSnapshot, hub_snapshot, is_path_like
from . import check_checkpoint_name
from .tiny import TRAINED_NAME, builtin_checkpoint  # noqa: F401  (TRAINED_NAME: re-exported)
from ..utils.errors import ReformError

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def _one_line(e: BaseException, limit: int = 300) -> str:
    """A wrapped library error as one short line (the CLI prints errors on one line)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + " ..."


#: a name the user meant as a filesystem path (not an ``org/model`` hub id)
_is_path_like = is_path_like


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


@contextlib.contextmanager
def weight_loading_bars(show: bool) -> Iterator[None]:
    """transformers' "Loading weights" progress bars only when asked (``-v``): without it a run,
    and the Python API, print nothing of their own while loading (issue 17); the previous
    setting is restored."""
    from transformers.utils import logging as hf_logging  # transformers is heavy; loaded only to load a model

    was = hf_logging.is_progress_bar_enabled()
    if was and not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not show:
            hf_logging.enable_progress_bar()


class HFLoadingMixin(HFState):
    """Loading and placement of ``HFBaseInterface`` (config in ``self.config``)."""

    #: tiny-builder family name and the accepted ``config.model_type`` values
    family: str = ""
    model_types: Tuple[str, ...] = ()
    #: model class; None => AutoModelForImageTextToText
    model_class: Any = None
    option_names: Tuple[str, ...] = ("dtype", "trust_remote_code", "attn_implementation", "tiny_size", "device_map", "max_memory",
                    "gpus_per_rank", "tp_plan", "offload_folder")
    config: Dict[str, Any]
    name: str

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
        """``tiny`` => the built tiny checkpoint; ``tiny-trained`` => the known-skill checkpoint
        (shipped, or trained by ``evaluation.training``); a path must exist with a config.json; any
        other name is an HF id resolved in the offline cache to its snapshot folder
        (``models.hub_cache``), loaded from there and fingerprinted like a local folder, its
        commit kept in ``self.hub_snapshot``; an id not in the cache is left to ``from_pretrained``
        to report."""
        self.hub_snapshot: Optional[HubSnapshot] = None
        builtin = builtin_checkpoint(self.family, name, self.config)
        if builtin is not None:
            return builtin
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
        self.hub_snapshot = hub_snapshot(name)
        if self.hub_snapshot is not None:
            logger.info("%s: snapshot %s of the local HF cache (%s)", name, self.hub_snapshot.commit,
                        self.hub_snapshot.path)
            return self.hub_snapshot.path
        # neither a folder nor in the cache: the one line that says so (never a network error)
        check_checkpoint_name(self.name or self.family, name)
        return name

    def _load(self) -> None:
        """Load config, processor and model, offline; check the checkpoint's family."""
        from transformers import AutoModelForImageTextToText

        self._load_processor()
        trust = bool(self.config.get("trust_remote_code", False))
        cls = self.model_class or AutoModelForImageTextToText
        kwargs: Dict[str, Any] = {"dtype": self.dtype, "local_files_only": True, "trust_remote_code": trust}
        if self.config.get("attn_implementation"):
            kwargs["attn_implementation"] = self.config["attn_implementation"]
        placement = self._placement_kwargs()
        kwargs.update(placement)
        if os.path.isdir(self.model_path):
            check_checkpoint_dir(self.model_path)  # a truncated weight file: one line naming it
        try:
            with weight_loading_bars(logger.isEnabledFor(logging.INFO)):
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
        logger.info("loaded %s from %s (%s, %s, %.1fM params)", self.name or self.family, self.model_path,
                    self.device, self.dtype, sum(p.numel() for p in self.model.parameters()) / 1e6)

    def _load_processor(self) -> Any:
        """Everything of a checkpoint but its weights, offline: its config (the family checked),
        processor, tokenizer (left padding, a pad token) and context length; returns the config.
        Why apart from ``_load``: an outside engine that runs the weights itself still renders
        prompts with this (``HFBaseInterface(config, load_weights=False)``, used by the vLLM
        interface)."""
        from transformers import AutoConfig, AutoProcessor

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
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        text_cfg = hf_config.get_text_config()
        self.max_context: Optional[int] = getattr(text_cfg, "max_position_embeddings", None)
        if self.config.get("max_context_tokens"):  # a tighter limit (long-context quality, memory)
            self.max_context = int(self.config["max_context_tokens"])
        return hf_config

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
