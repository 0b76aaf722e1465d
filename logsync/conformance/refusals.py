"""What a peer refuses and how (§11 errors, §12 the bearer token), and the two routes a
kit may only open, never read to the end (§7.6 snapshot, §7.7 change stream).

An error answer is `{"error": CODE, "reason": SENTENCE}` with CODE from
`logsync.errorcodes.ERROR_CODES` carrying the answer's status, from a peer that advertises
`logsync`; a peer that does not (a MemPalace hub) answers upstream's `{"error":
SENTENCE}`, and its unknown-route 404 and 401 are the HTML pages of Python's
`http.server`, whose status alone is judged."""

from __future__ import annotations

import secrets
from urllib.parse import urlencode

from logsync.conformance.context import Run, fresh_origin
from logsync.conformance.probe import Reply
from logsync.errorcodes import ERROR_CODES, ERRORS_CODED, ERRORS_HEADER, code_of, reason_of
from logsync.errors import shorten
from logsync.snapshot import SHA256_HEADER, SIZE_HEADER, SNAPSHOT_PATH, SNAPSHOT_TYPE
from logsync.wire import (
    DIGESTS_PATH,
    EXT_CHAIN,
    EXT_PUSH,
    EXT_SNAPSHOT,
    PUSH_PATH,
    parse_digest,
)


# (check, path, params, status): the refusals every peer makes, upstream's included.
def _refusals(origin: str) -> list[tuple[str, str, dict[str, str], int]]:
    return [
        ("negative-after", "/sync/ops", {"origin": origin, "after": "-1"}, 400),
        ("zero-limit", "/sync/ops", {"origin": origin, "limit": "0"}, 400),
        ("missing-origin", "/sync/ops", {"after": "0"}, 400),
        ("bad-origin-label", "/sync/ops", {"origin": "bad\x01origin"}, 400),
        ("missing-artifact-id", "/sync/artifact", {}, 400),
        ("unknown-route", "/sync/nope", {}, 404),
    ]


def shape_problem(reply: Reply, advertised: bool, where: str) -> str | None:
    """Why an error answer's body breaks §11's shape, or None."""
    data = reply.data
    if advertised:
        code = code_of(data)
        if code is None or not reason_of(data):
            return (f"{where} answered {reply.text()}; a peer advertising "
                    "logsync answers {\"error\": CODE, \"reason\": SENTENCE} with CODE from "
                    "the error table")
        if ERROR_CODES[code][0] != reply.status:
            return (f"{where} answered HTTP {reply.status} with code {code!r}, which the "
                    f"error table sends with {ERROR_CODES[code][0]}")
        return None
    if isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"].strip():
        return None
    return (f"{where} answered {reply.text()}; expected upstream's "
            "{\"error\": SENTENCE}")


def check_errors(run: Run) -> None:
    advertised = run.advert is not None
    origin = next(iter(run.origins()), None) or run.vector.replica_id
    for check, path, params, status in _refusals(origin):
        query = urlencode(params)
        where = f"{path}{'?' + query if query else ''}"
        reply = run.probe.get(path, params)
        if reply.status != status:
            run.report.failed("§11", check, f"{where} answered HTTP {reply.status}; expected "
                              f"{status}")
            continue
        if not advertised and path == "/sync/nope":
            run.report.passed("§11", check, "status only: upstream's 404 page is HTML")
            continue
        problem = shape_problem(reply, advertised, where)
        if problem:
            run.report.failed("§11", check, problem)
        else:
            run.report.passed("§11", check, "logsync shape" if advertised else "upstream shape")
    if advertised:
        _upstream_shape_kept(run, origin)
    if run.ext.msgpack:
        reply = run.probe.get("/sync/ops", {"origin": origin, "after": "-1"}, msgpack=True)
        run.tally.check("§8", "msgpack-errors-stay-json", None if reply.ctype ==
                        "application/json" else f"/sync/ops?after=-1 with Accept: "
                        f"application/msgpack answered Content-Type {shorten(reply.ctype)}; "
                        "errors stay JSON")


def _upstream_shape_kept(run: Run, origin: str) -> None:
    """A logsync peer answers a client that did not ask for codes (a hub's client) on an
    upstream route as the hub would: `{"error": SENTENCE}`."""
    where = f"/sync/ops?origin={origin}&after=-1 without {ERRORS_HEADER}: {ERRORS_CODED}"
    reply = run.probe.get("/sync/ops", {"origin": origin, "after": "-1"}, coded=False)
    data = reply.data
    if reply.status != 400:
        problem: str | None = f"{where} answered HTTP {reply.status}; expected 400"
    elif isinstance(data, dict) and set(data) == {"error"} and isinstance(data["error"], str):
        problem = None
    else:
        problem = (f"{where} answered {reply.text()}; a client that did not ask "
                   "for codes gets upstream's {\"error\": SENTENCE} on an upstream route")
    run.tally.check("§11", "upstream-shape-without-codes", problem)


def check_auth(run: Run) -> None:
    """With a token given: no token and a wrong one are both 401 on each route the peer
    serves (§7 rule 2: every route but /healthz): the mandatory three (ops and artifact
    asked of nothing held), the change stream, and each advertised extension's route
    (a snapshot is the whole store; a push writes). Streams are not read."""
    if not run.probe.token:
        run.report.not_applicable("§12", "token-required", "no --token given: an open peer "
                                  "and one that checks tokens look alike")
        return
    advertised = run.advert is not None
    wrong = f"Bearer conformance-wrong-{secrets.token_hex(8)}"
    origin = fresh_origin()
    routes: list[tuple[str, str, dict[str, str]]] = [
        ("GET", "/sync/version_vector", {}),
        ("GET", "/sync/ops", {"origin": origin, "after": "0", "limit": "1"}),
        ("GET", "/sync/artifact", {"id": "art_x"}),
        ("STREAM", "/logstream/stream", {})]
    if run.advertises(EXT_CHAIN):
        routes.append(("GET", DIGESTS_PATH, {"origin": origin, "at": "1"}))
    if run.advertises(EXT_SNAPSHOT):
        routes.append(("STREAM", SNAPSHOT_PATH, {}))
    if run.advertises(EXT_PUSH):
        routes.append(("POST", PUSH_PATH, {}))
    for method, path, params in routes:
        query = urlencode(params)
        for check, auth in (("token-required", None), ("wrong-token-refused", wrong)):
            where = f"{'POST ' if method == 'POST' else ''}{path}" \
                    f"{'?' + query if query else ''} " + (
                        "without a token" if auth is None else "with a wrong token")
            if method == "POST":  # an empty object: the token is checked before the body
                reply = run.probe.post(path, b"{}", auth=auth)
            elif method == "STREAM":
                reply = run.probe.head_only(path, params, auth=auth)
            else:
                reply = run.probe.get(path, params, auth=auth)
            if method == "STREAM" and path == "/logstream/stream" and reply.status == 404:
                continue  # §7: the stream is a SHOULD; a peer without it has nothing to guard
            if reply.status != 401:
                run.tally.bad("§12", check, f"{where} answered HTTP {reply.status}; "
                              "expected 401")
                continue
            challenge = reply.headers.get("www-authenticate", "")
            if advertised:  # a hub's 401 is http.server's HTML page, with no challenge
                run.tally.check("§12", "www-authenticate", None if challenge.lower(
                ).startswith("bearer") else f"{where} answered 401 with WWW-Authenticate "
                    f"{shorten(challenge)}; expected Bearer")
                if method != "STREAM":  # a stream's body is not read
                    run.tally.check("§11", "unauthorized-shape",
                                    shape_problem(reply, True, where))
            run.tally.ok("§12", check)


def check_snapshot(run: Run) -> None:
    """§7.6: a peer advertising `snapshot` answers its route (read no further: a copy of
    the whole store is the joiner's to read)."""
    if not run.advertises(EXT_SNAPSHOT):
        run.report.not_applicable("§7.6", "snapshot-served", "snapshot not advertised")
        return
    reply = run.probe.head_only(SNAPSHOT_PATH)
    sha = reply.headers.get(SHA256_HEADER, "")
    size = reply.headers.get(SIZE_HEADER, "")
    if reply.status != 200:
        problem = (f"{SNAPSHOT_PATH} answered HTTP {reply.status}; the peer advertises "
                   "snapshot, so expected 200")
    elif reply.ctype != SNAPSHOT_TYPE:
        problem = f"{SNAPSHOT_PATH} answered Content-Type {shorten(reply.ctype)}; expected " \
                  f"{SNAPSHOT_TYPE}"
    elif parse_digest(sha) is None or not size.isdigit():
        problem = (f"{SNAPSHOT_PATH} answered {SHA256_HEADER}={shorten(sha)} and "
                   f"{SIZE_HEADER}={shorten(size)}; expected 64 lowercase hex and a "
                   "byte count")
    else:
        problem = None
    run.tally.check("§7.6", "snapshot-served", problem)


def check_stream(run: Run) -> None:
    """§7.7: `/logstream/stream`, where served, opens as an event stream (headers only:
    it never ends). A peer SHOULD serve it; a puller copes without it, so a 404 is n/a."""
    reply = run.probe.head_only("/logstream/stream")
    ctype = reply.ctype
    if reply.status == 404:
        run.report.not_applicable("§7.7", "stream-opens", "no change stream served (404)")
    elif reply.status == 200 and ctype == "text/event-stream":
        run.report.passed("§7.7", "stream-opens")
    else:
        run.report.failed("§7.7", "stream-opens", f"/logstream/stream answered HTTP "
                          f"{reply.status} with Content-Type {shorten(ctype)}; expected 200 "
                          "text/event-stream")
