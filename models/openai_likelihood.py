"""Likelihood through an OpenAI-compatible chat endpoint that returns prompt log-probabilities (vLLM).

Why it is possible: vLLM's chat completions accept ``prompt_logprobs`` (the log-probability of
every prompt token), ``continue_final_message`` (render the last, assistant, message without
closing it) and ``add_special_tokens``. A candidate written as the start of the assistant's reply
is then scored by the server exactly as the in-process path scores it (``models.hf_likelihood``:
the summed log-probability of the candidate's tokens after the prompt, and their count).

Per sample, through the client's own ``request`` (its transport, retries, deadline, concurrency
limit and token budget):

1. the *prefix* request: the sample's messages with the generation prompt (``add_generation_prompt:
   true``), ``prompt_logprobs: 0``, ``max_tokens: 1``. Its ``prompt_logprobs`` list the prompt's
   tokens as the server rendered and tokenized them;
2. one request per candidate: the same messages plus ``{"role": "assistant", "content":
   candidate}``, ``continue_final_message: true``, ``add_generation_prompt: false``,
   ``prompt_logprobs: 0``, ``max_tokens: 1``. The candidate's tokens are those after the prefix's
   tokens, which must be a prefix of them (as the in-process path requires; where a template or
   tokenizer merges the joint, the sample is refused in one line rather than scored on other
   tokens). Score: the sum of their log-probabilities, and their count.

Why a prefix request rather than vLLM's ``/tokenize``: it goes through the same client call (no
second endpoint, no second transport), it is rendered by exactly the template and tokenizer of
the candidate requests, and it costs one prompt pass per sample, shared by all candidates.

BOS: the chat endpoint tokenizes without special tokens unless asked, while the in-process path
(the family's processor) adds them (Llama: BOS). Likelihood requests send
``add_special_tokens: true`` by default (the endpoint is a vLLM-style one: the probe below proved
it) unless ``extra_body`` sets ``add_special_tokens`` itself; ``likelihood_provenance`` records the
choice. Generation requests are left as the user configures them (``extra_body={add_special_tokens:
true}`` on a vLLM server gives the in-process tokens; docs/cluster.md), because the field is a
vLLM extension that other endpoints refuse.

Capability probe: before the first likelihood request, one tiny text request with
``prompt_logprobs: 0``; an endpoint that refuses it or answers without ``prompt_logprobs`` is
refused in one line (``--infer_method generation`` is then the way).
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .interfaces.base_interface import CandidateScore
from .openai_messages import to_openai_messages
from ..utils.errors import BudgetExhausted, ReformError

#: the vLLM extension fields every likelihood request carries
LIKELIHOOD_FIELDS = {"prompt_logprobs": 0, "max_tokens": 1, "temperature": 0.0}

_probed: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_probe_lock = threading.Lock()


class PromptLogprobs(NamedTuple):
    """A reply's prompt tokens (``None`` where the server gives no token: the first) and their
    log-probabilities, with the reply's ``usage`` as sent (``request`` passes it through
    ``clean_usage`` before the token budget reads it)."""

    token_ids: List[Optional[int]]
    logprobs: List[Optional[float]]
    usage: Optional[Dict[str, Any]]


def parse_prompt_logprobs(reply: Any) -> PromptLogprobs:
    """The ``prompt_logprobs`` of a chat-completions reply (vLLM: a list with one ``{token id:
    {"logprob": ...}}`` entry per prompt token, ``null`` for the first); ReformError when absent."""
    entries = reply.get("prompt_logprobs") if isinstance(reply, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ReformError("the reply has no prompt_logprobs")
    ids: List[Optional[int]] = []
    lps: List[Optional[float]] = []
    for entry in entries:
        if entry is None:
            ids.append(None)
            lps.append(None)
            continue
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ReformError(f"malformed prompt_logprobs entry {json.dumps(entry)[:120]}")
        (tok, info), = entry.items()
        try:
            tid, lp = int(tok), float(info["logprob"])  # OverflowError: an integer too large for a float
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ReformError(f"malformed prompt_logprobs entry {json.dumps(entry)[:120]}") from None
        if not lp <= 0.0:  # a log-probability: NaN or a positive number would score garbage
            raise ReformError(f"malformed prompt_logprobs entry {json.dumps(entry)[:120]} (logprob {lp!r} is not <= 0)")
        ids.append(tid)
        lps.append(lp)
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else None
    return PromptLogprobs(ids, lps, usage)


def sends_bos(client: Any) -> bool:
    """Whether likelihood requests ask the server to add special tokens (BOS): yes unless the
    user's ``extra_body`` decides ``add_special_tokens``."""
    return bool(client.extra_body.get("add_special_tokens", True))


def likelihood_provenance(client: Any) -> Dict[str, Any]:
    """The BOS fields of the provenance record for likelihood through ``client`` (generation:
    whatever ``extra_body`` says, else the server's default, unknown here)."""
    return {"adds_bos": sends_bos(client),
            "bos_source": "extra_body" if "add_special_tokens" in client.extra_body else "likelihood default"}


def _with_fields(client: Any, body: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
    out = dict(body, **LIKELIHOOD_FIELDS, **extra)
    if "add_special_tokens" not in client.extra_body:
        out["add_special_tokens"] = True
    return out


def probe(client: Any) -> None:
    """Refuse, in one line, an endpoint that does not return prompt log-probabilities (once per client)."""
    with _probe_lock:
        if _probed.get(client):
            return
        body = _with_fields(client, client.build_request([], "Hi", max_new_tokens=1))
        why = None
        try:
            client.request(body, "likelihood capability probe", parse=parse_prompt_logprobs)
        except BudgetExhausted:
            raise
        except ReformError as e:
            text = str(e)
            refused = re.search(r"refused the request \((HTTP \d+: .*)\)$", text)
            if refused:
                why = refused.group(1)
            elif "prompt_logprobs" in text and "gave up" not in text:
                why = text.split("likelihood capability probe: ", 1)[-1]
            else:
                raise  # not an answer about the capability (unreachable, timed out): as it is
        if why is not None:
            raise ReformError(f"openai_api model '{client.model}': endpoint {client.public_url} cannot score "
                              f"candidates (likelihood needs prompt_logprobs, a vLLM extension: {why}); "
                              "use --infer_method generation")
        _probed[client] = True


def _bodies(client: Any, images: Sequence[Any], prompt: Any, candidates: Sequence[str]
            ) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(the prefix request, then one request per candidate; the images' URLs, encoded once)."""
    urls = [client.images.url(im) for im in images]
    base = client._body(to_openai_messages(prompt, urls), max_new_tokens=1)
    out = [_with_fields(client, base, add_generation_prompt=True)]
    for cand in candidates:
        messages = list(base["messages"]) + [{"role": "assistant", "content": str(cand)}]
        out.append(_with_fields(client, base, messages=messages, add_generation_prompt=False,
                                continue_final_message=True))
    return out, urls


def _send_all(client: Any, bodies: List[Dict[str, Any]], tags: List[str], parallel: bool = True
              ) -> List[PromptLogprobs]:
    """Every request, up to the client's concurrency in flight, on the client's request workers
    (their keep-alive connections); the first failure is raised. Not ``parallel`` (a call from
    ``run_eval``'s window, which already keeps samples in flight side by side), a sample's
    requests go one after another in the calling thread."""
    if len(bodies) == 1 or client.max_concurrency == 1 or not parallel:
        return [client.request(b, t, parse=parse_prompt_logprobs) for b, t in zip(bodies, tags)]
    return client.pool.map_all(lambda b, t: client.request(b, t, parse=parse_prompt_logprobs), list(zip(bodies, tags)))


def candidate_score(prefix: PromptLogprobs, joint: PromptLogprobs, tag: str) -> CandidateScore:
    """The candidate's tokens are the joint prompt's tokens after the prefix's; they must extend it."""
    n = len(prefix.token_ids)
    if len(joint.token_ids) <= n or joint.token_ids[1:n] != prefix.token_ids[1:n]:
        raise ReformError(f"{tag}: the server's tokens of prompt + candidate do not extend the prompt's "
                          f"({len(prefix.token_ids)} and {len(joint.token_ids)} tokens): the candidate cannot be "
                          "scored on the tokens the in-process path scores")
    lps = joint.logprobs[n:]
    return CandidateScore(float(sum(lp for lp in lps if lp is not None)), len(lps))


def score_candidates(client: Any, images_list: Sequence[Sequence[Any]], prompts: Sequence[Any],
                     candidates_list: Sequence[Sequence[str]], tags: Sequence[str],
                     parallel: bool = True, traces_out: Optional[List[Dict[str, Any]]] = None
                     ) -> List[List[CandidateScore]]:
    """``raw_batch_predict`` of the ``openai_api`` client: per sample its prefix request and one
    request per candidate (module docstring), all of the batch sent together. ``traces_out``
    gets each sample's trace, as a generation request's (``trace_of``: the prefix request's
    messages, the prompt's token count as the server tokenized it)."""
    probe(client)
    bodies: List[Dict[str, Any]] = []
    body_tags: List[str] = []
    spans: List[Tuple[int, int]] = []
    traces: List[Dict[str, Any]] = []
    for i, (ims, p, cands) in enumerate(zip(images_list, prompts, candidates_list)):
        if not cands:
            raise ReformError(f"{tags[i]}: no candidates to score")
        try:
            mine, urls = _bodies(client, ims, p, cands)
            if traces_out is not None:
                traces.append(client.trace_of(p, urls))
        except ReformError as e:
            raise ReformError(f"{tags[i]}: {e}" if tags[i] else str(e)) from None
        spans.append((len(bodies), len(mine)))
        bodies.extend(mine)
        body_tags.extend([f"{tags[i]} (prompt)".strip()] + [f"{tags[i]} (candidate {k + 1})".strip()
                                                              for k in range(len(cands))])
    replies = _send_all(client, bodies, body_tags, parallel)
    out = []
    for i, ((start, n), tag) in enumerate(zip(spans, tags)):
        prefix = replies[start]
        out.append([candidate_score(prefix, replies[start + k], tag or "likelihood") for k in range(1, n)])
        if traces_out is not None:
            traces[i]["prompt_tokens"] = len(prefix.token_ids)
            traces_out.append(traces[i])
    return out
