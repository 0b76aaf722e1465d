"""`peers.json` in the palace directory, in the upstream format.

    {"peers": [{"name": "laptop", "url": "http://127.0.0.1:8742", "token": "..."}]}

Only `url` is required (a peer without a name is known by its URL). The file
holds tokens, so it is written atomically with mode 0600. A MemPalace hub
reads the same file, so one palace can be served by either program.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from logsync.errors import ConfigError, NotFoundError, ValidationError, shorten
from logsync.files import UnreadableJSON, make_private_dir, read_json, write_atomic
from logsync.text import is_unicode

PEERS_FILENAME = "peers.json"
MAX_URL_CHARS = 2048  # what common servers and proxies take in a request line


@dataclass(frozen=True)
class Peer:
    url: str
    name: str | None = None
    token: str | None = None
    # Push to this peer after our pulls and local appends (`logsync/push.py`): for a peer
    # that cannot reach us (we are behind NAT) but takes pushes.
    push: bool = False

    def __post_init__(self) -> None:
        """A URL's user name and password go out as Basic authorization, which takes the
        place of the bearer token: both together would never send the token."""
        if self.token and urlsplit(self.url).netloc.rpartition("@")[1]:
            raise ValidationError(
                f"peer url={shorten(redact_url(self.url))} carries a user name and password, which "
                "are sent in place of the token: give the URL without them, or no token")

    @property
    def key(self) -> str:
        """How state and logs name this peer: its name, else its URL without credentials."""
        return self.name or redact_url(self.url)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name:
            out["name"] = self.name
        out["url"] = self.url
        if self.token:
            out["token"] = self.token
        if self.push:
            out["push"] = True
        return out


def check_url(url: object) -> str:
    """An http(s) URL with a host and, if given, a port 1-65535; the trailing slash dropped.
    The one rule for a peer's URL: `peers add`, peers.json, `--peer` and `PeerClient`."""
    if not isinstance(url, str) or not url.strip():
        raise ValidationError(f"peer url={shorten(url, 200)} is invalid: must be an http:// or "
                              "https:// URL")
    shown = shorten(redact_url(url.strip()), 200)
    if len(url) > MAX_URL_CHARS:
        raise ValidationError(f"peer url={shown} is invalid: it is {len(url)} characters "
                              f"long, the most a peer's URL may be is {MAX_URL_CHARS}")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url.strip()):
        # urlsplit drops tabs and newlines silently: the URL checked would not be the one
        # stored and later requested
        raise ValidationError(f"peer url={shown} is invalid: it must not contain spaces "
                              "or control characters")
    if not is_unicode(url):
        raise ValidationError(f"peer url={shown} is invalid: it must be valid Unicode")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:  # a bad port, or a bracketed host that does not close
        rule = "the port must be a number from 1 to 65535" if "port" in str(exc).lower() \
            else f"it is not a URL ({exc})"
        raise ValidationError(f"peer url={shown} is invalid: {rule}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(
            f"peer url={shown} is invalid: must be an http:// or https:// URL with a host"
        )
    if not _host_name_ok(parts.hostname):
        raise ValidationError(
            f"peer url={shown} is invalid: its host name must be at most 253 characters, "
            "in labels of at most 63")
    if port is not None and not 1 <= port <= 65535:
        raise ValidationError(
            f"peer url={shown} is invalid: the port must be a number from 1 to 65535"
        )
    if parts.query or parts.fragment:
        # The request paths are joined onto the URL: a query would swallow them.
        raise ValidationError(
            f"peer url={shown} is invalid: it must not carry a query or fragment "
            "(pass a token with --token)"
        )
    import httpx  # here, not at import: most commands never check a URL

    try:  # what the HTTP client cannot request (an IDNA-invalid host) is refused here too
        httpx.URL(url.strip())
    except httpx.InvalidURL as exc:
        raise ValidationError(f"peer url={shown} is invalid: {exc}") from None
    return url.strip().rstrip("/")


def _host_name_ok(host: str) -> bool:
    """DNS's bounds (RFC 1035): what a resolver would refuse only at the first request."""
    return len(host) <= 253 and all(len(label) <= 63 for label in host.split("."))


SECRET_QUERY_NAMES = ("token", "key", "secret", "password", "passwd", "auth", "sig", "cred")


def redact_url(url: object) -> str:
    """A URL safe to print: userinfo dropped, secret-looking query values masked.

    ``http://user:pass@host:8742/p?token=abc&x=1`` becomes
    ``http://host:8742/p?token=***&x=1``. A query name counts as secret when it contains
    token, key, secret, password, passwd, auth, sig or cred (case-insensitive). Text that
    does not parse is returned with anything before an ``@`` dropped.
    """
    text = str(url)
    try:
        parts = urlsplit(text)
        netloc = parts.netloc.rpartition("@")[2]
        query = "&".join(_mask_pair(pair) for pair in parts.query.split("&")) if parts.query \
            else ""
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return text.rpartition("@")[2]


def _mask_pair(pair: str) -> str:
    name, sep, value = pair.partition("=")
    lowered = name.lower()
    if sep and value and any(word in lowered for word in SECRET_QUERY_NAMES):
        return f"{name}=***"
    return pair


def check_token(token: object, what: str = "token") -> str | None:
    """None for no token; else printable ASCII (spaces inside included: the server
    compares the whole header), since it travels in an HTTP header: a control character
    or a non-ASCII one would fail every request instead of here."""
    if token is None or token == "":
        return None
    if not isinstance(token, str):
        raise ValidationError(f"{what} must be a string")
    if not token.strip():
        raise ValidationError(
            f"{what} is whitespace only: pass a real token or none at all"
        )
    if not all(0x20 <= ord(c) <= 0x7E for c in token):
        raise ValidationError(f"{what} is invalid: a token must be printable ASCII, without "
                              "control characters")
    return token


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 128 \
            or any(ord(c) < 0x20 for c in name) or not is_unicode(name):
        raise ValidationError(
            f"peer name={shorten(name)} is invalid: must be 1-128 printable characters "
            "of valid Unicode"
        )
    return name.strip()


def peers_path(palace: Path) -> Path:
    return Path(palace) / PEERS_FILENAME


def load_peers(palace: Path) -> list[Peer]:
    """The configured peers; a missing file means none, a malformed one is an error."""
    path = peers_path(palace)
    try:
        data = read_json(path)
    except FileNotFoundError:
        return []
    except UnreadableJSON as exc:
        raise ConfigError(str(exc)) from None
    entries = data.get("peers") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ConfigError(f"{path} must be an object with a 'peers' list")
    peers = [_peer_from(entry, path, i) for i, entry in enumerate(entries)]
    first: dict[str, int] = {}
    for index, peer in enumerate(peers):  # state, logs and `peers remove` go by the key
        if first.setdefault(peer.key, index) != index:
            raise ConfigError(
                f"{path}: peers[{first[peer.key]}] and peers[{index}] are both "
                f"{shorten(peer.key)}: each peer needs a name of its own; edit the file to rename "
                "or drop one")
    return peers


def _peer_from(entry: object, path: Path, index: int) -> Peer:
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: peers[{index}] must be an object with a 'url'")
    raw_name = entry.get("name")
    named = f" (peer {shorten(raw_name)})" if isinstance(raw_name, str) and raw_name else ""
    try:
        url = check_url(entry.get("url"))
        name = check_name(raw_name) if raw_name not in (None, "") else None
    except ValidationError as exc:
        raise ConfigError(f"{path}: peers[{index}]: {exc}{named}") from None
    try:
        token = check_token(entry.get("token"), f"peers[{index}].token")
    except ValidationError as exc:
        raise ConfigError(f"{path}: {exc}{named}") from None
    push = entry.get("push", False)
    if not isinstance(push, bool):
        raise ConfigError(f"{path}: peers[{index}].push={shorten(push)} must be true or false")
    try:
        return Peer(url=url, name=name, token=token or None, push=push)
    except ValidationError as exc:
        raise ConfigError(f"{path}: peers[{index}]: {exc}{named}") from None


def save_peers(palace: Path, peers: list[Peer]) -> Path:
    """Atomic, 0600: the file holds bearer tokens."""
    path = peers_path(palace)
    make_private_dir(path.parent)  # 0700 if made here; an existing one keeps its mode
    write_atomic(path, json.dumps({"peers": [p.to_json() for p in peers]}, indent=2) + "\n")
    return path


def add_peer(palace: Path, name: str, url: str, token: str | None, push: bool = False) -> Peer:
    """Add or replace the peer called `name`."""
    peer = Peer(url=check_url(url), name=check_name(name),
                token=check_token(token, "--token"), push=push)
    peers = [p for p in load_peers(palace) if p.key != peer.name and p.url != peer.url]
    save_peers(palace, [*peers, peer])
    return peer


def remove_peer(palace: Path, name_or_url: str) -> Peer:
    peers = load_peers(palace)
    keep = [p for p in peers if name_or_url not in (p.name, p.url)]
    if len(keep) == len(peers):
        raise NotFoundError(f"no peer named {shorten(name_or_url)} in {peers_path(palace)}")
    save_peers(palace, keep)
    return next(p for p in peers if name_or_url in (p.name, p.url))


def file_signature(palace: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of peers.json, so the daemon re-reads it only when it changes."""
    try:
        st = peers_path(palace).stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size
