"""Registry of dataset builders and the Builder base class.

A benchmark is one module that subclasses ``Builder`` and decorates it with
``@register_builder("Name")``; ``build/__init__.py`` imports the modules once.
"""
from __future__ import annotations

import os
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type

import yaml

from ..utils.schema import FORMULATIONS
from ..utils.errors import ReformError, did_you_mean, input_error, missing_path, unknown_name
from ..utils.inputs import MAX_DEPTH, check_name, check_value, read_text
from .. import configs

BUILDERS: Dict[str, Type["Builder"]] = {}


def register_builder(name: str):
    """Class decorator: make a Builder available as ``--dataset_name name``."""
    def deco(cls: Type["Builder"]) -> Type["Builder"]:
        if name in BUILDERS and BUILDERS[name] is not cls:
            raise ReformError(f"dataset builder '{name}' registered twice")
        cls.name = name
        BUILDERS[name] = cls
        return cls
    return deco


def get_builder_class(name: str) -> Type["Builder"]:
    """The builder class registered as ``name`` (case-insensitive fallback)."""
    if name in BUILDERS:
        return BUILDERS[name]
    lowered = {k.lower(): v for k, v in BUILDERS.items()}
    if str(name).lower() in lowered:
        return lowered[str(name).lower()]
    raise unknown_name("dataset", name, BUILDERS)


def canonical_benchmark(name: Any) -> Optional[str]:
    """The registered spelling of a benchmark's name, matched case-insensitively ("mme" -> "MME");
    None for a name no builder registers (another harness's benchmark)."""
    lowered = {k.lower(): k for k in BUILDERS}
    return lowered.get(str(name).lower())


def shipped_config_dir() -> str:
    """``configs/datasets`` of this installation (package data with ``pip install .``)."""
    return os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), "datasets")


def shipped_configs() -> Dict[str, str]:
    """Name -> path of every dataset config shipped with the project."""
    d = shipped_config_dir()
    if not os.path.isdir(d):
        return {}
    return {n[:-5]: os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".yaml")}


def resolve_config(value: Optional[str], dataset_name: Optional[str] = None) -> Optional[str]:
    """A ``--dataset_config`` value -> a file: an existing path, or the name of a shipped config
    (``iwisdm_high``), from any directory. A builder that needs a config says so when none is given."""
    if value is None:
        return None
    if os.path.isfile(value):
        return value
    shipped = shipped_configs()
    name = os.path.basename(value)[:-5] if value.endswith(".yaml") else value
    if os.sep not in value and name in shipped:
        return shipped[name]
    if os.path.exists(value):
        raise input_error("dataset config is not a file", file=value)
    if os.sep in value:
        raise missing_path(value, "dataset config")
    raise ReformError(f"dataset config '{value}': neither a file nor a shipped config{did_you_mean(name, shipped)}; "
                      f"shipped configs: {', '.join(sorted(shipped))}")


def read_dataset_config(value: Optional[str], dataset_name: str) -> Tuple[Optional[str], Dict[str, Any]]:
    """(path, content) of a ``--dataset_config`` value, its keys and values checked by the builder
    of ``dataset_name``: cheap (one YAML file), so a typo is told before anything heavy happens."""
    path = resolve_config(value, dataset_name)
    content, _ = load_config(path)
    cls = get_builder_class(dataset_name)
    cls.check_option_names(content, path or "<dataset config>")
    cls.check_option_values(content, path or "<dataset config>")
    return path, content


def load_config(path: Optional[str]) -> Tuple[Dict[str, Any], Optional[str]]:
    """Read a YAML dataset config; returns (config, absolute path)."""
    if path is None:
        return {}, None
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise input_error("dataset config file not found", file=path)
    text = read_text(check_name(path, "dataset config"), "dataset config")
    try:
        cfg = yaml.load(text, Loader=_StrictLoader) or {}  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise input_error(f"invalid YAML ({' '.join(str(e).split())})", file=path) from None
    except RecursionError:
        raise input_error("invalid YAML (recursive alias or nesting too deep)", file=path) from None
    try:
        _check_acyclic(cfg, path)
    except RecursionError:
        raise input_error(f"invalid YAML (nested more than {MAX_DEPTH} levels)", file=path) from None
    check_value(cfg, path, max_depth=MAX_DEPTH, finite=False)
    if not isinstance(cfg, dict):
        raise input_error("a dataset config must be a mapping of options", file=path)
    return cfg, path


def is_flag(v: Any) -> bool:
    return isinstance(v, bool)


def is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def is_path(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def is_paths(v: Any) -> bool:
    return is_path(v) or (isinstance(v, list) and bool(v) and all(is_path(x) for x in v))


def caller_paths_absolute(cls: Any, options: Dict[str, Any]) -> Dict[str, Any]:
    """Path options given by the caller (``--dataset_option`` on the command line, keyword
    arguments of ``load_reform_dataset``) are read from the current directory, as anything
    typed is; paths inside a dataset config stay relative to the config file."""
    out = dict(options)
    for key, value in options.items():
        predicate = cls.option_specs.get(key, (None, ""))[0]
        if predicate in (is_path, is_paths) and isinstance(value, str) and value:
            out[key] = os.path.abspath(os.path.expanduser(value))
        elif predicate is is_paths and isinstance(value, list):
            out[key] = [os.path.abspath(os.path.expanduser(v)) if isinstance(v, str) and v else v for v in value]
    return out


def options_by_content(cls: Any, options: Dict[str, Any]) -> Dict[str, Any]:
    """The options as a run's identity sees them: a path option's value is where the data lies,
    not what it is (its samples and images are in the data fingerprint), so the same data in
    another folder is the same run."""
    out = dict(options)
    for key in options:
        if cls.option_specs.get(key, (None, ""))[0] in (is_path, is_paths):
            out[key] = "<path: by content>"
    return out


def one_of(*values: Any) -> Tuple[Any, str]:
    return (lambda v: v in values), "one of " + ", ".join(map(str, values))


FLAG = (is_flag, "true or false")
COUNT = (is_count, "a whole number >= 1")
PATH = (is_path, "a path")


#: most values a dataset config may expand to (aliases counted each time they are used)
MAX_CONFIG_VALUES = 100_000


def _check_acyclic(obj: Any, path: str) -> None:
    """A YAML recursive alias (``&a [*a]``) loads as a self-containing object, and nested aliases
    (a "billion laughs" file) expand exponentially: refuse both. Each object is walked once."""
    sizes: Dict[int, int] = {}
    stack: set = set()

    def size(o: Any) -> int:
        if not isinstance(o, (dict, list)):
            return 1
        if id(o) in stack:
            raise input_error("invalid YAML (recursive alias)", file=path)
        if id(o) not in sizes:
            stack.add(id(o))
            n = 1 + sum(size(v) for v in (o.values() if isinstance(o, dict) else o))
            stack.discard(id(o))
            sizes[id(o)] = n
            if n > MAX_CONFIG_VALUES:
                raise input_error(f"invalid YAML (expands to more than {MAX_CONFIG_VALUES} values through "
                                  "aliases)", file=path)
        return sizes[id(o)]
    size(obj)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (the last would win silently)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key) if isinstance(key, (str, int, float, bool)) else None
        return super().construct_mapping(node, deep=deep)


class Builder:
    """Base class for benchmark builders.

    Subclasses implement ``build_items``; the returned *base items* are dicts with
    ``sample_id``, ``images``, ``question``, ``answer``, ``meta`` and, per formulation,
    ``answer_options`` (SingleChoice) or optional ``candidates``/``answer_index``
    (Generation scored by likelihood). An item may fix ``instruct`` or give its own
    ``instruction_pool``; it may carry ``history``.
    """

    name: ClassVar[str] = ""
    formulations: ClassVar[Tuple[str, ...]] = FORMULATIONS
    #: metric used by default for each formulation (None: the generic one)
    default_metric: ClassVar[Dict[str, str]] = {}
    #: every config key the builder reads; anything else is an error that lists these
    #: (None: not declared, unchecked; every built-in builder declares its keys)
    option_names: ClassVar[Optional[Tuple[str, ...]]] = None
    #: value checks: key -> (predicate, what the value must be); a failing value is one line
    #: naming the config file (or --dataset_option) and the key, before anything is built
    option_specs: ClassVar[Dict[str, Tuple[Any, str]]] = {}

    def __init__(self, config: Optional[Dict[str, Any]] = None, config_path: Optional[str] = None,
                 **options: Any) -> None:
        self.check_option_names(config or {}, config_path or "<dataset config>")
        self.check_option_names(options, "--dataset_option")
        self.check_option_values(config or {}, config_path or "<dataset config>")
        self.check_option_values({k: v for k, v in options.items() if v is not None}, "--dataset_option")
        self.config: Dict[str, Any] = dict(config or {})
        self.config.update({k: v for k, v in options.items() if v is not None})
        self.config_path = config_path
        #: human-readable notes about the build (irregularities, skipped items); logged by run_eval
        self.build_log: List[str] = []

    #: facts of the build the samples do not hold (``build_dataset`` sets "image_ablation"); unset
    #: until then
    build_info: Dict[str, Any]

    @classmethod
    def check_option_names(cls, options: Dict[str, Any], where: str) -> None:
        """Unknown keys (a typo such as ``n_trial``) are errors, never silently ignored."""
        if cls.option_names is None:
            return
        unknown = sorted(str(k) for k in options if k not in cls.option_names)
        if unknown:
            owners = [b.name for b in BUILDERS.values() if b is not cls and b.option_names
                      and all(k in b.option_names for k in options)]
            if owners and where != "--dataset_option":
                raise ReformError(f"{where}: this is a {owners[0]} dataset config, not one for {cls.name} "
                                  f"(options {', '.join(repr(u) for u in unknown)} are {owners[0]}'s); pass a "
                                  f"{cls.name} config to --dataset_config")
            raise ReformError(f"{where}: unknown {cls.name} option{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(repr(u) for u in unknown)}; valid options: "
                              f"{', '.join(sorted(cls.option_names))}")

    @classmethod
    def check_option_values(cls, options: Dict[str, Any], where: str) -> None:
        for key, value in options.items():
            spec = cls.option_specs.get(key)
            if spec is not None and value is not None and not spec[0](value):
                raise input_error(f"must be {spec[1]}, got {value!r}", file=where, field=key)

    def subsample_key(self, item: Dict[str, Any]) -> str:
        """The unit ``--dataset_subsample`` draws: a whole group (an MME image with both of its
        questions, an MMMT-IF chat with all turns), so the benchmark's structure survives."""
        return self.group_key(item)

    def resolve_path(self, value: str) -> str:
        """Paths in configs are relative to the config file, or absolute."""
        value = os.path.expanduser(str(value))
        if os.path.isabs(value) or self.config_path is None:
            return os.path.abspath(value)
        return os.path.normpath(os.path.join(os.path.dirname(self.config_path), value))

    def require(self, key: str) -> Any:
        """A config value that must be present."""
        if key not in self.config or self.config[key] is None:
            if self.config_path is None:
                mine = [n for n in shipped_configs() if n.replace("_", "").startswith(
                    self.name.lower().replace("-", "").replace("_", ""))]
                raise ReformError(f"--dataset_config is missing: the {self.name} builder needs option '{key}' "
                                  f"from a dataset config (a YAML path, or a shipped name: "
                                  f"{', '.join(mine) or ', '.join(shipped_configs())})")
            raise input_error(f"the {self.name} builder needs option '{key}'", file=self.config_path, field=key)
        return self.config[key]

    def check_inputs(self) -> None:
        """The files and folders this build reads, where given, exist. The run's validation calls
        it before anything heavy is imported or written (a mistyped data path is told at once),
        and the build meets the same check with the same message (one hint per missing thing); a
        key not given at all is left to the build (``require`` says which config it needs)."""

    def build_items(self, formulation: str, inference_method: str, seed: int) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def instruction_pool(self, formulation: str, inference_method: str) -> Optional[List[str]]:
        """Benchmark-specific instruction phrasings (None: the generic pool)."""
        return None

    def in_context_example(self, formulation: str) -> Optional[Dict[str, Any]]:
        """Benchmark-specific one-shot example (None: the generic one)."""
        return None

    def group_key(self, sample: Dict[str, Any]) -> str:
        """Unit of sharding: samples with one key run in order on one rank (e.g. a chat)."""
        return str(sample["sample_id"])
