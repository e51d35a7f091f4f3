"""Credentials never leave memory: one redaction rule for results files, logs and the run identity.

A value is secret when its key looks like a credential (``api_key``, ``token``, ``password``,
``secret``, ``authorization``, ...) or when it equals the value of such an environment
variable (``OPENAI_API_KEY`` set in the shell and passed on the command line by value).
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable, List

REDACTED = "***"
_SECRET_KEY_RE = re.compile(r"(api[_-]?key|token|secret|password|passwd|authorization|credential|bearer)",
                            re.IGNORECASE)


def is_secret_key(key: Any) -> bool:
    """True for option or variable names that hold credentials."""
    return bool(_SECRET_KEY_RE.search(str(key)))


def secret_env_values() -> List[str]:
    """Values of credential-named environment variables (long enough to be credentials)."""
    return [v for k, v in os.environ.items() if is_secret_key(k) and len(v) >= 8]


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret value replaced, and ``key=value`` credential pairs masked."""
    for value in list(secrets) + secret_env_values():
        if value and len(value) >= 4:
            text = text.replace(value, REDACTED)
    return re.sub(r"((?:[A-Za-z_]*)(?:api[_-]?key|token|secret|password|authorization)[A-Za-z_]*\s*[=:]\s*)"
                  r"([^\s,;'\"}]+)", lambda m: m.group(1) + REDACTED, text, flags=re.IGNORECASE)


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, ``KEY=VALUE`` strings) with credentials replaced by ``***``."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def drop_secrets(obj: Any) -> Any:
    """A copy of ``obj`` without credential entries at all (for the run identity: a new key
    must not change which prediction file a run uses)."""
    if isinstance(obj, dict):
        return {k: drop_secrets(v) for k, v in obj.items() if not is_secret_key(k)}
    if isinstance(obj, (list, tuple)):
        out = [drop_secrets(v) for v in obj
               if not (isinstance(v, str) and "=" in v and is_secret_key(v.split("=", 1)[0]))]
        return type(obj)(out)
    return obj
