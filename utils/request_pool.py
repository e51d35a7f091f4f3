"""A fixed pool of long-lived worker threads that run submitted calls and hand back futures.

Why not ``concurrent.futures.ThreadPoolExecutor``: its workers are joined when the interpreter
exits, so a Ctrl-C during a run whose requests wait on a slow server would hang until each of
them timed out. These workers are daemon threads: the process ends when the run does, and the
requests in flight are what an interrupt loses (docs/reliability.md). They are long-lived, so
per-thread state (an HTTP keep-alive connection) is set up once and reused for every request
the thread sends, never per request or per batch.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional, Tuple

from .errors import Stopped

_Job = Optional[Tuple[Future, Callable[..., Any], tuple, dict]]


class RequestPool:
    """``size`` daemon threads; ``submit(fn, *args)`` returns a ``Future`` of ``fn(*args)``.

    The threads start on the first submit. ``close()`` lets them finish their current call and
    exit; calls still queued are cancelled."""

    def __init__(self, size: int, name: str = "request") -> None:
        self.size = max(1, int(size))
        self.name = name
        self._queue: "queue.SimpleQueue[_Job]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("submit on a closed RequestPool")
            if not self._threads:
                for i in range(self.size):
                    t = threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
                    t.start()
                    self._threads.append(t)
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            fut, fn, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread as it is
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def map_all(self, fn: Callable[..., Any], calls: List[tuple]) -> List[Any]:
        """``fn(*args)`` for every ``args`` of ``calls`` on the workers, results in order; the
        first failure cancels the calls not yet started and is raised, unless it is a ``Stopped``
        (a call given up because another failed): then the other call's failure, the cause, is
        raised (the calls in flight are waited for; a stopping run ends them at once)."""
        futures = [self.submit(fn, *args) for args in calls]
        out = []
        for fut in futures:
            exc = fut.exception()
            if exc is not None:
                for other in futures:
                    other.cancel()
                if isinstance(exc, Stopped):
                    causes = [e for e in (f.exception() for f in futures if not f.cancelled())
                              if e is not None and not isinstance(e, Stopped)]
                    if causes:
                        raise causes[0]
                raise exc
            out.append(fut.result())
        return out

    def close(self) -> None:
        """Cancel queued calls; each thread exits after its current one (never waited for)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in threads:
            self._queue.put(None)
