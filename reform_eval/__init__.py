"""reform-lmm-eval: does this vision-language model follow instructions? (the one import package)

    from reform_eval import load_reform_dataset, evaluate, score, RunConfig

Its subpackages are the repository's top-level folders (``build``, ``models``, ``metrics``,
``utils``, ``evaluation``, ``configs``): a wheel installs them under this package
(``setup.py``'s ``package_dir``), and in a clone or an editable install this file puts the
repository's root on the package's path, so ``reform_eval.utils`` is ``<clone>/utils``. Nothing
is installed, or imported, under those short names (docs/architecture.md, "One package").
The names below load on first use, so ``import reform_eval`` stays instant.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_HERE, "utils")):  # a clone (or editable install): the root holds them
    __path__.append(os.path.dirname(_HERE))  # noqa: F821  (set by the import system)

_LAZY = {"load_reform_dataset": "reform_eval.build", "build_dataset": "reform_eval.build",
         "get_model": "reform_eval.models",
         "evaluate": "reform_eval.evaluation", "score": "reform_eval.evaluation",
         "RunConfig": "reform_eval.evaluation", "ModelConfig": "reform_eval.evaluation",
         "DatasetConfig": "reform_eval.evaluation", "GenerationConfig": "reform_eval.evaluation",
         "ScoringConfig": "reform_eval.evaluation", "OutputConfig": "reform_eval.evaluation"}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """The library API on first use (PEP 562): importing the package imports nothing heavy."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'reform_eval' has no attribute {name!r}")
