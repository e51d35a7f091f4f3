"""The project's exception type.

Every user-facing failure (bad input file, unknown name, missing model path) is raised as
``ReformError`` with a message that names the file, record and field, so the CLI can print
one line and exit with code 2 instead of a traceback.
"""
from __future__ import annotations

import difflib
import os
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, List, Optional


class ReformError(Exception):
    """A user-facing error: the message says what is wrong and where."""

    exit_code = 2


def where(file: Optional[str] = None, record: Optional[Any] = None, field: Optional[str] = None) -> str:
    """Format a location prefix like ``preds.json: record 3: field 'answer'``."""
    parts = []
    if file is not None:
        parts.append(str(file))
    if record is not None:
        parts.append(f"record {record}")
    if field is not None:
        parts.append(f"field '{field}'")
    return ": ".join(parts)


def input_error(message: str, file: Optional[str] = None, record: Optional[Any] = None,
                field: Optional[str] = None) -> ReformError:
    """Build a ReformError whose message starts with the location it refers to."""
    loc = where(file, record, field)
    return ReformError(f"{loc}: {message}" if loc else message)


def closest(name: Any, valid: Iterable[str]) -> Optional[str]:
    """The valid name a typo most likely meant (case-insensitive), or None when none is close."""
    by_lower = {str(v).lower(): str(v) for v in valid}
    match = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


def did_you_mean(name: Any, valid: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest valid name, or the empty string."""
    match = closest(name, valid)
    return f" (did you mean {match}?)" if match is not None else ""


def unknown_name(kind: str, name: Any, valid: Iterable[str]) -> ReformError:
    """Error for an unknown registry name: the closest valid name first, then all of them."""
    valid = sorted(valid)
    return ReformError(f"unknown {kind} '{name}'{did_you_mean(name, valid)}; valid names: {', '.join(valid)}")


def missing_path(path: str, what: str, field: Optional[str] = None, hint: str = "") -> ReformError:
    """A file or folder the input names that does not exist: the path, what it should be, the
    closest name beside it (``data/mme_synthtic``: did you mean data/mme_synthetic?) and the way on."""
    parent, base = os.path.split(os.path.normpath(path))
    try:
        siblings = [n for n in os.listdir(parent or ".") if not n.startswith(".")]
    except OSError:
        siblings = []
    match = closest(base, siblings)
    suggestion = f" (did you mean {os.path.join(parent, match)}?)" if match is not None else ""
    return input_error(f"{what} not found{suggestion}" + (f"; {hint}" if hint else ""), file=path, field=field)


class Interrupted(ReformError):
    """Ctrl-C or SIGTERM: what was saved and how to resume, in one line."""

    exit_code = 130


_stages: List[str] = []


@contextmanager
def stage(what: str) -> Iterator[None]:
    """Name what the program is doing, so an unexpected failure can say it in one line."""
    _stages.append(what)
    try:
        yield
    except BaseException as e:  # the innermost stage names the failure (the stack is gone by the boundary)
        if not hasattr(e, "reform_stage"):
            try:
                e.reform_stage = what  # type: ignore[attr-defined]
            except AttributeError:
                pass
        raise
    finally:
        _stages.pop()


def current_stage(error: Optional[BaseException] = None) -> str:
    """What was being done: the stage an error was raised in, else the innermost open one."""
    stage_of_error = getattr(error, "reform_stage", None) if error is not None else None
    return stage_of_error or (_stages[-1] if _stages else "starting")


class Stopped(ReformError):
    """A call given up, unsent or between attempts, because ANOTHER call failed for good (or the
    run is stopping): a consequence, so a caller that has the cause at hand reports the cause
    (``utils.request_pool.RequestPool.map_all``)."""


class BudgetExhausted(ReformError):
    """A token budget (``max_total_tokens``) would be passed by the next request: the run stops
    before sending it; finished samples are saved, so re-running the same command resumes."""
