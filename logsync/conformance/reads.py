"""The upstream read checks: the vector (§3, §6, §7.1, §13), the ops pages (§4, §5, §6,
§7.2) and artifacts (§7.3). Every rule is the puller's own (`wire.parse_vector_answer`,
`wire.parse_page`, `remoteops.validate_remote_event`, `model.validate_remote_artifact`): the
kit only asks the questions a puller does not, and names the section a failure breaks."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlencode

import msgpack

from logsync.conformance.context import (
    MAX_ARTIFACTS,
    MAX_WALK_PAGES,
    WALK_LIMIT,
    Run,
    fresh_origin,
    status_problem,
)
from logsync.errors import PeerProtocolError, ValidationError, shorten
from logsync.model import validate_remote_artifact
from logsync.remoteops import validate_remote_event
from logsync.responder import EXTENSIONS, json_bytes
from logsync.wire import (
    ADVERTISED_MAX_PAGE,
    ADVERTISED_MAX_PAGE_BYTES,
    ADVERTISED_MAX_PUSH_BYTES,
    EXT_LARGE_PAGES,
    EXT_PUSH,
    EXT_SNAPSHOT,
    UPSTREAM_PAGE_LIMIT,
    parse_artifact_answer,
    parse_page,
)
from logsync.zstdcoding import ZSTD

KNOWN_EXTENSIONS = (*EXTENSIONS, EXT_PUSH, EXT_SNAPSHOT)
OPS = "/sync/ops"


def check_vector(run: Run) -> None:
    """§3, §6, §7.1, §8 (the advertisement), §13 from the vector answer parsed by
    `wire.parse_vector_answer` (which refused a bad `replica_id` or a non-object vector:
    the run never got here)."""
    report, vector = run.report, run.vector
    report.passed("§3", "replica-id", f"replica_id {vector.replica_id}")
    report.passed("§7.1", "vector-answer", f"{len(vector.vector)} origins")
    bad_ids = {o: why for o, why in vector.skipped_origins.items() if "replica id" in why}
    bad_counts = {o: why for o, why in vector.skipped_origins.items() if o not in bad_ids}
    if bad_ids:
        origin, why = next(iter(bad_ids.items()))
        report.failed("§3", "vector-origin-ids", f"version_vector key {shorten(origin)}: {why}")
    else:
        report.passed("§3", "vector-origin-ids")
    if bad_counts:
        origin, why = next(iter(bad_counts.items()))
        report.failed("§6", "vector-entries", f"version_vector[{origin}]: {why}")
    else:
        report.passed("§6", "vector-entries")
    _check_advertisement(run)


def _check_advertisement(run: Run) -> None:
    report, advert = run.report, run.advert
    if advert is None:
        if "logsync" in run.answer:
            report.failed("§8", "advertisement", f"'logsync' is {shorten(run.answer['logsync'])}"
                          ", not an object")
        else:
            report.not_applicable("§8", "advertisement", "no 'logsync' advertisement (an "
                                  "upstream hub: no extensions)")
        report.not_applicable("§13", "version", "no 'logsync' advertisement")
        return
    version = advert.get("version")
    if isinstance(version, str) and version.strip():
        report.passed("§13", "version", f"version {shorten(version)}")
    else:
        report.failed("§13", "version", f"logsync.version={shorten(version)} must be a "
                      "non-empty string")
    names = advert.get("extensions")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        report.failed("§8", "advertisement", f"logsync.extensions={shorten(names)} must be "
                      "a list of extension names")
        return
    problems = []
    for key, needed in ((ADVERTISED_MAX_PAGE, EXT_LARGE_PAGES in names),
                        (ADVERTISED_MAX_PAGE_BYTES, EXT_LARGE_PAGES in names),
                        (ADVERTISED_MAX_PUSH_BYTES, EXT_PUSH in names)):
        value = advert.get(key)
        if (needed or value is not None) and not (type(value) is int and value > 0):
            problems.append(f"logsync.{key}={shorten(value)} must be a positive integer")
    max_page = advert.get(ADVERTISED_MAX_PAGE)
    if type(max_page) is int and 0 < max_page < UPSTREAM_PAGE_LIMIT:
        problems.append(f"logsync.max_page={max_page} must be at least {UPSTREAM_PAGE_LIMIT}")
    if problems:
        report.failed("§8", "advertisement", "; ".join(problems))
        return
    unknown = [n for n in names if n not in KNOWN_EXTENSIONS]
    note = f"extensions {', '.join(names) or 'none'}"
    if unknown:  # a newer peer's names are not a fault: a puller ignores them (§8)
        note += f" ({len(unknown)} this kit does not know: {shorten(', '.join(unknown))})"
    report.passed("§8", "advertisement", note)


# ── §7.2 ops ──────────────────────────────────────────────────────────


def ops(run: Run, origin: str, after: int, limit: int, **extra: Any) -> Any:
    """One `/sync/ops` page (params as the wire writes them)."""
    params = {"origin": origin, "after": after, "limit": limit}
    msgpack, zstd = extra.pop("msgpack", False), extra.pop("zstd", False)
    params.update(extra)
    return run.probe.get(OPS, params, msgpack=msgpack, zstd=zstd)


def check_page(run: Run, reply: Any, origin: str, after: int, limit: int, check: str,
               where: str | None = None, **asked: bool) -> list[dict[str, Any]] | None:
    """The page's events when `wire.parse_page` takes it and its `count` and `origin` are
    its own; else None, the problem tallied under §7.2 `check`."""
    where = where or f"/sync/ops?origin={origin}&after={after}&limit={limit}"
    problem = status_problem(reply, where)
    if problem is None:
        try:
            page = parse_page(reply.data, run.label, origin, after, limit, **asked)
        except PeerProtocolError as exc:
            problem = str(exc).removesuffix("; nothing of it was stored")
        else:
            count, named = reply.data.get("count"), reply.data.get("origin")
            if count != len(page.events):
                problem = f"{where} has count={shorten(count)} for {len(page.events)} events"
            elif named != origin:
                problem = f"{where} names origin={shorten(named)}"
    run.tally.check("§7.2", check, problem)
    return None if problem else page.events


def walk(run: Run, origin: str) -> None:
    """Pull `origin` from after=0 in pages of `WALK_LIMIT` (bounded), checking each page
    (§7.2), each op (§4) and the HLC order (§5); whether it reached the vector's entry
    exactly is §6."""
    top = run.vector.vector[origin]
    events: list[dict[str, Any]] = []
    after, reached = 0, False
    for _ in range(MAX_WALK_PAGES):
        page = check_page(run, ops(run, origin, after, WALK_LIMIT), origin, after, WALK_LIMIT,
                          "page-order-and-after")
        if page is None:
            run.broken.add(origin)
            break
        events.extend(page)
        if not page or page[-1]["origin_seq"] >= top:
            reached = True
            break
        after = page[-1]["origin_seq"]
    run.walked[origin] = events
    run.complete[origin] = reached
    for event in events:
        try:
            validate_remote_event(event)
        except ValidationError as exc:
            run.tally.bad("§4", "event-valid", f"op {event.get('origin_seq')} of {origin}: {exc}")
            run.broken.add(origin)  # later checks compute over valid ops only
        else:
            run.tally.ok("§4", "event-valid")
    for before, event in zip(events, events[1:], strict=False):
        run.tally.check("§5", "hlc-rises-with-origin-seq", None if str(event.get("hlc")) > str(
            before.get("hlc")) else f"op {event['origin_seq']} of {origin} has hlc "
            f"{shorten(event.get('hlc'))}, not above op {before['origin_seq']}'s "
            f"{shorten(before.get('hlc'))}")
    if reached:
        last = events[-1]["origin_seq"] if events else 0
        run.tally.check("§6", "walk-reaches-vector", None if last == top or (
            last > top and grew(run, origin, last)) else
                        f"walking origin {origin} from after=0 ended at origin_seq {last}; its "
                        f"version_vector entry is {top}")


def grew(run: Run, origin: str, seq: int) -> bool:
    """Whether the peer now holds `origin` up to `seq` (its vector read again): a peer
    written to while the kit runs serves ops above the vector read at the start."""
    reply = run.probe.get("/sync/version_vector")
    vector = reply.data.get("version_vector") if isinstance(reply.data, dict) else None
    now = vector.get(origin) if isinstance(vector, dict) else None
    return reply.status == 200 and type(now) is int and now >= seq


def check_ops(run: Run) -> None:
    """Every §7.2 rule over the walked origins (the walks first)."""
    origins = run.origins()
    for origin in origins:
        walk(run, origin)
    _unknown_origin(run)
    _defaults(run)
    if not origins:
        for section, check in (("§7.2", "page-order-and-after"), ("§4", "event-valid"),
                               ("§5", "hlc-rises-with-origin-seq"),
                               ("§6", "walk-reaches-vector"), ("§6", "vector-top-held")):
            run.report.not_applicable(section, check, "the peer holds no ops")
        return
    for origin in origins:
        _offsets(run, origin)
        _top_held(run, origin)
    _upstream_cap(run, origins[0])
    _msgpack_same(run, run.sound()[:1])
    _zstd_same(run, run.sound()[:1])


def _offsets(run: Run, origin: str) -> None:
    """`after=k` starts at the first op above k (k = 0 and one in the middle), and
    `after=<vector entry>` is an empty page."""
    seqs = [e["origin_seq"] for e in run.walked.get(origin, [])]
    top = run.vector.vector[origin]
    probes = [0] + ([seqs[len(seqs) // 2 - 1]] if len(seqs) >= 2 else [])
    for k in probes:
        following = [s for s in seqs if s > k][:1]
        page = check_page(run, ops(run, origin, k, 2), origin, k, 2, "after-offset")
        if page is None or not following:
            continue
        first = page[0]["origin_seq"] if page else None
        run.tally.check("§7.2", "after-offset", None if first == following[0] else
                        f"/sync/ops?origin={origin}&after={k} starts at origin_seq "
                        f"{shorten(first)}; the first op above {k} is {following[0]}")
    page = check_page(run, ops(run, origin, top, 2), origin, top, 2, "empty-above-top")
    if page and not grew(run, origin, page[-1]["origin_seq"]):
        run.tally.bad("§7.2", "empty-above-top", f"/sync/ops?origin={origin}&after={top} (its "
                      f"version_vector entry) served {len(page)} ops; expected none")


def _unknown_origin(run: Run) -> None:
    """An origin the peer does not hold is an empty 200 page, whatever its vector (asked
    of every peer: one holding no ops is otherwise never asked a valid question)."""
    origin = fresh_origin()
    where = f"/sync/ops?origin={origin}&after=0&limit=2 (an origin held nowhere)"
    page = check_page(run, ops(run, origin, 0, 2), origin, 0, 2, "unknown-origin-empty", where)
    if page:
        run.tally.bad("§7.2", "unknown-origin-empty", f"{where} served {len(page)} ops; "
                      "expected an empty page")


def _defaults(run: Run) -> None:
    """`after` defaults to 0 and `limit` to 500, also when given empty: both questions get
    the walk's first page of 500 (an origin held nowhere: an empty page)."""
    sound = run.sound()
    if run.origins() and not sound:
        run.report.not_applicable("§7.2", "defaults", "no origin's walk passed to compare with")
        return
    origin = sound[0] if sound else fresh_origin()
    want = [e["origin_seq"] for e in run.walked.get(origin, [])[:UPSTREAM_PAGE_LIMIT]]
    for params in ({"origin": origin}, {"origin": origin, "after": "", "limit": ""}):
        where = f"{OPS}?{urlencode(params)}"
        page = check_page(run, run.probe.get(OPS, params), origin, 0, UPSTREAM_PAGE_LIMIT,
                          "defaults", where)
        if page is None:
            continue
        got = [e["origin_seq"] for e in page]
        longer = len(got) > len(want) and (not run.complete.get(origin, True) or grew(
            run, origin, got[-1]))  # a walk cut short, or a peer written to meanwhile
        run.tally.check("§7.2", "defaults", None if got[:len(want)] == want and (
            len(got) == len(want) or longer) else
            f"{where} served {len(got)} ops starting at origin_seq "
            f"{got[0] if got else None}; expected {len(want)} starting at "
            f"{want[0] if want else None} (after defaults to 0, limit to "
            f"{UPSTREAM_PAGE_LIMIT})")


def _top_held(run: Run, origin: str) -> None:
    """§6: the vector's entry is the greatest origin_seq held, so `after=<entry - 1>`
    serves that very op (the walk is bounded; this reaches any origin's top)."""
    top = run.vector.vector[origin]
    page = check_page(run, ops(run, origin, top - 1, 1), origin, top - 1, 1, "after-offset")
    if page is None:
        return
    first = page[0]["origin_seq"] if page else None
    run.tally.check("§6", "vector-top-held", None if first == top else
                    f"/sync/ops?origin={origin}&after={top - 1}&limit=1 served "
                    f"{f'origin_seq {first}' if page else 'no op'}; its version_vector "
                    f"entry is {top}, so op {top} must be held")


def _upstream_cap(run: Run, origin: str) -> None:
    """Without `large_pages` a page holds at most 500 ops whatever `limit` asks."""
    asked = 4 * UPSTREAM_PAGE_LIMIT
    page = check_page(run, ops(run, origin, 0, asked), origin, 0, UPSTREAM_PAGE_LIMIT,
                      "upstream-page-cap")
    walked = run.walked.get(origin, [])
    if page is None or not (run.complete.get(origin) or len(walked) >= UPSTREAM_PAGE_LIMIT):
        return
    want = min(UPSTREAM_PAGE_LIMIT, len(walked))
    grown = want < len(page) <= UPSTREAM_PAGE_LIMIT and grew(run, origin, page[-1]["origin_seq"])
    run.tally.check("§7.2", "upstream-page-cap", None if len(page) == want or grown else
                    f"/sync/ops?origin={origin}&limit={asked} served {len(page)} ops; expected "
                    f"{want} (the ops there are, up to the cap of {UPSTREAM_PAGE_LIMIT} without "
                    "large_pages)")


def _msgpack_same(run: Run, sound: list[str]) -> None:
    """With `msgpack` advertised, the msgpack answer is the JSON answer's object."""
    if not run.ext.msgpack:
        run.report.not_applicable("§8", "msgpack-same-events", "msgpack not advertised")
        return
    if not sound:
        return
    origin = sound[0]
    reply = ops(run, origin, 0, WALK_LIMIT, msgpack=True)
    events = check_page(run, reply, origin, 0, WALK_LIMIT, "page-order-and-after")
    if events is None:
        return
    expected = run.walked[origin][:len(events)]
    if reply.ctype not in ("application/msgpack", "application/x-msgpack"):
        if reply.ctype == "application/json" and not _packable(events):
            run.tally.ok("§8", "msgpack-same-events")  # §8 item 3: the JSON fallback
            return
        run.tally.bad("§8", "msgpack-same-events", f"/sync/ops with Accept: application/msgpack"
                      f" answered Content-Type {shorten(reply.ctype)} for a page msgpack can "
                      "encode")
    elif json_bytes(events) != json_bytes(expected) or \
            len(events) != min(WALK_LIMIT, len(run.walked[origin])):  # bytes: 1 == True
        run.tally.bad("§8", "msgpack-same-events", f"the msgpack page of origin {origin} "
                      "decodes to other events than the JSON page")
    else:
        run.tally.ok("§8", "msgpack-same-events")


def _zstd_same(run: Run, sound: list[str]) -> None:
    """RFC 004 D5: a page asked for with `Accept-Encoding: zstd` is, once decoded, the
    plain answer's bytes. Coding is a MAY: a server that answers plain (a MemPalace hub)
    leaves the check not applicable."""
    if not sound:
        return
    origin = sound[0]
    where = f"/sync/ops?origin={origin}&limit={WALK_LIMIT} asked with Accept-Encoding: zstd"
    coded = ops(run, origin, 0, WALK_LIMIT, zstd=True)
    plain = ops(run, origin, 0, WALK_LIMIT)
    if status_problem(coded, where) is not None or status_problem(plain, where) is not None:
        return  # the plain page's own checks say what is wrong with it
    if coded.headers.get("content-encoding", "").strip().lower() != ZSTD:
        run.report.not_applicable("§7.2", "zstd-same-bytes", "the peer answered plain "
                                  "(coding a page is a MAY, D5)")
        return
    same = coded.body == plain.body
    if not same and isinstance(coded.data, dict) and isinstance(plain.data, dict):
        ours, theirs = coded.data.get("events"), plain.data.get("events")
        same = isinstance(ours, list) and isinstance(theirs, list) and \
            len(theirs) > len(ours) and theirs[:len(ours)] == ours  # the origin grew between
    run.tally.check("§7.2", "zstd-same-bytes", None if same else
                    f"{where} decodes to other bytes than the same page asked plain")


def _packable(events: list[Any]) -> bool:
    """Whether msgpack can encode the page (not an integer beyond 64 bits, say): only
    then must a peer that advertises msgpack answer in it."""
    try:
        msgpack.packb(events)
    except (OverflowError, TypeError, ValueError):
        return False
    return True


# ── §7.3 artifacts ────────────────────────────────────────────────────


def check_artifacts(run: Run) -> None:
    """Each artifact the walked ops name (bounded) is served with content matching its
    sha256; an id nobody holds is 404."""
    named = sorted({a for events in run.walked.values() for e in events
                    for a in e.get("artifact_ids") or [] if isinstance(a, str)})
    for artifact_id in named[:MAX_ARTIFACTS]:
        reply = run.probe.get("/sync/artifact", {"id": artifact_id})
        problem = status_problem(reply, f"/sync/artifact?id={artifact_id}")
        if problem is None:
            try:
                artifact = parse_artifact_answer(reply.data, run.label, artifact_id)
                assert artifact is not None
                checked = validate_remote_artifact(artifact)
            except (PeerProtocolError, ValidationError) as exc:
                problem = str(exc)
            else:
                run.artifacts[artifact_id] = checked["sha256"]
        run.tally.check("§7.3", "artifact-sha256", problem)
    if not named:
        run.report.not_applicable("§7.3", "artifact-sha256", "no walked op names an artifact")
    absent = f"art_conformance_absent_{secrets.token_hex(6)}"
    reply = run.probe.get("/sync/artifact", {"id": absent})
    run.tally.check("§7.3", "absent-artifact-404", None if reply.status == 404 else
                    f"/sync/artifact?id={absent} (held nowhere) answered HTTP {reply.status}; "
                    "expected 404")
