"""An endpoint's window of requests spread over several client processes of one run.

Why: a Python process holds one interpreter lock. Against a server that answers at once, the
client's own work per request (the sample, its prompt and record, hashes, JSON, the socket
calls) is what limits the run, and one process reached 0.6-0.75 of a bare ``http.client``
client that does none of that work (``bench/api_ceiling.py``, 2 cores, issue 24). Two
processes do that work side by side.

How: after the plan is made, the rank's samples are split by group (a chat stays whole, in one
process, with its history) into ``processes`` parts; the parent forks one child per part but
the first (fork: the plan, the samples and the configured client are inherited, nothing is
rebuilt or fingerprinted again), and every process runs its part through
``evaluation.window.run_window`` with its share of ``max_concurrency`` and of the token
budget, appending to its own shard file (``<rank shard>-p<k>.jsonl``); the merge reads every
shard file, as it reads a rank's. What stays true (docs/reliability.md):

* a child dies with the run, even when the run is killed with -9 (``PR_SET_PDEATHSIG``); each
  process's kill -9 loses at most its calls in flight, as one process's does;
* when one process fails (a call that failed for good, the budget), the others start nothing
  more, finish and record their calls in flight, and the first error is the run's one line;
* Ctrl-C or SIGTERM stops every process at once; what each saved is kept and a re-run resumes;
* the run's counts (cache hits, generated tokens) and what the server said about itself are
  gathered from every process.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, cast

from reform_eval.evaluation.calls import Runner
from reform_eval.evaluation.plan import Key
from reform_eval.evaluation.runinfo import log_file_handler
from reform_eval.evaluation.window import run_window
from reform_eval.utils.distributed import share_of
from reform_eval.utils.errors import BudgetExhausted, ReformError
from reform_eval.utils.lifetime import die_with_parent
from reform_eval.utils.secrets import redact_text
from reform_eval.utils.world import interrupt_of, interrupts_held, note_signal, world_error

#: how long the run waits for its children to stop after an interrupt before killing them
STOP_WAIT_S = 10.0


def split_by_group(order: Sequence[int], group_of: Callable[[int], Any], parts: int) -> List[List[int]]:
    """``order`` cut into ``parts`` lists, whole groups each (group j goes to part j mod
    ``parts``, in order of first appearance); the order within a part is kept."""
    index: Dict[Any, int] = {}
    out: List[List[int]] = [[] for _ in range(max(1, parts))]
    for i in order:
        g = group_of(i)
        if g not in index:
            index[g] = len(index) % len(out)
        out[index[g]].append(i)
    return [p for p in out if p]


def shares(total: int, parts: int) -> List[int]:
    """``total`` split into ``parts`` whole shares that differ by at most one (larger first)."""
    return [share_of(total, k, parts) for k in range(parts)]


class _Child:
    def __init__(self, index: int, pid: int, fd: int) -> None:
        self.index, self.pid, self.fd = index, pid, fd
        self.message: Dict[str, Any] = {}
        self.status: Optional[int] = None  # exit status, once reaped (by the watcher only)


#: the errors a child's message can carry back as themselves (the boundary names each its way)
_ERRORS = {cls.__name__: cls for cls in (ReformError, BudgetExhausted)}


def run_window_processes(runner: Runner, item: Callable[[int], Dict[str, Any]], parts: List[List[int]],
                         deps: Dict[int, List[Key]], keys: Dict[int, Key], done: set,
                         seen: Callable[[Dict[str, Any]], None], write: Callable[[List[Dict[str, Any]]], None],
                         after_write: Optional[Callable[[], None]], window: int,
                         child_write: Callable[[int], Callable[[List[Dict[str, Any]]], None]],
                         saved_by: Callable[[int], List[Key]], report: Callable[[], Dict[str, Any]],
                         gather: Callable[[Dict[str, Any]], None]) -> None:
    """``run_window`` over one process per part (``split_by_group``; one part forks nothing): this one runs
    ``parts[0]``, a forked child each other part. ``done`` gets the keys every process saved.
    ``child_write(k)`` makes child k's writer (its own shard file) and ``saved_by(k)`` reads the
    keys that file holds; ``report()`` is what a child sends back when its part is done
    (counts, what the server said) and ``gather(report)`` takes it in, in the parent."""
    windows = shares(max(window, len(parts)), len(parts))
    children: List[_Child] = []
    stop = threading.Event()
    watcher = _Watcher(children, stop)
    try:
        for k in range(1, len(parts)):
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(read_fd)
                _child(k, len(parts), write_fd, runner, item, parts[k], deps, keys, done, seen, child_write(k),
                       after_write, windows[k], report)
            os.close(write_fd)
            children.append(_Child(k, pid, read_fd))
        watcher.start()
        runner.interface.process_share(0, len(parts))
        run_window(runner, item, parts[0], deps, keys, done, seen, write, windows[0], stop=stop,
                   after_write=after_write)
        _finish(children, watcher, None, done, saved_by)  # (an interrupt while waiting is one like any other)
    except BaseException as e:
        stop.set()
        if not interrupt_of(e) is not None:
            # this process failed (a call refused for good, a full disk): the others record
            # their calls in flight first; an interrupt during that wait stops them at once
            _signal(children, signal.SIGUSR1)
            try:
                _finish(children, watcher, None, done, saved_by)
            except BaseException as again:  # noqa: BLE001
                if not interrupt_of(again) is not None:
                    raise
                _stop_now(children, watcher, done, saved_by)
                raise again from None
            raise
        _stop_now(children, watcher, done, saved_by)
        raise
    for c in children:
        if "report" in c.message:
            gather(c.message["report"])
    failed = [c for c in children if c.status != 0 or c.message.get("error")]
    if failed:
        first = min(failed, key=lambda c: c.message.get("at", float("inf")))
        if first.message.get("interrupted"):
            if first.message.get("signal"):  # (the one line names the signal a child was stopped by)
                note_signal(int(first.message["signal"]))
            raise KeyboardInterrupt
        message = first.message.get("error")
        if message is None:  # no message: killed (the out-of-memory killer), a condition of the world
            raise ReformError(f"client process {first.index} of {len(parts)} died ({_death(first.status)}); "
                              "the samples saved so far are kept and re-running the same command resumes "
                              "(--model_option client_processes=1 runs the window in this process)")
        error = _ERRORS.get(str(first.message.get("kind")), ReformError)(message)
        if first.message.get("kind") == "internal":
            error.exit_code = 1  # a defect of ours, not bad input
        raise error


def _death(status: Optional[int]) -> str:
    """How a child ended, from its exit status (negative: the signal that killed it)."""
    if status is not None and status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"{name}: killed, most often by the out-of-memory killer" if name == "SIGKILL" else name
    return f"exit status {status} without a report"


def _stop_now(children: List[_Child], watcher: "_Watcher", done: set, saved_by: Callable[[int], List[Key]]) -> None:
    """An interrupt: every child is stopped at once (SIGTERM; SIGKILL past ``STOP_WAIT_S``),
    and what each saved is counted; further Ctrl-C meanwhile is noted, not raised."""
    _signal(children, signal.SIGTERM)
    with interrupts_held():
        _finish(children, watcher, STOP_WAIT_S, done, saved_by)


def _signal(children: List[_Child], sig: int) -> None:
    for c in children:
        if c.status is None:
            try:
                os.kill(c.pid, sig)
            except ProcessLookupError:
                pass


class _Watcher(threading.Thread):
    """The thread that reaps the children (``_watch``); ``finished`` is set when all are reaped.
    (The main thread waits on that event, not on ``join``: in Python 3.11 a ``join`` cut by
    Ctrl-C marks the live thread as stopped, and a second ``join`` then returns at once.)"""

    def __init__(self, children: List[_Child], stop: threading.Event) -> None:
        super().__init__(name="client-processes", daemon=True)
        self.children, self.stop_event, self.finished = children, stop, threading.Event()

    def run(self) -> None:
        try:
            _watch(self.children, self.stop_event)
        finally:
            self.finished.set()


def _finish(children: List[_Child], watcher: _Watcher, limit: Optional[float], done: set,
            saved_by: Callable[[int], List[Key]]) -> None:
    """Wait until the watcher has reaped every child (past ``limit`` seconds, kill what is left);
    the keys each child's shard file holds join ``done`` (read from the file: a child killed
    before it could report saved what its file holds)."""
    if watcher.ident is not None:
        if not watcher.finished.wait(limit):
            _signal(children, signal.SIGKILL)
            watcher.finished.wait()
    else:  # the watcher never started (a fork failed): reap here
        for c in children:
            os.close(c.fd)
            os.kill(c.pid, signal.SIGKILL)
            c.status = os.waitstatus_to_exitcode(os.waitpid(c.pid, 0)[1])
    for c in children:
        done.update(saved_by(c.index))


def _watch(children: List[_Child], stop: threading.Event) -> None:
    """The one reaper: reads each child's message as it ends; a child that fails stops the
    others (and this process's window)."""
    pending = {c.fd: c for c in children}
    chunks: Dict[int, List[bytes]] = {fd: [] for fd in pending}
    while pending:
        ready, _, _ = select.select(list(pending), [], [])
        for fd in ready:
            data = os.read(fd, 1 << 20)
            if data:
                chunks[fd].append(data)
                continue
            c = pending.pop(fd)
            os.close(fd)
            try:
                c.message = json.loads(b"".join(chunks[fd]).decode("utf-8")) if chunks[fd] else {}
            except ValueError:
                c.message = {}
            c.status = os.waitstatus_to_exitcode(os.waitpid(c.pid, 0)[1])
            if c.status != 0 or c.message.get("error"):
                c.message.setdefault("at", time.monotonic())
                stop.set()
                _signal([o for o in children if o.status is None and o is not c], signal.SIGUSR1)


def _child(index: int, count: int, fd: int, runner: Runner, item: Callable[[int], Dict[str, Any]],
           part: List[int], deps: Dict[int, List[Key]], keys: Dict[int, Key], done: set,
           seen: Callable[[Dict[str, Any]], None], write: Callable[[List[Dict[str, Any]]], None],
           after_write: Optional[Callable[[], None]], window: int, report: Callable[[], Dict[str, Any]]) -> None:
    """Child ``index``: run its part, send one JSON message (its report or its error) through
    ``fd`` and exit without running anything of the parent's."""
    code, message = 1, cast(Dict[str, Any], {})
    stopped_by: List[int] = []
    try:
        die_with_parent()
        stop = threading.Event()

        def interrupt(signum: int, frame: Any) -> None:
            for sig in (signal.SIGINT, signal.SIGTERM):  # one interrupt stops the child; more would
                signal.signal(sig, signal.SIG_IGN)  # cut its writing short
            stopped_by.append(signum)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGUSR1, lambda signum, frame: stop.set())

        runner.interface.process_share(index, count)
        try:
            run_window(runner, item, part, deps, keys, done, seen, write, window, stop=stop, after_write=after_write)
            code, message = 0, {"report": report()}
        except ReformError as e:
            code, message = 2, {"error": str(e), "kind": type(e).__name__}
        except BaseException as e:  # noqa: BLE001 - the child's one way out is its message
            condition = world_error(e)
            if interrupt_of(e) is not None:
                code, message = 130, {"interrupted": True, "error": "interrupted",
                                      "signal": stopped_by[0] if stopped_by else None}
            elif condition is not None:  # the world's condition (a full disk): its one line, as the boundary says it
                code, message = 2, {"error": str(condition), "kind": "ReformError"}
            else:
                code, message = 1, {"error": f"internal error in client process {index} of {count}: "
                                             f"{type(e).__name__}: {e}", "kind": "internal"}
                handler = log_file_handler()
                if handler is not None:  # the traceback to log.txt, as the boundary does for the parent
                    handler.emit(logging.LogRecord("client_processes", logging.ERROR, __file__, 0,
                                                   redact_text(traceback.format_exc()), None, None))
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})
        if message.get("error"):
            message["at"] = time.monotonic()  # (one clock for all processes: the first error wins)
        data = json.dumps(message, default=str).encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:  # noqa: BLE001 - nothing of the parent's may run in the child
        pass
    finally:
        os._exit(code)
