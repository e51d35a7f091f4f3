"""``openai_api``: any OpenAI-compatible chat-completions endpoint (black-box, generation only).

This is how users reach GPT-4o / Claude / Gemini gateways and local vLLM or SGLang servers.
It speaks HTTP with the standard library (``urllib``) so the harness gains no dependency.

Why the details below:

* images are sent inline as base64 ``data:`` URLs, in the order their ``<image>``
  placeholders appear in the conversation, because gateways cannot reach local files;
* 429 and 5xx replies, timeouts and dropped connections are retried with exponential
  backoff (honouring ``Retry-After``), because rate limits and overloaded servers are the
  normal state of shared endpoints; other 4xx replies are refusals and fail at once;
* a batch is sent with adaptive concurrency between 1 and ``max_concurrency``: a 429 or 503
  halves the requests in flight (and pauses new ones for the reply's ``Retry-After``), each
  healthy reply grows the limit back by about one per round trip (AIMD), so a rate-limited
  endpoint is used near its limit without a storm of rejected requests
  (``adaptive_concurrency=false`` keeps it fixed at ``max_concurrency``);
* every reply's ``usage`` is kept with its text (``models.outputs.GenText``) and goes into the
  record; ``max_total_tokens`` stops the run before a request could pass the budget
  (``utils.errors.BudgetExhausted``; finished samples are saved and a re-run resumes);
* the reply text is normalised by ``models.outputs.finish_text``, the function the in-process
  models use, so a served model gives the same prediction string as in-process;
* a call that finally fails raises :class:`ReformError`; it is never returned as a
  prediction, so a re-run retries exactly the samples that failed;
* ``timeout`` bounds the WHOLE request (send, headers and body): every socket read gets
  the time left until one deadline, so a server that drips one byte a second cannot hold a
  call forever (a per-read socket timeout restarts on every byte);
* redirects are never followed (``http.client``, no redirect handler): a 3xx is an error, so
  the ``Authorization`` header is only ever sent to the configured host;
* credentials are held as ``utils.secrets.Secret`` values: the API key, the user info and
  credential query parameters of ``base_url`` (``?api-key=``, ``auth=``, ``X-Amz-Signature=``:
  split out at config time, ``utils.secrets.SecretURL``, and put back only on the wire) and
  credential-named keys at any depth of ``extra_body``; a reply that echoes one has it
  redacted before it becomes a prediction or an error message.
* options the client cannot honour are refused, not ignored: ``preprocessor``, ``roles`` and
  ``response_prefix`` (the server applies its own chat template).

For a model served by vLLM or SGLang (``vllm serve <model>`` / ``python -m
sglang.launch_server``), point ``base_url`` at the server's ``/v1`` and raise
``max_concurrency`` together with ``--per_gpu_eval_batch_size``: a batch is sent with that
many requests in flight, so the server can batch them (see docs/models.md).

Settings (config key, then environment variable, then default):

``model_name`` / ``OPENAI_MODEL``             the served model id (``--model_name``)
``base_url``   / ``OPENAI_BASE_URL``          default ``https://api.openai.com/v1``
``api_key``    / ``OPENAI_API_KEY``           optional (local servers need none)
``timeout`` (60 s per request), ``max_retries`` (5), ``backoff_base`` (1 s),
``backoff_max`` (30 s), ``max_concurrency`` (4), ``adaptive_concurrency`` (true),
``max_new_tokens`` (256), ``image_format`` (PNG, JPEG/JPG, WEBP), ``system_msg`` (for the
preprocessor), ``extra_body`` (dict merged into every request), ``max_total_tokens`` (budget of
prompt + completion tokens for this process), ``prompt_price`` / ``completion_price`` (per
million tokens: the results' cost, ``utils.usage.usage_totals``).
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from PIL import Image

from utils.schema import IMAGE_TOKEN
from models import register_model
from models.interfaces.base_interface import BaseInterface, CandidateScore
from models.openai_likelihood import score_candidates
from models.outputs import GenText, finish_text
from utils.secrets import (REDACTED, Secret, SecretURL, join_url_secrets, redact_text, reveal_deep,
                           secret_options)
from utils.errors import BudgetExhausted, ReformError
from utils.images import open_image
from utils.preprocessors import ChatTemplateProcessor

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: HTTP statuses worth another try: rate limit, request timeout, conflict, server errors
RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
#: statuses that say "too many requests": the adaptive limit backs off on these
CONGESTION_STATUS = frozenset({429, 503})
#: ``image_format`` names (case-insensitive) -> PIL format names
IMAGE_FORMATS = {"PNG": "PNG", "JPEG": "JPEG", "JPG": "JPEG", "WEBP": "WEBP"}


class _Retryable(Exception):
    """A failure that another attempt may cure (carries an optional Retry-After in seconds)."""

    def __init__(self, message: str, retry_after: Optional[float] = None, congestion: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.congestion = congestion


class _DeadlinePassed(socket.timeout):
    """The whole request outlived its deadline."""


def _deadline_socket(base: type) -> type:
    """``base`` (a socket class) whose reads and writes each get the time left until the
    instance's ``deadline`` as their timeout, and fail once it has passed: a server that
    drips one byte a second cannot keep a call alive (a plain socket timeout restarts on
    every byte)."""
    class DeadlineSocket(base):  # type: ignore[misc, valid-type]
        deadline: Optional[float] = None

        def _arm(self) -> None:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise _DeadlinePassed("request deadline passed")
                self.settimeout(left)

        def recv_into(self, *args: Any, **kwargs: Any) -> int:
            self._arm()
            try:
                return super().recv_into(*args, **kwargs)
            except socket.timeout:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    raise _DeadlinePassed("request deadline passed") from None
                raise

        def recv(self, *args: Any, **kwargs: Any) -> bytes:
            self._arm()
            return super().recv(*args, **kwargs)

        def sendall(self, *args: Any, **kwargs: Any) -> None:
            self._arm()
            return super().sendall(*args, **kwargs)

    return DeadlineSocket


_DeadlineSocket = _deadline_socket(socket.socket)
_DeadlineSSLSocket = _deadline_socket(ssl.SSLSocket)


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    """http.client (which never follows redirects) on a deadline socket."""

    deadline: Optional[float] = None

    def connect(self) -> None:
        super().connect()
        raw = self.sock
        self.sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        self.sock.settimeout(self.timeout)
        self.sock.deadline = self.deadline


class _DeadlineHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS on a deadline TLS socket (the context builds ``_DeadlineSSLSocket``)."""

    deadline: Optional[float] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        ctx = ssl.create_default_context()
        ctx.sslsocket_class = _DeadlineSSLSocket
        super().__init__(*args, context=ctx, **kwargs)

    def connect(self) -> None:
        super().connect()
        self.sock.deadline = self.deadline


def image_format(name: Any) -> str:
    """The PIL format for an ``image_format`` option (case-insensitive; JPG means JPEG)."""
    fmt = IMAGE_FORMATS.get(str(name).strip().upper())
    if fmt is None:
        raise ReformError(f"--model_option image_format: must be PNG, JPEG (or JPG) or WEBP, got {name!r}")
    return fmt


def encode_image(image: Union[Image.Image, str], fmt: str = "PNG") -> str:
    """A base64 ``data:`` URL for one image (paths are opened, with errors naming the file)."""
    if isinstance(image, str):
        image = open_image(image)
    if not isinstance(image, Image.Image):
        raise ReformError(f"openai_api: cannot send an image of type {type(image).__name__}")
    fmt = image_format(fmt)
    im = image.convert("RGB") if fmt == "JPEG" or image.mode not in ("RGB", "RGBA", "L") else image
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    mime = "jpeg" if fmt == "JPEG" else fmt.lower()
    return f"data:image/{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def _text_to_parts(text: str, urls: List[str], cursor: List[int]) -> List[Dict[str, Any]]:
    """Split a string on ``IMAGE_TOKEN`` into text / image_url parts, consuming ``urls`` in order."""
    parts: List[Dict[str, Any]] = []
    for i, piece in enumerate(text.split(IMAGE_TOKEN)):
        if i > 0:
            parts.append(_image_part(urls, cursor))
        if piece.strip():
            parts.append({"type": "text", "text": piece.strip()})
    return parts


def _image_part(urls: List[str], cursor: List[int]) -> Dict[str, Any]:
    if cursor[0] >= len(urls):
        raise ReformError(f"openai_api: the prompt has more image placeholders than the "
                          f"{len(urls)} images given")
    part = {"type": "image_url", "image_url": {"url": urls[cursor[0]]}}
    cursor[0] += 1
    return part


def to_openai_messages(prompt: Any, image_urls: List[str]) -> List[Dict[str, Any]]:
    """Convert a preprocessor output into chat-completions ``messages`` with images in place.

    Accepts chat messages (``ChatTemplateProcessor`` output: ``{"type": "image"}`` parts) or a
    plain string with ``<image>`` placeholders (sent as one user message). Every image must
    be placed exactly once; a mismatch is an error rather than a silently dropped image.
    """
    cursor = [0]
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": _text_to_parts(prompt, image_urls, cursor)}]
    elif isinstance(prompt, (list, tuple)):
        messages = []
        for msg in prompt:
            content = msg.get("content", "")
            if isinstance(content, str):
                parts = _text_to_parts(content, image_urls, cursor)
            else:
                parts = []
                for part in content:
                    if part.get("type") == "image":
                        parts.append(_image_part(image_urls, cursor))
                    elif part.get("type") == "text":
                        parts.extend(_text_to_parts(part.get("text", ""), image_urls, cursor))
                    else:
                        parts.append(part)
            # assistant/system turns are plain strings: most servers reject parts there
            if msg["role"] != "user" and all(p.get("type") == "text" for p in parts):
                messages.append({"role": msg["role"], "content": "\n".join(p["text"] for p in parts)})
            else:
                messages.append({"role": msg["role"], "content": parts})
    else:
        raise ReformError(f"openai_api: unsupported prompt type {type(prompt).__name__}")
    if cursor[0] != len(image_urls):
        raise ReformError(f"openai_api: the prompt places {cursor[0]} images but {len(image_urls)} were given")
    return messages


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
        self._cond = threading.Condition()

    def acquire(self) -> float:
        """Wait for a free slot (and the end of any pause); returns the send time."""
        with self._cond:
            while True:
                now = time.monotonic()
                if now < self.paused_until:
                    self._cond.wait(self.paused_until - now)
                elif self.in_flight < max(1, int(self.limit)):
                    self.in_flight += 1
                    return now
                else:
                    self._cond.wait()

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
    reply's ``usage`` then replaces its reservation (a reply without ``usage`` keeps it)."""

    def __init__(self, limit: Optional[int]) -> None:
        self.limit = limit
        self.run_limit = limit  # max_total_tokens as given; ``limit`` is this process's share
        self.prompt = 0
        self.completion = 0
        self.reserved = 0
        self.largest_prompt = 0
        self.earlier = 0  # tokens of answers saved by an earlier process of this run
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        return self.prompt + self.completion

    def estimate(self, body: Dict[str, Any]) -> int:
        """Worst case of one request: its ``max_tokens`` plus its prompt (largest seen, or
        a quarter of its text's characters, whichever is larger)."""
        chars = sum(len(p.get("text", "")) if isinstance(p, dict) else 0
                    for m in body.get("messages", [])
                    for p in (m["content"] if isinstance(m.get("content"), list) else [{"text": m.get("content", "")}]))
        return int(body.get("max_tokens") or 0) + max(self.largest_prompt, chars // 4)

    def reserve(self, need: int, what: str) -> None:
        if self.limit is None:
            return
        with self._lock:
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

    def charge_recorded(self, usages: Iterable[Any], world_size: int = 1) -> None:
        """Count the tokens of records this run already holds (an earlier, interrupted process's
        answers being resumed), and keep this rank to its share of what is left: the budget is
        the run's, not one process's, so ranks together never pass it."""
        with self._lock:
            for usage in usages:
                if isinstance(usage, dict):
                    p, c = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
                    self.prompt, self.completion, self.earlier = self.prompt + p, self.completion + c, self.earlier + p + c
                    self.largest_prompt = max(self.largest_prompt, int(usage.get("prompt_tokens") or 0))
            if self.run_limit is not None and world_size > 1:
                self.limit = self.used + max(0, self.run_limit - self.used) // world_size


@register_model("openai_api")
class OpenAIAPIInterface(BaseInterface):
    """Client for an OpenAI-compatible ``/chat/completions`` endpoint; generation only."""

    option_names = ("base_url", "api_key", "timeout", "max_retries", "max_concurrency", "backoff_base",
                    "backoff_max", "image_format", "extra_body", "adaptive_concurrency", "max_total_tokens",
                    "prompt_price", "completion_price")
    #: options of other families that this client cannot honour: refused, with why
    refused_options = {
        "preprocessor": "the server applies its own chat template to the chat messages",
        "roles": "the server's chat template names the roles",
        "response_prefix": "chat-completions endpoints do not continue a prefilled answer",
    }
    #: environment variables that decide which model answers: part of the run identity
    identity_env = ("OPENAI_MODEL", "OPENAI_BASE_URL")
    #: the served model id (``--model_name``) and a variant label; precision is the server's
    run_flags = ("model_name", "model_type")

    #: where the endpoint returns prompt log-probabilities (vLLM): models.openai_likelihood probes it
    supports_likelihood = True

    def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(config)
        self.config = cfg = secret_options(self.config)  # a Python caller's plain key is wrapped too
        for key, why in self.refused_options.items():
            if key in cfg:
                raise ReformError(f"--model_option {key}: not used by model 'openai_api' ({why})")
        self.model: str = cfg.get("model_name") or os.environ.get("OPENAI_MODEL") or ""
        if not self.model:
            raise ReformError("openai_api: no model id; pass --model_name <served model> "
                              "(or set OPENAI_MODEL)")
        self.base_url = SecretURL(cfg.get("base_url") or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
        key = cfg.get("api_key") or os.environ.get("OPENAI_API_KEY") or None
        self.api_key: Optional[Secret] = Secret(key) if key else None
        self.timeout = float(cfg.get("timeout", 60.0))
        self.max_retries = int(cfg.get("max_retries", 5))
        self.backoff_base = float(cfg.get("backoff_base", 1.0))
        self.backoff_max = float(cfg.get("backoff_max", 30.0))
        self.max_concurrency = max(1, int(cfg.get("max_concurrency", 4)))
        self.max_new_tokens = int(cfg.get("max_new_tokens", 256))
        self.image_format = image_format(cfg.get("image_format", "PNG"))
        self.extra_body: Dict[str, Any] = secret_options(dict(cfg.get("extra_body") or {}))
        adaptive = cfg.get("adaptive_concurrency", True)
        if not isinstance(adaptive, bool):
            raise ReformError(f"--model_option adaptive_concurrency: must be true or false, got {adaptive!r}")
        self.limiter = AdaptiveLimit(self.max_concurrency, adaptive)
        budget = cfg.get("max_total_tokens")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ReformError(f"--model_option max_total_tokens: must be a whole number >= 1, got {budget!r}")
        self.budget = TokenBudget(budget)
        for price in ("prompt_price", "completion_price"):
            v = cfg.get(price)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ReformError(f"--model_option {price}: must be a number >= 0 (per million tokens), got {v!r}")
        pub = urllib.parse.urlsplit(str.__str__(self.base_url))
        if pub.scheme not in ("http", "https") or not pub.hostname:
            raise ReformError(f"openai_api: base_url must be an http(s) URL, got '{public_url(self.base_url)}'")
        path = pub.path.rstrip("/")
        path = path if path.endswith("/chat/completions") else path + "/chat/completions"
        self.url = urllib.parse.urlunsplit((pub.scheme, pub.netloc, path, pub.query, ""))
        #: where requests go: the URL with its credentials put back (only ever used on the wire)
        self._parts = urllib.parse.urlsplit(join_url_secrets(self.url, self.base_url.secrets))
        #: the endpoint as logs and errors show it (no credentials, no query)
        self.public_url = public_url(self.url)
        self._sample_tags: Optional[List[str]] = None

    def _secret_values(self) -> List[str]:
        """This client's credentials in the clear (for scrubbing replies), longest first."""
        values = [self.api_key.reveal()] if self.api_key else []
        values += [v.reveal() for v in self.base_url.secrets.values()]
        values += [v.reveal() for v in _secrets_in(self.extra_body)]
        values += [urllib.parse.quote(v, safe="") for v in list(values)]
        return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        """``text`` without this client's credentials (a server may echo them back)."""
        for value in self._secret_values():
            text = text.replace(value, REDACTED)
        return text

    def make_preprocessor(self, config: Dict[str, Any]) -> ChatTemplateProcessor:
        """Chat messages: the server applies its own chat template."""
        return ChatTemplateProcessor(system_msg=config.get("system_msg", ""))

    def describe(self) -> Dict[str, Any]:
        """The endpoint and model identify outputs; the key never appears."""
        out = super().describe()
        out["base_url"] = public_url(str.__str__(self.base_url))
        return out

    # -- request building ------------------------------------------------------------
    def build_request(self, images: Sequence[Any], prompt: Any, **gen_kwargs: Any) -> Dict[str, Any]:
        """The JSON body for one sample; HF-style generation kwargs are mapped to API names.
        Credentials of ``extra_body`` stay Secrets here; ``request`` reveals them on the wire."""
        urls = [encode_image(im, self.image_format) for im in images]
        body: Dict[str, Any] = {"model": self.model, "messages": to_openai_messages(prompt, urls)}
        body["max_tokens"] = int(gen_kwargs.get("max_new_tokens", gen_kwargs.get("max_tokens", self.max_new_tokens)))
        temperature = float(gen_kwargs.get("temperature") or 0.0)
        do_sample = gen_kwargs.get("do_sample", temperature > 0)
        if not do_sample:
            body["temperature"] = 0.0
        else:
            body["temperature"] = float(gen_kwargs.get("temperature", 1.0))
            if "top_p" in gen_kwargs:
                body["top_p"] = float(gen_kwargs["top_p"])
        for key in ("seed", "stop"):
            if gen_kwargs.get(key) is not None:
                body[key] = gen_kwargs[key]
        body.update(self.extra_body)
        return body

    # -- transport -------------------------------------------------------------------
    def _post_once(self, payload: bytes) -> Dict[str, Any]:
        """One HTTP attempt, bounded as a whole by ``timeout``; no redirects.
        Raises _Retryable for transient failures, ReformError otherwise."""
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": "reform-eval"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key.reveal()}"
        elif "userinfo" in self.base_url.secrets:
            token = base64.b64encode(self.base_url.secrets["userinfo"].reveal().encode("utf-8")).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        conn, target = self._connection(time.monotonic() + self.timeout)
        try:
            conn.request("POST", target, body=payload, headers=headers)
            resp = conn.getresponse()
            status, reason = resp.status, resp.reason
            raw = resp.read()
            resp_headers = resp.headers
        except _DeadlinePassed:
            raise _Retryable(f"no complete reply within {self.timeout:g} s") from None
        except (socket.timeout, TimeoutError):
            raise _Retryable(f"no reply within {self.timeout:g} s") from None
        except (ConnectionRefusedError, socket.gaierror) as e:
            raise _Retryable(f"cannot reach endpoint ({e})") from None
        except (OSError, http.client.HTTPException) as e:
            raise _Retryable(self.scrub(f"connection failed ({type(e).__name__}: {e})")) from None
        finally:
            conn.close()
        if 300 <= status < 400:
            location = public_url(resp_headers.get("Location") or "?")
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} redirected "
                              f"(HTTP {status}) to {location}; redirects are not followed so the API key "
                              "is never sent to another host: set base_url to the final URL")
        if status >= 400 or status < 200:
            detail = _error_detail(self.scrub(raw.decode("utf-8", "replace")), reason)
            if status in RETRYABLE_STATUS:
                raise _Retryable(f"HTTP {status}: {detail}", _retry_after(resp_headers),
                                 congestion=status in CONGESTION_STATUS)
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} refused the request "
                              f"(HTTP {status}: {detail})")
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            shown = redact_text(self.scrub(raw.decode("utf-8", "replace")))[:200]
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} replied with "
                              f"malformed JSON: {shown!r}") from None

    def _connection(self, deadline: float) -> "tuple[http.client.HTTPConnection, str]":
        """A connection to the endpoint whose every socket read and write must finish before
        ``deadline`` (through ``http(s)_proxy`` when the environment sets one for this host),
        and the request target."""
        p = self._parts
        path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        https = p.scheme == "https"
        port = p.port or (443 if https else 80)
        host, conn_port, target = p.hostname, port, path
        proxy = urllib.request.getproxies().get(p.scheme)
        if proxy and not urllib.request.proxy_bypass(p.hostname):
            pp = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            host, conn_port = pp.hostname, pp.port or 8080
            if not https:
                target = f"http://{p.hostname}:{port}{path}"
        if https:
            conn: http.client.HTTPConnection = _DeadlineHTTPSConnection(host, conn_port, timeout=self.timeout)
            if host != p.hostname:
                conn.set_tunnel(p.hostname, port)
        else:
            conn = _DeadlineHTTPConnection(host, conn_port, timeout=self.timeout)
        conn.deadline = deadline
        return conn, target

    def _parse(self, reply: Any) -> GenText:
        """The assistant text of a chat-completions reply (credentials scrubbed, normalised by
        ``finish_text``) with its ``usage``; anything else is a malformed reply."""
        try:
            message = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise ReformError(f"openai_api model '{self.model}': malformed reply from {self.public_url} "
                              f"(no choices[0].message): {self._show(reply)}") from None
        content = message.get("content") if isinstance(message, dict) else None
        text: Optional[str] = None
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):  # some gateways return content parts
            texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if texts:
                text = "".join(texts)
        if text is None:
            refusal = message.get("refusal") if isinstance(message, dict) else None
            if not isinstance(refusal, str):
                raise ReformError(f"openai_api model '{self.model}': malformed reply from {self.public_url} "
                                  f"(choices[0].message.content is {type(content).__name__}): {self._show(reply)}")
            logger.warning("openai_api model '%s' refused to answer: %s", self.model, self.scrub(refusal)[:200])
            text = refusal
        usage = _usage(reply.get("usage") if isinstance(reply, dict) else None)
        tokens = usage.get("completion_tokens") if usage else None
        return GenText(finish_text(self.scrub(text)), tokens=tokens, usage=usage)

    def _show(self, reply: Any) -> str:
        """A reply, short, for an error message: credentials scrubbed before it is cut."""
        return redact_text(self.scrub(json.dumps(reply, default=str)))[:200]

    def request(self, body: Dict[str, Any], tag: str = "", parse: Optional[Any] = None) -> GenText:
        """POST with retries and backoff (through the adaptive limit and the token budget);
        returns the reply text with its usage (``parse(reply)`` instead, when given: an object
        with ``usage``), or raises ReformError naming ``tag``."""
        payload = json.dumps(reveal_deep(body)).encode("utf-8")
        label = f" {tag}" if tag else ""
        last = ""
        for attempt in range(self.max_retries + 1):
            need = self.budget.estimate(body)
            self.budget.reserve(need, tag or "the next request")
            sent = self.limiter.acquire()
            outcome, retry_after, usage = "other", None, None
            try:
                out = (parse or self._parse)(self._post_once(payload))
                outcome, usage = "ok", out.usage
                return out
            except _Retryable as e:
                last, retry_after = str(e), e.retry_after
                if e.congestion:
                    outcome = "congested"
            except ReformError as e:  # a refusal or a malformed reply: name the sample
                raise ReformError(f"{tag}: {e}" if tag else str(e)) from None
            finally:
                self.limiter.release(sent, outcome, retry_after)
                self.budget.settle(need, usage if outcome == "ok" else {"prompt_tokens": 0})
            if attempt == self.max_retries:
                break
            delay = min(self.backoff_max, self.backoff_base * (2 ** attempt))
            if retry_after is not None:
                delay = min(self.backoff_max, max(delay, retry_after))
            logger.warning("openai_api %s%s: attempt %d/%d failed (%s); retrying in %.2f s", self.model,
                           label, attempt + 1, self.max_retries + 1, last, delay)
            time.sleep(delay)
        raise ReformError(f"openai_api model '{self.model}'{label}: gave up after "
                          f"{self.max_retries + 1} attempts at {self.public_url}; last error: {last}")

    # -- contract ----------------------------------------------------------------------
    def forward(self, inference_method: str, samples: Sequence[Dict[str, Any]], prompts: Sequence[Any],
                **gen_kwargs: Any) -> List[Any]:
        """As ``BaseInterface.forward``; remembers the samples so errors can name them."""
        self._sample_tags = [f"sample {s.get('sample_id')} (dup_index {s.get('dup_index', 0)})" for s in samples]
        try:
            return super().forward(inference_method, samples, prompts, **gen_kwargs)
        finally:
            self._sample_tags = None

    def _tag(self, i: int, n: int) -> str:
        tags = self._sample_tags
        if tags is not None and len(tags) == n:
            return tags[i]
        return f"request {i + 1} of {n}" if n > 1 else ""

    def resume_from(self, records: Sequence[Dict[str, Any]], world_size: int = 1) -> None:
        """max_total_tokens is the run's budget: the tokens of answers already saved count, and
        each of ``world_size`` ranks spends at most its share of the rest."""
        self.budget.charge_recorded((spent_usage(r) for r in records), world_size)

    def raw_generate(self, images: Sequence[Any], prompt: Any, **gen_kwargs: Any) -> str:
        return self.raw_batch_generate([images], [prompt], **gen_kwargs)[0]

    def raw_batch_generate(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                           **gen_kwargs: Any) -> List[str]:
        """Send the batch with up to ``max_concurrency`` requests in flight (adaptive).

        If any sample fails, the whole batch raises (after the in-flight requests end), so
        no failed call is ever returned as a prediction; the error names the failing sample.
        With a token budget, a batch that might not fit is refused before any request is sent.
        """
        seeds = gen_kwargs.pop("seeds", None)  # run_eval's per-sample seeds -> the API's ``seed``
        if seeds is not None and len(seeds) != len(prompts):
            raise ReformError(f"openai_api: {len(seeds)} seeds for {len(prompts)} prompts")
        n = len(prompts)
        bodies = []
        for i, (im, p) in enumerate(zip(images_list, prompts)):
            try:
                bodies.append(self.build_request(im, p, **gen_kwargs,
                                                 **({"seed": int(seeds[i])} if seeds is not None else {})))
            except ReformError as e:
                tag = self._tag(i, n)
                raise ReformError(f"{tag}: {e}" if tag else str(e)) from None
        if self.budget.limit is not None and n > 1:  # all or nothing: no paid reply is thrown away
            need = sum(self.budget.estimate(b) for b in bodies)
            self.budget.reserve(need, f"a batch of {n} requests")
            self.budget.settle(need, {"prompt_tokens": 0})
        if n <= 1 or self.max_concurrency == 1:
            return [self.request(b, tag=self._tag(i, n)) for i, b in enumerate(bodies)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, n),
                                thread_name_prefix="openai_api") as pool:
            futures = [pool.submit(self.request, b, self._tag(i, n)) for i, b in enumerate(bodies)]
            results: List[str] = []
            for fut in futures:
                exc = fut.exception()
                if exc is not None:
                    for other in futures:
                        other.cancel()
                    raise exc
                results.append(fut.result())
        return results

    def raw_batch_predict(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                          candidates_list: Sequence[Sequence[str]]) -> List[List[CandidateScore]]:
        """Candidate scores from the endpoint's prompt log-probabilities (``models.openai_likelihood``);
        an endpoint without them is refused in one line."""
        n = len(prompts)
        return score_candidates(self, images_list, prompts, candidates_list, [self._tag(i, n) for i in range(n)])


def _secrets_in(obj: Any) -> List[Secret]:
    """Every Secret inside ``obj`` (dicts and lists, any depth)."""
    if isinstance(obj, Secret):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _secrets_in(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in _secrets_in(v)]
    return []


def _usage(raw: Any) -> Optional[Dict[str, int]]:
    """The numeric fields of a reply's ``usage`` (prompt, completion, total tokens), or None."""
    if not isinstance(raw, dict):
        return None
    out = {k: int(v) for k, v in raw.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and k.endswith("_tokens")}
    return out or None


def public_url(url: str) -> str:
    """``url`` without user info and query (where keys hide: ``https://k@host/?api-key=...``)."""
    try:
        p = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    host = p.hostname or ""
    if p.port:
        host += f":{p.port}"
    return urllib.parse.urlunsplit((p.scheme, host, p.path, "", ""))


def _error_detail(body: str, reason: str = "") -> str:
    """The server's error message, short (``body``: the reply text, credentials scrubbed)."""
    try:
        msg = json.loads(body).get("error", {})
        if isinstance(msg, dict) and msg.get("message"):  # servers may echo the key back
            return redact_text(str(msg["message"]))[:200]
    except (json.JSONDecodeError, AttributeError):
        pass
    return redact_text(str(body.strip() or reason or ""))[:200]


def _retry_after(headers: Any) -> Optional[float]:
    """Seconds from a numeric ``Retry-After`` header, if any."""
    value = headers.get("Retry-After") if headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
