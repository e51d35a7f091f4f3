"""The one exception boundary of both command lines.

Whatever escapes the library ends here: a ``ReformError`` (bad input) prints its one line
(exit 2); Ctrl-C / SIGTERM print what was saved and how to resume (exit 130); anything else is
a bug: one line naming what was being done (``utils.errors.stage``), the traceback to log.txt
(exit 1). Credentials are redacted from every line.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Callable

from evaluation.runinfo import log_file_handler
from utils.errors import ReformError, current_stage
from utils.secrets import redact_text

logger = logging.getLogger("evaluation.boundary")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_cli(body: Callable[[], int], tool: str) -> int:
    """Run a command line's body inside the boundary; returns the exit status."""
    single = os.environ.get("WORLD_SIZE", "1") == "1"
    if single:  # under torchrun, SIGTERM is how the launcher stops the peers of a failed rank
        try:
            signal.signal(signal.SIGTERM, _raise_interrupt)
        except ValueError:  # not the main thread (a library caller's worker): leave signals alone
            pass
    try:
        return body()
    except ReformError as e:
        return report_error(e, tool)
    except KeyboardInterrupt as e:
        return report_error(ReformError(f"interrupted while {current_stage(e)}; re-running the same command "
                                        "resumes from the samples already saved"), tool, code=130)
    except Exception as e:  # noqa: BLE001  (the boundary: everything unexpected ends here)
        if not single and isinstance(e, RuntimeError):  # (torch's DistError is a RuntimeError)
            # another rank failed and printed its one-line error; this rank stops quietly
            logger.debug("stopped after a peer failed: %s", e)
            return 1
        handler = log_file_handler()
        detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        if handler is not None:
            handler.emit(logging.LogRecord(tool, logging.ERROR, __file__, 0, redact_text(detail), None, None))
        where = f"; the traceback is in {handler.baseFilename}" if handler is not None else ""
        message = f"internal error while {current_stage(e)}: {type(e).__name__}: {e}{where}"
        return report_error(ReformError(message), tool, code=1, logged=True)


def report_error(e: ReformError, tool: str, code: int = 0, logged: bool = False) -> int:
    """The error once, as the last line on stderr (the log file gets it too); the exit status."""
    message = redact_text(" ".join(str(e).split()))
    handler = log_file_handler()
    if handler is not None and not logged:
        handler.emit(logging.LogRecord(tool, logging.ERROR, __file__, 0, message, None, None))
    code = code or e.exit_code
    rank = os.environ.get("RANK")
    if getattr(e, "every_rank", False) and rank not in (None, "0"):
        return code  # every rank met this input error: rank 0 reports it, once
    prefix = f"error (rank {rank}): " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else "error: "
    sys.stderr.flush()
    print(prefix + message, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchrun's failure summary then shows this line instead of a traceback hint
        try:
            with open(error_file, "w", encoding="utf-8") as f:
                json.dump({"message": {"message": prefix + message, "extraInfo": {
                    "py_callstack": prefix + message, "timestamp": str(int(time.time()))}}}, f)
        except OSError:
            pass
    return code
