"""HTTP for the endpoint clients: keep-alive connections, one deadline per request, no redirects.

Why hand-written on sockets rather than httpx (docs/models.md says more):

* ``timeout`` bounds the WHOLE request (send, headers and body): every socket read and write
  waits at most until one deadline (and 1% of ``timeout`` more, at most 0.5 s, so the socket's
  timeout need not be set again before each of them), so a server that drips one byte a second
  cannot hold a call forever. httpx's timeouts are per phase and per read (a read timeout restarts on
  every byte), which cannot keep that promise;
* redirects are never followed (a 3xx is returned to the caller, who refuses it): the
  ``Authorization`` header only ever goes to the configured host;
* each worker thread keeps ONE keep-alive HTTP/1.1 connection per endpoint and reuses it for
  every request it sends; a connection the server closed while idle, or one with bytes nobody
  asked for, is replaced before use (one ``poll``), and a request whose send failed on a reused
  connection is sent again once, only if no byte of a reply arrived (an answered request is
  never sent twice);
* the reply is read straight from the socket (``_Connection``): ``http.client`` parses each
  reply's headers with the email package, which cost more CPU per request than the rest of
  the client; ``bench/api_ceiling.py`` measures the client against a plain ``http.client``
  keep-alive client at the loopback limit;
* a reply is read up to ``MAX_REPLY_BYTES``: a hostile or broken server cannot fill memory.

Numbers that arrive from outside are validated where they enter: the protocol's own fields
(status code, Content-Length, chunk size) by one parser, ``field_number``; ``retry_after``: a
``Retry-After`` of a day is clamped to the caller's ``backoff_max`` and logged once.
"""
from __future__ import annotations

import email.utils
import logging
import math
import select
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, NamedTuple, Optional, Set

from .http_proxy import Proxy, proxy_for
from ..utils.errors import ReformError
from ..utils.secrets import excerpt

logger = logging.getLogger(__name__)

#: the largest reply body read (bytes); a longer one is an error naming the endpoint
MAX_REPLY_BYTES = 64 * 1024 * 1024


class Retryable(Exception):
    """A failure that another attempt may cure (carries an optional Retry-After in seconds)."""

    def __init__(self, message: str, retry_after: Optional[float] = None, congestion: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.congestion = congestion


class DeadlinePassed(socket.timeout):
    """The whole request outlived its deadline."""


#: how far past its deadline one blocking read or write may wait, as a share of the request's
#: time (at most ``DEADLINE_SLACK_MAX_S``): the socket's timeout is set again only when it would
#: otherwise end before the deadline or more than this after it. Each ``settimeout`` is a system
#: call that gives up the interpreter lock; setting it before every read and write cost two per
#: request (``bench/api_ceiling.py``), and a request on a fast server now needs none.
DEADLINE_SLACK = 0.01
DEADLINE_SLACK_MAX_S = 0.5


def _deadline_socket(base: type) -> type:
    """``base`` (a socket class) whose reads and writes each wait until the instance's
    ``deadline`` at least and at most ``slack`` seconds longer, and fail once it has passed."""
    class DeadlineSocket(base):
        deadline: Optional[float] = None
        slack: float = 0.0

        def _arm(self) -> None:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise DeadlinePassed("request deadline passed")
                current = self.gettimeout()  # (no system call)
                if current is None or current < left or current > left + self.slack:
                    self.settimeout(left + self.slack)

        def _read(self, read: Any, *args: Any, **kwargs: Any) -> Any:
            self._arm()
            try:
                return read(*args, **kwargs)
            except socket.timeout:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    raise DeadlinePassed("request deadline passed") from None
                raise

        def recv_into(self, *args: Any, **kwargs: Any) -> int:
            return self._read(super().recv_into, *args, **kwargs)

        def recv(self, *args: Any, **kwargs: Any) -> bytes:
            return self._read(super().recv, *args, **kwargs)

        def sendall(self, *args: Any, **kwargs: Any) -> None:
            self._arm()
            return super().sendall(*args, **kwargs)

        def do_handshake(self, *args: Any, **kwargs: Any) -> None:
            # (TLS sockets only) the handshake is bounded by the same deadline as every read
            return self._read(super().do_handshake, *args, **kwargs)

    return DeadlineSocket


_DeadlineSocket = _deadline_socket(socket.socket)
_DeadlineSSLSocket = _deadline_socket(ssl.SSLSocket)


class Reply(NamedTuple):
    status: int
    reason: str
    headers: Any
    body: bytes


def public_url(url: str) -> str:
    """``url`` without user info and query (where keys hide: ``https://k@host/?api-key=...``)."""
    try:
        p = urllib.parse.urlsplit(url)
        host = p.hostname or ""
        if p.port:
            host += f":{p.port}"
    except ValueError:
        return "<unparseable url>"
    return urllib.parse.urlunsplit((p.scheme, host, p.path, "", ""))


class Headers:
    """A reply's header fields, looked up without regard to case (``get("Retry-After")``)."""

    def __init__(self, fields: Dict[str, str]) -> None:
        self._fields = fields

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        return self._fields.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._fields


class ProtocolError(Exception):
    """The server broke HTTP/1.1 (a malformed status line, header or chunk)."""


_DECIMAL = "0123456789"
_HEX = "0123456789abcdefABCDEF"


def field_number(text: str, what: str, hexadecimal: bool = False) -> int:
    """The one parser of the reply's numeric protocol fields (status code, Content-Length,
    chunk size): ASCII digits only, at most 15 of them, else ``ProtocolError``. ``int`` alone
    takes a sign, ``_`` separators, spaces, ``0x`` and non-ASCII digits ('٣'), and
    ``str.isdigit`` passes '²', which ``int`` then refuses with a ValueError."""
    if not text or len(text) > 15 or text.strip(_HEX if hexadecimal else _DECIMAL):
        raise ProtocolError(f"malformed {what} {excerpt(text, 20)!r}")
    return int(text, 16 if hexadecimal else 10)


class _Connection:
    """One keep-alive HTTP/1.1 connection: a request is written in one ``sendall`` and the reply
    read straight from the socket (status line, header fields, a body by Content-Length, by
    chunks, or up to the close). ``http.client`` parses every reply's header block with the
    email package, which cost more CPU per request than everything else the client does
    (``bench/api_ceiling.py``).

    ``replied`` says whether any byte of the current request's reply arrived: such a request
    reached the server and is never sent again. A reply followed by bytes nobody asked for
    (a server sending more than its Content-Length) ends the connection: the surplus must not
    be read as the next request's reply."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.used = False
        self.replied = False
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._tls_pending = getattr(sock, "pending", None)  # bytes TLS decrypted and holds

    def idle_intact(self) -> bool:
        """True when the idle connection has nothing to read: no unsolicited bytes and no
        close by the server (one ``poll`` with no wait)."""
        return not self.buf and not self._poll.poll(0) and not (self._tls_pending and self._tls_pending())

    def _fill(self, what: str) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionResetError(f"connection closed by the server {what}")
        self.replied = True
        self.buf += data

    def _line(self, limit: int = 65536) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return line
            if len(self.buf) > limit:
                raise ProtocolError("header line too long")
            self._fill("in the middle of a reply")

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill("in the middle of a reply body")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def request(self, head: bytes, payload: bytes, tunnel: bool = False) -> "tuple[Reply, bool]":
        """Send one request; (the reply, whether the connection may be used again).

        A server may answer before it has read the whole body (a 413 for a large upload) and
        close: the failed send is then followed by a read, and that reply is returned. A
        ``tunnel`` request is a CONNECT: its 2xx reply has no body (RFC 9110 9.3.6)."""
        self.used = True
        self.replied = False
        try:
            self.sock.sendall(head + payload)
        except (BrokenPipeError, ConnectionResetError) as send_error:
            try:
                reply, _ = self._reply(tunnel)
            except (OSError, ProtocolError):
                raise send_error from None
            return reply, False  # the body was not all sent: the connection ends here
        reply, keep = self._reply(tunnel)
        return reply, keep and not self.buf

    def _reply(self, tunnel: bool) -> "tuple[Reply, bool]":
        while True:  # 1xx interim replies are skipped
            status_line = self._line()
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or len(parts[1]) != 3:
                raise ProtocolError(f"malformed status line {excerpt(status_line, 60)!r}")
            version = parts[0]
            status = field_number(parts[1].decode("latin-1"), "status code")
            reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
            fields: Dict[str, str] = {}
            size = 0
            while True:
                line = self._line()
                if not line:
                    break
                size += len(line)
                if size > 65536:
                    raise ProtocolError("header block longer than 64 KB")
                name, sep, value = line.partition(b":")
                if not sep:
                    raise ProtocolError(f"malformed header field {excerpt(line, 60)!r}")
                key = name.strip().lower().decode("latin-1")
                text = value.strip().decode("latin-1")
                fields[key] = f"{fields[key]}, {text}" if key in fields else text
            if not 100 <= status < 200:
                break
        headers = Headers(fields)
        connection = (headers.get("connection") or "").lower()
        keep = version == b"HTTP/1.1" and "close" not in connection or "keep-alive" in connection
        if status in (204, 304) or tunnel and 200 <= status < 300:
            return Reply(status, reason, headers, b""), keep
        if "chunked" in (headers.get("transfer-encoding") or "").lower():
            body = bytearray()
            while True:
                size_line = self._line().split(b";")[0].strip()
                n = field_number(size_line.decode("latin-1"), "chunk size", hexadecimal=True)
                if n == 0:
                    while self._line():  # trailer fields
                        pass
                    break
                if len(body) + n > MAX_REPLY_BYTES:
                    raise Retryable(f"reply longer than {MAX_REPLY_BYTES // (1024 * 1024)} MB")
                body += self._exactly(n)
                if self._line():
                    raise ProtocolError("chunk longer than its size")
            return Reply(status, reason, headers, bytes(body)), keep
        length = headers.get("content-length")
        if length is not None:
            n = field_number(length, "Content-Length")
            if n > MAX_REPLY_BYTES:
                raise Retryable(f"reply longer than {MAX_REPLY_BYTES // (1024 * 1024)} MB")
            return Reply(status, reason, headers, self._exactly(n)), keep
        while True:  # no length: the body ends when the server closes the connection
            if len(self.buf) > MAX_REPLY_BYTES:
                raise Retryable(f"reply longer than {MAX_REPLY_BYTES // (1024 * 1024)} MB")
            data = self.sock.recv(65536)
            if not data:
                break
            self.buf += data
        reply = Reply(status, reason, headers, bytes(self.buf))
        self.buf.clear()
        return reply, False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _proxy_authentication(proxy: Proxy) -> ReformError:
    """The one line for a proxy's 407 (on a CONNECT or on a plain-http request through it)."""
    where = f"{proxy.host}:{proxy.port}"
    return ReformError(f"proxy {where} ({proxy.variable}) demands authentication (HTTP 407)"
                       + (" and refused the credentials in its URL" if proxy.authorization else
                          f": give them in the URL, {proxy.variable}=http://USER:PASSWORD@{where}"))


class Endpoint:
    """POSTs to one URL over per-thread keep-alive connections.

    ``url`` is the URL as sent on the wire (credentials already put back); ``scrub`` removes
    credentials from any text that goes into an error message."""

    def __init__(self, url: str, timeout: float, scrub: Callable[[str], str] = str) -> None:
        p = urllib.parse.urlsplit(url)
        self._parts = p
        self.timeout = float(timeout)
        self.scrub = scrub
        self.https = p.scheme == "https"
        self.host = p.hostname or ""
        self.port = p.port or (443 if self.https else 80)
        self.path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        default = 443 if self.https else 80
        self.bracketed_host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = self.bracketed_host + (f":{self.port}" if self.port != default else "")
        #: the proxy from the environment (checked here: a malformed variable is one line before any request)
        self.proxy = proxy_for(p.scheme, self.host, self.port)
        self._local = threading.local()
        self._all: Set[_Connection] = set()
        self._lock = threading.Lock()

    def _new_connection(self, deadline: float) -> "tuple[_Connection, str]":
        """A connection to the endpoint (through the proxy the environment sets for this host,
        ``models.http_proxy``: an absolute target for http, a CONNECT tunnel for https) and the
        target."""
        proxy = self.proxy
        host, port = (proxy.host, proxy.port) if proxy else (self.host, self.port)
        raw = socket.create_connection((host, port), timeout=max(0.001, deadline - time.monotonic()))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        sock.deadline = deadline
        target = self.path
        if proxy and not self.https:
            target = f"http://{self.host_header}{self.path}"
        if self.https:
            if proxy:
                tunnel = _Connection(sock)
                authority = f"{self.bracketed_host}:{self.port}"
                auth = f"Proxy-Authorization: {proxy.authorization.reveal()}\r\n" if proxy.authorization else ""
                reply, _ = tunnel.request(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n"
                                          .encode("latin-1"), b"", tunnel=True)
                if not 200 <= reply.status < 300 or tunnel.buf:
                    sock.close()
                    if reply.status == 407:
                        raise _proxy_authentication(proxy)
                    raise OSError(f"proxy {host}:{port} refused the tunnel (HTTP {reply.status})")
            ctx = ssl.create_default_context()
            ctx.sslsocket_class = _DeadlineSSLSocket
            tls: Any = ctx.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)  # a _DeadlineSSLSocket
            tls.deadline = deadline
            tls.do_handshake()
            sock = tls
        conn = _Connection(sock)
        with self._lock:
            self._all.add(conn)
        return conn, target

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
            with self._lock:
                self._all.discard(conn)

    def post(self, payload: bytes, headers: Dict[str, str]) -> Reply:
        """One HTTP attempt, bounded as a whole by ``timeout``. Raises ``Retryable`` for
        transient failures (the connection is then discarded)."""
        deadline = time.monotonic() + self.timeout
        for fresh_try in (False, True):
            conn = getattr(self._local, "conn", None)
            if conn is not None and not conn.idle_intact():
                self._drop()  # closed by the server while idle, or unsolicited bytes: never reused
                conn = None
            reused = conn is not None
            try:
                if conn is None:
                    conn, self._local.target = self._new_connection(deadline)
                    self._local.conn = conn
                timed: Any = conn.sock  # a _DeadlineSocket (made in _new_connection)
                timed.deadline = deadline
                timed.slack = min(DEADLINE_SLACK_MAX_S, DEADLINE_SLACK * self.timeout)
                head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                if self.proxy is not None and self.proxy.authorization and not self.https:
                    head += f"Proxy-Authorization: {self.proxy.authorization.reveal()}\r\n"
                head = (f"POST {self._local.target} HTTP/1.1\r\nHost: {self.host_header}\r\n{head}"
                        f"Content-Length: {len(payload)}\r\n\r\n")
                reply, keep = conn.request(head.encode("latin-1"), payload)
                if not keep:
                    self._drop()
                if reply.status == 407 and self.proxy is not None and not self.https:  # the proxy's, not the endpoint's
                    self._drop()
                    raise _proxy_authentication(self.proxy)
                return reply
            except DeadlinePassed:
                self._drop()
                raise Retryable(f"no complete reply within {self.timeout:g} s") from None
            except (socket.timeout, TimeoutError):
                self._drop()
                raise Retryable(f"no reply within {self.timeout:g} s") from None
            except (ConnectionRefusedError, socket.gaierror) as e:
                self._drop()
                raise Retryable(f"cannot reach endpoint ({e})") from None
            except (BrokenPipeError, ConnectionResetError) as e:
                stale = reused and not fresh_try and conn is not None and not conn.replied  # never resend a request that was answered
                self._drop()
                if stale:
                    continue  # the server closed the idle keep-alive connection: once more, fresh
                raise Retryable(self.scrub(f"connection failed ({type(e).__name__}: {e})")) from None
            except Retryable:
                self._drop()
                raise
            except (OSError, ProtocolError) as e:
                self._drop()
                raise Retryable(self.scrub(f"connection failed ({type(e).__name__}: {e})")) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every connection of every thread (an interrupted run's requests end at once)."""
        with self._lock:
            conns, self._all = list(self._all), set()
        for conn in conns:
            conn.close()


_clamped: Set[str] = set()


def log_clamp_once(what: str, message: str) -> None:
    """A warning the first time an outside number of kind ``what`` is clamped or refused."""
    if what not in _clamped:
        _clamped.add(what)
        logger.warning("%s (said once)", message)


def retry_after(headers: Any, cap: float, source: str = "endpoint") -> Optional[float]:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date), clamped to [0, ``cap``]:
    one 429 with ``Retry-After: 86400`` must not stall a run for a day when the user set
    ``backoff_max``. None when absent or unreadable."""
    value = headers.get("Retry-After") if headers else None
    if value is None:
        return None
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            log_clamp_once("retry-after-bad", f"{source}: unreadable Retry-After {excerpt(text, 40)!r} ignored")
            return None
        if when is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        log_clamp_once("retry-after-bad", f"{source}: Retry-After {excerpt(text, 40)!r} is not a finite number; ignored")
        return None
    if seconds < 0:
        return 0.0
    if seconds > cap:
        log_clamp_once("retry-after-cap", f"{source}: Retry-After {excerpt(text, 40)} s clamped to backoff_max={cap:g} s")
        return float(cap)
    return seconds
