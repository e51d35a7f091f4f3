"""The run-wide window of calls for an endpoint: ``window`` worker threads, each taking the next
ready sample the moment its last reply arrived, and recording each answer as it arrives.

Why not batches: a batch waits for its slowest reply before the next one starts, so against a
server whose replies vary in time (10 ms for most, 300 ms for a few, as replies of different
lengths do) the client idled most of the time and reached half of what a plain keep-alive
client does (issue 24). Why every worker carries its sample end to end (prompt, request,
record, shard line) rather than handing replies to one scheduling thread: with 128 requests in
flight that one thread got a 1/129 share of the interpreter and became the bottleneck
(``bench/api_ceiling.py``); here no step waits on another thread, as in a plain client.

What stays true (docs/reliability.md):
* a multi-turn chat's turn starts only after the turns its history needs are recorded;
* each record is appended to the rank's shard as soon as its sample's calls are answered (by one
  writer thread, in batches gathered over at most ``GATHER_S``, 5 ms), so kill -9 loses at most
  the calls in flight and the records of the last few milliseconds;
* when a call fails for good (or the token budget is reached) no new sample starts, the calls
  in flight finish and their answers are recorded, and then the first error is raised: no
  paid reply is thrown away;
* Ctrl-C stops at once; the requests in flight are what it loses.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

from .calls import Runner
from .plan import Key
from ..utils.errors import ReformError
from ..utils.world import interrupts_held


#: how long the writer gathers finished records into one write (bounds what kill -9 can lose
#: beyond the calls in flight)
GATHER_S = 0.005


class _Writer:
    """One thread appends the finished records to the shard, in batches: a worker never holds a
    lock across a file write (a write releases the interpreter, and getting it back while holding
    the lock stalled every other worker behind it)."""

    def __init__(self, write: Callable[[List[Dict[str, Any]]], None],
                 after_write: Optional[Callable[[], None]] = None) -> None:
        self.write, self.after_write = write, after_write
        self.lines: "queue.SimpleQueue[Optional[Dict[str, Any]]]" = queue.SimpleQueue()
        self.error: Optional[BaseException] = None
        self.write_failed = False
        self.thread = threading.Thread(target=self._run, name="window-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            batch = [self.lines.get()]
            # gather what finishes in the next few milliseconds into the same write: one wake-up
            # and one system call per gathering, not per record
            time.sleep(GATHER_S)
            while True:
                try:
                    batch.append(self.lines.get_nowait())
                except queue.Empty:
                    break
            end = None in batch
            records = [r for r in batch if r is not None]
            # after a failed write nothing more is written: a later turn of a chat must never be
            # saved without the turn its history showed
            if records and not self.write_failed:
                try:
                    self.write(records)
                except BaseException as e:  # noqa: BLE001 - a full disk: the run's error, raised at the end
                    self.write_failed = True
                    self.error = self.error or e
                if self.after_write is not None and not self.write_failed:
                    try:  # (the response cache's full disk: it stops the run, the shard goes on)
                        self.after_write()
                    except BaseException as e:  # noqa: BLE001 - raised at the end
                        self.error = self.error or e
            if end:
                return

    def close(self) -> None:
        self.lines.put(None)
        self.thread.join()


class _Schedule:
    """Which sample runs next (every key of its ``deps`` recorded), shared by the workers."""

    def __init__(self, order: Sequence[int], deps: Dict[int, List[Key]], keys: Dict[int, Key], done: set,
                 seen: Callable[[Dict[str, Any]], None], writer: "_Writer") -> None:
        self.keys, self.done, self.seen, self.writer = keys, done, seen, writer
        self.cond = threading.Condition()
        self.dependents: Dict[Key, List[int]] = {}
        self.unmet: Dict[int, int] = {}
        self.ready: Deque[int] = deque()
        self.running = 0
        self.error: Optional[BaseException] = None
        self.stopped = False
        self.on_error: Optional[Callable[[], None]] = None  # called once, at the run's first error
        for i in order:
            missing = [k for k in deps.get(i, ()) if k not in done]
            if missing:
                self.unmet[i] = len(missing)
                for k in missing:
                    self.dependents.setdefault(k, []).append(i)
            else:
                self.ready.append(i)

    def take(self) -> Optional[int]:
        """The next ready sample, or None when there is none left to start (or the run stops)."""
        with self.cond:
            while True:
                if self.error is not None or self.stopped:
                    return None
                if self.ready:
                    self.running += 1
                    return self.ready.popleft()
                if self.running == 0:  # nothing ready and nothing in flight can make anything ready
                    return None
                self.cond.wait()

    def finish(self, i: int, record: Optional[Dict[str, Any]], error: Optional[BaseException] = None) -> None:
        with self.cond:
            # once the run is stopped (Ctrl-C) the writer is closing: an answer arriving now is
            # one of the calls in flight that the interrupt loses, never counted as saved
            if record is not None and error is None and not self.stopped:
                self.seen(record)  # its answer is there for a later turn's history before it counts as done
                self.writer.lines.put(record)
            self.running -= 1
            first = self.error is None
            if self.writer.error is not None and self.error is None:
                self.error = self.writer.error
            if error is not None:
                if self.error is None:
                    self.error = error
            if first and self.error is not None and self.on_error is not None:
                self.on_error()  # the run is stopping: the calls in flight start no new attempt
            elif record is not None and not self.stopped:
                key = self.keys[i]
                self.done.add(key)
                for j in self.dependents.pop(key, ()):
                    self.unmet[j] -= 1
                    if self.unmet[j] == 0:
                        del self.unmet[j]
                        self.ready.append(j)
            self.cond.notify_all()


def run_window(runner: Runner, item: Callable[[int], Dict[str, Any]], order: Sequence[int],
               deps: Dict[int, List[Key]], keys: Dict[int, Key], done: set,
               seen: Callable[[Dict[str, Any]], None], write: Callable[[List[Dict[str, Any]]], None],
               window: int, after_write: Optional[Callable[[], None]] = None) -> None:
    """Run the samples ``order`` (indices; ``item(i)`` loads one) with up to ``window`` calls in
    flight. A finished record goes to ``seen(record)`` at once (in its worker: history, counts)
    and to ``write(records)`` in batches (one writer thread: the shard). ``done`` (keys already
    recorded) grows as records finish. ``after_write()`` runs after each successful write; what it
    raises stops the run like a failed write, but the shard goes on taking the calls in flight."""
    writer = _Writer(write, after_write)
    schedule = _Schedule(order, deps, keys, done, seen, writer)
    schedule.on_error = getattr(runner, "stop_retrying", None)  # (no retries in flight spent after a failure)

    def work() -> None:
        while True:
            i = schedule.take()
            if i is None:
                return
            try:
                pending, record = runner.prepare(item(i))
                if record is None:
                    assert pending is not None  # prepare gives a record or what is still to call
                    for j in pending.missing:
                        runner.store(pending, j, runner.call(pending, j))
                    record = runner.record(pending)
            except BaseException as e:  # noqa: BLE001 - the first failure is raised after the drain
                schedule.finish(i, None, e)
                continue
            schedule.finish(i, record)

    workers = [threading.Thread(target=work, name=f"window-{k}", daemon=True) for k in range(max(1, window))]
    for w in workers:
        w.start()
    try:
        for w in workers:
            while w.is_alive():
                w.join(timeout=0.2)  # in slices, so Ctrl-C reaches this thread at once
    except BaseException:
        with schedule.cond:
            schedule.stopped = True
            schedule.cond.notify_all()
        with interrupts_held():  # a second Ctrl-C must not cut the writing of what has finished
            writer.close()  # what has finished is written (the requests in flight are lost)
        raise
    writer.close()
    error = schedule.error or writer.error
    if error is not None:
        raise error
    if schedule.unmet:
        i = next(iter(schedule.unmet))
        missing = next(k for k in deps[i] if k not in done)
        raise ReformError(f"sample {keys[i][0]}: history needs the prediction of {missing[0]}, "
                          "which is not part of this run (it must come earlier in its chat)")
