"""The run-wide window of requests for an endpoint: the next request starts the moment a reply
arrives, and each answer is recorded as it arrives.

Why not batches: a batch waits for its slowest reply before the next one starts, so against a
server whose replies vary in time (10 ms for most, 300 ms for a few, as replies of different
lengths do) the client idled most of the time and reached half of what a plain keep-alive
client does (issue 24). Here ``window`` calls are in flight from the first sample to the last.

What stays true (docs/reliability.md):
* a multi-turn chat's turn starts only after the turns its history needs are recorded;
* each record is appended to the rank's shard as soon as its sample's calls are answered, so
  kill -9 loses at most the calls in flight;
* when a call fails for good (or the token budget is reached) no new sample starts, the calls
  in flight are waited for and their answers recorded, and then the first error is raised:
  no paid reply is thrown away;
* Ctrl-C stops at once; the requests in flight are what it loses.
"""
from __future__ import annotations

import queue
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from evaluation.calls import Pending, Runner
from evaluation.plan import Key
from utils.errors import ReformError


def run_window(runner: Runner, item: Callable[[int], Dict[str, Any]], order: Sequence[int],
               deps: Dict[int, List[Key]], keys: Dict[int, Key], done: set,
               emit: Callable[[List[Dict[str, Any]]], None], window: int) -> None:
    """Run the samples ``order`` (indices; ``item(i)`` loads one) with up to ``window`` calls in
    flight; ``emit(records)`` receives records as they finish. ``done`` (keys already recorded)
    grows as records are emitted; a sample waits until every key of ``deps[i]`` is in it."""
    dependents: Dict[Key, List[int]] = {}
    unmet: Dict[int, int] = {}
    ready: Deque[int] = deque()
    for i in order:
        missing = [k for k in deps.get(i, ()) if k not in done]
        if missing:
            unmet[i] = len(missing)
            for k in missing:
                dependents.setdefault(k, []).append(i)
        else:
            ready.append(i)
    in_flight: Dict[Future, Tuple[int, int]] = {}
    pending: Dict[int, Pending] = {}
    error: Optional[BaseException] = None
    # answered calls arrive here (a done-callback per call): O(1) per reply, where waiting on
    # the set of futures costs O(window) per reply
    arrivals: "queue.SimpleQueue[Future]" = queue.SimpleQueue()

    def finished(i: int, records: List[Dict[str, Any]], rec: Dict[str, Any]) -> None:
        records.append(rec)
        key = keys[i]
        done.add(key)
        for j in dependents.pop(key, ()):
            unmet[j] -= 1
            if unmet[j] == 0:
                del unmet[j]
                ready.append(j)

    try:
        while True:
            records: List[Dict[str, Any]] = []
            while error is None and ready and len(in_flight) < window:
                i = ready.popleft()
                try:
                    p, rec = runner.prepare(item(i))
                except ReformError as e:
                    error = e
                    break
                if rec is not None:
                    finished(i, records, rec)
                    continue
                pending[i] = p
                for j in p.missing:
                    fut = runner.submit(p, j)
                    in_flight[fut] = (i, j)
                    fut.add_done_callback(arrivals.put)
            if records:
                emit(records)
                continue  # finished samples may have made others ready
            if not in_flight:
                break
            arrived = [_next(arrivals)]
            while True:  # every reply that is already here: recorded in one write
                try:
                    arrived.append(arrivals.get_nowait())
                except queue.Empty:
                    break
            for fut in arrived:
                i, j = in_flight.pop(fut)
                p = pending.get(i)
                try:
                    result = fut.result()
                except Exception as e:  # noqa: BLE001 - the first failure is raised after the drain
                    if error is None:
                        error = e
                    pending.pop(i, None)
                    continue
                if p is None:  # another call of this sample failed
                    continue
                runner.store(p, j, result)
                if not p.missing:
                    del pending[i]
                    finished(i, records, runner.record(p))
            if records:
                emit(records)
    except BaseException:
        for fut in in_flight:
            fut.cancel()
        raise
    if error is not None:
        raise error
    if unmet:
        i = next(iter(unmet))
        missing = next(k for k in deps[i] if k not in done)
        raise ReformError(f"sample {keys[i][0]}: history needs the prediction of {missing[0]}, "
                          "which is not part of this run (it must come earlier in its chat)")


def _next(arrivals: "queue.SimpleQueue[Future]") -> Future:
    """The next answered call (waiting in short slices, so Ctrl-C is seen at once)."""
    while True:
        try:
            return arrivals.get(timeout=0.2)
        except queue.Empty:
            continue
