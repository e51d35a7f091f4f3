"""How to start one of the two command lines the way this process was started: hints name the
command the user actually typed (issue 32).

``run_eval`` (the console script) -> ``run_loader_eval``; ``python run_eval.py`` in a clone ->
``python run_loader_eval.py`` (the folder as typed); ``python -m reform_eval.run_eval`` ->
``python -m reform_eval.run_loader_eval``; anything else (a notebook, a test) -> the ``-m`` form,
which works wherever the package imports.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

#: the project's command lines
TOOLS = ("run_eval", "run_loader_eval")


def command_for(tool: str, argv0: Optional[str] = None) -> str:
    """The command that starts ``tool`` (one of ``TOOLS``) as this process's own was started."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    folder, base = os.path.split(argv0 or "")
    if base in TOOLS:  # a console script (pip install)
        return tool
    if base.endswith(".py") and base[:-3] in TOOLS:
        if os.path.isfile(os.path.join(folder or ".", "__init__.py")):  # the package's module: python -m
            return f"python -m reform_eval.{tool}"
        return f"python {os.path.join(folder, tool + '.py')}"  # a clone's script, the folder as typed
    return f"python -m reform_eval.{tool}"
