"""Likelihood through ``--model openai_api`` (models.openai_likelihood) against a loopback server that
renders and tokenizes like vLLM's chat endpoint, word by word, with known log-probabilities.

The mock's rules (a stand-in for a chat template and a tokenizer): the rendered prompt is the
messages' texts joined by spaces, ``ASSISTANT:`` after them when ``add_generation_prompt``, an
assistant message continued as ``ASSISTANT: <content>`` when ``continue_final_message``; ``<s>``
first when ``add_special_tokens``; one token per word, token id = a stable hash of the word, and
the log-probability of a word is ``-len(word) / 10``. So a candidate's score is known exactly.
The real engine (vLLM) is tested in tests/test_vllm_engine.py.
"""
from __future__ import annotations

import json
import os
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

import pytest

from reform_eval.models import get_model
from reform_eval.utils.errors import BudgetExhausted, ReformError


def _word_id(word: str) -> int:
    return zlib.crc32(word.encode()) % 50000 + 10


def _texts(content: Any) -> List[str]:
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content if p.get("type") == "text"] + ["<image>" for p in content
                                                                      if p.get("type") == "image_url"]


def render(body: Dict[str, Any]) -> List[str]:
    """The words the mock server tokenizes (see the module docstring)."""
    words = ["<s>"] if body.get("add_special_tokens") else []
    messages = body["messages"]
    for k, m in enumerate(messages):
        if m["role"] == "assistant" and k == len(messages) - 1 and body.get("continue_final_message"):
            words += ["ASSISTANT:"] + " ".join(_texts(m["content"])).split()
        else:
            words += " ".join(_texts(m["content"])).split()
    if body.get("add_generation_prompt", True) and not body.get("continue_final_message"):
        words.append("ASSISTANT:")
    return words


class _Server:
    def __init__(self, mode: str = "vllm") -> None:
        self.mode = mode
        self.requests: List[Dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append(body)
                if outer.mode == "openai" and "prompt_logprobs" in body:
                    return self._send(400, {"error": {"message": "Unrecognized request argument supplied: "
                                                                 "prompt_logprobs"}})
                reply: Dict[str, Any] = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
                                         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
                if outer.mode == "vllm" and body.get("prompt_logprobs") is not None:
                    words = render(body)
                    if outer.mode == "vllm" and body.get("continue_final_message") and "merge" in words:
                        words = words[:-2] + [words[-2] + words[-1]]  # a tokenizer that merges across the join
                    reply["prompt_logprobs"] = [None] + [{str(_word_id(w)): {"logprob": -len(w) / 10, "rank": 1,
                                                                            "decoded_token": w}} for w in words[1:]]
                self._send(200, reply)

            def _send(self, code: int, payload: Dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()


@pytest.fixture
def vllm_like():
    s = _Server("vllm")
    yield s
    s.httpd.shutdown()


def _model(url: str, **options: Any):
    cfg = {"model_name": "served", "base_url": url, "max_retries": 0, "backoff_base": 0.0, **options}
    return get_model("openai_api", cfg)


def _sample(i: int, cands: List[str]) -> Dict[str, Any]:
    return {"sample_id": f"s{i}", "dup_index": 0, "images": [], "question": f"Is it item {i}?",
            "candidates": cands}


def test_candidate_scores_are_the_summed_log_probs_of_their_tokens(vllm_like):
    model, prep = _model(vllm_like.url, max_concurrency=4)
    samples = [_sample(0, ["yes", "no"]), _sample(1, ["a red circle", "blue"])]
    scores = model.forward("likelihood", samples, [prep(s) for s in samples])
    assert [[(round(c.logprob, 6), c.num_tokens) for c in row] for row in scores] == [
        [(-0.3, 1), (-0.2, 1)], [(-0.1 - 0.3 - 0.6, 3), (-0.4, 1)]]
    probe, *rest = vllm_like.requests
    assert probe["prompt_logprobs"] == 0 and probe["max_tokens"] == 1
    assert len(rest) == 2 * (1 + 2)  # per sample: the prompt once, each candidate once
    cands = [r for r in rest if r.get("continue_final_message")]
    prefixes = [r for r in rest if not r.get("continue_final_message")]
    assert len(cands) == 4 and len(prefixes) == 2
    for r in cands:  # the candidate continues the assistant's message, as the template renders it
        assert r["add_generation_prompt"] is False and r["messages"][-1]["role"] == "assistant"
        assert r["prompt_logprobs"] == 0 and r["max_tokens"] == 1 and r["temperature"] == 0.0
    assert all(r["add_special_tokens"] is True for r in rest)  # BOS as the in-process path adds it
    assert all(r["add_generation_prompt"] is True for r in prefixes)


def test_probe_runs_once_per_client(vllm_like):
    model, prep = _model(vllm_like.url)
    s = _sample(0, ["yes", "no"])
    model.forward("likelihood", [s], [prep(s)])
    model.forward("likelihood", [s], [prep(s)])
    assert len(vllm_like.requests) == 1 + 2 * 3


def test_users_add_special_tokens_is_kept(vllm_like):
    model, prep = _model(vllm_like.url, extra_body={"add_special_tokens": False})
    s = _sample(0, ["yes"])
    scores = model.forward("likelihood", [s], [prep(s)])
    assert all(r["add_special_tokens"] is False for r in vllm_like.requests)
    assert round(scores[0][0].logprob, 6) == -0.3  # the same candidate tokens without BOS


def test_endpoint_without_prompt_logprobs_is_refused_in_one_line():
    s = _Server("openai")
    try:
        model, prep = _model(s.url)
        sample = _sample(0, ["yes", "no"])
        with pytest.raises(ReformError) as err:
            model.forward("likelihood", [sample], [prep(sample)])
        msg = str(err.value)
        assert "\n" not in msg and "cannot score candidates" in msg and "HTTP 400" in msg
        assert "use --infer_method generation" in msg
        assert len(s.requests) == 1  # the probe only
    finally:
        s.httpd.shutdown()


def test_candidate_whose_tokens_do_not_extend_the_prompt_is_refused(vllm_like):
    model, prep = _model(vllm_like.url)
    s = _sample(3, ["merge"])
    with pytest.raises(ReformError, match=r"sample s3 .*do not extend the prompt"):
        model.forward("likelihood", [s], [prep(s)])


def test_run_eval_likelihood_through_the_endpoint(vllm_like, tmp_path, custom_cfg):
    """The whole command: scores land in the records, the chosen option is the best-scored one."""
    from reform_eval import run_eval
    out = tmp_path / "out"
    assert run_eval.main(["--model", "openai_api", "--model_name", "served", "--model_option",
                          f"base_url={vllm_like.url}", "--dataset_name", "custom", "--dataset_config", custom_cfg,
                          "--infer_method", "likelihood", "--dataset_subsample", "4", "--output_dir", str(out),
                          "--no_cache"]) == 0
    from tests.conftest import prediction_files
    (pred,) = prediction_files(out)
    with open(pred, encoding="utf-8") as f:
        records = json.load(f)
    assert len(records) == 4
    for r in records:
        expected = [-sum(len(w) for w in str(c).split()) / 10 for c in r["candidates"]]
        assert [round(a, 6) for a in r["candidate_logprobs"]] == [round(a, 6) for a in expected]
        assert r["candidate_num_tokens"] == [len(str(c).split()) for c in r["candidates"]]
        assert r["prediction"] == expected.index(max(expected))  # summed log-probs decide


# -- the replies' usage is validated where it enters, as generation's is
def _hostile(usage):
    s = _Server("vllm")
    handler = s.httpd.RequestHandlerClass
    send = handler._send

    def _send(self, code, payload):
        if isinstance(payload, dict) and "usage" in payload:
            payload = dict(payload, usage=usage)
        return send(self, code, payload)
    handler._send = _send
    return s


def test_negative_usage_does_not_switch_the_budget_off():
    """The likelihood replies' ``usage`` passes the same gate as generation's (``clean_usage`` in
    ``request``): it used to reach the budget raw, and a negative count switched the budget off."""
    s = _hostile({"prompt_tokens": -10 ** 8, "completion_tokens": 0})
    try:
        model, prep = _model(s.url, max_total_tokens=300, max_concurrency=1)
        samples = [_sample(i, ["yes", "no"]) for i in range(40)]
        # 40 samples x 3 requests, each estimated at ~10 tokens and reported as -1e8: the budget of
        # 300 must stop the run (as it does for generation, where clean_usage drops the count)
        with pytest.raises(BudgetExhausted):
            for smp in samples:
                model.forward("likelihood", [smp], [prep(smp)])
    finally:
        s.httpd.shutdown()
    assert model.budget.used >= 0, f"budget.used = {model.budget.used}"


@pytest.mark.parametrize("usage", [{"prompt_tokens": "many", "completion_tokens": 1},
                                   {"prompt_tokens": 1e400, "completion_tokens": 1}])
def test_malformed_usage_is_dropped_not_a_crash(usage):
    """A text or non-finite count is dropped (it was a ValueError / OverflowError in the budget)."""
    s = _hostile(usage)
    try:
        model, prep = _model(s.url, max_total_tokens=100000, max_concurrency=1)
        smp = _sample(0, ["yes", "no"])
        model.forward("likelihood", [smp], [prep(smp)])
    finally:
        s.httpd.shutdown()
    # dropped counts are charged their worst case: the budget counted every request
    assert model.budget.used > 0 and model.budget.reserved == 0


@pytest.mark.parametrize("logprob, why", [(10 ** 400, "an integer too large for a float"), (float("nan"), "NaN"),
                                          (0.5, "positive")])
def test_a_logprob_that_is_no_log_probability_is_a_malformed_reply(logprob, why):
    """A log-probability from the server must be a number <= 0: a 400-digit integer was an
    OverflowError (an internal error), NaN or a positive number a garbage score."""
    s = _Server("vllm")
    handler = s.httpd.RequestHandlerClass
    send = handler._send

    def _send(self, code, payload):
        if isinstance(payload, dict) and payload.get("prompt_logprobs"):
            tok = next(iter(payload["prompt_logprobs"][1]))
            payload = dict(payload, prompt_logprobs=[None, {tok: {"logprob": logprob}}] + payload["prompt_logprobs"][2:])
        return send(self, code, payload)
    handler._send = _send
    try:
        model, prep = _model(s.url, max_concurrency=1)
        smp = _sample(0, ["yes", "no"])
        with pytest.raises(ReformError, match="malformed prompt_logprobs entry"):
            model.forward("likelihood", [smp], [prep(smp)])
    finally:
        s.httpd.shutdown()


def test_api_generation_and_likelihood_records_both_carry_traces_and_explain_compares_them(vllm_like, tmp_path,
                                                                                          custom_cfg):
    """Every record of an endpoint run carries its trace, likelihood's too (it carried none), in
    one shape: what the request showed the server (``prompt_sha``), the server's prompt token
    count, the images' content (``image_sha``, the run's own hash); what the server made of them
    unknown (``bos``, ``pixel_sha`` null). explain between the two runs then lists no field as
    "recorded by one run only" and finds the same pictures."""
    from reform_eval import run_eval
    from reform_eval.evaluation.reporting.explain_files import explain_files
    from reform_eval.utils.fingerprint import images_digest, image_token
    from tests.conftest import prediction_files

    outs = {}
    for method in ("generation", "likelihood"):
        out = tmp_path / method
        assert run_eval.main(["--model", "openai_api", "--model_name", "served", "--model_option",
                              f"base_url={vllm_like.url}", "--dataset_name", "custom", "--dataset_config", custom_cfg,
                              "--infer_method", method, "--dataset_subsample", "4", "--output_dir", str(out),
                              "--no_cache", "--do_eval"]) == 0
        (pred,) = prediction_files(out)
        with open(pred, encoding="utf-8") as f:
            outs[method] = {r["sample_id"]: r for r in json.load(f)}
    for method, recs in outs.items():
        assert len(recs) == 4
        for r in recs.values():
            t = r["trace"]
            assert set(t) == {"prompt_sha", "prompt_tokens", "bos", "pixel_sha", "image_sizes", "image_sha"}, t
            assert len(t["prompt_sha"]) == 16 and isinstance(t["prompt_tokens"], int) and t["prompt_tokens"] > 0
            assert t["bos"] is None and t["pixel_sha"] is None
            # the images' content: the run's fingerprint of the sample's image file
            files = [str(tmp_path / "data" / os.path.basename(i)) for i in r["image_ids"]]
            assert t["image_sha"] == images_digest([image_token(p, {}) for p in files]), (method, t)
    gen, lik = outs["generation"], outs["likelihood"]
    assert {k: r["trace"]["image_sha"] for k, r in gen.items()} == {k: r["trace"]["image_sha"] for k, r in lik.items()}
    exp = explain_files(str(tmp_path / "generation"), str(tmp_path / "likelihood"), quiet=True)
    assert exp["recorded_by_one_run"] == [], exp["recorded_by_one_run"]
    assert all(f["pixels_differ"] is False for f in exp["flips"]), exp["flips"]
