"""Which interface module declares which model family and which tiny-checkpoint builder, read
from the modules' source text: nothing is imported to list, validate or find a family.

Why text: a family's module imports torch and transformers, which a baseline or an API run
must not pay for (issue 24), and the registry (``models``) and the tiny builders
(``models.tiny``) both need to know, before any import, which module to import for a name.
Why a regex and not ``ast``: parsing every interface costs ~0.1 s at each start; the regex reads
every spelling the two functions accept for their name (positional or keyword, either quote),
and a call whose name is not a literal string is an error naming its file and line, never a
family silently missing.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Optional, Tuple

from . import interfaces as interfaces_package
from ..utils.errors import ReformError

#: the registering calls and the keyword of their name argument
_CALLS = {"register_model": "name", "register_tiny_builder": "family"}
_SITE = {fn: re.compile(rf"^[ \t]*@?(?:\w+\.)*{fn}[ \t]*\(", re.M) for fn in _CALLS}
_LITERAL = {fn: re.compile(rf"^[ \t]*@?(?:\w+\.)*{fn}[ \t]*\(\s*(?:{kw}\s*=\s*)?(\"|')([^\"'\\\n]+)\1\s*[,)]", re.M)
            for fn, kw in _CALLS.items()}

_found: Optional[Tuple[Dict[str, str], Dict[str, str]]] = None


def _scan() -> Tuple[Dict[str, str], Dict[str, str]]:
    global _found
    if _found is None:
        by_call: Dict[str, Dict[str, str]] = {fn: {} for fn in _CALLS}
        for directory in interfaces_package.__path__:
            for fname in sorted(os.listdir(directory)):
                if not fname.endswith("_interface.py") or fname == "base_interface.py":
                    continue
                path = os.path.join(directory, fname)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for fn in _CALLS:
                    named = {m.start(): m.group(2) for m in _LITERAL[fn].finditer(text)}
                    for site in _SITE[fn].finditer(text):
                        if site.start() not in named:
                            line = text.count("\n", 0, site.start()) + 1
                            raise ReformError(f"{path}:{line}: {fn}(...) must name its "
                                              f"{'family' if fn == 'register_model' else 'tiny family'} with a "
                                              "literal string (the registry reads the names without importing "
                                              "the module)")
                    for name in named.values():
                        by_call[fn].setdefault(name, f"reform_eval.models.interfaces.{fname[:-3]}")
        _found = (by_call["register_model"], by_call["register_tiny_builder"])
    return _found


def family_modules() -> Dict[str, str]:
    """Registered model name -> the interface module that registers it."""
    return _scan()[0]


def tiny_builder_modules() -> Dict[str, str]:
    """Tiny-checkpoint family -> the interface module that registers its builder."""
    return _scan()[1]


def rescan() -> None:
    """Forget what was read (tests that add an interface folder)."""
    global _found
    _found = None
