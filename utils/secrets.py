"""Secrets (API keys, tokens) never leave memory: ``redact`` for every file, log and hash.

Why one helper: a key reaches the harness as a ``--model_option api_key=...``, as a config
entry, or through an environment variable (``OPENAI_API_KEY``), and from there could flow
into ``results.json``, ``log.txt``, the printed command line and the run identity hash.
``redact(obj)`` returns a copy in which

* the value of every key that names a credential (``api_key``, ``token``, ``password``,
  ``authorization``, ``*_secret``, ...) is replaced by ``REDACTED``;
* ``KEY=VALUE`` strings (``--model_option`` lists, ``sys.argv``) with such a key get their
  value replaced;
* every occurrence of a secret value the process has registered (``register_secret``, done
  by the interfaces that read a key) or of a credential environment variable's value is
  replaced inside any string.

The run identity leaves credentials out altogether (``drop_secrets``): rotating a key never
re-runs an evaluation, and the hash does not leak it.
"""
from __future__ import annotations

import base64
import functools
import os
import re
import threading
import urllib.parse
from typing import Any, Dict, FrozenSet, Set, Tuple

import yaml

REDACTED = "<redacted>"

#: key names (case-insensitive, ``-`` = ``_``) that hold credentials
_SECRET_NAME = re.compile(r"(^|_)(api_?key|apikey|token|access_token|secret|secret_key|password|passwd|"
                          r"authorization|auth|credentials?|bearer)$", re.IGNORECASE)
#: environment variables whose values are credentials
SECRET_ENV_VARS = ("OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY",
                   "GOOGLE_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "SGLANG_API_KEY")
# each pattern starts only where its leading run starts (the lookbehinds), so a long run of word
# characters is scanned once, not once per position: linear time on degenerate model output.
# A key may be quoted (a Python or JSON repr: ``'token': 'x'``); a value stops at brackets.
_KV = re.compile(r"(?<![A-Za-z0-9_.-])(?P<q>['\"]?)(?P<key>[A-Za-z0-9_.-]+)(?P=q)(?P<sep>\s*[=:]\s*)"
                 r"(?P<val>'[^']*'|\"[^\"]*\"|[^\s,;&'\"{}\[\]]+)")
#: credentials inside URLs: user info (``scheme://user:secret@host``) and query parameters. The
#: user info may hold an unencoded '/', '?' or '#' (``http://u:pa/ss@host``, a URL the client
#: refuses but the command line still shows): it runs to the last '@' within 256 characters
#: (bounded: a run of ``https://`` is scanned in linear time)
_URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^@\s'\"]{1,256})@")
_URL_QUERY = re.compile(r"(?P<lead>[?&](?:key|sig|code|auth|[A-Za-z0-9_-]*(?:api[_-]?key|token|secret|password|"
                        r"signature|credential)))=(?P<val>[^&\s'\"#]+)", re.IGNORECASE)

_lock = threading.Lock()
_registered: Set[str] = set()


#: token *names* of tokenizers (``pad_token``), not credentials
_NOT_SECRET = re.compile(r"(pad|bos|eos|unk|sep|cls|mask|image|video|audio|boi|eoi)_token$", re.IGNORECASE)


def is_secret_key(name: Any) -> bool:
    """Does a config / option key name a credential?"""
    key = str(name).strip().replace("-", "_")
    return bool(_SECRET_NAME.search(key)) and not _NOT_SECRET.search(key)


@functools.lru_cache(maxsize=256)
def secret_forms(value: str) -> FrozenSet[str]:
    """Every form of a credential that code derives from it and a server may echo: the value,
    percent-encoded and percent-decoded, and base64 (standard and URL-safe, with and without
    padding: a ``user:password`` user info becomes a Basic ``Authorization`` or
    ``Proxy-Authorization`` header). Each form of a secret is a secret (issue 31): redacting
    the key alone left ``Basic <base64 of user:pass>`` in the prediction file."""
    if not isinstance(value, str) or not value:
        return frozenset()
    forms = {value, urllib.parse.quote(value, safe=""), urllib.parse.quote(value), urllib.parse.unquote(value)}
    raw = value.encode("utf-8", "surrogatepass")
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = encoded.decode("ascii")
        forms.update((text, text.rstrip("=")))
    return frozenset(f for f in forms if len(f) >= 6)


def register_secret(value: Any) -> None:
    """Remember a credential value, and every form derived from it (``secret_forms``), so
    ``redact`` removes them from any string (values shorter than 6 characters are ignored: they
    would redact ordinary words)."""
    if isinstance(value, str) and len(value) >= 6:
        forms = secret_forms(value)
        with _lock:
            _registered.update(forms)


def basic_credentials(user: str, password: str) -> "Secret":
    """The value of a Basic ``Authorization`` / ``Proxy-Authorization`` header for ``user`` and
    ``password`` (already percent-decoded), as a Secret: the header, the pair and the password
    are each registered, so an echo of any of them is redacted."""
    pair = f"{user}:{password}"
    register_secret(password)
    register_secret(pair)
    return Secret("Basic " + base64.b64encode(pair.encode("utf-8", "surrogatepass")).decode("ascii"))


class Secret:
    """A credential as a value: its repr, str and JSON form are redacted, so a config that
    holds one can be printed, logged, hashed or dumped without leaking it. Code that must send
    the credential calls ``reveal()``, at the last moment (an HTTP header)."""

    __slots__ = ("_value",)
    _value: str  # the slot (set once, by __init__)

    def __init__(self, value: Any) -> None:
        if isinstance(value, Secret):
            value = value.reveal()
        object.__setattr__(self, "_value", "" if value is None else str(value))
        register_secret(self._value)

    def reveal(self) -> str:
        return self._value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Secret is immutable")

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, spec: str) -> str:
        return REDACTED

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> Any:  # pickled (DataLoader workers, deepcopy) as a Secret, never as text
        return (Secret, (self._value,))

    def __json__(self) -> str:
        return REDACTED


def json_default(obj: Any) -> Any:
    """``json.dumps(..., default=json_default)``: a Secret dumps as the redaction marker; other
    unknown objects as their ``str`` (paths, enums)."""
    if isinstance(obj, Secret):
        return REDACTED
    return str(obj)


def reveal(value: Any) -> Any:
    """The plain value of a Secret, or a SecretURL with its credentials put back (anything else
    unchanged)."""
    return value.reveal() if isinstance(value, (Secret, SecretURL)) else value


def reveal_deep(obj: Any) -> Any:
    """``obj`` (dicts, lists, tuples) with every Secret / SecretURL revealed: what is sent on the wire."""
    if isinstance(obj, dict):
        return {k: reveal_deep(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(reveal_deep(v) for v in obj)
    return reveal(obj)


def is_secret_query_param(name: str) -> bool:
    """Does a URL query parameter carry a credential (``api-key``, ``auth``, ``X-Amz-Signature``,
    ``sig``, ``access_token``, ...)?"""
    key = name.strip().lower().replace("-", "_")
    return (is_secret_key(key) or key in ("key", "sig", "code") or key.endswith(("signature", "credential"))
            or key.endswith("api_key"))


def split_url_secrets(url: str) -> Tuple[str, Dict[str, "Secret"]]:
    """``(public_url, secrets)``: the URL without its user info and credential query parameters
    (other parameters kept, in order), and those as Secrets, keyed ``"userinfo"`` and
    ``"query:<name>"``. ``join_url_secrets`` puts them back when a request is sent."""
    try:
        p = urllib.parse.urlsplit(url)
        pairs = urllib.parse.parse_qsl(p.query, keep_blank_values=True)
        p.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return url, {}
    secrets: Dict[str, Secret] = {}
    netloc = p.netloc
    if "@" in netloc:
        info, netloc = netloc.rsplit("@", 1)
        secrets["userinfo"] = Secret(urllib.parse.unquote(info))
        if ":" in info:
            register_secret(urllib.parse.unquote(info.split(":", 1)[1]))
    kept = []
    for name, value in pairs:
        if is_secret_query_param(name) and value:
            secrets[f"query:{name}"] = Secret(value)
        else:
            kept.append((name, value))
    if not secrets:
        return url, {}
    query = urllib.parse.urlencode(kept) if kept else ""
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, query, p.fragment)), secrets


def join_url_secrets(public: str, secrets: Dict[str, "Secret"]) -> str:
    """The URL to send: ``public`` with the credentials of ``split_url_secrets`` put back."""
    if not secrets:
        return public
    p = urllib.parse.urlsplit(public)
    netloc = p.netloc
    if "userinfo" in secrets:
        netloc = f"{urllib.parse.quote(reveal(secrets['userinfo']), safe=':')}@{netloc}"
    pairs = urllib.parse.parse_qsl(p.query, keep_blank_values=True)
    pairs += [(k.split(":", 1)[1], reveal(v)) for k, v in secrets.items() if k.startswith("query:")]
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, urllib.parse.urlencode(pairs), p.fragment))


class SecretURL(str):
    """A URL whose text (str, repr, JSON, the run identity) is the public URL; ``reveal()`` gives
    the URL to send, with the user info and credential query parameters put back. Rotating a
    key in the URL therefore changes neither the run identity nor any file."""

    secrets: Dict[str, Secret]

    def __new__(cls, url: str) -> "SecretURL":
        if isinstance(url, SecretURL):
            return url
        public, secrets = split_url_secrets(str(url))
        obj = super().__new__(cls, public)
        obj.secrets = secrets
        return obj

    def reveal(self) -> str:
        return join_url_secrets(str.__str__(self), self.secrets)

    def __reduce__(self) -> Any:  # pickled as a SecretURL (the credentials stay wrapped)
        return (_secret_url, (str.__str__(self), self.secrets))


def _secret_url(public: str, secrets: Dict[str, Secret]) -> SecretURL:
    obj = str.__new__(SecretURL, public)
    obj.secrets = dict(secrets)
    return obj


# YAML (a config echoed as flags, a dumped config) shows the redaction marker and the public URL
yaml.SafeDumper.add_representer(Secret, lambda dumper, _: dumper.represent_str(REDACTED))
yaml.SafeDumper.add_representer(SecretURL, lambda dumper, url: dumper.represent_str(str.__str__(url)))


def secret_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """Options with every credential-named value wrapped as a Secret, at any depth of a mapping
    value (``extra_body``), and every ``*url`` value with credentials inside as a SecretURL
    (parsed once, at the boundary)."""
    out: Dict[str, Any] = {}
    for k, v in options.items():
        if is_secret_key(k) and v not in (None, "") and not isinstance(v, (Secret, dict, list)):
            out[k] = Secret(v)
        elif isinstance(v, dict):
            out[k] = secret_options(v)
        elif isinstance(v, str) and not isinstance(v, SecretURL) and str(k).lower().endswith("url") \
                and split_url_secrets(v)[1]:
            out[k] = SecretURL(v)
        else:
            out[k] = v
    return out


def _secret_values() -> Set[str]:
    values: Set[str] = set()
    for n, v in os.environ.items():
        if (n in SECRET_ENV_VARS or is_secret_key(n)) and v and len(v) >= 6:
            values.update(secret_forms(v))
    with _lock:
        return values | _registered


def redact_text(text: str) -> str:
    """``text`` with registered/environment secrets and ``secret_key=value`` pairs masked."""
    for value in sorted(_secret_values(), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = re.sub(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{6,}", r"\1 " + REDACTED, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _URL_QUERY.sub(lambda m: f"{m.group('lead')}={REDACTED}", text)

    def mask(m: "re.Match[str]") -> str:
        if is_secret_key(m.group("key").split(".")[-1].lstrip("-")):
            return f"{m.group('q')}{m.group('key')}{m.group('q')}{m.group('sep')}{REDACTED}"
        return m.group(0)
    return _KV.sub(mask, text)


def excerpt(text: Any, limit: int) -> str:
    """``text`` (server-provided: a header, a status line, a reply) redacted, THEN cut to
    ``limit`` characters, for a message or a file: cutting first can leave part of a token
    that no whole-form redaction then recognises (``Bearer sk-proj-ABCDE``)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("latin-1")
    return redact_text(str(text))[:limit]


def misplaced_userinfo(url: str) -> bool:
    """Does ``url`` hold an ``@`` after its authority (in the path, query or fragment)? Then
    credentials with an unencoded ``/``, ``?`` or ``#`` were cut by the URL parser, and the
    host, port and path it found are pieces of them: a message must quote none of them."""
    rest = url.split("://", 1)[1] if "://" in url else url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return "@" in rest[len(authority):]


def redact(obj: Any) -> Any:
    """A deep copy of ``obj`` (dicts, lists, tuples, strings, scalars) with every secret
    masked as described in the module docstring; other objects are returned as they are."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, Secret):
        return REDACTED
    return obj


def drop_secrets(obj: Any) -> Any:
    """A copy of ``obj`` without credential entries at all (for the run identity: a new key
    must not change which prediction file a run uses)."""
    if isinstance(obj, dict):
        return {k: drop_secrets(v) for k, v in obj.items() if not is_secret_key(k) and not isinstance(v, Secret)}
    if isinstance(obj, (list, tuple)):
        out = [drop_secrets(v) for v in obj
               if not (isinstance(v, str) and "=" in v and is_secret_key(v.split("=", 1)[0].strip()))]
        return type(obj)(out)
    return obj
