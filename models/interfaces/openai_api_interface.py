"""``openai_api``: any OpenAI-compatible chat-completions endpoint (generation; likelihood where the
endpoint returns prompt log-probabilities, as vLLM does: ``models.openai_likelihood``).

This is how users reach GPT-4o / Claude / Gemini gateways and local vLLM or SGLang servers.
The transport (``models.http_transport``: keep-alive connections per worker thread, one
deadline per request, no redirects) and the limits (``models.request_limits``) have their own
modules; this one builds requests, reads replies and runs them.

Why the details below:

* a run keeps ONE window of ``max_concurrency`` requests in flight from its first sample to
  its last (``submit``: the engine starts the next request the moment a reply arrives, and
  records each answer as it comes, ``evaluation.window``); a batch that waited for its slowest
  reply halved the throughput against a server whose replies vary in time (issue 24);
* images are sent inline as base64 ``data:`` URLs, in the order their ``<image>``
  placeholders appear in the conversation, because gateways cannot reach local files; each
  distinct image is encoded once per run (``models.openai_messages.EncodedImages``);
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
* ``timeout`` bounds the WHOLE request (send, headers and body), and redirects are never
  followed (``models.http_transport``);
* numbers from the server are validated where they enter: ``Retry-After`` is clamped to
  ``backoff_max``, ``usage`` counts must be whole numbers from 0 up; a reply nested deeper than
  the JSON parser follows is a malformed reply, and a lone surrogate in its text is replaced
  by U+FFFD (each logged once);
* credentials are held as ``utils.secrets.Secret`` values: the API key, the user info and
  credential query parameters of ``base_url`` (``?api-key=``, ``auth=``, ``X-Amz-Signature=``:
  split out at config time, ``utils.secrets.SecretURL``, and put back only on the wire) and
  credential-named keys at any depth of ``extra_body``; a reply that echoes one has it
  redacted before it becomes a prediction or an error message.
* options the client cannot honour are refused, not ignored: ``preprocessor``, ``roles`` and
  ``response_prefix`` (the server applies its own chat template).

For a model served by vLLM or SGLang (``vllm serve <model>`` / ``python -m
sglang.launch_server``), point ``base_url`` at the server's ``/v1`` and raise
``max_concurrency``: that many requests stay in flight, so the server can batch them
(``--per_gpu_eval_batch_size`` does not apply to an endpoint; see docs/models.md).

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
import hashlib
import json
import logging
import os
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence

from PIL import Image

from .. import register_model
from ..http_transport import Endpoint, Retryable, log_clamp_once, public_url
from ..http_transport import retry_after as parse_retry_after
from .base_interface import BaseInterface, CandidateScore
from ..openai_messages import (IMAGE_FORMATS, EncodedImages, encode_image, image_format,  # noqa: F401
                                    to_openai_messages)
from ..openai_likelihood import score_candidates
from ..outputs import GenText, finish_text
from ..request_limits import (AdaptiveLimit, RetryGate, TokenBudget, clean_usage,  # noqa: F401
                                               image_tokens_upper, spent_usage)
from ...utils.errors import ReformError, Stopped
from ...utils.preprocessors import ChatTemplateProcessor
from ...utils.request_pool import RequestPool
from ...utils.secrets import (REDACTED, Secret, SecretURL, basic_credentials, join_url_secrets, excerpt,
                                       misplaced_userinfo, reveal_deep, secret_forms, secret_options)

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: HTTP statuses worth another try: rate limit, request timeout, conflict, server errors
RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
#: statuses that say "too many requests": the adaptive limit backs off on these
CONGESTION_STATUS = frozenset({429, 503})


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
    runs_on_device = False

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
        api_key = cfg.get("api_key") or os.environ.get("OPENAI_API_KEY") or None
        self.api_key: Optional[Secret] = Secret(api_key) if api_key else None
        #: base_url's user info as a Basic ``Authorization`` value: a Secret, registered (with the
        #: pair and the password) so an echo of the header is redacted wherever the key is
        info = self.base_url.secrets.get("userinfo")
        self.basic_auth: Optional[Secret] = basic_credentials(*info.reveal().partition(":")[::2]) if info else None
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
        #: who may retry after a failure, and whether the run is stopping (``stop_retrying``)
        self.retry_gate = RetryGate()
        budget = cfg.get("max_total_tokens")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ReformError(f"--model_option max_total_tokens: must be a whole number >= 1, got {budget!r}")
        self.budget = TokenBudget(budget)
        for price in ("prompt_price", "completion_price"):
            v = cfg.get(price)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ReformError(f"--model_option {price}: must be a number >= 0 (per million tokens), got {v!r}")
        origin = "--model_option base_url" if cfg.get("base_url") else \
            "OPENAI_BASE_URL" if os.environ.get("OPENAI_BASE_URL") else "base_url"
        if misplaced_userinfo(str.__str__(self.base_url)):  # its pieces may be parts of a password: none quoted
            raise ReformError(f"openai_api: {origin}: malformed URL (an '@' after the host: credentials in the URL "
                              "must percent-encode reserved characters, '/' as %2F, '?' as %3F, '#' as %23, "
                              "'@' as %40)")
        try:
            pub = urllib.parse.urlsplit(str.__str__(self.base_url))
            pub.port  # noqa: B018 - raises on a port out of range or not a number
        except ValueError as e:
            why = ("the host or port after the credentials is malformed" if "@" in str.__str__(self.base_url)
                   else excerpt(e, 200))
            raise ReformError(f"openai_api: {origin}: malformed URL ({why})") from None
        if pub.scheme not in ("http", "https") or not pub.hostname:
            raise ReformError(f"openai_api: {origin} must be an http(s) URL, got '{public_url(self.base_url)}'")
        path = pub.path.rstrip("/")
        path = path if path.endswith("/chat/completions") else path + "/chat/completions"
        self.url = urllib.parse.urlunsplit((pub.scheme, pub.netloc, path, pub.query, ""))
        #: the transport, to the URL with its credentials put back (only ever used on the wire)
        self.endpoint = Endpoint(join_url_secrets(self.url, self.base_url.secrets), self.timeout, self.scrub)
        #: the endpoint as logs and errors show it (no credentials, no query)
        self.public_url = public_url(self.url)
        self._sample_tags: Optional[List[str]] = None
        self.images = EncodedImages(self.image_format)
        #: what the server reported about itself (first reply): model id, fingerprint, Server header
        self.served: Dict[str, Any] = {}
        #: the run's request workers (one keep-alive connection each), started on the first submit
        self.pool = RequestPool(self.max_concurrency, name="openai_api")

    def _secret_values(self) -> List[str]:
        """This client's credentials in the clear (for scrubbing replies), longest first."""
        values = [self.api_key.reveal()] if self.api_key else []
        values += [v.reveal() for v in self.base_url.secrets.values()]
        values += [v.reveal() for v in _secrets_in(self.extra_body)]
        for auth in (self.basic_auth, self.endpoint.proxy.authorization if self.endpoint.proxy else None):
            if auth is not None:  # a Basic header: its token, and the user:password pair inside it
                token = auth.reveal().split(" ", 1)[1]
                values += [token, base64.b64decode(token).decode("utf-8", "replace")]
        forms = {f for v in values for f in secret_forms(v)} | {v for v in values if len(v) >= 4}
        return sorted(forms, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        """``text`` without this client's credentials (a server may echo them back)."""
        values = self.__dict__.get("_scrub_values")
        if values is None:  # the credentials never change: listed once
            values = self.__dict__["_scrub_values"] = self._secret_values()
        for value in values:
            if value in text:
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
        urls = [self.images.url(im) for im in images]
        return self._body(to_openai_messages(prompt, urls), **gen_kwargs)

    def _body(self, messages: List[Dict[str, Any]], **gen_kwargs: Any) -> Dict[str, Any]:
        body: Dict[str, Any] = {"model": self.model, "messages": messages}
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
    def _post_once(self, payload: bytes) -> Any:
        """One HTTP attempt, bounded as a whole by ``timeout``; no redirects.
        Raises Retryable for transient failures, ReformError otherwise. (The credentials are put
        in the headers per request: the object never holds them in the clear.)"""
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": "reform-eval"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key.reveal()}"
        elif self.basic_auth is not None:
            headers["Authorization"] = self.basic_auth.reveal()
        reply = self.endpoint.post(payload, headers)
        status, raw, resp_headers = reply.status, reply.body, reply.headers
        if self.served.get("server") is None:  # what the server says it is (the first reply that says)
            found = resp_headers.get("Server")
            if found:
                self.served["server"] = self._excerpt(found, 100)
        if 300 <= status < 400:
            location = public_url(resp_headers.get("Location") or "?")
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} redirected "
                              f"(HTTP {status}) to {location}; redirects are not followed so the API key "
                              "is never sent to another host: set base_url to the final URL")
        if status >= 400 or status < 200:
            detail = _error_detail(self.scrub(raw.decode("utf-8", "replace")), reply.reason)
            if status in RETRYABLE_STATUS:
                raise Retryable(f"HTTP {status}: {detail}",
                                parse_retry_after(resp_headers, self.backoff_max, f"openai_api {self.public_url}"),
                                congestion=status in CONGESTION_STATUS)
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} refused the request "
                              f"(HTTP {status}: {detail})")
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            shown = self._excerpt(raw.decode("utf-8", "replace"), 200)
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} replied with "
                              f"malformed JSON: {shown!r}") from None
        except RecursionError:
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} replied with JSON "
                              "nested deeper than the parser follows (a malformed or hostile reply)") from None
        except ValueError as e:  # an integer of thousands of digits (Python's int-string limit)
            raise ReformError(f"openai_api model '{self.model}': endpoint {self.public_url} replied with an "
                              f"unreadable JSON value ({self._excerpt(e, 120)})") from None

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
            logger.warning("openai_api model '%s' refused to answer: %s", self.model, self._excerpt(refusal, 200))
            text = refusal
        if "model" not in self.served and isinstance(reply, dict):  # what the server says answered
            model, fp = reply.get("model"), reply.get("system_fingerprint")
            self.served["model"] = self._excerpt(model, 200) if model is not None else None
            self.served["system_fingerprint"] = self._excerpt(fp, 200) if fp is not None else None
        usage = clean_usage(reply.get("usage") if isinstance(reply, dict) else None,
                            f"openai_api {self.public_url}")
        tokens = usage.get("completion_tokens") if usage else None
        return GenText(finish_text(self.scrub(well_formed(text, self.public_url))), tokens=tokens, usage=usage)

    def _show(self, reply: Any) -> str:
        """A reply, short, for an error message: credentials scrubbed before it is cut."""
        return self._excerpt(json.dumps(reply, default=str), 200)

    def _excerpt(self, text: Any, limit: int) -> str:
        """Server-provided ``text`` for a message or a file (the Server header, the served model
        id): this client's credentials scrubbed and every secret redacted, THEN cut (a cut first
        can leave part of a token that no redaction recognises)."""
        return excerpt(self.scrub(str(text)), limit)

    def request(self, body: Dict[str, Any], tag: str = "", image_tokens: int = 0, parse: Optional[Any] = None) -> GenText:
        """POST with retries and backoff (through the adaptive limit and the token budget);
        returns the reply text with its usage (``parse(reply)`` instead, when given: an object
        with ``usage``), or raises ReformError naming ``tag``. ``image_tokens``: the budget's
        estimate of the prompt tokens the body's images cost."""
        payload = json.dumps(reveal_deep(body) if self.extra_body else body).encode("utf-8")
        label = f" {tag}" if tag else ""
        last = ""
        gate = self.retry_gate
        try:
            for attempt in range(self.max_retries + 1):
                # once the run is stopping (or the call probing a failing endpoint failed for good), no
                # new attempt starts: models.request_limits.RetryGate
                if gate.stopping.is_set() or (attempt and not gate.may_retry()):
                    raise Stopped(f"openai_api model '{self.model}'{label}: stopped after {attempt} attempt"
                                      f"{'s' if attempt != 1 else ''} at {self.public_url}: the run is stopping "
                                      f"(another call failed for good, or the run was stopped)" + (f"; last error: {last}" if last else ""))
                need = self.budget.estimate(body, image_tokens) if self.budget.limit is not None else 0
                self.budget.reserve(need, tag or "the next request")
                sent = self.limiter.acquire()
                outcome, retry_after, usage = "other", None, None
                try:
                    out = (parse or self._parse)(self._post_once(payload))
                    # every parser's usage passes here, the one gate of a server's counts into the budget
                    outcome, usage = "ok", clean_usage(out.usage, f"openai_api {self.public_url}")
                    gate.outcome(True)
                    return out
                except Retryable as e:
                    last, retry_after = str(e), e.retry_after
                    if e.congestion:
                        outcome = "congested"
                except ReformError as e:  # a refusal or a malformed reply: name the sample
                    raise ReformError(f"{tag}: {e}" if tag else str(e)) from None
                finally:
                    self.limiter.release(sent, outcome, retry_after)
                    # a reply that does not say both counts is charged its worst case (issue 25: a server's
                    # numbers never switch the budget off)
                    counted = usage if usage and {"prompt_tokens", "completion_tokens"} <= set(usage) else None
                    self.budget.settle(need, counted if outcome == "ok" else {"prompt_tokens": 0})
                if attempt == self.max_retries:
                    break
                gate.outcome(False)
                delay = min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt, 64))  # no float overflow
                if retry_after is not None:
                    delay = min(self.backoff_max, max(delay, retry_after))
                logger.warning("openai_api %s%s: attempt %d/%d failed (%s); retrying in %.2f s", self.model,
                               label, attempt + 1, self.max_retries + 1, last, delay)
                gate.stopping.wait(delay)  # (a stopping run ends the wait at once)
            raise ReformError(f"openai_api model '{self.model}'{label}: gave up after "
                              f"{self.max_retries + 1} attempts at {self.public_url}; last error: {last}")
        except BaseException:  # (a refusal, the budget, an interrupt: the call failed for good)
            gate.outcome(False, final=True)
            raise

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
        """Send the batch through the run's request workers (``max_concurrency`` in flight).

        If any sample fails, the whole batch raises (after the in-flight requests end), so
        no failed call is ever returned as a prediction; the error names the failing sample.
        (``run_eval`` does not batch an endpoint: it keeps a window of calls in flight across the
        run and records every answer as it arrives, ``submit``.)
        """
        seeds = gen_kwargs.pop("seeds", None)  # run_eval's per-sample seeds -> the API's ``seed``
        if seeds is not None and len(seeds) != len(prompts):
            raise ReformError(f"openai_api: {len(seeds)} seeds for {len(prompts)} prompts")
        n = len(prompts)
        self.stop_retrying(False)  # a new batch of a library caller (a stopped run's flag is not its)
        if self.budget.limit is not None and n > 1:  # all or nothing: no paid reply is thrown away
            need = 0
            for im, p in zip(images_list, prompts):
                body = self.build_request(im, p, **gen_kwargs)
                need += self.budget.estimate(body, sum(image_tokens_upper(_image_size(x)) for x in im))
            self.budget.reserve(need, f"a batch of {n} requests")
            self.budget.settle(need, {"prompt_tokens": 0})
        kwargs = [dict(gen_kwargs, **({"seed": int(seeds[i])} if seeds is not None else {})) for i in range(n)]
        if n <= 1 or self.max_concurrency == 1:  # one at a time: the first failure stops the rest unsent
            return [self._generate_one(im, p, self._tag(i, n), kwargs[i])[0]
                    for i, (im, p) in enumerate(zip(images_list, prompts))]
        return [out for out, _ in self.pool.map_all(self._generate_one, [
            (im, p, self._tag(i, n), kwargs[i]) for i, (im, p) in enumerate(zip(images_list, prompts))])]

    def _generate_one(self, images: Sequence[Any], prompt: Any, tag: str,
                      gen_kwargs: Dict[str, Any]) -> "tuple[GenText, Dict[str, Any]]":
        """One sample's request, in a worker thread: (the reply, its trace)."""
        try:
            urls = [self.images.url(im) for im in images]
            body = self._body(to_openai_messages(prompt, urls), **gen_kwargs)
            trace = self.trace_of(prompt, urls)
            image_tokens = sum(image_tokens_upper(_image_size(im)) for im in images) \
                if self.budget.limit is not None else 0
        except ReformError as e:
            raise ReformError(f"{tag}: {e}" if tag else str(e)) from None
        out = self.request(body, tag=tag, image_tokens=image_tokens)
        # the prompt's token count as the server reports it
        trace["prompt_tokens"] = (out.usage or {}).get("prompt_tokens")
        return out, trace

    def trace_of(self, prompt: Any, urls: Sequence[str]) -> Dict[str, Any]:
        """What a request shows the server, as a trace: its messages with each image as the hash
        of the bytes sent (``prompt_sha``, ``prompt_text``). What the server makes of them is not
        visible from here: ``bos`` and ``pixel_sha`` are unknown (None; the images' content is the
        record's ``trace.image_sha``, their encoding ``provenance.image_format``), and
        ``prompt_tokens`` is the server's count, filled in from its reply."""
        shown = json.dumps(to_openai_messages(prompt, [f"sha:{self.images.digest(u)}" for u in urls]),
                           ensure_ascii=False, sort_keys=True)
        return {"prompt_sha": hashlib.sha256(shown.encode("utf-8", "surrogatepass")).hexdigest()[:16],
                "prompt_text": shown, "prompt_tokens": None, "bos": None, "pixel_sha": None}

    def stop_retrying(self, stopping: bool = True) -> None:
        """The run is stopping (a call failed for good, the budget or a write stopped it): no
        request starts a new attempt and every backoff ends now; ``False``: a new run begins."""
        if stopping:
            self.retry_gate.stopping.set()
        else:
            self.retry_gate = RetryGate()

    def max_in_flight(self) -> int:
        return self.max_concurrency

    def call(self, inference_method: str, sample: Dict[str, Any], prompt: Any, **gen_kwargs: Any) -> "tuple[Any, Any]":
        """One sample's call in the calling thread (a window worker, with its own keep-alive
        connection): (reply, trace)."""
        tag = f"sample {sample.get('sample_id')} (dup_index {sample.get('dup_index', 0)})"
        if inference_method == "generation":
            return self._generate_one(sample["images"], prompt, tag, gen_kwargs)
        traces: List[Dict[str, Any]] = []
        scores = score_candidates(self, [sample["images"]], [prompt], [sample.get("candidates") or []], [tag],
                                  parallel=False, traces_out=traces)[0]
        return scores, traces[0]

    def close(self) -> None:
        """The request workers end after their current request; connections are closed."""
        self.pool.close()
        self.pool = RequestPool(self.max_concurrency, name="openai_api")
        self.endpoint.close()

    def provenance(self) -> Dict[str, Any]:
        """What the client knows of what answered: the endpoint and the model id it was asked for
        (the server's own template, BOS and image processing are not visible from here)."""
        return {**super().provenance(), "engine": "openai_api",
                "endpoint": {"url": self.public_url, "requested_model": self.model,
                             "served_model": self.served.get("model"),
                             "server_version": self.served.get("system_fingerprint") or self.served.get("server")},
                "image_format": self.image_format, "extra_body_keys": sorted(self.extra_body)}

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


def _image_size(image: Any) -> Optional[Sequence[int]]:
    """An image's (width, height): a PIL image's, or a file's header read without decoding."""
    if isinstance(image, Image.Image):
        return image.size
    try:
        with Image.open(str(image)) as im:
            return im.size
    except (OSError, ValueError):
        return None


def well_formed(text: str, source: str) -> str:
    """``text`` with any lone surrogate (a reply's ``"\\ud800"``, which JSON allows but UTF-8
    cannot hold) replaced by U+FFFD, logged once: a prediction must be writable as it is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        log_clamp_once("surrogate", f"openai_api {source}: a reply held a lone surrogate; replaced by U+FFFD")
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _error_detail(body: str, reason: str = "") -> str:
    """The server's error message, short (``body``: the reply text, credentials scrubbed)."""
    try:
        msg = json.loads(body).get("error", {})
        if isinstance(msg, dict) and msg.get("message"):  # servers may echo the key back
            return excerpt(msg["message"], 200)
    except (ValueError, AttributeError, RecursionError):  # ValueError: malformed, or a huge integer
        pass
    return excerpt(body.strip() or reason or "", 200)
