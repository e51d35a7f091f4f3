"""openai_api against a local chat-completions server (stdlib http.server on 127.0.0.1).

The server follows a per-test script of behaviours (429, 500, a stall past the client
timeout, a malformed reply, a refusal) so retry, give-up and error paths are exercised
without any network. Backoff is set to milliseconds to keep the file fast.
"""
from __future__ import annotations

import base64
import io
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

import pytest
from PIL import Image

from reform_eval.models import get_model
from reform_eval.utils.errors import ReformError


class _Httpd(ThreadingHTTPServer):
    """A threading server with a listen backlog like a real serving engine's (the default 5
    drops concurrent connects, which then wait a second for a SYN retry)."""

    request_queue_size = 128
    daemon_threads = True


class _Server:
    """A scripted chat-completions endpoint. ``script`` holds the behaviour of the next requests."""

    def __init__(self) -> None:
        self.script: List[Any] = []
        self.requests: List[Dict[str, Any]] = []
        self.headers: List[Dict[str, str]] = []
        self.paths: List[str] = []
        self.usage: Any = None  # a reply's ``usage`` (None: the reply has none)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0
        self.gate = 0  # hold each reply until this many requests are in flight (or 60 s pass)
        self.released = threading.Event()  # a "stall" reply waits for it (set when the server closes)
        self.arrived = threading.Condition(self.lock)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append(body)
                    outer.headers.append(dict(self.headers))
                    outer.paths.append(self.path)
                    action = outer.script.pop(0) if outer.script else "ok"
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    outer.arrived.notify_all()
                    if outer.gate:
                        outer.arrived.wait_for(lambda: outer.max_in_flight >= outer.gate, 60)
                self._counted = True
                try:
                    if outer.delay:
                        time.sleep(outer.delay)
                    self._act(action, body)
                finally:
                    self._leave()

            def _leave(self) -> None:
                """Out of flight before the reply is written: the client may send its next request
                the moment it reads this one's reply, before this thread runs again."""
                if getattr(self, "_counted", False):
                    self._counted = False
                    with outer.lock:
                        outer.in_flight -= 1

            def _send(self, code: int, payload: bytes, headers: Dict[str, str] = None) -> None:
                self._leave()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _act(self, action: Any, body: Dict[str, Any]) -> None:
                if action == "ok":
                    last = body["messages"][-1]["content"]
                    text = " ".join(p["text"] for p in last if p["type"] == "text") \
                        if isinstance(last, list) else last
                    reply = {"choices": [{"index": 0, "message": {"role": "assistant",
                                                                  "content": f"echo: {text}"}}]}
                    if outer.usage is not None:
                        reply["usage"] = outer.usage
                    self._send(200, json.dumps(reply).encode())
                elif action == "padded":  # what a served model's raw decode looks like
                    reply = {"choices": [{"message": {"content": "\n  padded answer \n"}}]}
                    self._send(200, json.dumps(reply).encode())
                elif action in ("echo_key", "echo_key_notjson"):  # a server that echoes the credentials
                    seen = f"{self.headers.get('Authorization')} {self.path} {json.dumps(body.get('metadata'))}"
                    if action == "echo_key":
                        reply = {"choices": [{"message": {"content": f"you sent {seen}"}}],
                                 "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}
                        self._send(200, json.dumps(reply).encode())
                    else:
                        self._send(200, ("x" * 190 + f"not json, you sent {seen}").encode())
                elif action == "stall":
                    outer.released.wait(120)  # no reply before the test ends: only the client's timeout ends it
                    self._send(200, b'{"choices": []}')
                elif action == "malformed":
                    self._send(200, b'{"id": "x", "object": "chat.completion"}')
                elif action == "notjson":
                    self._send(200, b"<html>gateway error</html>")
                elif isinstance(action, int):
                    err = json.dumps({"error": {"message": getattr(outer, "echo", None) or f"scripted {action}"}}).encode()
                    headers = {"Retry-After": "0"} if action == 429 else {}
                    self._send(action, err, headers)
                else:
                    raise AssertionError(f"unknown action {action}")

        self.httpd = _Httpd(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = _Server()
    yield srv
    srv.close()


def _model(server: _Server, **over: Any):
    # (a timeout no loaded machine reaches on a loopback reply: a test that needs one sets its own)
    cfg = {"model_name": "gpt-test", "base_url": server.url, "api_key": "sk-test", "timeout": 30,
           "max_retries": 3, "backoff_base": 0.001, "backoff_max": 0.01, "max_concurrency": 3}
    cfg.update(over)
    return get_model("openai_api", cfg)


def _img(color: str, size=(8, 6)) -> Image.Image:
    return Image.new("RGB", size, color)


def _sample(n_images: int, question: str = "What is shown?") -> Dict[str, Any]:
    return {"sample_id": "s1", "formulation": "Generation", "inference_method": "generation",
            "images": [_img(c) for c in ["red", "green", "blue", "white"][:n_images]],
            "question": question, "instruct": "",
            "history": [{"from": "human", "value": "<image>First look."},
                        {"from": "assistant", "value": "Looked."}] if n_images > 1 else []}


def _decode(url: str) -> Image.Image:
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


def test_request_shape_images_in_order_and_auth(server):
    model, prep = _model(server)
    sample = _sample(3, question="<image><image>What is shown?")
    prompt = prep(sample)
    out = model.raw_generate(sample["images"], prompt, max_new_tokens=7)
    assert out == "echo: What is shown?"
    body, headers = server.requests[0], server.headers[0]
    assert body["model"] == "gpt-test" and body["max_tokens"] == 7 and body["temperature"] == 0.0
    assert headers["Authorization"] == "Bearer sk-test"
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == "Looked."
    urls = [p["image_url"]["url"] for m in body["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]
    colours = [_decode(u).getpixel((0, 0)) for u in urls]
    assert colours == [(255, 0, 0), (0, 128, 0), (0, 0, 255)]


def test_sampling_kwargs_mapped(server):
    model, prep = _model(server)
    model.raw_generate([], "hi", do_sample=True, temperature=0.7, top_p=0.9, seed=3)
    body = server.requests[0]
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["seed"] == 3
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_retries_429_and_500_then_succeeds(server):
    server.script = [429, 500, 503]
    model, _ = _model(server)
    assert model.raw_generate([], "hello") == "echo: hello"
    assert len(server.requests) == 4


def test_retries_after_timeout(server):
    """The first request is never answered (until the test ends): only the client's timeout ends
    it, and the retry is answered. (The timeout is long enough for any loopback reply.)"""
    server.script = ["stall"]
    model, _ = _model(server, timeout=3)
    assert model.raw_generate([], "late") == "echo: late"
    assert len(server.requests) == 2


def test_gives_up_cleanly_after_max_retries(server):
    server.script = [500] * 10
    model, _ = _model(server, max_retries=2)
    with pytest.raises(ReformError, match=r"gpt-test.*gave up after 3 attempts.*HTTP 500: scripted 500"):
        model.raw_generate([], "x")
    assert len(server.requests) == 3


def test_refusal_is_not_retried(server):
    server.script = [401]
    model, _ = _model(server)
    with pytest.raises(ReformError, match=r"refused the request \(HTTP 401: scripted 401\)"):
        model.raw_generate([], "x")
    assert len(server.requests) == 1


@pytest.mark.parametrize("action", ["malformed", "notjson"])
def test_malformed_reply_is_an_error(server, action):
    server.script = [action]
    model, _ = _model(server)
    with pytest.raises(ReformError, match="malformed"):
        model.raw_generate([], "x")


def test_unreachable_endpoint_gives_up(server):
    url = server.url
    server.close()
    model, _ = get_model("openai_api", {"model_name": "m", "base_url": url, "max_retries": 1,
                                        "backoff_base": 0.001, "timeout": 0.3})
    with pytest.raises(ReformError, match="gave up after 2 attempts.*cannot reach endpoint"):
        model.raw_generate([], "x")
    server.httpd = type("Dummy", (), {"shutdown": lambda s: None, "server_close": lambda s: None})()


def test_batch_bounded_concurrency_and_order(server):
    server.delay = 0.05
    server.gate = 2  # the first replies wait until 2 requests are in flight: no race with the clock
    model, _ = _model(server, max_concurrency=3)
    prompts = [f"q{i}" for i in range(8)]
    out = model.raw_batch_generate([[] for _ in prompts], prompts)
    assert out == [f"echo: q{i}" for i in range(8)]
    assert 1 < server.max_in_flight <= 3


def test_batch_with_a_failing_item_returns_nothing(server):
    server.script = ["ok", "ok", 400]
    model, _ = _model(server, max_concurrency=1)
    with pytest.raises(ReformError, match="HTTP 400"):
        model.raw_batch_generate([[], [], [], []], ["a", "b", "c", "d"])
    assert len(server.requests) == 3  # sequential: stops at the failure


def test_forward_generation_and_likelihood_refused(server):
    """An endpoint without prompt log-probabilities (this one) is refused for likelihood in one
    line after one probe request (models.openai_likelihood; a vLLM server is scored:
    tests/test_openai_likelihood.py, tests/test_vllm_engine.py)."""
    model, prep = _model(server)
    sample = _sample(1)
    assert model.forward("generation", [sample], [prep(sample)]) == ["echo: What is shown?"]
    sent = len(server.requests)
    with pytest.raises(ReformError, match="cannot score candidates .*prompt_logprobs.*use --infer_method generation"):
        model.raw_predict(sample["images"], prep(sample), ["yes", "no"])
    with pytest.raises(ReformError, match="cannot score candidates"):
        model.forward("likelihood", [dict(sample, candidates=["a"])], [prep(sample)])
    assert len(server.requests) == sent + 2  # one probe per refused call, no candidate request
    assert server.requests[-1]["prompt_logprobs"] == 0 and server.requests[-1]["max_tokens"] == 1


def test_config_from_environment(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    model, _ = get_model("openai_api", {"model_name": "env-model"})
    assert model.raw_generate([], "e") == "echo: e"
    assert server.headers[0]["Authorization"] == "Bearer sk-env"
    assert "sk-env" not in json.dumps(model.describe())
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    with pytest.raises(ReformError, match="--model_name"):
        get_model("openai_api", {})


def test_image_count_mismatch_is_an_error(server):
    model, _ = _model(server)
    with pytest.raises(ReformError, match="places 1 images but 2 were given"):
        model.raw_generate([_img("red"), _img("blue")], "<image> one")
    assert server.requests == []


def test_run_eval_records_no_failed_call(server, tmp_path):
    """End to end: successes are recorded; a sample whose call fails is not, and the run fails."""
    import os
    from reform_eval import run_eval
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=3, formulation="Generation")
    out = tmp_path / "out"
    args = ["--model", "openai_api", "--model_name", "gpt-test", "--dataset_name", "custom",
            "--dataset_config", cfg, "--formulation", "Generation", "--output_dir", str(out),
            "--model_option", f"base_url={server.url}", "--model_option", "max_retries=1",
            "--model_option", "backoff_base=0.001", "--model_option", "timeout=30",
            "--model_option", "max_concurrency=1"]  # one at a time: the script's order is the samples'
    server.script = ["ok", 500, 500]  # sample 0 answers, sample 1 fails twice
    assert run_eval.main(args) != 0
    recorded = []
    for root, _, files in os.walk(out):
        for name in files:
            if name.endswith((".json", ".jsonl")) and "results" not in name:
                text = open(os.path.join(root, name)).read()
                recorded += [line for line in text.splitlines() if '"prediction"' in line]
    assert len(recorded) <= 1 and all("echo:" in r for r in recorded)
    server.script = []
    assert run_eval.main(args) == 0  # the re-run completes the failed samples


# -- issue 9 item 15: secrets, redirects, whole-request timeout ---------------------------

class _RawServer:
    """A loopback server whose handler is a plain function (redirects, drip-feeding)."""

    def __init__(self, respond) -> None:
        self.requests: List[Dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append(dict(self.headers))
                try:
                    respond(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST  # noqa: N815 - a followed 302/303 arrives as GET

        self.httpd = _Httpd(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("code,target_host", [(302, "localhost"), (303, "127.0.0.1"), (307, "127.0.0.1")])
def test_redirects_are_not_followed_and_the_key_stays_home(code, target_host):
    """A redirect to another port/host is an error; the other host never sees a request,
    so it never sees the Authorization header (urllib forwarded it on 302/303)."""
    def ok(h):
        payload = json.dumps({"choices": [{"message": {"content": "stolen"}}]}).encode()
        h.send_response(200)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)
    other = _RawServer(ok)

    def redirect(h):
        h.send_response(code)
        h.send_header("Location", f"http://{target_host}:{other.port}/v1/chat/completions")
        h.send_header("Content-Length", "0")
        h.end_headers()
    front = _RawServer(redirect)
    try:
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": f"http://127.0.0.1:{front.port}/v1",
                                            "api_key": "sk-never-forward-me", "max_retries": 2, "timeout": 2})
        with pytest.raises(ReformError, match=rf"redirected \(HTTP {code}\).*not followed") as e:
            model.raw_generate([], "x")
        assert "sk-never-forward-me" not in str(e.value)
        assert len(front.requests) == 1 and front.requests[0]["Authorization"] == "Bearer sk-never-forward-me"
        assert other.requests == []  # the redirect target saw nothing, no header
    finally:
        front.close()
        other.close()


@pytest.mark.parametrize("where", ["body", "headers"])
def test_timeout_bounds_the_whole_request_against_a_dripping_server(where):
    """Each byte arrives well within the socket timeout, so only a deadline on the whole
    request ends the call (it hung as long as the server kept dripping). The server drips for at
    most 60 s: a call that outlived the deadline by half of that did not end at its deadline."""
    stop = threading.Event()

    def drip(h):
        if where == "body":
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "100000")
            h.end_headers()
            chunks = iter(lambda: b" ", None)
        else:
            chunks = iter(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100000)
            chunks = (bytes([c]) for c in chunks)
        for _, c in zip(range(240), chunks):  # (60 s of drip)
            if stop.is_set():
                return
            h.wfile.write(c)
            h.wfile.flush()
            time.sleep(0.25)
    srv = _RawServer(drip)
    try:
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": f"http://127.0.0.1:{srv.port}/v1",
                                            "timeout": 1.0, "max_retries": 0})
        t0 = time.monotonic()
        with pytest.raises(ReformError, match=r"no complete reply within 1 s"):
            model.raw_generate([], "x")
        assert time.monotonic() - t0 < 30
    finally:
        stop.set()
        srv.close()


def test_api_key_is_redacted_everywhere_and_never_logged(server, caplog, monkeypatch):
    from reform_eval.models import redact, redact_text
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    server.script = [500, 500]
    model, _ = _model(server, api_key="sk-secret-123456", max_retries=1)
    with caplog.at_level("DEBUG"):
        with pytest.raises(ReformError) as e:
            model.raw_generate([], "x")
    assert "sk-secret-123456" not in caplog.text and "sk-secret-123456" not in str(e.value)
    assert "sk-secret-123456" not in json.dumps(model.describe())
    config = {"model": "openai_api", "model_option": ["base_url=http://h/v1", "api_key=sk-secret-123456"],
              "api_key": "sk-secret-123456", "nested": {"HF_TOKEN": "hf_abcdefgh", "pad_token": "<pad>"},
              "command": "run_eval.py --model_option api_key=sk-secret-123456 --seed 3",
              "env_echo": "key is sk-from-the-environment", "temperature": 0.0}
    out = redact(config)
    text = json.dumps(out)
    for secret in ("sk-secret-123456", "hf_abcdefgh", "sk-from-the-environment"):
        assert secret not in text
    assert out["model_option"] == ["base_url=http://h/v1", "api_key=<redacted>"]
    assert out["nested"]["pad_token"] == "<pad>" and out["temperature"] == 0.0
    assert out["command"] == "run_eval.py --model_option api_key=<redacted> --seed 3"
    assert config["api_key"] == "sk-secret-123456"  # the input is not modified
    # a different key gives the same redacted identity (the hash never depends on the key)
    assert redact({**config, "api_key": "sk-other-987654"})["api_key"] == out["api_key"]
    assert "abcdef123456" not in redact_text("Authorization: Bearer abcdef123456")
    assert "abcdef123456" not in redact_text("curl -H \"Authorization: Bearer abcdef123456\"")


def test_a_server_echoing_the_key_does_not_leak_it(server, caplog):
    """Some servers put the rejected key in their error message; it must not reach the
    error line or the log."""
    model, _ = _model(server, api_key="sk-echoed-back-42")
    server.script = [401]
    server.echo = "Incorrect API key provided: sk-echoed-back-42"
    with caplog.at_level("DEBUG"):
        with pytest.raises(ReformError) as e:
            model.raw_generate([], "x")
    assert "sk-echoed-back-42" not in str(e.value) and "sk-echoed-back-42" not in caplog.text
    assert "Incorrect API key provided: <redacted>" in str(e.value)


def test_credentials_in_base_url_are_not_shown(server):
    port = server.url.split(":")[2].split("/")[0]
    model, _ = get_model("openai_api", {"model_name": "m", "base_url": f"http://user:pw-secret-1@127.0.0.1:{port}/v1?api-key=zz"})
    assert model.describe()["base_url"] == f"http://127.0.0.1:{port}/v1"


def test_run_eval_sampling_sends_temperature_and_per_sample_seed(server):
    model, _ = _model(server)
    model.raw_batch_generate([[], []], ["a", "b"], temperature=1.0, seeds=[11, 12])
    bodies = sorted(server.requests, key=lambda b: b["seed"])
    assert [b["temperature"] for b in bodies] == [1.0, 1.0] and [b["seed"] for b in bodies] == [11, 12]


# -- issue 12 section 6: a served model (vLLM / SGLang) with bounded concurrency -----------

def test_throughput_scales_with_max_concurrency(server):
    """Against a mock with a fixed 50 ms latency, 16 requests in flight finish a batch of 32
    far faster than one at a time (the ratio is printed; docs/models.md quotes it). What decides
    is how many requests are in flight at once: at 16 the server holds the first replies until
    16 requests have arrived (a client that sent fewer at once would wait 60 s and fail), at 1
    never more than one arrives; the wall-clock ratio, which a loaded machine moves, is printed."""
    server.delay = 0.05
    prompts = [f"q{i}" for i in range(32)]
    rates, peaks = {}, {}
    for c in (1, 16):
        server.max_in_flight, server.gate = 0, c
        model, _ = _model(server, max_concurrency=c)
        t0 = time.perf_counter()
        out = model.raw_batch_generate([[] for _ in prompts], prompts)
        rates[c] = len(prompts) / (time.perf_counter() - t0)
        peaks[c] = server.max_in_flight
        assert out == [f"echo: q{i}" for i in range(32)]
    ratio = rates[16] / rates[1]
    print(f"openai_api throughput: {rates[1]:.1f} req/s at max_concurrency=1, {rates[16]:.1f} req/s at 16, "
          f"ratio {ratio:.1f}x")
    assert peaks == {1: 1, 16: 16}, peaks


# -- issue 15: options openai_api cannot honour, image_format, errors naming the sample --------

@pytest.mark.parametrize("key,value", [("preprocessor", "conv"), ("roles", "A,B"), ("response_prefix", "Answer:")])
def test_options_the_client_cannot_honour_are_refused(server, key, value):
    from reform_eval.models import check_model_options, model_option_names
    assert key not in model_option_names("openai_api")
    with pytest.raises(ReformError, match=rf"^--model_option {key}: not used by model 'openai_api' \("):
        check_model_options("openai_api", {key: value})
    with pytest.raises(ReformError, match=rf"--model_option {key}: not used"):
        _model(server, **{key: value})
    check_model_options("llava", {key: value} if key != "roles" else {})  # still valid where it is used


@pytest.mark.parametrize("name,mime", [("JPG", "jpeg"), ("jpeg", "jpeg"), ("webp", "webp"), ("png", "png")])
def test_image_format_is_case_insensitive_and_jpg_means_jpeg(server, name, mime):
    model, _ = _model(server, image_format=name)
    model.raw_generate([_img("red")], "<image>what?")
    url = server.requests[0]["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith(f"data:image/{mime};base64,")
    assert Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).format == mime.upper()


def test_unknown_image_format_is_one_line(server):
    from reform_eval.models import check_model_options
    with pytest.raises(ReformError, match="image_format: must be PNG, JPEG"):
        check_model_options("openai_api", {"image_format": "gif"})
    with pytest.raises(ReformError, match=r"image_format: must be PNG, JPEG \(or JPG\) or WEBP, got 'gif'"):
        _model(server, image_format="gif")


def test_api_errors_name_the_sample_not_the_batch_position(server):
    model, prep = _model(server, max_concurrency=1)
    samples = [dict(_sample(0), sample_id=f"q{i}", dup_index=i % 2) for i in range(3)]
    server.script = ["ok", 400]
    with pytest.raises(ReformError) as e:
        model.forward("generation", samples, [prep(s) for s in samples])
    assert "sample q1 (dup_index 1)" in str(e.value) and "batch item" not in str(e.value)


def test_reply_text_is_normalised_by_the_function_the_in_process_path_uses(server):
    from reform_eval.models.outputs import finish_text
    model, _ = _model(server)
    server.script = ["padded"]
    out = model.raw_generate([], "x")
    assert out == "padded answer" == finish_text("\n  padded answer \n")


# -- issue 19 section 3: usage, budgets, adaptive concurrency -----------------------------------

def test_reply_usage_is_kept_with_the_text(server):
    from reform_eval.models.outputs import generation_stats
    server.usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                    "prompt_tokens_details": {"cached_tokens": 0}}
    model, _ = _model(server)
    out = model.raw_generate([], "x")
    assert generation_stats(out) == {"generated_tokens": 3,
                                     "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}


def _text_only_dataset(directory: str, n: int) -> str:
    """n items without images (the budget's estimates are then the text's alone)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "items.jsonl"), "w") as f:
        for i in range(n):
            f.write(json.dumps({"sample_id": f"q{i}", "images": [], "question": "Which colour is the sky?",
                                "answer": "blue"}) + "\n")
    cfg = os.path.join(directory, "custom.yaml")
    with open(cfg, "w") as f:
        f.write("data_file: items.jsonl\n")
    return cfg


def _run_args(server, tmp_path, *extra: str, n: int = 3, images: bool = True) -> List[str]:
    """run_eval's arguments against ``server``; an ``extra`` base_url replaces the plain one (a key
    may be given once only)."""
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=n, formulation="Generation") if images else \
        _text_only_dataset(str(tmp_path / "data"), n)
    own_url = any(str(e).startswith("base_url=") for e in extra)
    return ["--model", "openai_api", "--model_name", "gpt-test", "--dataset_name", "custom",
            "--dataset_config", cfg, "--formulation", "Generation", "--output_dir", str(tmp_path / "out"),
            "--cache_dir", str(tmp_path / "out" / "cache"), "--max_new_tokens", "5",
            *([] if own_url else ["--model_option", f"base_url={server.url}"]), "--model_option", "max_retries=1",
            "--model_option", "backoff_base=0.001", "--model_option", "timeout=30", *extra]


def _records(out) -> List[Dict[str, Any]]:
    from reform_eval.evaluation.reporting.scoring import prediction_files
    files = prediction_files(str(out))
    assert len(files) == 1, files
    with open(files[0]) as f:
        data = json.load(f)
    return data if isinstance(data, list) else data["predictions"]


def test_run_records_usage_and_a_token_budget_stops_before_it_is_passed_then_resumes(server, tmp_path, capsys):
    """Each reply costs 10 + 3 tokens; a request may need up to 5 + 10. With 40 tokens, two
    requests fit (26 used) and the third (26 + 15 > 40) is never sent: the run stops with one
    line, the two answers are saved, and the command with a raised budget finishes the same run."""
    from reform_eval import run_eval
    server.usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    args = _run_args(server, tmp_path, "--model_option", "max_concurrency=1", "--model_option", "max_total_tokens=40",
                     images=False)
    assert run_eval.main(args) == 2
    err = capsys.readouterr().err
    assert "max_total_tokens=40" in err and "26 tokens used (20 prompt + 6 completion)" in err
    assert "re-running the same command resumes" in err
    assert len(server.requests) == 2
    # the budget is the run's: the same command counts the 26 tokens the saved answers used and
    # sends nothing (a new process does not get a fresh 40)
    assert run_eval.main(args) == 2
    err = capsys.readouterr().err
    assert "26 tokens used (20 prompt + 6 completion; 26 by answers saved earlier)" in err
    assert len(server.requests) == 2
    args[-1] = "max_total_tokens=100"  # a raised budget resumes the same run (the budget is not in its identity)
    assert run_eval.main(args) == 0
    assert len(server.requests) == 3  # only the sample that had not run
    records = _records(tmp_path / "out")
    assert len(records) == 3
    for r in records:
        assert r["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
        assert r["generated_tokens"] == 3


def test_a_batch_that_might_pass_the_budget_sends_nothing(server):
    from reform_eval.utils.errors import BudgetExhausted
    server.usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    model, _ = _model(server, max_total_tokens=50)
    model.raw_generate([], "x", max_new_tokens=5)
    with pytest.raises(BudgetExhausted, match=r"before a batch of 3 requests: 13 tokens used"):
        model.raw_batch_generate([[], [], []], ["a", "b", "c"], max_new_tokens=5)
    assert len(server.requests) == 1


class _RateLimited(_Server):
    """Answers 429 (Retry-After: 0.05) whenever more than ``capacity`` requests are in flight."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.rejected = capacity, 0
        self.delay = 0.03
        self.gate = capacity + 1  # the first replies wait until one more than capacity is in flight: a 429 for sure
        handler = self.httpd.RequestHandlerClass
        outer, act = self, handler._act

        def _act(h, action, body):
            with outer.lock:
                over = outer.in_flight > outer.capacity
                outer.rejected += over
            if over:
                h._send(429, b'{"error": {"message": "slow down"}}', {"Retry-After": "0.05"})
            else:
                act(h, action, body)
        handler._act = _act


@pytest.mark.parametrize("adaptive", [True, False])
def test_concurrency_backs_off_on_429_and_stays_within_bounds(adaptive):
    srv = _RateLimited(capacity=3)
    try:
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": srv.url, "max_concurrency": 12,
                                            "max_retries": 30, "backoff_base": 0.001, "backoff_max": 0.05,
                                            "adaptive_concurrency": adaptive, "timeout": 5})
        prompts = [f"q{i}" for i in range(48)]
        assert model.raw_batch_generate([[] for _ in prompts], prompts) == [f"echo: {p}" for p in prompts]
        limiter = model.limiter
        assert 1 <= limiter.limit <= 12 and limiter.in_flight == 0
        if adaptive:
            assert limiter.cuts >= 1 and limiter.limit < 12
            assert srv.rejected < 48  # fewer rejections than answers
        else:
            assert limiter.cuts == 0 and limiter.limit == 12 and srv.rejected >= 48
    finally:
        srv.close()


def test_adaptive_limit_grows_back_while_replies_are_healthy():
    from reform_eval.models.interfaces.openai_api_interface import AdaptiveLimit
    lim = AdaptiveLimit(8)
    t = lim.acquire()
    lim.release(t, "congested", retry_after=0.0)
    assert lim.limit == 4.0
    t2 = lim.acquire()
    lim.release(t, "congested")  # a reply to a request sent before the cut: no second cut
    assert lim.limit == 4.0
    lim.release(t2, "ok")
    for _ in range(40):
        lim.release(lim.acquire(), "ok")
    assert lim.limit == 8.0  # capped at max_concurrency
    for _ in range(10):
        lim.release(lim.acquire(), "congested")
    assert lim.limit == 1.0  # never below one
    t = lim.acquire()
    t0 = time.monotonic()  # (before the pause starts: a stall of this thread cannot shorten what is measured)
    lim.release(t, "congested", retry_after=0.2)
    lim.release(lim.acquire(), "ok")
    assert time.monotonic() - t0 >= 0.199  # Retry-After pauses new requests


# -- issue 16 class 2: credentials as a type, end to end ---------------------------------------

KEY, URL_KEY, URL_PW, BODY_KEY = "sk-e2e-KEY-111111", "qk-e2e-333333", "pw-e2e-PASS-222", "tk-e2e-444444"


def _leaks(text: str) -> List[str]:
    return [s for s in (KEY, URL_KEY, URL_PW, BODY_KEY) if s in text]


def test_credentials_reach_the_server_and_no_file_output_or_log(server, tmp_path, capsys, caplog, monkeypatch):
    """The key (option), a key in base_url's query, the password in its user info and a token
    deep in extra_body all reach the server; the server echoes them in its answer; none of them
    appears in any file under the output directory (predictions, shards, results, log, cache),
    nor on stdout/stderr or in the log records."""
    import os
    from reform_eval import run_eval
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)  # the response cache is written too
    host = server.url.split("//", 1)[1]
    base = f"http://user:{URL_PW}@{host}?api-key={URL_KEY}&deployment=d1"
    server.script = ["echo_key"] * 3
    args = _run_args(server, tmp_path, "--model_option", f"api_key={KEY}", "--model_option", f"base_url={base}",
                     "--model_option", f"extra_body={{metadata: {{auth: {{token: {BODY_KEY}}}, user: u1}}}}",
                     "--do_eval")
    with caplog.at_level("DEBUG"):
        assert run_eval.main(args) == 0
    # the server really received every credential
    assert all(h["Authorization"] == f"Bearer {KEY}" for h in server.headers)
    assert all(f"api-key={URL_KEY}" in p and "deployment=d1" in p for p in server.paths)
    assert all(r["metadata"] == {"auth": {"token": BODY_KEY}, "user": "u1"} for r in server.requests)
    # ... and nothing kept it
    std = capsys.readouterr()
    assert _leaks(std.out + std.err) == [] and _leaks(caplog.text) == []
    files = [os.path.join(root, n) for root, _, names in os.walk(tmp_path / "out") for n in names]
    assert any(f.endswith("results.json") for f in files) and any("cache" in f for f in files)
    for path in files:
        with open(path, "rb") as f:
            assert _leaks(f.read().decode("utf-8", "replace")) == [], path
    preds = [r["prediction"] for r in _records(tmp_path / "out")]
    assert preds and all(p.startswith("you sent Bearer <redacted> /v1/chat/completions?") for p in preds), preds
    assert all("deployment=d1" in p and '"user": "u1"' in p for p in preds)  # only the secrets are cut


def test_user_info_of_base_url_is_sent_as_basic_auth_and_never_shown(server):
    host = server.url.split("//", 1)[1]
    model, _ = get_model("openai_api", {"model_name": "m", "base_url": f"http://user:{URL_PW}@{host}"})
    assert model.raw_generate([], "x") == "echo: x"
    assert base64.b64decode(server.headers[0]["Authorization"].split()[1]).decode() == f"user:{URL_PW}"
    assert _leaks(json.dumps(model.describe()) + repr(model.config) + model.url) == []


def test_config_time_split_and_plain_values_are_wrapped():
    from reform_eval.utils.secrets import Secret, SecretURL, drop_secrets, secret_options, split_url_secrets
    url = f"https://user:{URL_PW}@h.example/v1?api-key={URL_KEY}&auth=a-secret-9&X-Amz-Signature=sig-777777&v=2"
    public, secrets = split_url_secrets(url)
    assert public == "https://h.example/v1?v=2"
    assert sorted(secrets) == ["query:X-Amz-Signature", "query:api-key", "query:auth", "userinfo"]
    opts = secret_options({"base_url": url, "api_key": KEY, "extra_body": {"a": [1], "x": {"access_token": BODY_KEY}}})
    assert isinstance(opts["base_url"], SecretURL) and opts["base_url"] == public
    assert isinstance(opts["api_key"], Secret) and isinstance(opts["extra_body"]["x"]["access_token"], Secret)
    assert _leaks(json.dumps(opts, default=str) + repr(opts) + json.dumps(drop_secrets(opts), default=str)) == []
    assert opts["base_url"].reveal().startswith(f"https://user:{URL_PW}@h.example/v1?v=2&")
    assert f"api-key={URL_KEY}" in opts["base_url"].reveal()
    import pickle
    again = pickle.loads(pickle.dumps(opts["base_url"]))
    assert isinstance(again, SecretURL) and again.reveal() == opts["base_url"].reveal()


def test_a_reply_that_fails_to_parse_does_not_print_the_key(server):
    """The key sits past the first 200 characters' cut: scrubbing happens before the cut."""
    model, _ = _model(server, api_key=KEY)
    server.script = ["echo_key_notjson"]
    with pytest.raises(ReformError, match="malformed JSON") as e:
        model.raw_generate([], "x")
    assert _leaks(str(e.value)) == [] and "sk-e2e" not in str(e.value)


def test_usage_totals_and_cost_per_million_tokens():
    from reform_eval.utils.usage import usage_totals
    recs = [{"usage": {"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010}, "generated_tokens": 10},
            {"usage": {"prompt_tokens": 3000, "completion_tokens": 30}, "generated_tokens": 30}]
    out = usage_totals(recs, prompt_price=2.5, completion_price=10.0)
    assert out == {"records": 2, "records_with_usage": 2, "prompt_tokens": 4000, "completion_tokens": 40,
                   "total_tokens": 4040, "generated_tokens": 40, "cost": 0.0104}
    partial = usage_totals(recs + [{"prediction": "x"}], prompt_price=2.5)
    assert "cost" not in partial and "generated_tokens" not in partial and partial["records_with_usage"] == 2


def test_an_option_value_that_fails_to_parse_does_not_print_a_nested_key():
    from reform_eval.evaluation.config import RunConfig
    with pytest.raises(ReformError, match="cannot parse the value of extra_body") as e:
        RunConfig.from_argv(["--model", "openai_api", "--dataset_name", "MME", "--model_option",
                             f"extra_body={{auth: {{token: {BODY_KEY}, x: [1}}"])
    assert BODY_KEY not in str(e.value)


def test_the_budget_is_the_runs_saved_answers_count_and_ranks_share_the_rest():
    from reform_eval.models.interfaces.openai_api_interface import TokenBudget
    from reform_eval.utils.errors import BudgetExhausted
    b = TokenBudget(100)
    b.charge_recorded([{"prompt_tokens": 10, "completion_tokens": 10}, None, {"prompt_tokens": 5}], world_size=2)
    assert (b.used, b.earlier, b.limit, b.run_limit) == (25, 25, 62, 100)  # 25 + (100 - 25) // 2
    b.reserve(37, "x")
    b.settle(37, {"prompt_tokens": 30, "completion_tokens": 7})  # spent, not merely reserved: 62 used
    with pytest.raises(BudgetExhausted, match=r"max_total_tokens=100 reached before y \(this rank's share: 62\)"):
        b.reserve(1, "y")
    alone = TokenBudget(100)
    alone.charge_recorded([{"prompt_tokens": 10, "completion_tokens": 10}])
    assert (alone.used, alone.limit) == (20, 100)


def test_a_request_waits_for_reservations_in_flight_and_only_spending_stops_the_run():
    """``TokenBudget.reserve``: a worst case that does not fit beside a reservation in flight
    waits for it to settle (it used to raise at once); once settled at what the reply cost it
    fits; tokens spent plus the worst case past the limit raise at once."""
    import threading
    import time
    from reform_eval.models.interfaces.openai_api_interface import TokenBudget
    from reform_eval.utils.errors import BudgetExhausted
    b = TokenBudget(100)
    b.reserve(60, "a")
    done, failed = threading.Event(), []

    def second() -> None:
        try:
            b.reserve(60, "b")
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            failed.append(e)
        done.set()
    threading.Thread(target=second, daemon=True).start()
    # (no race with a timer: "b" is seen waiting on the budget's condition before "a" settles)
    deadline = time.monotonic() + 60
    while not b._settled._waiters and not done.is_set() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not done.is_set(), f"the second reservation did not wait: {failed}"
    b.settle(60, {"prompt_tokens": 10, "completion_tokens": 5})
    assert done.wait(60) and not failed, failed
    assert (b.used, b.reserved) == (15, 60)
    b.settle(60, {"prompt_tokens": 50, "completion_tokens": 10})
    with pytest.raises(BudgetExhausted, match="75 tokens used"):
        b.reserve(30, "c")


def test_saved_answers_cost_what_was_spent_on_them():
    """A resumed run counts a saved answer's ``usage``; nothing for one served from the response
    cache; a text-length estimate for one from a server that reports no usage."""
    from reform_eval.models.interfaces.openai_api_interface import spent_usage
    assert spent_usage({"prediction": "x", "usage": {"prompt_tokens": 7, "completion_tokens": 2}}) == \
        {"prompt_tokens": 7, "completion_tokens": 2}
    assert spent_usage({"prediction": "x", "cached_responses": 1, "cached_usage": {"prompt_tokens": 7}}) is None
    assert spent_usage({"prediction": "a" * 40, "prompt": "p" * 100}) == {"prompt_tokens": 25, "completion_tokens": 10}
    assert spent_usage({"prediction": "a" * 8, "predictions": ["a" * 8, "b" * 12], "prompt": "p" * 100}) == \
        {"prompt_tokens": 50, "completion_tokens": 5}
    assert spent_usage({"skipped": True}) is None


@pytest.mark.parametrize("mode,bits,as_is", [("RGB", 8, True), ("RGBA", 8, False), ("L", 8, False), ("P", 8, False),
                                             ("I;16", 16, False), ("LA", 8, False)])
def test_a_png_file_goes_out_as_its_own_bytes_only_when_that_is_the_same_picture(tmp_path, mode, bits, as_is):
    """reform_eval.models.openai_messages.png_as_is: an 8-bit RGB PNG is sent as the file's own bytes (no
    decode and encode per request); any other PNG is converted to RGB as before. Either way the
    server decodes exactly the pixels ``encode_image`` gives."""
    import base64
    import io
    from reform_eval.models.openai_messages import EncodedImages, encode_image, png_as_is
    from reform_eval.utils.file_hashes import file_digest

    im = Image.new(mode, (5, 4))
    im.putdata([(i * 37) % (256 if bits == 8 else 65536) if mode in ("L", "P", "I;16") else
                tuple((i * k) % 256 for k in range(1, len(mode) + 1)) for i in range(20)])
    path = str(tmp_path / "x.png")
    im.save(path, format="PNG")
    data = open(path, "rb").read()
    assert png_as_is(data) is as_is
    file_digest(path)  # as the run's fingerprint does
    url = EncodedImages("PNG").url(path)
    assert (base64.b64decode(url.split(",", 1)[1]) == data) is as_is
    sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    expected = Image.open(io.BytesIO(base64.b64decode(encode_image(path).split(",", 1)[1])))
    assert sent.mode == expected.mode == "RGB" and sent.tobytes() == expected.tobytes()


def test_an_rgb_png_with_a_transparent_colour_is_converted():
    from reform_eval.models.openai_messages import png_as_is
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buf, format="PNG", transparency=(1, 2, 3))
    assert b"tRNS" in buf.getvalue() and not png_as_is(buf.getvalue())
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buf, format="PNG")
    assert png_as_is(buf.getvalue())
