"""The one exception boundary of both command lines.

Whatever escapes the library ends here: a ``ReformError`` (bad input) prints its one line
(exit 2); Ctrl-C / SIGTERM print what was saved and how to resume (exit 130), also when the
interrupt reached us as something else (torch's "DataLoader worker ... is killed by signal"
when a scheduler signals the whole process group); a condition of the world (a full disk, a
folder path through a regular file, a read-only folder, a worker killed for memory:
``utils.world``) is one line naming the file, the setting and the way out (exit 2); anything
else is a bug: one line naming what was being done (``utils.errors.stage``), the traceback to
log.txt (exit 1). Credentials are redacted from every line.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, List

from .runinfo import log_file_handler
from ..utils import world
from ..utils.distributed import process_ends_after_this_run
from ..utils.errors import ReformError, current_stage
from ..utils.secrets import redact_text

logger = logging.getLogger("reform_eval.evaluation.boundary")


#: how long a stopped run may take to end after the first Ctrl-C / SIGTERM (what is saved is on
#: disk already: the shards are appended as answers arrive)
STOP_GRACE_S = 60.0
_reported = threading.Event()  # the command's one line is printed
_watchdog: List[threading.Thread] = []


def _raise_interrupt(signum: int, frame: object) -> None:
    world.note_signal(signum)  # an error that replaces the interrupt is still reported as the interrupt
    if not _watchdog and process_ends_after_this_run():  # (a library caller's process goes on)
        _watchdog.append(threading.Thread(target=_end_a_stopped_run, args=(signum,), name="stop-watchdog",
                                          daemon=True))
        _watchdog[0].start()
    raise KeyboardInterrupt


def _end_a_stopped_run(signum: int) -> None:
    """A stopped run that has not ended ``STOP_GRACE_S`` after the signal is ended here, with its
    one line (if not printed yet) and the interrupt's status: a scheduler's SIGTERM must end the
    job. (Once in CI, a run stopped by SIGTERM to its process group, DataLoader workers included,
    never exited; the interrupt had landed where the shutdown then waited for ever.)"""
    if _reported.wait(STOP_GRACE_S):
        time.sleep(STOP_GRACE_S)  # the line is out: the rest of the shutdown gets the same grace
    else:
        try:
            print("error: " + world.interrupted_line(signal.Signals(signum).name, "stopping"), file=sys.stderr,
                  flush=True)
        except (OSError, ValueError):
            pass
    os._exit(130)


def _interrupted(e: BaseException, tool: str) -> int:
    sig = world.interrupt_of(e) or "SIGINT"
    return report_error(ReformError(world.interrupted_line(sig, current_stage(e))), tool, code=130)


def run_cli(body: Callable[[], int], tool: str) -> int:
    """Run a command line's body inside the boundary; returns the exit status."""
    single = os.environ.get("WORLD_SIZE", "1") == "1"
    world.reset()
    _reported.clear()
    previous = {}
    if single:  # under torchrun, SIGTERM is how the launcher stops the peers of a failed rank
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                handler = signal.getsignal(sig)
                if sig == signal.SIGTERM or handler is signal.default_int_handler:
                    signal.signal(sig, _raise_interrupt)
                    previous[sig] = handler  # (only what was set is put back)
        except ValueError:  # not the main thread (a library caller's worker): leave signals alone
            pass
    try:
        return _run(body, tool, single)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(body: Callable[[], int], tool: str, single: bool) -> int:
    try:
        return body()
    except ReformError as e:
        return report_error(e, tool)
    except KeyboardInterrupt as e:
        return _interrupted(e, tool)
    except Exception as e:  # noqa: BLE001  (the boundary: everything unexpected ends here)
        if world.interrupt_of(e) is not None:  # the interrupt, replaced by what it broke on its way
            return _interrupted(e, tool)
        condition = world.world_error(e)
        if condition is not None:  # the world's condition, not our defect: one line, exit 2
            _log_traceback(e, tool)
            return report_error(condition, tool)
        if not single and isinstance(e, RuntimeError):  # (torch's DistError is a RuntimeError)
            # another rank failed and printed its one-line error; this rank stops quietly
            logger.debug("stopped after a peer failed: %s", e)
            return 1
        handler = _log_traceback(e, tool)
        where = f"; the traceback is in {handler.baseFilename}" if handler is not None else ""
        message = f"internal error while {current_stage(e)}: {type(e).__name__}: {e}{where}"
        return report_error(ReformError(message), tool, code=1, logged=True)


def _log_traceback(e: BaseException, tool: str) -> Any:
    """The traceback into log.txt (never the console); returns the log handler, if any."""
    handler = log_file_handler()
    if handler is not None:
        detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        handler.emit(logging.LogRecord(tool, logging.ERROR, __file__, 0, redact_text(detail), None, None))
    return handler


# How long a rank other than 0 waits for the launcher to stop it, after an input error that every
# rank meets: rank 0's report normally ends the wait within a second (torchrun stops the peers of
# a failed rank); a rank still running after it prints the line itself.
PEER_REPORT_WAIT_S = 120.0


def _leave_the_report_to_rank_0() -> None:
    """Wait (bounded) to be stopped by the launcher once rank 0 has reported and failed.

    Why: a rank that exited first with the error status made torchrun stop rank 0 before it
    printed the line, and the run ended without its one error line (once in CI). Waiting makes
    rank 0 the first rank to fail, so its line is printed and torchrun's summary names it; the
    launcher's SIGTERM ends this rank (no handler is installed under torchrun). The wait ends
    early when the launcher is gone, or at Ctrl-C (the terminal interrupts every rank: the rank
    then prints its line, where the interrupt had escaped the boundary as a traceback)."""
    parent = os.getppid()
    deadline = time.monotonic() + PEER_REPORT_WAIT_S
    try:
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass


def _a_launcher_stops_this_rank(e: ReformError) -> bool:
    """Whether rank 0's failure of ``e`` will make the launcher stop this rank: an input error every
    rank meets, in a rank other than 0 of a world of several, started by torchrun (a torchelastic
    agent sets TORCHELASTIC_RUN_ID; srun and other launchers let the other tasks run on) in a
    command line's process (it exits next; a library caller's rank 0 returns and goes on, so no
    launcher stops its peers)."""
    return (bool(getattr(e, "every_rank", False)) and os.environ.get("RANK") not in (None, "0")
            and os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1")
            and "TORCHELASTIC_RUN_ID" in os.environ and process_ends_after_this_run())


def report_error(e: ReformError, tool: str, code: int = 0, logged: bool = False) -> int:
    """The error once, as the last line on stderr (the log file gets it too); the exit status."""
    message = redact_text(" ".join(str(e).split()))
    handler = log_file_handler()
    if handler is not None and not logged:
        handler.emit(logging.LogRecord(tool, logging.ERROR, __file__, 0, message, None, None))
    code = code or e.exit_code
    rank = os.environ.get("RANK")
    if _a_launcher_stops_this_rank(e):
        # every rank met this input error: rank 0 reports it, once; a rank that outlives the wait
        # (no launcher stopped it: rank 0 did not fail alike) reports it itself
        _leave_the_report_to_rank_0()
    prefix = f"error (rank {rank}): " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else "error: "
    sys.stderr.flush()
    print(prefix + message, file=sys.stderr, flush=True)
    _reported.set()
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchrun's failure summary then shows this line instead of a traceback hint
        try:
            with open(error_file, "w", encoding="utf-8") as f:
                json.dump({"message": {"message": prefix + message, "extraInfo": {
                    "py_callstack": prefix + message, "timestamp": str(int(time.time()))}}}, f)
        except OSError:
            pass
    return code
