"""Model registry: ``get_model(name, config) -> (interface, preprocessor)``.

An interface module registers a factory with ``@register_model("name")``; the factory takes
the config dict (``model_name``, ``model_type``, ``half_evaluation``, ``device``,
``inference_method``, ...) and returns ``(interface, preprocessor)``.

``redact(config)`` masks API keys and other credentials before a config reaches a file, a
log or the run identity (see ``utils.secrets``).
"""
from __future__ import annotations

if not __name__.startswith("reform_eval."):  # this folder reached under its short name: one copy only
    from reform_eval import refuse_short_name
    refuse_short_name(__name__)

import importlib
import math
import os
from typing import Any, Callable, Dict, Optional, Tuple

from .hub_cache import HubSnapshot, hub_cache_dir, hub_snapshot, in_hub_cache, is_path_like
from .registry_sources import family_modules, tiny_builder_modules
from .tiny import TRAINED_NAME, builtin_checkpoint
from ..utils.errors import ReformError, did_you_mean, missing_path, unknown_name
from ..utils.inputs import plain_data_problem
from ..utils.invocation import command_for
from ..utils.secrets import split_url_secrets

MODELS: Dict[str, Callable[[Dict[str, Any]], Tuple[Any, Callable]]] = {}

#: adding a family is one new ``models/interfaces/<x>_interface.py`` with a ``@register_model``
#: line. A family's module is imported when that family is first asked for, never the others:
#: the Hugging Face families import torch and transformers, which a baseline or an API run
#: must not pay for (issue 24: every start loaded the whole stack). The names each module
#: registers are read from its source text (``models.registry_sources``: every spelling
#: ``register_model`` accepts), so listing and validating names imports nothing.
_loaded = False

#: secrets never leave memory: ``redact(config)`` before a config reaches a file, a log or
#: the run identity (imported here, apart from the imports above, as the package's public API)
from ..utils.secrets import redact, redact_text, register_secret  # noqa: E402,F401


def register_model(name: str):
    """Register a factory ``config -> (interface, preprocessor)`` under ``name``."""
    def deco(factory):
        MODELS[name] = factory
        if isinstance(factory, type):
            factory.name = name
        return factory
    return deco


def _family_modules() -> Dict[str, str]:
    """Registered name -> the interface module that registers it (from the modules' text)."""
    return family_modules()


def _load(name: str) -> None:
    """Import the module that registers family ``name`` (unknown names are left to the caller)."""
    if name not in MODELS and name in _family_modules():
        importlib.import_module(_family_modules()[name])


def load_all() -> None:
    """Import every family's module (tools that walk the whole zoo: tests, ``--model vllm``
    finding the family that renders a checkpoint's prompts)."""
    global _loaded
    if _loaded:
        return
    for module in sorted(set(_family_modules().values()) | set(tiny_builder_modules().values())):
        importlib.import_module(module)
    _loaded = True


_load_all = load_all  # (the name the tests use)


def available_models() -> list:
    return sorted(set(MODELS) | set(_family_modules()))


#: config keys run_eval itself sets (never ``--model_option`` keys), each with how a user sets
#: it instead; every flag named here exists in ``run_eval.py --help`` (tested)
RUN_CONFIG_KEYS: Dict[str, str] = {
    "model_name": "use --model_name",
    "model_type": "use --model_type",
    "half_evaluation": "use --half_evaluation",
    "inference_method": "use --infer_method",
    "seed": "use --seed",
    "batch_size": "use --per_gpu_eval_batch_size",
    "device": ("run_eval places each rank on its own GPU, or on the CPU when no GPU is visible; to run on "
               "the CPU, hide the GPUs (CUDA_VISIBLE_DEVICES= {run_eval} ...); to spread a model "
               "over devices, use --model_option device_map=auto or gpus_per_rank=K"),
}


def model_option_names(name: str) -> Tuple[str, ...]:
    """Every ``--model_option`` key the family ``name`` reads (collected over its class hierarchy)."""
    _load(name)
    if name not in MODELS:
        raise unknown_name("model", name, available_models())
    names: set = set()
    for cls in getattr(MODELS[name], "__mro__", ()):
        names.update(getattr(cls, "option_names", ()) if "option_names" in vars(cls) else ())
    return tuple(sorted(names - set(getattr(MODELS[name], "refused_options", {}))))


#: the dtype names ``--model_option dtype=`` takes (``models.hf_loading`` maps them to torch dtypes;
#: a test keeps the two equal, so the registry stays light to import)
DTYPE_NAMES: Tuple[str, ...] = ("float32", "fp32", "float16", "fp16", "half", "bfloat16", "bf16")


def _dtype_names() -> Tuple[str, ...]:
    return DTYPE_NAMES


def _is_int(v: Any, low: int, high: int = 4096) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _is_number(v: Any, low: float, high: float) -> bool:
    """A finite number in [low, high] (nan and inf fail every comparison or the upper bound)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and low <= v <= high


#: the upper bounds of the numeric options: no option is unbounded, because a number past any
#: sensible value (``timeout=1e12``) reaches a system call or a float conversion far from here
#: and ends there as an internal error (OverflowError), not at the option check
DAY_S = 86400
MAX_TOKENS_OPTION = 10 ** 7  # tokens of one answer or context (the largest contexts are ~10^6)
MAX_BUDGET_TOKENS = 10 ** 15  # a run's token budget
MAX_WORKERS = 4096  # requests in flight, processes, GPUs


def _whole(low: int, high: int, none_ok: bool = False) -> Tuple[Callable[[Any], bool], str]:
    return (lambda v: (none_ok and v is None) or _is_int(v, low, high)), f"a whole number >= {low} and <= {high}"


def _seconds(low: float, high: float, above: bool = False) -> Tuple[Callable[[Any], bool], str]:
    return ((lambda v: _is_number(v, low, high) and (not above or v > low)),
            f"a number of seconds {'>' if above else '>='} {low:g} and <= {high:g}")


#: value checks of the shared ``--model_option`` keys: (predicate, what it must be), so a bad
#: value fails before any model is loaded. Every numeric option is bounded here, above and
#: below (the one place: ``check_option_values``), and every interface applies the same checks
#: to the configuration it is given (a Python caller passes no option check)
OPTION_CHECKS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "dtype": (lambda v: str(v).replace("torch.", "") in _dtype_names(), "a dtype name: float32, float16 or bfloat16"),
    "trust_remote_code": (lambda v: isinstance(v, bool), "true or false"),
    "candidate_batch_size": _whole(1, 10 ** 6, none_ok=True),
    "likelihood_strategy": (lambda v: v in ("expand", "packed"), "expand or packed"),
    "tiny_size": (lambda v: v in ("tiny", "bench"), "tiny or bench"),
    "max_new_tokens": _whole(1, MAX_TOKENS_OPTION),
    "max_context_tokens": _whole(1, MAX_TOKENS_OPTION, none_ok=True),
    "max_model_len": _whole(1, MAX_TOKENS_OPTION, none_ok=True),
    "max_images": _whole(1, 10 ** 4),
    "tensor_parallel_size": _whole(1, MAX_WORKERS),
    "gpus_per_rank": _whole(1, MAX_WORKERS),
    "timeout": _seconds(0.001, DAY_S),  # a millisecond: below it no connection can even be made
    "max_retries": _whole(0, 10 ** 4),
    "max_concurrency": _whole(1, MAX_WORKERS),
    "backoff_base": _seconds(0, DAY_S),
    "backoff_max": _seconds(0, DAY_S),
    "base_url": (lambda v: isinstance(v, str) and v.startswith(("http://", "https://")), "an http(s) URL"),
    "image_format": (lambda v: str(v).upper() in ("PNG", "JPEG", "JPG", "WEBP"), "PNG, JPEG (or JPG) or WEBP"),
    "extra_body": (lambda v: isinstance(v, dict) and plain_data_problem(v, json_only=True) is None,
                   "a mapping of JSON values (text keys, finite numbers, no recursive alias), e.g. {top_k: 20}"),
    "system_msg": (lambda v: isinstance(v, str), "text"),
    "response_prefix": (lambda v: v is None or isinstance(v, str), "text"),
    "preprocessor": (lambda v: v in ("conv", "chat_template"), "conv or chat_template"),
    "roles": (lambda v: (isinstance(v, str) and v.count(",") == 1) or (isinstance(v, (list, tuple)) and len(v) == 2),
              "two role names, e.g. roles=Question,Answer"),
    "adaptive_concurrency": (lambda v: isinstance(v, bool), "true or false"),
    "max_total_tokens": _whole(1, MAX_BUDGET_TOKENS),
    "prompt_price": (lambda v: _is_number(v, 0, 10 ** 6), "a number >= 0 and <= 1000000 (per million tokens)"),
    "completion_price": (lambda v: _is_number(v, 0, 10 ** 6), "a number >= 0 and <= 1000000 (per million tokens)"),
}


def check_option_values(options: Dict[str, Any]) -> None:
    """The value of every known key of ``options`` against ``OPTION_CHECKS``: one line naming
    the option, or nothing."""
    for key, value in options.items():
        if key in OPTION_CHECKS and not OPTION_CHECKS[key][0](value):
            problem = plain_data_problem(value, json_only=key == "extra_body")
            got = f"it holds {problem}" if problem else f"got {value!r}"[:300]
            raise ReformError(f"--model_option {key}: must be {OPTION_CHECKS[key][1]}, {got}")


def identity_env(name: str) -> Dict[str, Optional[str]]:
    """Values of the environment variables that decide the outputs of family ``name`` (an API's
    model id and endpoint), for the run identity."""
    _load(name)
    names = getattr(MODELS.get(name), "identity_env", ()) or ()
    out: Dict[str, Optional[str]] = {}
    for n in names:
        value = os.environ.get(n)
        # an endpoint joins the identity without the credentials inside it (a new key is the same run)
        out[n] = split_url_secrets(value)[0] if value and n.upper().endswith("URL") else value
    return out


def builtin_checkpoint_dir(name: str, model_name: Optional[str], options: Dict[str, Any]) -> Optional[str]:
    """The directory a built-in checkpoint name (``tiny``, ``tiny-trained``) stands for with
    model ``name`` (built or trained on first use), or None for any other name or a family
    without such checkpoints (the run identity fingerprints it: evaluation.plan)."""
    _load(name)
    family = getattr(MODELS.get(name), "family", None)
    if not family:
        return None
    return builtin_checkpoint(family, model_name, options)


#: families whose ``--model_name`` is no checkpoint (a served model id, or nothing at all); every
#: other family loads a checkpoint folder (a test keeps this equal to the families without a
#: ``family`` attribute, so the check below needs no import of a family's module)
NON_CHECKPOINT_FAMILIES: Tuple[str, ...] = ("constant", "openai_api", "random", "reference")
#: the checkpoint names built here (``models.tiny``): random weights for every family, and the
#: known-skill LLaVA
BUILTIN_NAMES: Tuple[str, ...] = ("tiny", TRAINED_NAME)


def check_checkpoint_name(name: str, model_name: Optional[str]) -> None:
    """``--model_name`` of a checkpoint family is a built-in name, an existing folder or a hub id
    in the local HF cache; anything else is refused in one line that says which, names the close
    built-in name and how a hub checkpoint gets into the cache. Looks at the file system only (no
    torch, no network), so a typo is told within a second, before anything is written."""
    if not model_name or name in NON_CHECKPOINT_FAMILIES or name not in available_models():
        return
    text = str(model_name)
    if text in BUILTIN_NAMES:
        return
    if is_path_like(text):
        if not os.path.isdir(os.path.expanduser(text)):
            raise missing_path(os.path.expanduser(text), f"checkpoint folder (--model {name} --model_name)",
                               hint="give a checkpoint folder, an HF id in the local cache, or " + " or ".join(
                                   BUILTIN_NAMES))
        return
    if in_hub_cache(text):
        return
    hub_id = text if "/" in text else "ORG/NAME"
    raise ReformError(
        f"model {name}: --model_name '{text}' is neither a local checkpoint folder nor in the Hugging Face cache "
        f"({hub_cache_dir()}){did_you_mean(text, BUILTIN_NAMES)}; built-in names: tiny (random weights), "
        f"{TRAINED_NAME} (the known-skill LLaVA); a hub checkpoint: `huggingface-cli download {hub_id}` on a machine "
        "with network, then run with HF_HUB_OFFLINE=1 (docs/models.md)")


def needs_image(name: str) -> bool:
    """Whether family ``name`` cannot run without an image (``--image_ablation none`` then
    gives it a blank image: ``build.ablation``)."""
    _load(name)
    if name not in MODELS:
        raise unknown_name("model", name, available_models())
    return bool(getattr(MODELS[name], "needs_image", False))


def checkpoint_source(name: str, model_name: Optional[str]) -> Optional[HubSnapshot]:
    """The hub snapshot that ``model_name`` (an ``org/model`` id of a Hugging Face family, not a
    local folder) resolves to in the offline cache, or None (``models.hub_cache``): the run
    identity fingerprints its folder and the run info records its commit."""
    _load(name)
    if not getattr(MODELS.get(name), "family", None) or not model_name:
        return None
    return hub_snapshot(str(model_name))


#: the run_eval flag of each run-level model setting
RUN_FLAG_NAMES = {"model_name": "--model_name", "model_type": "--model_type", "half_evaluation": "--half_evaluation"}


def check_run_flags(name: str, given: Dict[str, Any]) -> None:
    """Run-level settings (``--model_name``, ``--model_type``, ``--half_evaluation``) that family
    ``name`` does not read are refused, not ignored (they would change the run identity and
    nothing else); likelihood is refused for a family that cannot score candidates."""
    _load(name)
    if name not in MODELS:
        raise unknown_name("model", name, available_models())
    cls = MODELS[name]
    honoured = getattr(cls, "run_flags", tuple(RUN_FLAG_NAMES))
    for key, value in given.items():
        if key == "inference_method":
            if value == "likelihood" and not getattr(cls, "supports_likelihood", True):
                raise ReformError(f"--infer_method likelihood: model '{name}' cannot score candidates "
                                  "(use --infer_method generation)")
        elif value not in (None, False, "") and key not in honoured:
            raise ReformError(f"{RUN_FLAG_NAMES[key]}: not used by model '{name}'"
                              + (f" (it reads {', '.join(RUN_FLAG_NAMES[k] for k in honoured)})" if honoured else ""))


def check_installed(name: str) -> None:
    """The engine family ``name`` runs on is importable here (its ``check_installed``), so a
    missing engine is one line before any work, not an import error after the data is built."""
    _load(name)
    hook = getattr(MODELS.get(name), "check_installed", None)
    if callable(hook):
        hook()


def check_model_options(name: str, options: Dict[str, Any]) -> None:
    """Unknown ``--model_option`` keys (``dtyp=bfloat16``) are errors that list the valid keys;
    values of the shared keys are checked (``OPTION_CHECKS``) before anything is loaded."""
    run_keys = sorted(k for k in options if k in RUN_CONFIG_KEYS)
    if run_keys:
        raise ReformError(f"--model_option {run_keys[0]}: set by run_eval itself, not a model option; "
                          f"{RUN_CONFIG_KEYS[run_keys[0]].format(run_eval=command_for('run_eval'))}")
    _load(name)
    if name not in MODELS:
        raise unknown_name("model", name, available_models())
    refused = getattr(MODELS[name], "refused_options", {})  # a family names the shared keys it cannot honour
    for key in sorted(k for k in options if k in refused):
        raise ReformError(f"--model_option {key}: not used by model '{name}' ({refused[key]})")
    valid = set(model_option_names(name))
    unknown = sorted(k for k in options if k not in valid)
    if unknown:
        raise ReformError(f"--model_option: unknown option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(repr(k) for k in unknown)} for model '{name}'; valid options: "
                          f"{', '.join(model_option_names(name))}")
    check_option_values(options)


def runs_on_device(name: str) -> bool:
    """Whether family ``name`` computes on a torch device (False: baselines, endpoints)."""
    _load(name)
    return bool(getattr(MODELS.get(name), "runs_on_device", True))


def get_model(name: str, config: Optional[Dict[str, Any]] = None) -> Tuple[Any, Callable]:
    """Instantiate the interface registered as ``name`` and its preprocessor."""
    _load(name)
    if name not in MODELS:
        raise unknown_name("model", name, available_models())
    factory = MODELS[name]
    cfg = dict(config or {})
    if isinstance(factory, type):
        interface = factory(cfg)
        interface.name = name
        interface.preprocessor = interface.make_preprocessor(cfg)  # its system line is provenance
        return interface, interface.preprocessor
    return factory(cfg)
