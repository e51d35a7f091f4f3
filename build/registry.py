"""Registry of dataset builders and the Builder base class.

A benchmark is one module that subclasses ``Builder`` and decorates it with
``@register_builder("Name")``; ``build/__init__.py`` imports the modules once.
"""
from __future__ import annotations

import os
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type

import yaml

from build.schema import FORMULATIONS
from utils.errors import ReformError, input_error, unknown_name

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


def load_config(path: Optional[str]) -> Tuple[Dict[str, Any], Optional[str]]:
    """Read a YAML dataset config; returns (config, absolute path)."""
    if path is None:
        return {}, None
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise input_error("dataset config file not found", file=path)
    with open(path, "r", encoding="utf-8") as f:
        try:
            cfg = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise input_error(f"invalid YAML ({e})", file=path) from None
    if not isinstance(cfg, dict):
        raise input_error("a dataset config must be a mapping of options", file=path)
    return cfg, path


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

    def __init__(self, config: Optional[Dict[str, Any]] = None, config_path: Optional[str] = None,
                 **options: Any) -> None:
        self.config: Dict[str, Any] = dict(config or {})
        self.config.update({k: v for k, v in options.items() if v is not None})
        self.config_path = config_path
        #: human-readable notes about the build (irregularities, skipped items); logged by run_eval
        self.build_log: List[str] = []

    def resolve_path(self, value: str) -> str:
        """Paths in configs are relative to the config file, or absolute."""
        value = os.path.expanduser(str(value))
        if os.path.isabs(value) or self.config_path is None:
            return os.path.abspath(value)
        return os.path.normpath(os.path.join(os.path.dirname(self.config_path), value))

    def require(self, key: str) -> Any:
        """A config value that must be present."""
        if key not in self.config or self.config[key] is None:
            raise input_error(f"the {self.name} builder needs option '{key}'",
                              file=self.config_path or "<options>", field=key)
        return self.config[key]

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
