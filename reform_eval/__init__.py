"""reform-lmm-eval: does this vision-language model follow instructions? (the one import package)

    from reform_eval import load_reform_dataset, evaluate, score, RunConfig

Its subpackages are the repository's top-level folders (``SUBPACKAGES``): a wheel installs them
under this package (``setup.py``'s ``package_dir``), and in a clone or an editable install a small
finder maps exactly those names to the repository's folders, so ``reform_eval.utils`` is
``<clone>/utils`` with no installation and no PYTHONPATH. Nothing is installed, or importable,
under the short names: a folder imported as ``utils`` refuses (``refuse_short_name``), so no module
is ever loaded twice (docs/architecture.md, "One package"). The names below load on first use, so
``import reform_eval`` stays instant.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Optional, Sequence

#: the repository's folders that are this package's subpackages (setup.py and commands/lint.sh
#: read this list)
SUBPACKAGES = ("build", "models", "metrics", "utils", "evaluation", "configs")

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)


class _CloneFinder(importlib.abc.MetaPathFinder):
    """``reform_eval.<sub>`` -> ``<clone>/<sub>`` for the subpackages only (their own modules are
    found through their ``__path__`` as usual); nothing else of the clone's root joins the package."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        head, _, sub = fullname.partition(".")
        if head != __name__ or sub not in SUBPACKAGES:
            return None
        folder = os.path.join(_ROOT, sub)
        return importlib.util.spec_from_file_location(fullname, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])


if not os.path.isdir(os.path.join(_HERE, "utils")) and \
        not any(isinstance(f, _CloneFinder) for f in sys.meta_path):  # a clone (or an editable install)
    sys.meta_path.insert(0, _CloneFinder())  # before an editable install of another checkout


def refuse_short_name(name: str) -> None:
    """A subpackage's folder imported under its short name (``import utils`` with a clone's root
    on sys.path) would be a second copy of every module, with registries of its own: refused.
    ``python -m build`` typed in a clone's root is PyPA's build, and is handed over to it."""
    if name == "build" and sys.argv[:1] == ["-m"]:
        _run_pypa_build()
    raise ImportError(f"'{name}' here is the harness's subpackage reform_eval.{name}: import it as "
                      f"reform_eval.{name} (the repository's folders are subpackages of reform_eval; "
                      f"docs/architecture.md)")


def _run_pypa_build() -> None:
    """``python -m build`` in a clone's root: run PyPA's build (the working directory, which holds
    this repository's ``build/``, comes first on sys.path), never this package's builders."""
    import runpy

    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != os.path.realpath(_ROOT)]
    for name in [m for m in sys.modules if m == "build" or m.startswith("build.")]:
        del sys.modules[name]
    try:
        runpy.run_module("build", run_name="__main__", alter_sys=True)
    except ImportError as e:
        sys.exit(f"python -m build: PyPA's build is not installed here ({e}); pip install build")
    sys.exit(0)


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
