"""The run's two log destinations, for any layer: the console (quiet unless ``-v``) and log.txt
(everything). ``evaluation.runinfo.setup_logging`` makes the handlers and marks them; this module
finds them by those marks, so an engine interface (layer 2) can send a library's own chatter where
the harness's goes without importing the engine layer.

Why: an engine such as vLLM configures its own console logger and prints from its workers and
native code (issue 30: 1,644 lines on stdout for 100 samples). ``library_log_to_run`` hands a
library's logger to the run's handlers; ``output_to_log`` sends everything written to the
process's stdout and stderr (file descriptors 1 and 2: native code and child processes too) to
log.txt while the engine works, unless ``-v``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Iterator, Optional

#: the marks ``setup_logging`` puts on its handlers
CONSOLE_MARK = "_reform_console"
FILE_MARK = "_reform_log"
#: on the console handler: does it show INFO (``-v``)? (its level stays INFO for the notices a quiet
#: console shows, such as "resumed: ...": a filter decides, evaluation.runinfo)
VERBOSE_MARK = "_reform_verbose"


def _handler(mark: str) -> Any:
    for h in logging.getLogger().handlers:
        if getattr(h, mark, False):
            return h
    return None


def log_file_handler() -> Any:
    """The log.txt handler of this process, if one is set up."""
    return _handler(FILE_MARK)


def console_verbose() -> bool:
    """Does the console show INFO (``-v``)? Without the run's console handler (a library caller
    that set up no logging) the answer is yes: nothing is hidden from a caller who did not ask."""
    console = _handler(CONSOLE_MARK)
    return console is None or bool(getattr(console, VERBOSE_MARK, console.level <= logging.INFO))


def library_log_to_run(name: str, level: int = logging.INFO) -> None:
    """Logger ``name`` (and its children) writes to log.txt, and to the console only with ``-v``:
    its own handlers (a library's console handler) are removed. Without a log.txt (a library
    caller), the logger is left as the library set it up."""
    log_file = log_file_handler()
    if log_file is None:
        return
    lib = logging.getLogger(name)
    for h in list(lib.handlers):
        lib.removeHandler(h)
    lib.addHandler(log_file)
    console = _handler(CONSOLE_MARK)
    if console is not None and console_verbose():
        lib.addHandler(console)
    lib.setLevel(level)
    lib.propagate = False


@contextlib.contextmanager
def output_to_log() -> Iterator[Optional[str]]:
    """Inside: file descriptors 1 and 2 write to log.txt (yields its path), unless ``-v`` or
    there is no log.txt (yields None, nothing changed). Restored on the way out, whatever happens;
    Python's own buffers are flushed on both sides of the switch."""
    log_file = log_file_handler()
    if log_file is None or console_verbose():
        yield None
        return
    path = log_file.baseFilename
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    log_file.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # Python's own writes too, where sys.stdout is not file descriptor 1 (a caller's replacement)
    text = open(path, "a", encoding="utf-8", errors="replace", buffering=1)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            yield path
    finally:
        for stream in (sys.stdout, sys.stderr, text):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        text.close()
        for fd in (*saved, target):
            os.close(fd)
