"""The proxy an endpoint request goes through, from the environment, checked before any request.

Why here and not ``urllib.request.getproxies``: urllib reads the variables but checks nothing,
so a malformed one (``HTTP_PROXY=http://u:p@127.0.0.1:99999``, a port that is not a number, an
unclosed ``[``) ended at the first request as an internal ``ValueError``; it ignored the
credentials of a proxy URL, so a proxy that demands them refused every request (407); and its
``no_proxy`` match split an IPv6 host at its last colon. Here:

* ``{scheme}_proxy``, then ``all_proxy``, each lower case first, then upper case (as curl and
  urllib read them); ``no_proxy`` / ``NO_PROXY``: a comma-separated list of ``*``, host names
  (``.example.com`` and ``example.com`` both match its subdomains), IP addresses, ``[v6]``, any
  of them with ``:port``, and CIDR blocks (``10.0.0.0/8``);
* every one of these variables that is set is parsed when the client is made; a malformed one
  is one line naming the variable (``ReformError``: exit 2), before any request. The proxy in
  effect must be an ``http://`` proxy (the client speaks plain HTTP to it: an absolute target
  for http, a CONNECT tunnel for https);
* credentials in the proxy URL (percent-decoded) are sent as a Basic ``Proxy-Authorization``
  header: on every request through a plain HTTP proxy and on the CONNECT of an https tunnel
  (never to the endpoint inside the tunnel). They are Secrets (``utils.secrets``): an echo of
  the header, the pair or the password is redacted, and no message shows them.
"""
from __future__ import annotations

import ipaddress
import os
import urllib.parse
from typing import List, NamedTuple, Optional, Tuple

from ..utils.errors import ReformError
from ..utils.secrets import Secret, basic_credentials, misplaced_userinfo

#: the variables read, in the order of precedence for one name (lower case first)
PROXY_NAMES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class Proxy(NamedTuple):
    host: str
    port: int
    #: the ``Proxy-Authorization`` value (Basic), or None when the URL holds no credentials
    authorization: Optional[Secret]
    #: the variable it came from (messages name it)
    variable: str


class _NoProxyEntry(NamedTuple):
    host: str  # a lower-case name without leading dots, '*' or an IP address; '' for a network
    port: Optional[int]
    network: Optional["ipaddress.IPv4Network | ipaddress.IPv6Network"]


def _variables(name: str) -> List[Tuple[str, str]]:
    """(variable, value) of ``name`` in lower case, then upper case, where set and not empty."""
    out = []
    for variable in (name, name.upper()):
        value = os.environ.get(variable)
        if value and value.strip():
            out.append((variable, value.strip()))
    return out


def _malformed(variable: str, why: str) -> ReformError:
    return ReformError(f"environment variable {variable}: malformed proxy setting ({why}); fix or unset it")


def _port(text: str, variable: str, quote: bool = True) -> int:
    """``quote=False`` where the URL holds credentials: the port text is then not shown."""
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= 65535:
        shown = f"port {text[:20]!r}" if quote else "the port"
        raise _malformed(variable, f"{shown} is not a number from 1 to 65535")
    return int(text)


def parse_proxy(variable: str, value: str) -> Tuple[str, str, int, Optional[Secret]]:
    """(scheme, host, port, Proxy-Authorization) of a proxy URL, or one line naming ``variable``.
    A URL without a scheme is an http proxy; one without a port, port 8080."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise _malformed(variable, "it holds a space or a control character")
    url = value if "://" in value else f"http://{value}"
    if misplaced_userinfo(url):  # the parser's host and port would be pieces of the password: none quoted
        raise _malformed(variable, "an '@' after the host: credentials in the URL must percent-encode reserved "
                                   "characters, '/' as %2F, '?' as %3F, '#' as %23, '@' as %40")
    quote = "@" not in url  # with credentials in the URL, a message quotes none of its pieces
    try:
        p = urllib.parse.urlsplit(url)
        netloc = p.netloc.rpartition("@")[2]
        host = p.hostname or ""
    except ValueError as e:  # an unclosed '[' ('Invalid IPv6 URL')
        raise _malformed(variable, str(e) if quote else "the host after the credentials is malformed") from None
    if netloc.startswith("[") and "]" not in netloc:
        raise _malformed(variable, "unclosed '['")
    rest = netloc[netloc.index("]") + 1:] if netloc.startswith("[") else netloc
    if netloc.startswith("[") and rest and not rest.startswith(":"):  # '[::1]x:3128' is not [::1]:3128
        raise _malformed(variable, "text after ']' that is not ':port'")
    if rest.count(":") > 1 or (not netloc.startswith("[") and "]" in rest):
        raise _malformed(variable, f"host {netloc[:60]!r} is neither a name nor a bracketed IPv6 address")
    port_text = rest.partition(":")[2] if ":" in rest else ""
    if not host:
        raise _malformed(variable, "no host")
    if netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise _malformed(variable, f"[{host[:60]}] is not an IPv6 address") from None
    port = _port(port_text, variable, quote) if port_text else 8080
    authorization = None
    if p.username is not None or p.password is not None:
        authorization = basic_credentials(urllib.parse.unquote(p.username or ""),
                                          urllib.parse.unquote(p.password or ""))
    return p.scheme.lower(), host, port, authorization


def _no_proxy_entries(variable: str, value: str) -> List[_NoProxyEntry]:
    entries = []
    for raw in value.replace(" ", ",").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            entries.append(_NoProxyEntry("*", None, None))
            continue
        port: Optional[int] = None
        if entry.startswith("["):
            if "]" not in entry:
                raise _malformed(variable, f"entry {raw.strip()[:60]!r}: unclosed '['")
            host, _, rest = entry[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise _malformed(variable, f"entry {raw.strip()[:60]!r}: text after ']'")
                port = _port(rest[1:], variable)
            try:
                host = str(ipaddress.IPv6Address(host))
            except ValueError:
                raise _malformed(variable, f"entry {raw.strip()[:60]!r}: not an IPv6 address") from None
            entries.append(_NoProxyEntry(host, port, None))
            continue
        if "]" in entry:
            raise _malformed(variable, f"entry {raw.strip()[:60]!r}: ']' without '['")
        if "/" in entry:
            try:
                entries.append(_NoProxyEntry("", None, ipaddress.ip_network(entry, strict=False)))
            except ValueError:
                raise _malformed(variable, f"entry {raw.strip()[:60]!r}: not a network (CIDR)") from None
            continue
        if entry.count(":") > 1:  # a bare IPv6 address
            try:
                entries.append(_NoProxyEntry(str(ipaddress.IPv6Address(entry)), None, None))
            except ValueError:
                raise _malformed(variable, f"entry {raw.strip()[:60]!r}: not an IPv6 address (bracket it "
                                           "to give a port: [::1]:8000)") from None
            continue
        host, sep, port_text = entry.partition(":")
        if sep:
            port = _port(port_text, variable)
        host = host.lstrip("*").lstrip(".").rstrip(".")  # 'example.com.' is example.com (the host is compared so too)
        if not host:
            raise _malformed(variable, f"entry {raw.strip()[:60]!r}: no host")
        entries.append(_NoProxyEntry(host, port, None))
    return entries


def _bypassed(entries: List[_NoProxyEntry], host: str, port: int) -> bool:
    host = host.lower().rstrip(".")
    try:
        address: Optional["ipaddress.IPv4Address | ipaddress.IPv6Address"] = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        address = None
    for e in entries:
        if e.host == "*":
            return True
        if e.port is not None and e.port != port:
            continue
        if e.network is not None:
            if address is not None and address.version == e.network.version and address in e.network:
                return True
        elif address is not None:
            try:
                if ipaddress.ip_address(e.host) == address:
                    return True
            except ValueError:
                pass
        elif host == e.host or host.endswith("." + e.host):
            return True
    return False


def proxy_for(scheme: str, host: str, port: int) -> Optional[Proxy]:
    """The proxy a request to ``scheme://host:port`` goes through, or None. Every proxy
    variable that is set is checked here (one line naming a malformed one, before any request),
    whether or not it applies to this endpoint."""
    proxies, bypass = {}, {}
    for name in PROXY_NAMES:
        for variable, value in _variables(name):
            if name == "no_proxy":
                bypass[variable] = _no_proxy_entries(variable, value)
            else:
                proxies[variable] = parse_proxy(variable, value)
    no_proxy = _variables("no_proxy")
    if no_proxy and _bypassed(bypass[no_proxy[0][0]], host, port):
        return None
    for name in (f"{scheme.lower()}_proxy", "all_proxy"):
        found = _variables(name)
        if found:
            variable = found[0][0]
            proxy_scheme, proxy_host, proxy_port, authorization = proxies[variable]
            if proxy_scheme != "http":
                raise ReformError(f"environment variable {variable}: a {proxy_scheme}:// proxy is not supported "
                                  "(the endpoint client speaks to http:// proxies only); set an http:// proxy, or "
                                  f"add the endpoint's host to NO_PROXY")
            return Proxy(proxy_host, proxy_port, authorization, variable)
    return None
