"""Proxies from the environment (models/http_proxy.py; issue 31 class 1): a malformed proxy
variable is one line naming it before any request, and a proxy that demands authentication
gets the credentials of its URL as a Basic ``Proxy-Authorization``, for plain HTTP proxying
and on the CONNECT of an HTTPS tunnel. Each test failed before its fix (an internal
``ValueError``, or a 407 for every request)."""
from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import threading
from typing import Any, Callable, List, Optional

import pytest

from reform_eval.models import get_model
from reform_eval.models.http_transport import Endpoint
from reform_eval.utils.errors import ReformError
from reform_eval.utils.secrets import redact_text

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


class Loopback:
    """A TCP server on 127.0.0.1: ``handle(conn, head)`` answers each request head it reads."""

    def __init__(self, handle: Callable[[socket.socket, bytes, "Loopback"], Optional[bool]]) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.heads: List[bytes] = []
        self.conns: List[socket.socket] = []
        self.handle = handle
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            while True:
                head = read_head(c)
                if head is None:
                    return
                self.heads.append(head)
                if self.handle(c, head, self) is False:
                    return
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def read_head(c: Any) -> Optional[bytes]:
    """A request's head (the body, by Content-Length, is read and dropped)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = c.recv(65536)
        if not d:
            return None
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    lengths = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
    n = int(lengths[0].split(b":")[1]) if lengths else 0
    while len(rest) < n:
        rest += c.recv(65536)
    return head


def header(head: bytes, name: str) -> Optional[str]:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name.lower().encode():
            return v.strip().decode("latin-1")
    return None


REPLY = json.dumps({"choices": [{"message": {"content": "through the proxy"}}]}).encode()


def reply(c: socket.socket, status: str, body: bytes = REPLY, extra: str = "") -> None:
    c.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
              .encode() + body)


USER, PASSWORD = "us er", "p@ss:w%rd-proxy-77"  # given percent-encoded in the URL
PROXY_USERINFO = "us%20er:p%40ss%3Aw%25rd-proxy-77"
WANTED = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def auth_proxy(c: socket.socket, head: bytes, srv: Loopback) -> Optional[bool]:
    """A plain HTTP proxy that answers 407 unless the request carries the wanted credentials
    (and then answers for the origin itself)."""
    if header(head, "Proxy-Authorization") != WANTED:
        reply(c, "407 Proxy Authentication Required", b'{"error": {"message": "auth"}}',
              'Proxy-Authenticate: Basic realm="p"\r\n')
        return None
    reply(c, "200 OK")
    return None


# -- a malformed variable: one line naming it, before any request ------------------------------

MALFORMED_PROXY = ["http://u:p@127.0.0.1:99999", "http://127.0.0.1:8o80", "http://[::1:3128", "http://[::1", "http://:3128",
                   "127.0.0.1:-1", "http://127.0.0.1:0", "http://pro xy:3128", "http://[not-v6]:3128",
                   "http://[::1]x:3128"]
MALFORMED_NO_PROXY = ["[::1", "localhost:99999", "localhost:abc", "10.0.0.0/99", "::1::2", "example.com]"]


@pytest.mark.parametrize("name", ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"])
@pytest.mark.parametrize("value", MALFORMED_PROXY)
def test_a_malformed_proxy_variable_is_one_line_naming_it(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ReformError) as e:
        Endpoint("http://127.0.0.1:9/v1/chat/completions", timeout=1)
    msg = str(e.value)
    assert msg.startswith(f"environment variable {name}: malformed proxy setting") and "\n" not in msg
    assert "u:p@" not in msg


@pytest.mark.parametrize("name", ["no_proxy", "NO_PROXY"])
@pytest.mark.parametrize("value", MALFORMED_NO_PROXY)
def test_a_malformed_no_proxy_is_one_line_naming_it(name, value, monkeypatch):
    monkeypatch.setenv(name, f"example.org,{value}")
    with pytest.raises(ReformError) as e:
        Endpoint("http://127.0.0.1:9/v1/chat/completions", timeout=1)
    assert str(e.value).startswith(f"environment variable {name}: malformed proxy setting")


def test_the_command_line_stops_before_any_request_with_exit_2(monkeypatch, tmp_path, capsys):
    from reform_eval import run_eval
    from tests.conftest import write_custom_dataset
    origin = Loopback(lambda c, head, srv: reply(c, "200 OK"))
    try:
        monkeypatch.setenv("HTTP_PROXY", "http://u:p@127.0.0.1:99999")
        cfg = write_custom_dataset(str(tmp_path / "data"), n=2, formulation="Generation")
        code = run_eval.main(["--model", "openai_api", "--model_name", "m", "--dataset_name", "custom",
                              "--dataset_config", cfg, "--formulation", "Generation", "--output_dir",
                              str(tmp_path / "out"), "--model_option", f"base_url=http://127.0.0.1:{origin.port}/v1"])
    finally:
        origin.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "HTTP_PROXY" in err[0] and "internal error" not in err[0], err
    assert origin.heads == []


def test_a_proxy_scheme_the_client_cannot_speak_is_refused_only_where_it_applies(monkeypatch):
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(ReformError, match="^environment variable ALL_PROXY: a socks5:// proxy is not supported"):
        Endpoint("https://api.example.com/v1/chat/completions", timeout=1)
    monkeypatch.setenv("NO_PROXY", "api.example.com")  # not used for this host: no reason to refuse
    assert Endpoint("https://api.example.com/v1/chat/completions", timeout=1).proxy is None


@pytest.mark.parametrize("no_proxy, host, bypassed", [
    ("*", "api.example.com", True), ("example.com", "api.example.com", True), (".example.com", "example.com", True),
    ("example.com", "badexample.com", False), ("127.0.0.0/8", "127.0.0.1", True), ("[::1]", "[::1]", True),
    ("::1", "[::1]", True), ("10.0.0.0/8", "127.0.0.1", False), ("api.example.com:443", "api.example.com", True),
    ("api.example.com:8443", "api.example.com", False), ("EXAMPLE.COM.", "api.example.com", True),
    ("example.com.", "example.com.", True), ("example.com", "api.example.com.", True)])
def test_no_proxy_forms(no_proxy, host, bypassed, monkeypatch):
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:3128")
    monkeypatch.setenv("no_proxy", no_proxy)
    assert (Endpoint(f"https://{host}/v1/chat/completions", timeout=1).proxy is None) is bypassed


def test_lower_case_wins_and_all_proxy_is_the_fallback(monkeypatch):
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:1111")
    assert Endpoint("http://api.example.com/v1", timeout=1).proxy.port == 1111
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:2222")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:3333")
    p = Endpoint("http://api.example.com/v1", timeout=1).proxy
    assert (p.port, p.variable) == (3333, "http_proxy")


# -- a proxy that demands authentication -------------------------------------------------------

def test_plain_http_proxying_sends_basic_proxy_authorization(monkeypatch, caplog):
    proxy = Loopback(auth_proxy)
    try:
        monkeypatch.setenv("http_proxy", f"http://{PROXY_USERINFO}@127.0.0.1:{proxy.port}")
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": "http://origin.invalid:8000/v1",
                                            "max_retries": 0})
        with caplog.at_level("DEBUG"):
            assert model.raw_generate([], "hi") == "through the proxy"
    finally:
        proxy.close()
    assert len(proxy.heads) == 1
    assert proxy.heads[0].startswith(b"POST http://origin.invalid:8000/v1/chat/completions HTTP/1.1\r\n")
    assert header(proxy.heads[0], "Proxy-Authorization") == WANTED
    # the credentials, and each form derived from them, are secrets
    token = WANTED.split()[1]
    assert redact_text(f"x {token} {PASSWORD} {USER}:{PASSWORD}") == "x <redacted> <redacted> <redacted>"
    assert token not in caplog.text and PASSWORD not in caplog.text


def test_without_credentials_the_407_is_one_line_that_shows_no_secret(monkeypatch):
    proxy = Loopback(auth_proxy)
    try:
        monkeypatch.setenv("http_proxy", f"http://us%20er:wrong-secret-99@127.0.0.1:{proxy.port}")
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": "http://origin.invalid/v1", "max_retries": 3})
        with pytest.raises(ReformError) as e:
            model.raw_generate([], "hi")
    finally:
        proxy.close()
    assert "407" in str(e.value) and "wrong-secret-99" not in str(e.value)
    assert len(proxy.heads) == 1  # a refusal, not retried


def _self_signed(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed: no certificate for a local TLS server")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(tmp_path / "cert.pem"), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")


@pytest.mark.parametrize("with_credentials", [True, False])
def test_an_https_tunnel_sends_proxy_authorization_on_connect_only(with_credentials, tmp_path, monkeypatch):
    cert, key = _self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    origin_heads: List[bytes] = []

    def origin_handle(c, head, srv):
        return False  # (unused: the origin speaks TLS, below)

    origin = Loopback(origin_handle)

    def tls_serve(c: socket.socket) -> None:
        try:
            t = ctx.wrap_socket(c, server_side=True)
            while True:
                head = read_head(t)
                if head is None:
                    return
                origin_heads.append(head)
                reply(t, "200 OK")  # type: ignore[arg-type]
        except (OSError, ssl.SSLError):
            return
    origin._serve = tls_serve  # type: ignore[method-assign]

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    return
                b.sendall(d)
        except OSError:
            return

    def tunnel(c, head, srv):
        if header(head, "Proxy-Authorization") != WANTED:
            reply(c, "407 Proxy Authentication Required", b"", 'Proxy-Authenticate: Basic realm="p"\r\n')
            return None
        host, port = head.split(b" ")[1].rsplit(b":", 1)
        up = socket.create_connection((host.decode(), int(port)))
        c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=pipe, args=(c, up), daemon=True).start()
        pipe(up, c)
        return False

    proxy = Loopback(tunnel)
    try:
        userinfo = f"{PROXY_USERINFO}@" if with_credentials else ""
        monkeypatch.setenv("HTTPS_PROXY", f"http://{userinfo}127.0.0.1:{proxy.port}")
        ep = Endpoint(f"https://127.0.0.1:{origin.port}/v1/chat/completions", timeout=5)
        if with_credentials:
            r = ep.post(b"{}", {"Content-Type": "application/json"})
            assert r.status == 200 and r.body == REPLY
        else:
            with pytest.raises(ReformError, match=r"\(HTTPS_PROXY\) demands authentication \(HTTP 407\): give them"):
                ep.post(b"{}", {"Content-Type": "application/json"})
        ep.close()
    finally:
        proxy.close()
        origin.close()
    assert proxy.heads[0].startswith(f"CONNECT 127.0.0.1:{origin.port} HTTP/1.1".encode())
    if with_credentials:
        assert header(proxy.heads[0], "Proxy-Authorization") == WANTED
        assert len(origin_heads) == 1 and header(origin_heads[0], "Proxy-Authorization") is None
    else:
        assert origin_heads == []


def test_a_proxy_that_echoes_its_credentials_leaves_none_in_the_answer(monkeypatch):
    def echo(c, head, srv):
        seen = header(head, "Proxy-Authorization") or ""
        reply(c, "200 OK", json.dumps({"choices": [{"message": {"content": f"you sent {seen} ({USER}:{PASSWORD})"}}]})
              .encode())
    proxy = Loopback(echo)
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://{PROXY_USERINFO}@127.0.0.1:{proxy.port}")
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": "http://origin.invalid/v1"})
        answer = model.raw_generate([], "hi")
    finally:
        proxy.close()
    assert WANTED.split()[1] not in answer and PASSWORD not in answer and answer.startswith("you sent Basic <redacted>")


# -- review 3: no piece of a password in a message; a plain-http proxy's 407 ------------------

@pytest.mark.parametrize("value", ["http://alice:Tr0ub4dor#horse@127.0.0.1:3128", "http://alice:Tr0ub4dor/horse@127.0.0.1:3128",
                                   "http://alice:Tr0ub4dor?horse@127.0.0.1:3128", "alice:Tr0ub4dor#horse@127.0.0.1:3128",
                                   "http://alice:horse@127.0.0.1:Tr0ub4dor", "http://alice:horse@[Tr0ub4dor:3128"])
def test_a_malformed_proxy_url_with_credentials_quotes_no_piece_of_them(value, monkeypatch):
    """Review 3, D3: a '#' in the password cut the URL there, and the message quoted the rest
    of the password as the port ("port 'Tr0ub4dor' is not a number")."""
    monkeypatch.setenv("HTTP_PROXY", value)
    with pytest.raises(ReformError) as e:
        Endpoint("http://127.0.0.1:9/v1/chat/completions", timeout=1)
    msg = str(e.value)
    assert msg.startswith("environment variable HTTP_PROXY: malformed proxy setting") and "Tr0ub" not in msg, msg
    if "Tr0ub4dor" in value.split("@")[0]:  # the password holds a reserved character
        assert "percent-encode reserved characters" in msg


@pytest.mark.parametrize("url", ["http://alice:Tr0ub4dor/horse@127.0.0.1:9/v1", "http://alice:Tr0ub4dor#horse@127.0.0.1:9/v1",
                                 "http://alice:horse@127.0.0.1:Tr0ub4dor/v1"])
def test_a_malformed_base_url_with_credentials_quotes_no_piece_of_them(url):
    """Review 3, D3: urllib's ValueError quoted the password's tail as the port."""
    with pytest.raises(ReformError) as e:
        get_model("openai_api", {"model_name": "m", "base_url": url})
    msg = str(e.value)
    assert msg.startswith("openai_api: --model_option base_url: malformed URL") and "Tr0ub" not in msg, msg


def test_a_plain_http_proxy_answering_407_is_named_with_a_hint(monkeypatch):
    """Review 3, D8: the proxy's 407 read as the endpoint's refusal ('endpoint ... refused the
    request (HTTP 407 ...)'), naming neither the proxy variable nor the credentials."""
    proxy = Loopback(auth_proxy)
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        model, _ = get_model("openai_api", {"model_name": "m", "base_url": "http://origin.invalid/v1", "max_retries": 3})
        with pytest.raises(ReformError) as e:
            model.raw_generate([], "hi")
    finally:
        proxy.close()
    msg = str(e.value)
    assert f"proxy 127.0.0.1:{proxy.port} (HTTP_PROXY) demands authentication (HTTP 407)" in msg, msg
    assert f"HTTP_PROXY=http://USER:PASSWORD@127.0.0.1:{proxy.port}" in msg and "refused the request" not in msg
    assert len(proxy.heads) == 1  # a refusal, not retried
