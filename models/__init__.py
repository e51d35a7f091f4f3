"""Model registry: ``get_model(name, config) -> (interface, preprocessor)``.

An interface module registers a factory with ``@register_model("name")``; the factory takes
the config dict (``model_name``, ``model_type``, ``half_evaluation``, ``device``,
``inference_method``, ...) and returns ``(interface, preprocessor)``.

``redact(config)`` masks API keys and other credentials before a config reaches a file, a
log or the run identity (see ``models.redaction``).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Optional, Tuple

from utils.errors import unknown_name

MODELS: Dict[str, Callable[[Dict[str, Any]], Tuple[Any, Callable]]] = {}

#: every ``models/interfaces/*_interface.py`` is imported at first use, so adding a family
#: is one new file with a ``@register_model`` line.

_loaded = False

#: secrets never leave memory: ``redact(config)`` before a config reaches a file, a log or
#: the run identity (imported here, apart from the imports above, as the package's public API)
from models.redaction import redact, redact_text, register_secret  # noqa: E402,F401


def register_model(name: str):
    """Register a factory ``config -> (interface, preprocessor)`` under ``name``."""
    def deco(factory):
        MODELS[name] = factory
        if isinstance(factory, type):
            factory.name = name
        return factory
    return deco


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    import pkgutil
    import models.interfaces as pkg
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.endswith("_interface") and info.name != "base_interface":
            importlib.import_module(f"models.interfaces.{info.name}")
    _loaded = True


def available_models() -> list:
    _load_all()
    return sorted(MODELS)


def get_model(name: str, config: Optional[Dict[str, Any]] = None) -> Tuple[Any, Callable]:
    """Instantiate the interface registered as ``name`` and its preprocessor."""
    _load_all()
    if name not in MODELS:
        raise unknown_name("model", name, MODELS)
    factory = MODELS[name]
    cfg = dict(config or {})
    if isinstance(factory, type):
        interface = factory(cfg)
        interface.name = name
        return interface, interface.make_preprocessor(cfg)
    return factory(cfg)
