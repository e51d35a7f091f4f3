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
