"""``openai_api``: any OpenAI-compatible chat-completions endpoint (black-box, generation only).

This is how users reach GPT-4o / Claude / Gemini gateways and local vLLM or SGLang servers.
It speaks HTTP with the standard library (``urllib``) so the harness gains no dependency.

Why the details below:

* images are sent inline as base64 ``data:`` URLs, in the order their ``<image>``
  placeholders appear in the conversation, because gateways cannot reach local files;
* 429 and 5xx replies, timeouts and dropped connections are retried with exponential
  backoff (honouring ``Retry-After``), because rate limits and overloaded servers are the
  normal state of shared endpoints; other 4xx replies are refusals and fail at once;
* a batch is sent with bounded concurrency (``max_concurrency`` threads) so a big
  evaluation does not flood the endpoint;
* a call that finally fails raises :class:`ReformError`; it is never returned as a
  prediction, so a re-run retries exactly the samples that failed;
* ``timeout`` bounds the WHOLE request (send, headers and body): every socket read gets
  the time left until one deadline, so a server that drips one byte a second cannot hold a
  call forever (a per-read socket timeout restarts on every byte);
* redirects are never followed (``http.client``, no redirect handler): a 3xx is an error, so
  the ``Authorization`` header is only ever sent to the configured host;
* the API key is registered with ``utils.secrets`` and never logged; ``describe()`` and
  error messages show the endpoint without credentials.

For a model served by vLLM or SGLang (``vllm serve <model>`` / ``python -m
sglang.launch_server``), point ``base_url`` at the server's ``/v1`` and raise
``max_concurrency`` together with ``--per_gpu_eval_batch_size``: a batch is sent with that
many requests in flight, so the server can batch them (see docs/models.md).

Settings (config key, then environment variable, then default):

``model_name`` / ``OPENAI_MODEL``             the served model id (``--model_name``)
``base_url``   / ``OPENAI_BASE_URL``          default ``https://api.openai.com/v1``
``api_key``    / ``OPENAI_API_KEY``           optional (local servers need none)
``timeout`` (60 s per request), ``max_retries`` (5), ``backoff_base`` (1 s),
``backoff_max`` (30 s), ``max_concurrency`` (4), ``max_new_tokens`` (256), ``image_format`` (PNG),
``system_msg`` (for the preprocessor), ``extra_body`` (dict merged into every request).
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
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Union

from PIL import Image

from utils.schema import IMAGE_TOKEN
from models import register_model
from models.interfaces.base_interface import BaseInterface, CandidateScore
from utils.secrets import redact_text, register_secret, reveal
from utils.errors import ReformError
from utils.images import open_image
from utils.preprocessors import ChatTemplateProcessor

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: HTTP statuses worth another try: rate limit, request timeout, conflict, server errors
RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))


class _Retryable(Exception):
    """A failure that another attempt may cure (carries an optional Retry-After in seconds)."""

    def __init__(self, message: str, retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


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


def encode_image(image: Union[Image.Image, str], fmt: str = "PNG") -> str:
    """A base64 ``data:`` URL for one image (paths are opened, with errors naming the file)."""
    if isinstance(image, str):
        image = open_image(image)
    if not isinstance(image, Image.Image):
        raise ReformError(f"openai_api: cannot send an image of type {type(image).__name__}")
    fmt = fmt.upper()
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


@register_model("openai_api")
class OpenAIAPIInterface(BaseInterface):
    """Client for an OpenAI-compatible ``/chat/completions`` endpoint; generation only."""

    option_names = ("base_url", "api_key", "timeout", "max_retries", "max_concurrency", "backoff_base",
                    "backoff_max", "image_format", "extra_body")
    #: environment variables that decide which model answers: part of the run identity
    identity_env = ("OPENAI_MODEL", "OPENAI_BASE_URL")

    supports_likelihood = False

    def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(config)
        cfg = self.config
        self.model: str = cfg.get("model_name") or os.environ.get("OPENAI_MODEL") or ""
        if not self.model:
            raise ReformError("openai_api: no model id; pass --model_name <served model> "
                              "(or set OPENAI_MODEL)")
        self.base_url: str = (cfg.get("base_url") or os.environ.get("OPENAI_BASE_URL")
                              or DEFAULT_BASE_URL).rstrip("/")
        self.api_key: Optional[str] = reveal(cfg.get("api_key")) or os.environ.get("OPENAI_API_KEY") or None
        register_secret(self.api_key)
        self.timeout = float(cfg.get("timeout", 60.0))
        self.max_retries = int(cfg.get("max_retries", 5))
        self.backoff_base = float(cfg.get("backoff_base", 1.0))
        self.backoff_max = float(cfg.get("backoff_max", 30.0))
        self.max_concurrency = max(1, int(cfg.get("max_concurrency", 4)))
        self.max_new_tokens = int(cfg.get("max_new_tokens", 256))
        self.image_format = str(cfg.get("image_format", "PNG"))
        self.extra_body: Dict[str, Any] = dict(cfg.get("extra_body") or {})
        self.url = self.base_url if self.base_url.endswith("/chat/completions") \
            else self.base_url + "/chat/completions"
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ReformError(f"openai_api: base_url must be an http(s) URL, got '{public_url(self.base_url)}'")
        if parts.password:
            register_secret(parts.password)
        self._parts = parts
        #: the endpoint as logs and errors show it (no credentials, no query)
        self.public_url = public_url(self.url)

    def make_preprocessor(self, config: Dict[str, Any]) -> ChatTemplateProcessor:
        """Chat messages: the server applies its own chat template."""
        return ChatTemplateProcessor(system_msg=config.get("system_msg", ""),
                                     response_prefix=config.get("response_prefix"))

    def describe(self) -> Dict[str, Any]:
        """The endpoint and model identify outputs; the key never appears."""
        out = super().describe()
        out["base_url"] = public_url(self.base_url)
        return out

    # -- request building ------------------------------------------------------------
    def build_request(self, images: Sequence[Any], prompt: Any, **gen_kwargs: Any) -> Dict[str, Any]:
        """The JSON body for one sample; HF-style generation kwargs are mapped to API names."""
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
            headers["Authorization"] = f"Bearer {self.api_key}"
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
            raise _Retryable(f"connection failed ({type(e).__name__}: {e})") from None
        finally:
            conn.close()
        if 300 <= status < 400:
            location = public_url(resp_headers.get("Location") or "?")
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} redirected "
                              f"(HTTP {status}) to {location}; redirects are not followed so the API key "
                              "is never sent to another host: set base_url to the final URL")
        if status >= 400 or status < 200:
            detail = _error_detail(raw, reason)
            if status in RETRYABLE_STATUS:
                raise _Retryable(f"HTTP {status}: {detail}", _retry_after(resp_headers))
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} refused the request "
                              f"(HTTP {status}: {detail})")
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} replied with "
                              f"malformed JSON: {raw[:200]!r}") from None

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

    def _parse(self, reply: Any) -> str:
        """The assistant text of a chat-completions reply; anything else is a malformed reply."""
        try:
            message = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise ReformError(f"openai_api model '{self.model}': malformed reply from {self.public_url} "
                              f"(no choices[0].message): {str(reply)[:200]}") from None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # some gateways return content parts
            texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if texts:
                return "".join(texts)
        refusal = message.get("refusal") if isinstance(message, dict) else None
        if isinstance(refusal, str):
            logger.warning("openai_api model '%s' refused to answer: %s", self.model, refusal[:200])
            return refusal
        raise ReformError(f"openai_api model '{self.model}': malformed reply from {self.public_url} "
                          f"(choices[0].message.content is {type(content).__name__}): {str(reply)[:200]}")

    def request(self, body: Dict[str, Any], tag: str = "") -> str:
        """POST with retries and exponential backoff; returns the reply text or raises ReformError."""
        payload = json.dumps(body).encode("utf-8")
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                return self._parse(self._post_once(payload))
            except _Retryable as e:
                last = str(e)
                if attempt == self.max_retries:
                    break
                delay = min(self.backoff_max, self.backoff_base * (2 ** attempt))
                if e.retry_after is not None:
                    delay = min(self.backoff_max, max(delay, e.retry_after))
                logger.warning("openai_api %s%s: attempt %d/%d failed (%s); retrying in %.2f s", self.model,
                               f" {tag}" if tag else "", attempt + 1, self.max_retries + 1, last, delay)
                time.sleep(delay)
        raise ReformError(f"openai_api model '{self.model}'{f' {tag}' if tag else ''}: gave up after "
                          f"{self.max_retries + 1} attempts at {self.public_url}; last error: {last}")

    # -- contract ----------------------------------------------------------------------
    def raw_generate(self, images: Sequence[Any], prompt: Any, **gen_kwargs: Any) -> str:
        return self.raw_batch_generate([images], [prompt], **gen_kwargs)[0]

    def raw_batch_generate(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                           **gen_kwargs: Any) -> List[str]:
        """Send the batch with at most ``max_concurrency`` requests in flight.

        If any sample fails, the whole batch raises (after the in-flight requests end), so
        no failed call is ever returned as a prediction; the error names the failing sample.
        """
        seeds = gen_kwargs.pop("seeds", None)  # run_eval's per-sample seeds -> the API's ``seed``
        if seeds is not None and len(seeds) != len(prompts):
            raise ReformError(f"openai_api: {len(seeds)} seeds for {len(prompts)} prompts")
        bodies = [self.build_request(im, p, **gen_kwargs, **({"seed": int(seeds[i])} if seeds is not None else {}))
                  for i, (im, p) in enumerate(zip(images_list, prompts))]
        if len(bodies) <= 1 or self.max_concurrency == 1:
            return [self.request(b, tag=f"batch item {i}") for i, b in enumerate(bodies)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(bodies)),
                                thread_name_prefix="openai_api") as pool:
            futures = [pool.submit(self.request, b, f"batch item {i}") for i, b in enumerate(bodies)]
            results: List[str] = []
            for fut in futures:
                exc = fut.exception()
                if exc is not None:
                    for other in futures:
                        other.cancel()
                    raise exc
                results.append(fut.result())
        return results

    def raw_predict(self, images: Sequence[Any], prompt: Any,
                    candidates: Sequence[str]) -> List[CandidateScore]:
        raise ReformError(f"model 'openai_api' ({self.model}) is black-box: likelihood needs a white-box "
                          "model; use --infer_method generation")

    def raw_batch_predict(self, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                          candidates_list: Sequence[Sequence[str]]) -> List[List[CandidateScore]]:
        raise ReformError(f"model 'openai_api' ({self.model}) is black-box: likelihood needs a white-box "
                          "model; use --infer_method generation")


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


def _error_detail(raw: bytes, reason: str = "") -> str:
    """The server's error message, short."""
    body = raw.decode("utf-8", "replace")
    try:
        msg = json.loads(body).get("error", {})
        if isinstance(msg, dict) and msg.get("message"):  # servers may echo the key back
            return redact_text(str(msg["message"])[:200])
    except (json.JSONDecodeError, AttributeError):
        pass
    return redact_text(str(body.strip() or reason or "")[:200])


def _retry_after(headers: Any) -> Optional[float]:
    """Seconds from a numeric ``Retry-After`` header, if any."""
    value = headers.get("Retry-After") if headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
