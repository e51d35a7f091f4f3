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
