"""Edges of the endpoint client that a held-out suite found (issue 31): every form of a secret
that the client derives is a secret (class 2), and once a run's call has failed for good no new
attempt starts (class 8). Each test failed before its fix."""
from __future__ import annotations

import base64
import os
from typing import List

from tests.test_openai_api import _records, _run_args, server  # noqa: F401 - the scripted endpoint

USER, PASSWORD = "user", "pass"  # as the issue gives them: the password alone is too short to register
BASIC = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def _leaks(text: str) -> List[str]:
    return [s for s in (BASIC, f"{USER}:{PASSWORD}", BASIC.rstrip("=")) if s in text]


def test_the_basic_authorization_built_from_base_url_is_redacted_everywhere(server, tmp_path, capsys, caplog,  # noqa: F811
                                                                            monkeypatch):
    """``base_url=http://user:pass@host/v1``: the client sends ``Authorization: Basic <base64 of
    user:pass>``, a server echoes it in every answer; the prediction file, per_sample.json, the
    results, the response cache, the log, a report and the printed lines show none of it (they
    showed the header in full)."""
    from reform_eval import run_eval, run_loader_eval
    monkeypatch.delenv("REFORM_NO_CACHE", raising=False)  # the response cache is written too
    host = server.url.split("//", 1)[1]
    server.script = ["echo_key"] * 3
    args = _run_args(server, tmp_path, "--model_option", f"base_url=http://{USER}:{PASSWORD}@{host}", "--do_eval")
    with caplog.at_level("DEBUG"):
        assert run_eval.main(args) == 0
        assert all(h["Authorization"] == f"Basic {BASIC}" for h in server.headers)  # it did reach the server
        preds = [r["prediction"] for r in _records(tmp_path / "out")]
        assert preds and all(p.startswith("you sent <redacted> /v1/chat/completions") or
                             p.startswith("you sent Basic <redacted> /v1/chat/completions") for p in preds), preds
        files = [os.path.join(root, n) for root, _, names in os.walk(tmp_path / "out") for n in names]
        pred_file = [f for f in files if f.endswith(".json") and not f.endswith(("results.json", "per_sample.json"))
                     and "cache" not in f]
        assert run_loader_eval.main(["--prediction_file", *pred_file[:1], "--output_dir", str(tmp_path / "out" / "rep")]) == 0
    files = [os.path.join(root, n) for root, _, names in os.walk(tmp_path / "out") for n in names]
    assert any(f.endswith("per_sample.json") for f in files) and any("cache" in f for f in files)
    assert any(f.endswith("report.html") for f in files), files
    for path in files:
        with open(path, "rb") as f:
            assert _leaks(f.read().decode("utf-8", "replace")) == [], path
    std = capsys.readouterr()
    assert _leaks(std.out + std.err) == [] and _leaks(caplog.text) == []


def test_an_error_line_that_echoes_the_basic_header_does_not_show_it(server):  # noqa: F811
    import pytest

    from reform_eval.models import get_model
    from reform_eval.utils.errors import ReformError
    host = server.url.split("//", 1)[1]
    server.script = [400]
    server.echo = f"you sent Authorization: Basic {BASIC}"
    model, _ = get_model("openai_api", {"model_name": "m", "base_url": f"http://{USER}:{PASSWORD}@{host}",
                                        "max_retries": 0})
    with pytest.raises(ReformError) as e:
        model.raw_generate([], "x")
    assert _leaks(str(e.value)) == [] and "HTTP 400: you sent Authorization: " in str(e.value)


# -- class 8: no retries spent after the run has failed ------------------------------------------

def test_against_a_server_failing_for_ever_the_run_sends_about_concurrency_requests(server, tmp_path,  # noqa: F811
                                                                                     capsys):
    """500 for every request, 3 calls in flight, 4 retries each: the calls in flight spent their
    retries in parallel after the first had failed for good (3 x 5 = 15 requests). Now one call
    probes the failing endpoint, the others wait for its outcome, and when it fails for good
    they give up: 3 first attempts + 4 retries of the probe."""
    from reform_eval import run_eval
    server.script = [500] * 1000
    args = _run_args(server, tmp_path, "--model_option", "max_concurrency=3", "--model_option", "max_retries=4",
                     "--model_option", "backoff_max=0.01", n=6)
    args[args.index("max_retries=1")] = "adaptive_concurrency=false"  # (the helper's own max_retries=1 replaced)
    assert run_eval.main(args) == 2
    err = capsys.readouterr().err
    assert "gave up after 5 attempts" in err and "HTTP 500" in err
    assert len(server.requests) <= 3 + 4, len(server.requests)


def test_a_batch_against_a_failing_server_spends_one_calls_retries(server):  # noqa: F811
    import pytest

    from reform_eval.models import get_model
    from reform_eval.utils.errors import ReformError
    server.script = [500] * 1000
    model, _ = get_model("openai_api", {"model_name": "m", "base_url": server.url, "max_concurrency": 3,
                                        "max_retries": 4, "backoff_base": 0.001, "backoff_max": 0.01,
                                        "adaptive_concurrency": False})
    with pytest.raises(ReformError, match="gave up after 5 attempts"):
        model.raw_batch_generate([[], [], []], ["a", "b", "c"])
    assert len(server.requests) <= 3 + 4, len(server.requests)
    # the endpoint recovers: the next batch is answered (a failed batch's stop does not stay)
    server.script = []
    assert model.raw_batch_generate([[], []], ["d", "e"]) == ["echo: d", "echo: e"]


def test_a_stopping_run_ends_a_backoff_at_once_and_starts_no_attempt(server):  # noqa: F811
    """A call waiting out a long backoff when the run stops (another call failed for good, the
    budget ran out) ends without a new attempt, not after the backoff."""
    import threading

    from reform_eval.models import get_model
    from reform_eval.utils.errors import ReformError
    server.script = [500] * 1000
    model, _ = get_model("openai_api", {"model_name": "m", "base_url": server.url, "max_retries": 3,
                                        "backoff_base": 600, "backoff_max": 600})
    errors = []

    def call():
        try:
            model.request(model.build_request([], "x"), tag="sample s1 (dup_index 0)")
        except ReformError as e:
            errors.append(str(e))
    t = threading.Thread(target=call, daemon=True)
    t.start()
    while not server.requests:  # (the first attempt is sent, then the 600 s backoff)
        t.join(0.01)
    model.stop_retrying()
    t.join(60)
    assert not t.is_alive() and len(server.requests) == 1
    assert errors and "the run is stopping" in errors[0] and "sample s1" in errors[0]


# -- review 3: what a server says of itself, and a cut before redaction ---------------------------

KEY = "sk-QWZX1234poiuLKJH9876"  # registered as a Secret by the client that sends it


def _partial_leaks(text: str, secret: str = KEY[3:], width: int = 5) -> List[str]:
    """Every piece of ``secret`` of ``width`` characters found in ``text`` (a cut token too)."""
    return sorted({secret[i:i + width] for i in range(len(secret) - width + 1) if secret[i:i + width] in text})


def _echoing_endpoint():
    """A loopback endpoint that echoes the Authorization header in its Server header (cut by the
    client's 100-character bound in the middle of the key), its model id and its fingerprint."""
    import json

    from tests.test_proxy import Loopback, header, reply

    def handle(c, head, srv):
        auth = header(head, "Authorization") or ""
        body = json.dumps({"model": f"served {auth}", "system_fingerprint": "f" * 190 + auth,
                           "choices": [{"message": {"content": "an answer"}}]}).encode()
        reply(c, "200 OK", body, f"Server: {'s' * 85}{auth}\r\n")
    return Loopback(handle)


def _run_files(out) -> List[str]:
    return [os.path.join(root, n) for root, _, names in os.walk(out) for n in names
            if n.endswith((".results.json", ".run.json"))]


def test_a_server_echo_in_its_model_id_and_server_header_reaches_no_file(tmp_path, capsys):
    """Review 3, D1: the served model id, Server header and fingerprint went into results.json and
    run.json as the server sent them ("served Bearer sk-..."), the Server header cut at 100
    characters in the middle of the key (a partial token no redaction recognises)."""
    from reform_eval import run_eval
    from reform_eval.models import get_model
    from tests.conftest import write_custom_dataset
    srv = _echoing_endpoint()
    try:
        url = f"http://127.0.0.1:{srv.port}/v1"
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": url, "api_key": KEY, "max_retries": 0})
        assert model.raw_generate([], "hi") == "an answer"
        endpoint = model.provenance()["endpoint"]
        assert endpoint["served_model"] == "served Bearer <redacted>"
        assert endpoint["server_version"] == ("f" * 190 + "Bearer <redacted>")[:200]  # redacted, then cut
        model.served.pop("system_fingerprint")
        assert _partial_leaks(model.provenance()["endpoint"]["server_version"]) == []
        cfg = write_custom_dataset(str(tmp_path / "data"), n=2, formulation="Generation")
        for out, more in (("scored", ["--do_eval"]), ("unscored", [])):
            args = ["--model", "openai_api", "--model_name", "m", "--dataset_name", "custom", "--dataset_config", cfg,
                    "--formulation", "Generation", "--output_dir", str(tmp_path / out), "--model_option", f"base_url={url}",
                    "--model_option", f"api_key={KEY}", "--model_option", "max_retries=0", *more]
            assert run_eval.main(args) == 0
    finally:
        srv.close()
    files = _run_files(tmp_path / "scored") + _run_files(tmp_path / "unscored")
    assert {f.rsplit(".", 2)[-2] for f in files} == {"results", "run"}, files
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert '"served_model": "served Bearer <redacted>"' in text and _partial_leaks(text) == [], path
    std = capsys.readouterr()
    assert _partial_leaks(std.out + std.err) == []


def test_the_results_and_run_files_redact_provenance_whatever_an_interface_returns(server, tmp_path,  # noqa: F811
                                                                                   monkeypatch):
    """Defence in depth (review 3, D1): the writers of results.json and run.json redact the
    provenance as they do a prediction record, even when an interface hands back a secret."""
    from reform_eval import run_eval
    from reform_eval.models.interfaces.openai_api_interface import OpenAIAPIInterface
    from reform_eval.utils.secrets import register_secret
    register_secret(KEY)
    monkeypatch.setattr(OpenAIAPIInterface, "provenance", lambda self: {"engine": "openai_api",
                                                                       "endpoint": {"served_model": f"x{KEY}"}})
    for out, more in (("scored", ["--do_eval"]), ("unscored", [])):
        assert run_eval.main(_run_args(server, tmp_path / out, *more, n=1)) == 0
    files = _run_files(tmp_path / "scored" / "out") + _run_files(tmp_path / "unscored" / "out")
    assert len(files) == 2
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert '"served_model": "x<redacted>"' in text and KEY not in text, path


def test_a_retry_after_or_protocol_field_is_redacted_before_it_is_cut(caplog):
    """Review 3, D2: ``Retry-After: zzz...Bearer sk-...`` was logged cut at 40 characters, which
    left 'Bearer sk-QWZX12' that the log's redaction (of whole forms) could not recognise."""
    import pytest

    from reform_eval.models import http_transport
    from reform_eval.models.http_transport import Headers, ProtocolError, field_number, retry_after
    from reform_eval.utils.secrets import redact_text, register_secret
    register_secret(KEY)
    http_transport._clamped.discard("retry-after-bad")
    with caplog.at_level("WARNING"):
        assert retry_after(Headers({"retry-after": "z" * 20 + "Bearer " + KEY}), 30.0, "src") is None
    assert "unreadable Retry-After" in caplog.text
    assert _partial_leaks(redact_text(caplog.text)) == []  # what log.txt's filter leaves
    with pytest.raises(ProtocolError) as e:
        field_number("9" * 5 + KEY, "Content-Length")
    assert _partial_leaks(str(e.value)) == []


def test_a_timeout_below_a_millisecond_is_refused():
    """Review 3, D9: timeout=5e-324 passed the check ("> 0") and every request failed at once."""
    import pytest

    from reform_eval.models import get_model
    from reform_eval.utils.errors import ReformError
    for value in (5e-324, 1e-9, 0.0009):
        with pytest.raises(ReformError, match="^--model_option timeout: must be a number of seconds >= 0.001"):
            get_model("openai_api", {"model_name": "m", "base_url": "http://127.0.0.1:9/v1", "timeout": value})
    assert get_model("openai_api", {"model_name": "m", "base_url": "http://127.0.0.1:9/v1", "timeout": 0.001})[0].timeout == 0.001


def test_a_batch_reports_the_failure_that_stopped_the_others_not_a_stopped_call():
    """The first call in order was given up because the second failed for good: the batch's one
    line is the second's failure, the cause (it was whichever call came first in order, so the
    line said 'stopped ... another call failed' and hid the cause, depending on timing)."""
    import threading

    import pytest

    from reform_eval.utils.errors import ReformError, Stopped
    from reform_eval.utils.request_pool import RequestPool
    failed = threading.Event()

    def call(i: int) -> int:
        if i == 0:
            assert failed.wait(30)
            raise Stopped("stopped: another call failed")
        if i == 1:
            failed.set()
            raise ReformError("gave up after 5 attempts")
        return i

    pool = RequestPool(3)
    try:
        with pytest.raises(ReformError, match="^gave up after 5 attempts$"):
            pool.map_all(call, [(0,), (1,), (2,)])
    finally:
        pool.close()
