"""What limits an endpoint client: requests in flight (``AdaptiveLimit``), the run's token
budget (``TokenBudget``), and the numbers a server reports about itself (``clean_usage``).

Why here, apart from the transport: these are the client's promises about what it spends and
how hard it pushes, each with its own tests (docs/reliability.md).
"""
from __future__ import annotations

import json
import math
import threading
import time
from typing import Any, Dict, Iterable, Optional, Sequence

from .http_transport import log_clamp_once
from ..utils.errors import BudgetExhausted

#: the largest token count a server may report for one request (a larger one is refused)
MAX_REPORTED_TOKENS = 10 ** 9


class CleanUsage(dict):
    """A ``usage`` that ``clean_usage`` made: passing it again returns it as it is (the reply's
    parser and the budget's gate both clean what they are given; the second costs nothing)."""


def clean_usage(raw: Any, source: str = "endpoint") -> Optional[Dict[str, int]]:
    """The ``*_tokens`` counts of a reply's ``usage``, validated where they enter: each must be a
    whole number from 0 to ``MAX_REPORTED_TOKENS``. A negative, fractional, boolean, non-finite
    or absurd count is dropped (logged once), so a hostile or broken server can neither make
    token totals and cost negative nor switch the budget off; a reply whose counts are all
    dropped counts as one without usage (the budget then charges its worst case)."""
    if type(raw) is CleanUsage:
        return raw
    if not isinstance(raw, dict):
        return None
    out = CleanUsage()
    for k, v in raw.items():
        if not (isinstance(k, str) and k.endswith("_tokens")):
            continue
        if isinstance(v, bool):
            ok = False
        elif isinstance(v, int):  # compared as an int: a 400-digit count has no float
            ok = 0 <= v <= MAX_REPORTED_TOKENS
        else:
            ok = isinstance(v, float) and v.is_integer() and 0 <= v <= MAX_REPORTED_TOKENS
        if ok:
            out[k] = int(v)
        else:
            shown = f"an integer of {v.bit_length()} bits" if isinstance(v, int) and v.bit_length() > 64 \
                else repr(v)[:40]
            log_clamp_once(f"usage-{k}", f"{source}: usage.{k} = {shown} is not a token count "
                                         f"(0 to {MAX_REPORTED_TOKENS}); ignored")
    return out or None


def image_tokens_upper(size: Optional[Sequence[int]]) -> int:
    """A conservative count of the prompt tokens one image may cost on an endpoint whose image
    processing is unknown: the largest of the published rules (OpenAI's high-detail tiles,
    Anthropic's pixels / 750, Qwen2-VL's 28-pixel patches up to 16384) and LLaVA-1.5's fixed
    576. Unknown size: 16384."""
    if not size or len(size) != 2:
        return 16384
    w, h = max(1, int(size[0])), max(1, int(size[1]))
    scale = min(1.0, 2048 / max(w, h))
    ow, oh = w * scale, h * scale
    scale = min(1.0, 768 / min(ow, oh))
    ow, oh = ow * scale, oh * scale
    openai_high = 85 + 170 * math.ceil(ow / 512) * math.ceil(oh / 512)
    s = min(1.0, 1568 / max(w, h))
    anthropic = math.ceil(w * s * h * s / 750)
    qwen = min(16384, math.ceil(w / 28) * math.ceil(h / 28))
    return max(576, openai_high, anthropic, qwen)


class AdaptiveLimit:
    """How many requests may be in flight, adapted to the endpoint (AIMD, as TCP does).

    A 429/503 halves the limit (once per episode: the replies to requests sent before the last
    cut do not cut again) and pauses new requests for the reply's ``Retry-After``; each healthy
    reply adds ``1/limit``, about one per round trip; the limit stays in [1, maximum]. With
    ``adaptive=False`` the limit is fixed at ``maximum``. Shared by all batches of one
    interface, so what was learnt carries over from batch to batch."""

    def __init__(self, maximum: int, adaptive: bool = True) -> None:
        self.maximum = max(1, int(maximum))
        self.adaptive = adaptive
        self.limit = float(self.maximum)
        self.in_flight = 0
        self.paused_until = 0.0
        self.last_cut = float("-inf")
        self.cuts = 0
        self.waiting = 0  # threads waiting in ``acquire``
        self._cond = threading.Condition()

    def acquire(self) -> float:
        """Wait for a free slot (and the end of any pause); returns the send time."""
        with self._cond:
            while True:
                now = time.monotonic()
                if now < self.paused_until:
                    self._wait(self.paused_until - now)
                elif self.in_flight < max(1, int(self.limit)):
                    self.in_flight += 1
                    return now
                else:
                    self._wait(None)

    def _wait(self, timeout: Optional[float]) -> None:
        self.waiting += 1
        try:
            self._cond.wait(timeout)
        finally:
            self.waiting -= 1

    def release(self, sent: float, outcome: str, retry_after: Optional[float] = None) -> None:
        """``outcome``: ``ok`` (a healthy reply), ``congested`` (429/503) or ``other``."""
        with self._cond:
            self.in_flight -= 1
            if self.adaptive and outcome == "ok":
                self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)
            elif self.adaptive and outcome == "congested":
                now = time.monotonic()
                if sent >= self.last_cut:
                    self.limit = max(1.0, self.limit / 2)
                    self.last_cut = now
                    self.cuts += 1
                if retry_after:
                    self.paused_until = max(self.paused_until, now + retry_after)
            if self.waiting:  # (a notify with nobody waiting still costs a lock round)
                self._cond.notify_all()


def spent_usage(record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The tokens a saved answer cost: the server's ``usage``; none for an answer served from
    the response cache; else (a server that reports no usage) a text-length estimate, a quarter
    of the prompt's and the response's characters, as a request is estimated before it is sent."""
    if isinstance(record.get("usage"), dict):
        return record["usage"]
    if record.get("cached_responses") or "prediction" not in record:
        return None
    responses = record.get("predictions") or [record.get("prediction")]
    prompt = record.get("prompt")
    prompt_chars = len(prompt) if isinstance(prompt, str) else len(json.dumps(prompt, default=str))
    return {"prompt_tokens": len(responses) * (prompt_chars // 4),
            "completion_tokens": sum(len(str(r or "")) // 4 for r in responses)}


class TokenBudget:
    """``max_total_tokens`` for this process: a request is sent only while the tokens used, plus
    those reserved by requests in flight, plus its own worst case (its ``max_tokens`` and the
    largest prompt seen so far, or a text-length estimate before the first reply) fit. A
    reply's ``usage`` then replaces its reservation (a reply without ``usage`` keeps it).

    A request that does not fit beside the reservations of requests in flight WAITS for them to
    settle (their replies usually cost far less than their worst case); only what is spent
    stops the run: ``BudgetExhausted`` once the tokens used plus the request's own worst case
    pass the limit with nothing in flight. So no request is sent that could overshoot, and no
    paid reply is thrown away for a reservation."""

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.run_limit = limit  # max_total_tokens as given; ``limit`` is this process's share
        self.prompt = 0
        self.completion = 0
        self.reserved = 0
        self.largest_prompt = 0
        self.earlier = 0  # tokens of answers saved by an earlier process of this run
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)

    @property
    def used(self) -> int:
        return self.prompt + self.completion

    def estimate(self, body: Dict[str, Any], image_tokens: int = 0) -> int:
        """Worst case of one request: its ``max_tokens`` plus its prompt (the largest seen, or a
        quarter of its text's characters plus ``image_tokens``, whichever is larger)."""
        chars = sum(len(p.get("text", "")) if isinstance(p, dict) else 0
                    for m in body.get("messages", [])
                    for p in (m["content"] if isinstance(m.get("content"), list) else [{"text": m.get("content", "")}]))
        return int(body.get("max_tokens") or 0) + max(self.largest_prompt, chars // 4 + int(image_tokens))

    def reserve(self, need: int, what: str) -> None:
        if self.limit is None:
            return
        with self._lock:
            while self.reserved and self.used + self.reserved + need > self.limit \
                    and self.used + need <= self.limit:
                self._settled.wait(1.0)  # requests in flight settle, then this one may fit
            if self.used + self.reserved + need > self.limit:
                raise BudgetExhausted(
                    f"openai_api: token budget max_total_tokens={self.run_limit} reached before {what}"
                    + (f" (this rank's share: {self.limit})" if self.limit != self.run_limit else "") + ": "
                    f"{self.used} tokens used ({self.prompt} prompt + {self.completion} completion"
                    + (f"; {self.earlier} by answers saved earlier" if self.earlier else "") + "), "
                    f"{self.reserved} reserved by requests in flight, and it could need up to {need} more; "
                    "the finished samples are saved: re-running the same command resumes (raise "
                    "max_total_tokens to go on)")
            self.reserved += need

    def settle(self, reserved: int, usage: Optional[Dict[str, Any]]) -> None:
        with self._lock:
            if self.limit is not None:
                self.reserved -= reserved
            if usage:
                self.prompt += int(usage.get("prompt_tokens") or 0)
                self.completion += int(usage.get("completion_tokens") or 0)
                self.largest_prompt = max(self.largest_prompt, int(usage.get("prompt_tokens") or 0))
            elif self.limit is not None:  # unknown cost: charge the worst case
                self.completion += reserved
            if self.limit is not None:  # (only a limit makes a request wait in ``reserve``)
                self._settled.notify_all()

    def charge_recorded(self, usages: Iterable[Any], world_size: int = 1) -> None:
        """Count the tokens of records this run already holds (an earlier, interrupted process's
        answers being resumed), and keep this rank to its share of what is left: the budget is
        the run's, not one process's, so ranks together never pass it."""
        with self._lock:
            for usage in usages:
                usage = clean_usage(usage, "a saved record")
                if usage:
                    p, c = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
                    self.prompt, self.completion, self.earlier = self.prompt + p, self.completion + c, self.earlier + p + c
                    self.largest_prompt = max(self.largest_prompt, int(usage.get("prompt_tokens") or 0))
            if self.run_limit is not None and world_size > 1:
                self.limit = self.used + max(0, self.run_limit - self.used) // world_size


class RetryGate:
    """Who may send another attempt after a failure (issue 31: against a server that answers 500
    for ever, every call in flight spent all its retries in parallel, concurrency x retries
    requests, though the first call's failure for good stops the run).

    * While the endpoint is failing (the last outcome was a failure) ONE call probes it: it alone
      retries; the other failed calls wait for its outcome without spending an attempt. When an
      attempt succeeds (the probe's or any other call's), the endpoint is healthy again and every
      waiting call retries at once.
    * When the probe fails for good, the waiting calls give up without a new attempt: the run (or
      the batch) fails with that call's error anyway, so their retries could only cost requests.
    * ``stopping`` (set by the run when any call failed for good, a budget or a write stopped it:
      ``evaluation.window``) ends every retry and every backoff at once; no new attempt starts.
    Against a server that fails every request a run of ``c`` calls in flight and ``r`` retries
    sends about ``c + r`` requests, not ``c x (r + 1)``."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.healthy = True
        self.prober: Optional[int] = None
        self.given_up = 0  # probes that failed for good (a waiting call compares before and after)
        self._cond = threading.Condition()

    def may_retry(self) -> bool:
        """Wait for this call's turn to retry; False: give up (the run is stopping, or the call
        probing the failing endpoint failed for good while this one waited)."""
        me = threading.get_ident()
        with self._cond:
            seen = self.given_up
            while True:
                if self.stopping.is_set() or self.given_up != seen:
                    return False
                if self.healthy or self.prober in (None, me):
                    if not self.healthy:
                        self.prober = me
                    return True
                self._cond.wait(0.2)  # (in slices: ``stopping`` is an event of its own)

    def outcome(self, ok: bool, final: bool = False) -> None:
        """After each attempt: ``ok`` a reply that counts; ``final``: the call failed for good."""
        me = threading.get_ident()
        with self._cond:
            if ok:
                self.healthy = True
                self.prober = None if self.prober == me else self.prober
            else:
                self.healthy = False  # (a failed probe stays the probe: it alone retries)
                if final:  # any call failing for good fails its run (or batch): the waiting ones give up
                    self.prober = None if self.prober == me else self.prober
                    self.given_up += 1
            self._cond.notify_all()
