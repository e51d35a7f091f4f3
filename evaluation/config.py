"""The typed run configuration: built once (from argv or from Python), validated once.

Every flag, ``--model_option``, ``--dataset_option`` and ``--metric_option`` is parsed here
into a typed value; below this module nothing sees argparse or ``KEY=VALUE`` text. A
credential-named option becomes a ``utils.secrets.Secret`` on the way in, so the config can be
printed, logged, hashed and dumped without leaking it.

    cfg = RunConfig.from_argv(["--model", "random", "--dataset_name", "MME", ...])
    cfg = RunConfig(model=ModelConfig("llava", "tiny"), dataset=DatasetConfig("iWISDM"))
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import shlex
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .. import build  # noqa: F401  (registers the builders)
import yaml
from ..build import IMAGE_ABLATIONS, LOAD_DEFAULTS
from ..build.registry import (BUILDERS, caller_paths_absolute, get_builder_class, read_dataset_config,
                                        shipped_configs)
from ..metrics import check_metric_options, metric_for
from ..models import (available_models, check_checkpoint_name, check_installed, check_model_options,
                                check_run_flags)
from ..utils.errors import ReformError, unknown_name
from ..utils.options import metric_options as parse_metric_options
from ..utils.options import parse_kv
from ..utils.schema import FORMULATIONS, INFER_METHODS, OPTION_MARKS
from .cache import default_cache_dir
from .trackers import BACKENDS as TRACKERS
from .trackers import check_installed as check_tracker_installed
from .trackers import check_store as check_tracker_store
from ..utils.secrets import REDACTED, Secret, secret_options
from ..utils.world import name_setting, probe_folder

#: model options that decide where and how fast a model runs, never what it outputs: left out of
#: the run identity, so moving a run to other devices (or a faster endpoint) resumes it
PLACEMENT_OPTIONS = ("device_map", "max_memory", "offload_folder", "gpus_per_rank", "tp_plan", "max_concurrency",
                     "timeout", "max_retries", "backoff_base", "backoff_max", "adaptive_concurrency",
                     "max_total_tokens", "prompt_price", "completion_price")
HISTORY_MODES = ("model", "reference")
CONTEXT_POLICIES = ("error", "truncate_history", "skip")
REDUCTIONS = ("sum", "mean")
MME_PARSES = ("official", "stripped", "vlmevalkit", "word")
#: bounds that keep a typo from asking for a week of work
MAX_DUPLICATION = 1000
MAX_N_BOOT = 100_000


def cache_disabled_by_env() -> bool:
    """``REFORM_NO_CACHE=1`` (or true/yes/on) turns the response cache off; 0/false/empty do not."""
    return os.environ.get("REFORM_NO_CACHE", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class DatasetConfig:
    """Which samples are built, and how they are reformulated."""

    name: str
    formulation: Optional[str] = None          # None: the benchmark's first
    config: Optional[str] = None               # a YAML path or a shipped config name
    options: Dict[str, Any] = field(default_factory=dict)
    duplication: int = LOAD_DEFAULTS["data_duplication"]
    in_context_sample: bool = LOAD_DEFAULTS["in_context_sample"]
    random_instruct: bool = LOAD_DEFAULTS["random_instruct"]
    shuffle_options: bool = LOAD_DEFAULTS["shuffle_options"]
    option_mark: str = LOAD_DEFAULTS["option_mark"]
    subsample: Optional[int] = None
    history: str = "model"
    instructions_at_end: bool = False
    skip_corrupt: bool = False
    save_images: bool = False
    context_policy: str = "error"
    image_ablation: Optional[str] = None       # none | blank | noise | shuffle (build.ablation)


@dataclass(frozen=True)
class ModelConfig:
    """Which model, and the interface options it declared (``--model_option``)."""

    family: str
    name: Optional[str] = None                 # checkpoint: local path, offline HF id, 'tiny'
    type: Optional[str] = None
    options: Dict[str, Any] = field(default_factory=dict)
    half_evaluation: bool = False

    @property
    def label(self) -> str:
        """How records and comparison tables name the model: family, plus checkpoint where given."""
        if not self.name:
            return self.family
        return f"{self.family}:{os.path.basename(str(self.name).rstrip('/')) or self.name}"


@dataclass(frozen=True)
class GenerationConfig:
    """How the model is asked: method, batching, sampling."""

    infer_method: str = "generation"
    batch_size: int = 1
    num_workers: int = 0
    temperature: float = 0.0
    max_new_tokens: Optional[int] = None
    num_samples: int = 1
    seed: int = 0


@dataclass(frozen=True)
class ScoringConfig:
    """How predictions are scored (never part of the run identity)."""

    do_eval: bool = False
    eval_stability: bool = False
    likelihood_reduction: str = "sum"
    metric_options: Dict[str, Any] = field(default_factory=dict)
    export_mme_results: Optional[str] = None
    log_to: Optional[str] = None                  # an experiment tracker: mlflow or wandb


@dataclass(frozen=True)
class OutputConfig:
    output_dir: str = "./output/"
    overwrite: bool = False
    verbose: bool = False
    use_cache: bool = field(default_factory=lambda: not cache_disabled_by_env())
    cache_dir: str = field(default_factory=default_cache_dir)


@dataclass(frozen=True)
class RunConfig:
    """One evaluation run. ``validated()`` returns the checked, normalised copy the engine runs."""

    model: ModelConfig
    dataset: DatasetConfig
    generation: GenerationConfig = GenerationConfig()
    scoring: ScoringConfig = ScoringConfig()
    output: OutputConfig = OutputConfig()

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_argv(cls, argv: Optional[Sequence[str]] = None) -> "RunConfig":
        return cls.from_namespace(build_parser().parse_args(argv))

    @classmethod
    def from_namespace(cls, a: argparse.Namespace) -> "RunConfig":
        dataset_options = parse_kv(a.dataset_option, "--dataset_option")
        for flag, key in (("instructions_at_end", "instructions_at_end"), ("skip_corrupt", "skip_corrupt")):
            if getattr(a, flag):
                dataset_options[key] = True
        metric_options = parse_metric_options(a.metric_option, a.mme_parse, a.strip_reasoning)
        return cls(
            model=ModelConfig(a.model, a.model_name, a.model_type,
                              secret_options(parse_kv(a.model_option, "--model_option")), a.half_evaluation),
            dataset=DatasetConfig(a.dataset_name, a.formulation, a.dataset_config, dataset_options,
                                  a.dataset_duplication, a.in_context_sample, a.random_instruct, a.shuffle_options,
                                  a.option_mark, a.dataset_subsample, a.history, a.instructions_at_end,
                                  a.skip_corrupt, a.save_images, a.context_policy,
                                  image_ablation=a.image_ablation),
            generation=GenerationConfig(a.infer_method, a.per_gpu_eval_batch_size, a.num_workers, a.temperature,
                                        a.max_new_tokens, a.num_samples, a.seed),
            scoring=ScoringConfig(a.do_eval, a.eval_stability, a.likelihood_reduction, metric_options,
                                  a.export_mme_results, a.log_to),
            output=OutputConfig(a.output_dir, a.overwrite, a.verbose,
                                use_cache=not a.no_cache and not cache_disabled_by_env(),
                                cache_dir=a.cache_dir or default_cache_dir()))

    def replace(self, **parts: Any) -> "RunConfig":
        return dataclasses.replace(self, **parts)

    # -- validation --------------------------------------------------------------------------
    def validated(self) -> "RunConfig":
        """Names and values checked before anything is built, loaded or written; the benchmark's
        canonical name and default formulation filled in."""
        for part in (self.model, self.dataset, self.generation, self.scoring, self.output):
            check_field_types(part)
        # credentials become Secrets here too (a Python caller's plain key), at any depth
        m = dataclasses.replace(self.model, options=secret_options(self.model.options))
        d, g = self.dataset, self.generation
        s = dataclasses.replace(self.scoring, metric_options=secret_options(self.scoring.metric_options))
        d = dataclasses.replace(d, options=secret_options(d.options))
        if m.family not in available_models():
            raise unknown_name("model", m.family, available_models())
        cls = get_builder_class(d.name)
        formulation = d.formulation or cls.formulations[0]
        by_lower = {f.lower(): f for f in FORMULATIONS}
        if str(formulation).lower() not in by_lower:
            raise unknown_name("formulation", formulation, FORMULATIONS)
        formulation = by_lower[str(formulation).lower()]
        d = dataclasses.replace(d, name=cls.name, formulation=formulation,
                                options=caller_paths_absolute(cls, d.options), config=d.config)
        _choice("--infer_method", g.infer_method, INFER_METHODS)
        _choice("--option_mark", d.option_mark, OPTION_MARKS)
        _choice("--history", d.history, HISTORY_MODES)
        _choice("--context_policy", d.context_policy, CONTEXT_POLICIES)
        if d.image_ablation is not None:
            _choice("--image_ablation", d.image_ablation, IMAGE_ABLATIONS)
        _choice("--likelihood_reduction", s.likelihood_reduction, REDUCTIONS)
        for flag, value in (("--dataset_duplication", d.duplication), ("--per_gpu_eval_batch_size", g.batch_size),
                            ("--num_samples", g.num_samples), ("--dataset_subsample", d.subsample),
                            ("--max_new_tokens", g.max_new_tokens)):
            _whole(flag, value, 1)
        _whole("--num_workers", g.num_workers, 0)
        _whole("--seed", g.seed, 0)
        if d.duplication > MAX_DUPLICATION:
            raise ReformError(f"--dataset_duplication {d.duplication}: at most {MAX_DUPLICATION} copies of a sample")
        if isinstance(g.temperature, bool) or not isinstance(g.temperature, (int, float)) \
                or not math.isfinite(g.temperature) or not 0 <= g.temperature <= MAX_TEMPERATURE:
            raise ReformError(f"--temperature must be a finite number from 0 to {MAX_TEMPERATURE:g}, got {g.temperature}")
        if s.export_mme_results and cls.name != "MME":
            raise ReformError("--export_mme_results needs --dataset_name MME")
        if g.num_samples > 1 and g.infer_method != "generation":
            raise ReformError("--num_samples > 1 needs --infer_method generation")
        if s.eval_stability and d.duplication < 2:
            raise ReformError("--eval_stability needs --dataset_duplication >= 2: instability is measured across "
                              "duplicates of a sample, and with one copy it would read 0")
        if s.eval_stability and not d.shuffle_options and not d.random_instruct and d.option_mark != "random":
            raise ReformError("--eval_stability with --shuffle_options false and --random_instruct false scores "
                              "identical copies (every duplicate is the same prompt), so instability would read 0 "
                              "by construction; keep option shuffling, random instructions or --option_mark random on")
        out = self.output.output_dir
        if os.path.exists(out) and not os.path.isdir(out):
            raise ReformError(f"{out}: --output_dir exists and is not a directory")
        images = os.path.join(out, "images")
        if d.save_images and os.path.exists(images) and not os.path.isdir(images):
            raise ReformError(f"{images}: --save_images writes images there, and it is a file")
        for flag, key in (("--skip_corrupt", "skip_corrupt"), ("--instructions_at_end", "instructions_at_end")):
            if key in d.options and cls.option_names is not None and key not in cls.option_names:
                raise ReformError(f"{flag} does not apply to {cls.name} (it takes none of that option; valid "
                                  f"options: {', '.join(sorted(cls.option_names))})")
        cls.check_option_names(d.options, "--dataset_option")
        cls.check_option_values(d.options, "--dataset_option")
        # the names and paths a typo hides in (dataset config, data files, checkpoint), told from
        # files alone: before a family's module imports torch, and before anything is written
        config_path, content = read_dataset_config(d.config, cls.name)
        cls(content, config_path and os.path.abspath(config_path), **d.options).check_inputs()
        check_checkpoint_name(m.family, m.name)
        check_metric_options(metric_for(cls.name, formulation), s.metric_options)
        check_model_options(m.family, m.options)
        check_run_flags(m.family, {"model_name": m.name, "model_type": m.type, "half_evaluation": m.half_evaluation,
                                   "inference_method": g.infer_method})
        check_installed(m.family)
        if self.output.use_cache:
            check_writable_dir(self.output.cache_dir, cache_setting(self.output.cache_dir))
        gpus = m.options.get("gpus_per_rank", 1)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ReformError(f"--model_option gpus_per_rank: must be a whole number >= 1, got {gpus!r}")
        if s.export_mme_results:
            check_writable_dir(s.export_mme_results, "--export_mme_results")
        if s.log_to is not None:
            if s.log_to not in TRACKERS:
                raise unknown_name("tracker (--log_to)", s.log_to, TRACKERS)
            if not s.do_eval:
                raise ReformError("--log_to needs --do_eval (a tracker logs the scored results)")
            check_tracker_installed(s.log_to)
        name_setting("--output_dir", self.output.output_dir)
        if self.output.use_cache:  # last: the pure checks above leave nothing behind when they fail
            probe_folder(self.output.cache_dir, cache_setting(self.output.cache_dir))
        if s.log_to is not None and os.environ.get("RANK", "0") == "0":  # rank 0 logs: it alone opens the store
            check_tracker_store(s.log_to)  # the tracker's store, opened as logging will open it, before any work
        return dataclasses.replace(self, model=m, dataset=d, scoring=s)

    # -- views -------------------------------------------------------------------------------
    def model_options_for_identity(self) -> Dict[str, Any]:
        """Model options that change outputs: placement options and credentials left out."""
        return {k: v for k, v in sorted(self.model.options.items())
                if k not in PLACEMENT_OPTIONS and not isinstance(v, Secret)}

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON-ready dict of the whole config, credentials shown as the redaction marker."""
        return _plain(dataclasses.asdict(self))

    def flags(self) -> Dict[str, Any]:
        """The config as the command line's flag names and values (the ``config`` block of results
        files, as it always was); credentials shown as the redaction marker."""
        m, d, g, sc, o = self.model, self.dataset, self.generation, self.scoring, self.output
        return _plain({
            "model": m.family, "model_name": m.name, "model_type": m.type,
            "model_option": [_kv_text(k, v) for k, v in m.options.items()], "half_evaluation": m.half_evaluation,
            "dataset_name": d.name, "formulation": d.formulation, "dataset_config": d.config,
            "dataset_option": [_kv_text(k, v) for k, v in d.options.items()],
            "dataset_duplication": d.duplication, "in_context_sample": d.in_context_sample,
            "random_instruct": d.random_instruct, "shuffle_options": d.shuffle_options, "option_mark": d.option_mark,
            "dataset_subsample": d.subsample, "history": d.history, "instructions_at_end": d.instructions_at_end,
            "skip_corrupt": d.skip_corrupt, "save_images": d.save_images, "context_policy": d.context_policy,
            "image_ablation": d.image_ablation, "infer_method": g.infer_method, "per_gpu_eval_batch_size": g.batch_size, "num_workers": g.num_workers,
            "temperature": g.temperature, "max_new_tokens": g.max_new_tokens, "num_samples": g.num_samples,
            "seed": g.seed, "output_dir": o.output_dir, "overwrite": o.overwrite, "do_eval": sc.do_eval,
            "eval_stability": sc.eval_stability, "likelihood_reduction": sc.likelihood_reduction,
            "metric_option": [_kv_text(k, v) for k, v in sc.metric_options.items()],
            "export_mme_results": sc.export_mme_results, "log_to": sc.log_to, "verbose": o.verbose, "no_cache": not o.use_cache,
            "cache_dir": o.cache_dir})

    def command_line(self, program: str = "run_eval.py") -> str:
        """The command that reproduces this config, rebuilt from the parsed values (never from
        ``sys.argv``, which may hold a credential); credentials appear as the redaction marker."""
        return " ".join(shlex.quote(p) for p in [program, *to_argv(self)])


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def check_field_types(part: Any) -> None:
    """Every field of a config part has its declared type (a config built in Python is checked
    like one parsed from argv: ``shuffle_options="false"`` is an error, not a truthy string)."""
    hints = typing.get_type_hints(type(part))
    for f in dataclasses.fields(part):
        value = getattr(part, f.name)
        if not _type_ok(value, hints[f.name]):
            raise ReformError(f"{type(part).__name__}.{f.name}: expected {_hint_text(hints[f.name])}, "
                              f"got {type(value).__name__} {value!r}")


def _hint_text(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) is typing.Union and args else hint
    name = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}.get(
        base, "a mapping" if typing.get_origin(base) is dict else str(base))
    return name + (" or None" if typing.get_origin(hint) is typing.Union else "")


def _plain(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return REDACTED
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _choice(flag: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise unknown_name(flag.lstrip("-"), value, choices)


#: the upper bound of each whole-number run flag (every number a run takes is bounded: a huge one
#: reached a DataLoader, a loop or a seed far from here and ended there, not at the check)
FLAG_MAXIMUM = {"--per_gpu_eval_batch_size": 10 ** 5, "--num_samples": 1000, "--dataset_subsample": 10 ** 9,
                "--max_new_tokens": 10 ** 7, "--num_workers": 1024, "--seed": 2 ** 63 - 1}
#: the largest --temperature
MAX_TEMPERATURE = 100.0


def _whole(flag: str, value: Any, minimum: int) -> None:
    if value is None:
        return
    maximum = FLAG_MAXIMUM.get(flag)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum \
            or (maximum is not None and value > maximum):
        bound = f">= {minimum} and <= {maximum}" if maximum is not None else f">= {minimum}"
        raise ReformError(f"{flag} must be a whole number {bound}, got {value}")


def cache_setting(path: str) -> str:
    """The setting that chose the response cache folder: ``REFORM_CACHE`` for its default, else
    ``--cache_dir``."""
    return "REFORM_CACHE" if os.environ.get("REFORM_CACHE") and path == default_cache_dir() else "--cache_dir"


def check_writable_dir(path: str, flag: str) -> None:
    """A directory flag that will be written later: refuse a file there, or an unwritable parent."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ReformError(f"{path}: {flag} exists and is not a directory")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ReformError(f"{path}: {flag} cannot be created ({parent} is not a writable directory)")


def _kv_text(key: str, value: Any) -> str:
    """``KEY=VALUE`` that parses back (``parse_kv``) to the same value: a string that YAML would read
    as something else (``'42'``, ``'null'``) is quoted; a credential is the redaction marker."""
    if isinstance(value, Secret):
        return f"{key}={REDACTED}"
    if isinstance(value, str):
        try:
            same = yaml.safe_load(value) == value if value.strip() else True
        except yaml.YAMLError:
            same = False
        if same:
            return f"{key}={value}"
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10 ** 9).strip()
    return f"{key}={text.removesuffix('...').strip()}"


def to_argv(cfg: RunConfig) -> List[str]:
    """The flags of ``cfg`` (defaults omitted); the inverse of ``from_argv``."""
    m, d, g, s, o = cfg.model, cfg.dataset, cfg.generation, cfg.scoring, cfg.output
    out: List[str] = ["--model", m.family]
    for flag, value, default in (("--model_name", m.name, None), ("--model_type", m.type, None),
                                 ("--dataset_name", d.name, None), ("--formulation", d.formulation, None),
                                 ("--dataset_config", d.config, None),
                                 ("--dataset_duplication", d.duplication, 1), ("--option_mark", d.option_mark, "upper"),
                                 ("--dataset_subsample", d.subsample, None), ("--history", d.history, "model"),
                                 ("--context_policy", d.context_policy, "error"),
                                 ("--image_ablation", d.image_ablation, None),
                                 ("--infer_method", g.infer_method, "generation"),
                                 ("--per_gpu_eval_batch_size", g.batch_size, 1), ("--num_workers", g.num_workers, 0),
                                 ("--temperature", g.temperature, 0.0), ("--max_new_tokens", g.max_new_tokens, None),
                                 ("--num_samples", g.num_samples, 1), ("--seed", g.seed, 0),
                                 ("--output_dir", o.output_dir, "./output/"),
                                 ("--likelihood_reduction", s.likelihood_reduction, "sum"),
                                 ("--export_mme_results", s.export_mme_results, None), ("--log_to", s.log_to, None)):
        if value != default:
            out += [flag, str(value)]
    for flag, value, default in (("--in_context_sample", d.in_context_sample, LOAD_DEFAULTS["in_context_sample"]),
                                 ("--random_instruct", d.random_instruct, LOAD_DEFAULTS["random_instruct"]),
                                 ("--shuffle_options", d.shuffle_options, LOAD_DEFAULTS["shuffle_options"])):
        if value != default:
            out += [flag, str(value).lower()]
    for flag, value in (("--half_evaluation", m.half_evaluation), ("--instructions_at_end", d.instructions_at_end),
                        ("--skip_corrupt", d.skip_corrupt), ("--save_images", d.save_images),
                        ("--overwrite", o.overwrite), ("--do_eval", s.do_eval), ("--no_cache", not o.use_cache),
                        ("--eval_stability", s.eval_stability), ("--verbose", o.verbose)):
        if value:
            out.append(flag)
    implied = {"instructions_at_end": d.instructions_at_end, "skip_corrupt": d.skip_corrupt}
    for k, v in d.options.items():
        if not (k in implied and implied[k] and v is True):
            out += ["--dataset_option", _kv_text(k, v)]
    for k, v in m.options.items():
        out += ["--model_option", _kv_text(k, v)]
    for k, v in s.metric_options.items():
        out += ["--metric_option", _kv_text(k, v)]
    return out


# -- the command line -------------------------------------------------------------------------
def str2bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("1", "true", "yes", "y", "on"):
        return True
    if str(v).lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got '{v}'")


class HelpFormatter(argparse.HelpFormatter):
    """Shows each default once, only where the help text does not state it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # (identity: a default of 0 equals False, and is shown)
        if ("default" in text or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or action.option_strings == []):
            return text
        if isinstance(action.default, list) and not action.default:
            return text
        return f"{text} (default: %(default)s)"


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line (and exit 2), like every other input error; --help has the rest.

    A misspelled flag is named first, with the flag it resembles: argparse would otherwise
    report the required flag it hides (``--modle llava``: "--model is required")."""

    _argv: List[str] = []

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> Any:  # type: ignore[override]  # typeshed's overloads; both arguments pass through
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> "typing.NoReturn":
        known = [o for o in self._option_string_actions if o.startswith("--")]
        unknown = [a.split("=", 1)[0] for a in self._argv  # (a prefix of a flag is argparse's abbreviation)
                   if a.startswith("--") and not any(o.startswith(a.split("=", 1)[0]) for o in known)]
        if unknown and ("required" in message or "unrecognized" in message):
            hints = [f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u, known, n=1, cutoff=0.75))
                     else u for u in unknown]
            message = f"unrecognized arguments: {' '.join(hints)}"
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def add_scoring_flags(group: Any) -> None:
    """The scoring flags both command lines take (one declaration, one help text)."""
    group.add_argument("--likelihood_reduction", default="sum", choices=list(REDUCTIONS),
                       help="sum or mean (per token) of candidate log-probabilities")
    group.add_argument("--metric_option", action="append", default=[], metavar="KEY=VALUE",
                       help="metric option (repeatable), e.g. number_words=true for MMMT-IF")
    group.add_argument("--mme_parse", default=None, choices=list(MME_PARSES),
                       help="MME answer parsing rule (default: each file's own harness's rule: official for our "
                            "records, stripped (lmms-eval's parse_pred_ans) for lmms-eval logs, vlmevalkit (its "
                            "YOrN_Extraction) for VLMEvalKit files)")
    group.add_argument("--export_mme_results", default=None, metavar="DIR",
                       help="MME: also write the records in the official eval tool's results format")
    group.add_argument("--log_to", default=None, choices=list(TRACKERS),
                       help="also log the scored run to an experiment tracker (pip install '.[mlflow]' or '.[wandb]'; "
                            "MLFLOW_TRACKING_URI / WANDB_MODE=offline say where)")
    group.add_argument("--strip_reasoning", action="store_true",
                       help="remove <think>...</think> blocks (reasoning models) before scoring; the raw response "
                            "stays in the record")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="run_eval.py", formatter_class=HelpFormatter,
                      description="Evaluate one model on one benchmark: build samples, run the model, merge, score.")
    g = p.add_argument_group("model")
    g.add_argument("--model", required=True, help=f"model family: {', '.join(available_models())}")
    g.add_argument("--model_name", default=None,
                   help="checkpoint: local directory, HF id already in the offline cache, 'tiny' (the random-"
                        "weight test model) or, for --model llava, 'tiny-trained' (the known-skill model trained "
                        "here, docs/models.md); required for Hugging Face families")
    g.add_argument("--model_type", default=None, help="family-specific variant, passed to the interface")
    g.add_argument("--model_option", action="append", default=[], metavar="KEY=VALUE",
                   help="interface option (repeatable; values parsed as YAML), e.g. dtype=bfloat16, "
                        "preprocessor=chat_template, base_url=...; each family lists the options it accepts")
    g.add_argument("--half_evaluation", action="store_true", help="fp16 on GPU (bf16 on CPU)")
    g = p.add_argument_group("data")
    g.add_argument("--dataset_name", required=True, help=f"benchmark (case-insensitive): {', '.join(sorted(BUILDERS))}")
    g.add_argument("--formulation", default=None,
                   help="SingleChoice or Generation, case-insensitive (default: the benchmark's first)")
    g.add_argument("--dataset_config", default=None,
                   help="YAML dataset config: a path, or the name of a shipped one "
                        f"({', '.join(sorted(shipped_configs()))}); paths inside it are relative to the YAML")
    g.add_argument("--dataset_option", action="append", default=[], metavar="KEY=VALUE",
                   help="builder option overriding the config (repeatable; values parsed as YAML; relative paths "
                        "are resolved from the current directory, as on the command line)")
    g.add_argument("--dataset_duplication", type=int, default=LOAD_DEFAULTS["data_duplication"],
                   help="copies of each sample, each with its own option order and phrasing (for instability)")
    g.add_argument("--in_context_sample", type=str2bool, nargs="?", const=True,
                   default=LOAD_DEFAULTS["in_context_sample"],
                   help="prepend a one-shot example exchange showing the answer format (default: off)")
    g.add_argument("--random_instruct", type=str2bool, nargs="?", const=True,
                   default=LOAD_DEFAULTS["random_instruct"],
                   help="draw the instruction phrasing per duplicate from a pool (default: on)")
    g.add_argument("--shuffle_options", type=str2bool, nargs="?", const=True,
                   default=LOAD_DEFAULTS["shuffle_options"],
                   help="seeded option shuffling per duplicate (default: on)")
    g.add_argument("--option_mark", default=LOAD_DEFAULTS["option_mark"], choices=list(OPTION_MARKS),
                   help="option marks: upper (A), lower (a), number (1), random (drawn per duplicate)")
    g.add_argument("--dataset_subsample", type=int, default=None,
                   help="keep a seeded subset of N whole groups: MME images (both questions), MMMT-IF chats "
                        "(all turns), iWISDM trials, custom items (default: all)")
    g.add_argument("--history", default="model", choices=list(HISTORY_MODES),
                   help="multi-turn history: the model's own earlier answers or the reference answers")
    g.add_argument("--instructions_at_end", action="store_true",
                   help="MMMT-IF ablation: repeat all given instructions at the end of the input")
    g.add_argument("--skip_corrupt", action="store_true",
                   help="skip (and count in results) images that cannot be decoded instead of failing "
                        "(custom and MME; MMMT-IF has check_images/skip_bad_chats, iWISDM generates its frames)")
    g.add_argument("--save_images", action="store_true",
                   help="write each sample's in-memory images (iWISDM frames) once under OUTPUT_DIR/images/ and "
                        "record every image's path in the prediction records, for the report's thumbnails")
    g.add_argument("--context_policy", default="error", choices=list(CONTEXT_POLICIES),
                   help="a prompt longer than the model context: fail naming the sample, drop the oldest "
                        "turns (images and instructions kept), or skip the sample (counted in results)")
    g.add_argument("--image_ablation", default=None, choices=list(IMAGE_ABLATIONS),
                   help="what the image adds: remove the images and their placeholders (none), replace each by a "
                        "black (blank) or seeded noise image of its size, or by another sample's image (shuffle, "
                        "seeded by --seed); part of the run identity; a model that needs an image gets the blank "
                        "for none (default: images as given)")
    g = p.add_argument_group("inference")
    g.add_argument("--infer_method", default="generation", choices=list(INFER_METHODS),
                   help="generation (parse the text) or likelihood (score the candidates)")
    g.add_argument("--per_gpu_eval_batch_size", type=int, default=1,
                   help="batch size per process (greedy outputs do not depend on it)")
    g.add_argument("--num_workers", type=int, default=0, help="DataLoader workers that decode images")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples with per-sample seeds")
    g.add_argument("--max_new_tokens", type=int, default=None, help="generation length (default: the family's)")
    g.add_argument("--num_samples", type=int, default=1, help="responses per sample (MMMT-IF PIF-N-K)")
    g.add_argument("--seed", type=int, default=0, help="the one seed for everything")
    g = p.add_argument_group("output and scoring")
    g.add_argument("--output_dir", default="./output/", help="where predictions, results and log.txt go")
    g.add_argument("--overwrite", action="store_true", help="discard an existing prediction file and shards")
    g.add_argument("--do_eval", action="store_true", help="score the merged predictions")
    g.add_argument("--eval_stability", action="store_true",
                   help="report instability (entropy of the chosen option across duplicates)")
    add_scoring_flags(g)
    g.add_argument("--cache_dir", default=None,
                   help="the response cache: model calls keyed by model, prompt, image pixels, candidates, settings "
                        "and seed, so a changed item re-runs only itself (default: $REFORM_CACHE/responses)")
    g.add_argument("--no_cache", action="store_true",
                   help="neither read nor write the response cache (REFORM_NO_CACHE=1 does the same)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="more console output (the INFO log, library logs, loading bars)")
    return p
