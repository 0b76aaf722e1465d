"""The error answer (RFC 004 §11): `{"error": CODE, "reason": SENTENCE}`, a
machine-readable code from one table and one human sentence. A client branches on the
status and the code, never on the sentence.

A MemPalace hub answers `{"error": SENTENCE}`, and a server standing in for a hub must
answer its clients in the hub's shape (the sentences are ours). So on the routes upstream defines
(`UPSTREAM_PATHS`) an error keeps upstream's shape unless the request carries
`Logsync-Errors: codes` (every logsync client sends it); every other route always
answers with a code. `reason_of` reads both shapes. Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

# code -> (HTTP status, when it is sent). The one table; RFC 004 §11 prints it.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "bad_request": (400, "a query parameter or request body breaks a rule the reason names"),
    "unauthorized": (401, "the bearer token is missing or wrong"),
    "forbidden": (403, "the request is not allowed here (a push to a replica without a "
                       "token, a non-loopback Host or Origin on a loopback-only server)"),
    "not_found": (404, "no such route, or the artifact or snapshot asked for is not held"),
    "method_not_allowed": (405, "the route exists but not for this method"),
    "timeout": (408, "the request body did not arrive in time"),
    "too_large": (413, "the request body is over its byte or container bound"),
    "unsupported_media_type": (415, "the request body has a content type the route does "
                                    "not take"),
    "internal": (500, "the answer could not be made; the server logged why"),
    "not_implemented": (501, "the server advertises an extension its store cannot serve"),
    "unavailable": (503, "the store cannot be read or written now; retry after Retry-After"),
    "busy": (503, "every slot for this kind of request is taken; retry after Retry-After"),
}

# The request header that asks for coded errors on the upstream routes.
ERRORS_HEADER = "logsync-errors"
ERRORS_CODED = "codes"
UPSTREAM_PATHS = frozenset({"/sync/version_vector", "/sync/ops", "/sync/artifact", "/healthz"})

# the code a status gets where the site names none
_BY_STATUS: dict[int, str] = {}
for _code, (_status, _why) in ERROR_CODES.items():
    _BY_STATUS.setdefault(_status, _code)
del _code, _status, _why


def error_body(status: int, reason: str, code: str | None = None) -> dict[str, str]:
    """The body of an error answer with `status`: `code` if given (it must be in the table
    and carry that status), else the status's first code."""
    if code is None:
        code = _BY_STATUS.get(status, "internal" if status >= 500 else "bad_request")
    elif ERROR_CODES.get(code, (None,))[0] != status:
        raise ValueError(f"error code {code!r} is not sent with status {status}")
    return {"error": code, "reason": reason}


def wants_upstream_shape(path: str, header_value: str | None) -> bool:
    """Whether an error answer to a request for `path` keeps upstream's shape: the header's
    value is a comma-separated list, matched without case or spaces."""
    asked = {token.strip().lower() for token in (header_value or "").split(",")}
    return path in UPSTREAM_PATHS and ERRORS_CODED not in asked


def upstream_shape(body: Any) -> Any:
    """A coded error body as a MemPalace hub words it: `{"error": SENTENCE}`; any other
    body unchanged."""
    if isinstance(body, dict) and set(body) == {"error", "reason"}:
        return {"error": body["reason"]}
    return body


def reason_of(data: Any) -> str:
    """The sentence of a decoded error body of either shape (ours: `reason`; a MemPalace
    hub's: `error`), cut to one line of at most 200 characters; "" if there is none."""
    if not isinstance(data, dict):
        return ""
    text = data.get("reason") if isinstance(data.get("reason"), str) else data.get("error")
    return " ".join(text[:200].split()) if isinstance(text, str) else ""


def code_of(data: Any) -> str | None:
    """The machine code of a decoded error body, or None (a hub's sentence is no code)."""
    if isinstance(data, dict) and isinstance(data.get("reason"), str):
        code = data.get("error")
        return code if isinstance(code, str) and code in ERROR_CODES else None
    return None


def reason_from_bytes(body: bytes | bytearray) -> str:
    """`reason_of` over raw bytes; an error sentence is short, so a large body is never
    decoded here."""
    if len(body) > 64 * 1024:
        return ""
    try:
        return reason_of(json.loads(body))
    except (ValueError, RecursionError):
        return ""
