"""A corpus of hostile peer answers, one mode per finding of issue 8 a peer can cause.

Pure: no sockets, no clocks, no files. `tests/hostile/` serves these answers from
a real HTTP server on loopback to a real `logsync serve`; the simulator's
byzantine fault (`logsync.sim.serve.tamper`) throws the page-level ones at the
real engine and store through `tamper_page` and `tamper_vector`.

A `Scene` is one hostile peer: its replica id, the valid ops it holds (a GOOD
origin it serves honestly in every mode, so a test can check that the good origin
converged despite the bad one, plus whatever the mode needs) and the mode. Its
`answer(path, params)` returns an `Answer`: a status, headers and either a body
(a dict, sent as JSON, or bytes) or a `Stream` -- a description of what only a
real socket can do (drip one byte every 20 s, 400 MB without a newline, a 60 MB
decoding bomb, a connection reset) that the test server turns into a response.

Valid ops are generated the way a real store writes them (`logsync.model`):
ids `evt_YYYYmmddTHHMMSS_<12 hex>`, HLC `<13-digit ms>-<6 hex>-<origin>`,
`created_at` `YYYY-MM-DDTHH:MM:SSZ`, keys in `model.EVENT_KEYS` order.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from logsync.model import EVENT_KEYS

# 2026-07-02T03:24:43Z, the RFC's example instant (the past: never beyond the drift bound).
T0_MS = 1_782_962_683_000
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01
MAX_SEQ = 2**62  # the largest origin_seq a store may hold

PEER_ID = "rep_" + "e" * 32
GOOD_ORIGIN = "rep_" + "f" * 32  # sorts after every bad origin
BAD_ORIGIN = "rep_" + "0" * 31 + "b"  # sorts before the good origin
GOOD_COUNT = 12

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
JSON = (("content-type", "application/json"),)
MSGPACK = (("content-type", "application/msgpack"),)
SSE = (("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"))

ADVERTISEMENT = {
    "version": 1,
    "extensions": ["msgpack", "large_pages", "inline_artifacts", "notify"],
    "max_page": 5000,
}
UPSTREAM_PAGE = 500


# ── valid ops, as real stores write them ─────────────────────────────


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_event(origin: str, seq: int, *, ms: int | None = None, counter: int = 0,
               body: str | None = None, metadata: Mapping[str, Any] | None = None,
               **over: Any) -> dict[str, Any]:
    """One valid op of `origin` at `origin_seq` = `seq`, keys in EVENT_KEYS order."""
    stamp_ms = T0_MS + min(seq, 10**6) * 1000 if ms is None else ms
    when = datetime.fromtimestamp(stamp_ms / 1000, UTC)
    tag = hashlib.sha256(f"{origin}:{seq}:{stamp_ms}".encode()).hexdigest()[:12]
    event: dict[str, Any] = {
        "id": f"evt_{when:%Y%m%dT%H%M%S}_{tag}",
        "seq": seq,
        "origin_replica": origin,
        "origin_seq": seq,
        "hlc": f"{stamp_ms:013d}-{counter:06x}-{origin}",
        "type": "task.note",
        "stream": "hostile",
        "room": "general",
        "topic": None,
        "from_agent": f"agent@{origin[-6:]}",
        "to_agent": None,
        "correlation_id": None,
        "branch": None,
        "base_commit": None,
        "status": None,
        "artifact_ids": [],
        "body": f"op {seq} of {origin}" if body is None else body,
        "created_at": iso(stamp_ms),
        "metadata": {"n": seq} if metadata is None else dict(metadata),
    }
    event.update(over)
    return {k: event[k] for k in EVENT_KEYS} | {k: v for k, v in event.items()
                                                 if k not in EVENT_KEYS}


def chain(origin: str, count: int, start: int = 1, **over: Any) -> list[dict[str, Any]]:
    return [make_event(origin, s, **over) for s in range(start, start + count)]


def bad_origin(index: int) -> str:
    """A distinct bad origin per index, sorting before GOOD_ORIGIN."""
    return f"rep_{index + 1:032x}"


def nested(depth: int) -> dict[str, Any]:
    """{"a": {"a": ... {}}} nested `depth` objects deep (built without recursion)."""
    inner: dict[str, Any] = {}
    for _ in range(depth - 1):
        inner = {"a": inner}
    return inner


# ── op and page mutations (shared with the simulator) ────────────────


def overflow_seq(op: dict[str, Any], seq: int = 2**63) -> dict[str, Any]:
    """Finding 1: origin_seq >= 2**63 (beyond SQLite's INTEGER)."""
    return dict(op, origin_seq=seq)


def deep_metadata(op: dict[str, Any], depth: int = 990) -> dict[str, Any]:
    """Finding 2: metadata nested ~990 deep (RecursionError in encoders)."""
    return dict(op, metadata=nested(depth))


def newline_type(op: dict[str, Any]) -> dict[str, Any]:
    """Finding 6: a type ending in a newline (`$` matches before a final `\\n`)."""
    return dict(op, type=op["type"] + "\n")


def newline_id(op: dict[str, Any]) -> dict[str, Any]:
    return dict(op, id=op["id"] + "\n")


def arabic_hlc(op: dict[str, Any]) -> dict[str, Any]:
    """Finding 6: an HLC whose ms digits are Arabic-Indic (`\\d` matches them)."""
    ms, rest = op["hlc"].split("-", 1)
    return dict(op, hlc=ms.translate(ARABIC_INDIC) + "-" + rest)


def arabic_created_at(op: dict[str, Any]) -> dict[str, Any]:
    return dict(op, created_at=op["created_at"].translate(ARABIC_INDIC))


def numeric_twin(value: Any) -> Any:
    """The same decoded value, other bytes: 1 -> true, 0 -> -0.0, n -> n.0 (finding 13)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if value == 1:
            return True
        if value == 0:
            return -0.0
        return float(value)
    if isinstance(value, dict):
        return {k: numeric_twin(v) for k, v in value.items()}
    if isinstance(value, list):
        return [numeric_twin(v) for v in value]
    return value


def has_number(value: Any) -> bool:
    if isinstance(value, int | float):
        return True
    if isinstance(value, dict):
        return any(has_number(v) for v in value.values())
    if isinstance(value, list):
        return any(has_number(v) for v in value)
    return False


def forged_own(origin: str, seq: int, *, ms: int = FAR_FUTURE_MS) -> dict[str, Any]:
    """Finding 12/14: an op under the victim's own origin, far-future HLC."""
    return make_event(origin, seq, ms=ms, body=f"forged op {seq} under {origin}")


OP_MUTATIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "deep_metadata": deep_metadata,
    "newline_type": newline_type,
    "newline_id": newline_id,
    "arabic_hlc": arabic_hlc,
    "arabic_created_at": arabic_created_at,
}

BAD_PAGE_SEQ_VARIANTS = ("seq_zero", "seq_negative", "seq_float", "seq_bool", "seq_string",
                         "backwards", "status_500", "reset")
PAGE_SEQ_VALUES: dict[str, Any] = {
    "seq_zero": 0, "seq_negative": -1, "seq_float": 1.5, "seq_bool": True, "seq_string": "1",
}


def bad_page(variant: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finding 8, page level: a page no receiver may apply (seq 0/neg/float/bool/str,
    backwards). `events` is an honest page (not altered)."""
    out = [dict(e) for e in events]
    if variant == "backwards":
        if len(out) < 2:
            out.append(dict(out[0], origin_seq=max(0, out[0]["origin_seq"] - 1)))
        return list(reversed(out)) if len(out) > 1 else out
    out[0]["origin_seq"] = PAGE_SEQ_VALUES[variant]
    return out


# ── the simulator's byzantine kinds ──────────────────────────────────

# Each alters an honest 200 answer in place and says what it did (None: not applicable).
SIM_KINDS = ("seq_overflow", "deep_metadata", "newline_fields", "arabic_digits",
             "bad_page_seq", "numeric_fork", "forged_own_far_future", "vector_overflow")
# Kinds that (also) alter `/sync/version_vector` answers (`tamper_vector`).
VECTOR_KINDS = ("forged_own_far_future", "vector_overflow")


def tamper_page(kind: str, body: dict[str, Any], params: Mapping[str, Any],
                rng: random.Random, requester: str) -> str | None:
    """One hostile alteration of an honest `/sync/ops` page (the simulator's byzantine
    fault). Never one a receiver cannot catch, except `numeric_fork`, which is only
    served to the op's own origin (who holds it and must record the conflict)."""
    events: list[dict[str, Any]] = body.get("events") or []
    origin = str(params.get("origin") or "")
    if kind == "forged_own_far_future":
        if origin != requester:
            return None
        top = max([e["origin_seq"] for e in events] or [0])
        events.append(forged_own(requester, top + 1))
        events.append(forged_own(requester, top + 2**40))
        body["count"] = len(events)
        return f"forged_own_far_future {requester} seq={top + 1},{top + 2**40}"
    if not events:
        return None
    if kind == "seq_overflow":
        events[-1] = overflow_seq(events[-1], rng.choice([2**63, 2**64 - 1, 2**62 + 1]))
        return f"seq_overflow {events[-1]['id']} origin_seq={events[-1]['origin_seq']}"
    if kind == "bad_page_seq":
        variant = rng.choice([v for v in BAD_PAGE_SEQ_VARIANTS if v in PAGE_SEQ_VALUES
                              or v == "backwards"])
        if variant == "backwards" and len(events) < 2:
            variant = "seq_zero"
        body["events"] = bad_page(variant, events)
        return f"bad_page_seq {variant} origin={origin}"
    if kind == "numeric_fork":
        if origin != requester:
            return None
        for index, event in enumerate(events):
            if has_number(event.get("metadata")):
                events[index] = dict(event, metadata=numeric_twin(event["metadata"]))
                return f"numeric_fork {event['id']} metadata={event['metadata']!r}"
        return None
    index = rng.randrange(len(events))
    if kind == "deep_metadata":
        events[index] = deep_metadata(events[index])
        return f"deep_metadata {events[index]['id']}"
    if kind == "newline_fields":
        name = rng.choice(["newline_type", "newline_id"])
        events[index] = OP_MUTATIONS[name](events[index])
        return f"{name} {events[index]['id']!r}"
    if kind == "arabic_digits":
        name = rng.choice(["arabic_hlc", "arabic_created_at"])
        events[index] = OP_MUTATIONS[name](events[index])
        return f"{name} {events[index]['id']}"
    return None


def tamper_vector(kind: str, body: dict[str, Any], rng: random.Random,
                  requester: str) -> str | None:
    """One hostile alteration of an honest `/sync/version_vector` answer."""
    vector = body.get("version_vector")
    if not isinstance(vector, dict):
        return None
    if kind == "vector_overflow" and vector:
        origin = rng.choice(sorted(vector))
        vector[origin] = rng.choice([2**64 - 1, 2**63, 2**62])
        return f"vector_overflow {origin}={vector[origin]}"
    if kind == "forged_own_far_future":
        vector[requester] = max(int(vector.get(requester, 0)), 0) + 2**40
        return f"forged_own_far_future vector[{requester}]={vector[requester]}"
    return None


# ── answers and streams ──────────────────────────────────────────────


@dataclass(frozen=True)
class Stream:
    """A response only a real socket can give; the test server performs it.

    kinds: `drip` (declared `length`, one byte of `fill` every `interval` s),
    `bytes` (`length` bytes: `prefix` then `fill` repeated, in `chunk`-byte writes,
    then `suffix`), `reset` (close with RST before any answer), `sse` (`frames`, and
    any the scene adds later, then pings every `interval` s until the client leaves).
    """

    kind: str
    length: int = 0
    fill: bytes = b""
    prefix: bytes = b""
    suffix: bytes = b""
    chunk: int = 1 << 20
    interval: float = 0.0
    frames: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: tuple[tuple[str, str], ...] = JSON
    body: Any = None  # dict/list (JSON, or msgpack when asked), bytes, or a Stream

    def encoded(self, msgpack: bool = False) -> tuple[tuple[tuple[str, str], ...], bytes]:
        """(headers, bytes). A 200 object goes out as msgpack when the request asked
        for it (as a logsync server does) unless an integer does not fit in 64 bits."""
        if isinstance(self.body, bytes):
            return self.headers, self.body
        if msgpack and self.status == 200 and self.headers == JSON:
            try:
                return MSGPACK, to_msgpack(self.body)
            except OverflowError:
                pass
        return self.headers, to_json(self.body)


# Encoders without a depth limit: a hostile answer may nest deeper than the stdlib
# encoders (or msgpack's 511) allow, and must still reach the victim intact.


class _Literal(str):
    """Text already encoded (punctuation) on the JSON encoder's stack."""


def to_json(value: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass")
    except RecursionError:
        pass
    parts: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Literal):
            parts.append(str(item))
        elif isinstance(item, dict):
            parts.append("{")
            stack.append(_Literal("}"))
            pairs = list(item.items())
            for index in range(len(pairs) - 1, -1, -1):
                key, val = pairs[index]
                stack.append(val)
                stack.append(_Literal(json.dumps(str(key), ensure_ascii=False) + ":"))
                if index:
                    stack.append(_Literal(","))
        elif isinstance(item, list | tuple):
            parts.append("[")
            stack.append(_Literal("]"))
            for index in range(len(item) - 1, -1, -1):
                stack.append(item[index])
                if index:
                    stack.append(_Literal(","))
        else:
            parts.append(json.dumps(item, ensure_ascii=False))
    return "".join(parts).encode("utf-8", "surrogatepass")


def to_msgpack(value: Any) -> bytes:
    """msgpack of JSON-shaped values, any depth; OverflowError past 64-bit integers."""
    out = bytearray()
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if item is None:
            out += b"\xc0"
        elif item is True or item is False:
            out += b"\xc3" if item else b"\xc2"
        elif isinstance(item, int):
            out += _msgpack_int(item)
        elif isinstance(item, float):
            out += b"\xcb" + struct.pack(">d", item)
        elif isinstance(item, str):
            raw = item.encode("utf-8", "surrogatepass")
            out += _msgpack_head(len(raw), 0xA0, 32, b"\xd9", b"\xda", b"\xdb") + raw
        elif isinstance(item, list | tuple):
            out += _msgpack_head(len(item), 0x90, 16, None, b"\xdc", b"\xdd")
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            out += _msgpack_head(len(item), 0x80, 16, None, b"\xde", b"\xdf")
            for key, val in reversed(list(item.items())):
                stack.append(val)
                stack.append(str(key))
        else:
            raise TypeError(f"cannot encode {type(item).__name__} as msgpack")
    return bytes(out)


def _msgpack_int(n: int) -> bytes:
    if 0 <= n < 128:
        return bytes([n])
    if -32 <= n < 0:
        return struct.pack(">b", n)
    if 0 <= n < 2**64:
        return b"\xcf" + struct.pack(">Q", n)
    if -(2**63) <= n < 0:
        return b"\xd3" + struct.pack(">q", n)
    raise OverflowError(f"{n} does not fit in msgpack's 64-bit integers")


def _msgpack_head(n: int, fix: int, fix_limit: int, one: bytes | None, two: bytes,
                  four: bytes) -> bytes:
    if n < fix_limit:
        return bytes([fix | n])
    if one is not None and n < 256:
        return one + bytes([n])
    if n < 65536:
        return two + struct.pack(">H", n)
    return four + struct.pack(">I", n)


def sse_frame(event: Mapping[str, Any]) -> bytes:
    return (f"id: {event.get('id')}\nevent: logstream\n"
            f"data: {json.dumps(event, ensure_ascii=False)}\n\n").encode()


# ── one hostile peer ─────────────────────────────────────────────────


@dataclass
class Scene:
    """One hostile peer: the ops it holds honestly, and the mode that bends its answers.

    `victims`: replica ids the forged modes aim at (the puller's own origin).
    `held`: origin -> valid ops, honest; `mode` bends answers through MODES[mode].
    """

    mode: str = "honest"
    victims: tuple[str, ...] = ()
    replica_id: str = PEER_ID
    held: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    vector_extra: dict[str, int] = field(default_factory=dict)
    stream_frames: list[bytes] = field(default_factory=list)  # SSE frames, appendable
    own_held: dict[str, int] = field(default_factory=dict)  # victim -> own ops it holds

    @classmethod
    def build(cls, mode: str, victims: tuple[str, ...] = ()) -> Scene:
        if mode not in MODES:
            raise KeyError(f"unknown hostile mode {mode!r}; modes: {', '.join(MODES)}")
        scene = cls(mode=mode, victims=victims)
        scene.held[GOOD_ORIGIN] = chain(GOOD_ORIGIN, GOOD_COUNT)
        SETUP.get(mode, _no_setup)(scene)
        return scene

    # honest answers

    def vector(self) -> dict[str, int]:
        out = {o: (ops[-1]["origin_seq"] if ops else 0) for o, ops in sorted(self.held.items())}
        out.update(self.vector_extra)
        return out

    def honest(self, path: str, params: Mapping[str, Any]) -> Answer:
        if path == "/sync/version_vector":
            return Answer(200, JSON, {"replica_id": self.replica_id,
                                      "version_vector": self.vector(),
                                      "logsync": dict(ADVERTISEMENT)})
        if path == "/sync/ops":
            origin = str(params.get("origin") or "")
            try:
                after = int(params.get("after", 0))
                limit = int(params.get("limit", UPSTREAM_PAGE))
            except (TypeError, ValueError):
                return Answer(400, JSON, {"error": "after and limit must be integers"})
            cap = ADVERTISEMENT["max_page"] if "large_pages" in str(params.get("ext", "")) \
                else UPSTREAM_PAGE
            ops = [e for e in self.held.get(origin, []) if e["origin_seq"] > after]
            page = ops[: max(1, min(limit, cap))]
            body: dict[str, Any] = {"origin": origin, "events": page, "count": len(page)}
            if "inline_artifacts" in str(params.get("ext", "")):
                body["artifacts"] = []
            return Answer(200, JSON, body)
        if path == "/sync/artifact":
            return Answer(404, JSON, {"error": "no such artifact"})
        if path == "/logstream/stream":
            return Answer(200, SSE, Stream("sse", frames=tuple(self.stream_frames), interval=15.0))
        if path == "/healthz":
            return Answer(200, (("content-type", "text/plain"),), b"ok\n")
        return Answer(404, JSON, {"error": f"no route {path}"})

    def answer(self, path: str, params: Mapping[str, Any]) -> Answer:
        honest = self.honest(path, params)
        return MODES[self.mode](self, path, dict(params), honest)


def _no_setup(scene: Scene) -> None:
    return None


def _is_ops(path: str, params: Mapping[str, Any], origin: str) -> bool:
    return path == "/sync/ops" and params.get("origin") == origin


def _page(honest: Answer, events: list[dict[str, Any]]) -> Answer:
    body = dict(honest.body, events=events, count=len(events))
    return Answer(200, JSON, body)


# ── the modes: (scene, path, params, honest answer) -> hostile answer ─


def honest_mode(scene: Scene, path: str, params: dict[str, Any], honest: Answer) -> Answer:
    return honest


OVERFLOW_ORIGIN = bad_origin(1)  # an ordinary vector entry, a page ending at 2**63


def _setup_seq_overflow(scene: Scene) -> None:
    scene.held[BAD_ORIGIN] = chain(BAD_ORIGIN, 3)
    scene.vector_extra[BAD_ORIGIN] = 2**64 - 1
    scene.held[OVERFLOW_ORIGIN] = chain(OVERFLOW_ORIGIN, 3)
    scene.vector_extra[OVERFLOW_ORIGIN] = 4


def seq_overflow_mode(scene: Scene, path: str, params: dict[str, Any], honest: Answer) -> Answer:
    """Finding 1: BAD_ORIGIN has the vector entry 2**64-1 (a receiver may refuse it at the
    vector); OVERFLOW_ORIGIN has an ordinary entry and its page ends with an op at
    origin_seq 2**63 (only the op validator or the store can refuse that)."""
    origin = params.get("origin")
    if path == "/sync/ops" and origin in (BAD_ORIGIN, OVERFLOW_ORIGIN) and honest.status == 200:
        events = list(honest.body["events"])
        if not events or events[-1]["origin_seq"] < 2**63:
            events += [overflow_seq(make_event(str(origin), 4), 2**63)]
        return _page(honest, events)
    return honest


def _setup_deep_metadata(scene: Scene) -> None:
    ops = chain(BAD_ORIGIN, 3)
    ops[1] = deep_metadata(ops[1])
    scene.held[BAD_ORIGIN] = ops


def _setup_trailing_newline(scene: Scene) -> None:
    newline_origin = bad_origin(0) + "\n"
    scene.held[newline_origin] = [
        make_event(bad_origin(0), s, hlc=f"{T0_MS + s * 1000:013d}-000000-{newline_origin}",
                   origin_replica=newline_origin) for s in (1, 2)]
    fields = chain(bad_origin(1), 4)
    fields = [newline_type(fields[0]), newline_id(fields[1]), arabic_hlc(fields[2]),
              arabic_created_at(fields[3])]
    scene.held[bad_origin(1)] = fields


def _setup_huge_page(scene: Scene) -> None:
    """Finding 7: 300 valid ops of 250 KiB bodies (77 MB in one page of 5 000)."""
    scene.held[BAD_ORIGIN] = [make_event(BAD_ORIGIN, s, body=huge_body(s)) for s in range(1, 301)]


HUGE_BODY_BYTES = 250 * 1024


def huge_body(seq: int) -> str:
    unit = f"line {seq} of a big but valid body\n"
    return (unit * (HUGE_BODY_BYTES // len(unit) + 1))[:HUGE_BODY_BYTES]


def _setup_bad_page_seq(scene: Scene) -> None:
    for index, _variant in enumerate(BAD_PAGE_SEQ_VARIANTS):
        scene.held[bad_origin(index)] = chain(bad_origin(index), 3)


def bad_page_seq_mode(scene: Scene, path: str, params: dict[str, Any], honest: Answer) -> Answer:
    """Finding 8: one bad origin per variant, all sorting before the good origin."""
    if path != "/sync/ops" or honest.status != 200:
        return honest
    origin = params.get("origin")
    for index, variant in enumerate(BAD_PAGE_SEQ_VARIANTS):
        if origin != bad_origin(index):
            continue
        if variant == "status_500":
            return Answer(500, JSON, {"error": "internal error (hostile)"})
        if variant == "reset":
            return Answer(200, JSON, Stream("reset"))
        events = honest.body["events"] or chain(str(origin), 2)
        return _page(honest, bad_page(variant, events))
    return honest


def _setup_endless(scene: Scene) -> None:
    scene.held[BAD_ORIGIN] = []
    scene.vector_extra[BAD_ORIGIN] = MAX_SEQ


def endless_page(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A full page of fresh valid ops after `after` (finding 9: never ends)."""
    after = int(params.get("after", 0))
    cap = ADVERTISEMENT["max_page"] if "large_pages" in str(params.get("ext", "")) \
        else UPSTREAM_PAGE
    limit = max(1, min(int(params.get("limit", UPSTREAM_PAGE)), cap))
    ms = T0_MS
    return [make_event(BAD_ORIGIN, s, ms=ms, counter=s % 0xFFFFFF, body="endless",
                       metadata={}) for s in range(after + 1, min(after + limit, MAX_SEQ) + 1)]


def endless_mode(scene: Scene, path: str, params: dict[str, Any], honest: Answer) -> Answer:
    if _is_ops(path, params, BAD_ORIGIN) and honest.status == 200:
        return _page(honest, endless_page(params))
    return honest


SSE_NO_NEWLINE_BYTES = 400 * 1024 * 1024


def sse_no_newline_mode(scene: Scene, path: str, params: dict[str, Any],
                        honest: Answer) -> Answer:
    """Finding 10: 400 MB on /logstream/stream without a single newline."""
    if path == "/logstream/stream":
        return Answer(200, SSE, Stream("bytes", length=SSE_NO_NEWLINE_BYTES, prefix=b"data: ",
                                       fill=b"x"))
    return honest


DRIP_INTERVAL_S = 20.0


def _setup_one_bad(scene: Scene) -> None:
    scene.held[BAD_ORIGIN] = chain(BAD_ORIGIN, 3)


def drip_mode(scene: Scene, path: str, params: dict[str, Any], honest: Answer) -> Answer:
    """Finding 10: a /sync/ops answer dripping one byte every 20 s (never a read timeout)."""
    if _is_ops(path, params, BAD_ORIGIN) and honest.status == 200:
        return Answer(200, JSON, Stream("drip", length=len(honest.encoded()[1]) + 1000,
                                        fill=b" ", interval=DRIP_INTERVAL_S))
    return honest


def far_frame() -> bytes:
    """An SSE frame naming BAD_ORIGIN at origin_seq 2**62 (finding 10)."""
    far = make_event(BAD_ORIGIN, 4)
    far["origin_seq"] = MAX_SEQ
    return sse_frame(far)


def _setup_sse_far_origin(scene: Scene) -> None:
    scene.stream_frames.append(far_frame())


def sse_far_origin_mode(scene: Scene, path: str, params: dict[str, Any],
                        honest: Answer) -> Answer:
    """Finding 10: a frame names BAD_ORIGIN at 2**62 (our vector never lists it, so only
    a pull the frame starts asks for it), and that pull drips: a claim on the origin
    that never ends unless claims are bounded. An honest partner peer (`partner_scene`)
    holds BAD_ORIGIN and announces its new ops; they must still be pulled."""
    if _is_ops(path, params, BAD_ORIGIN):
        return Answer(200, JSON, Stream("drip", length=1000, fill=b" ",
                                        interval=DRIP_INTERVAL_S))
    return honest


def partner_scene() -> Scene:
    """The honest peer next to an `sse_far_origin` one: it holds BAD_ORIGIN 1..3."""
    scene = Scene.build("honest")
    scene.replica_id = "rep_" + "d" * 32
    scene.held[BAD_ORIGIN] = chain(BAD_ORIGIN, 3)
    return scene


def _setup_bomb(scene: Scene) -> None:
    scene.held[BAD_ORIGIN] = chain(BAD_ORIGIN, 3)


BOMB_BYTES = 60 * 1000 * 1000


def msgpack_bomb(origin: str, count: int = BOMB_BYTES) -> Stream:
    """Finding 11: {"origin", "events": array32 of `count` empty arrays} -- 0x90 each."""
    prefix = (b"\x83" + b"\xa6origin" + b"\xd9" + bytes([len(origin)]) + origin.encode()
              + b"\xa5count" + b"\x00" + b"\xa6events" + b"\xdd" + struct.pack(">I", count))
    return Stream("bytes", length=len(prefix) + count, prefix=prefix, fill=b"\x90")


def json_bomb(origin: str, size: int = BOMB_BYTES) -> Stream:
    """Finding 11: {"events": [[],[],...]} of about `size` bytes."""
    prefix = b'{"origin":"' + origin.encode() + b'","count":0,"events":[[]'
    suffix = b"]}"
    count = (size - len(prefix) - len(suffix)) // 3
    return Stream("bytes", length=len(prefix) + 3 * count + len(suffix), prefix=prefix,
                  fill=b",[]", suffix=suffix)


def msgpack_bomb_mode(scene: Scene, path: str, params: dict[str, Any],
                      honest: Answer) -> Answer:
    if _is_ops(path, params, BAD_ORIGIN) and honest.status == 200:
        return Answer(200, MSGPACK, msgpack_bomb(BAD_ORIGIN))
    return honest


def json_bomb_mode(scene: Scene, path: str, params: dict[str, Any], honest: Answer) -> Answer:
    if _is_ops(path, params, BAD_ORIGIN) and honest.status == 200:
        return Answer(200, JSON, json_bomb(BAD_ORIGIN))
    return honest


FORGED_HUGE_SEQ = 2**40


def forged_seqs(held: int) -> tuple[int, ...]:
    """The slots a forging peer claims above a victim holding `held` own ops."""
    return (held + 1, held + 2, FORGED_HUGE_SEQ)


def forged_own_mode(scene: Scene, path: str, params: dict[str, Any], honest: Answer) -> Answer:
    """Findings 12 and 14: the victim's own origin, claimed above its counter with a
    far-future HLC and a huge origin_seq. `scene.own_held[victim]` is what the victim
    holds of its own origin; the forged slots sit above it (`forged_seqs`)."""
    if path == "/sync/version_vector" and honest.status == 200:
        vector = dict(honest.body["version_vector"])
        for victim in scene.victims:
            vector[victim] = FORGED_HUGE_SEQ
        return Answer(200, JSON, dict(honest.body, version_vector=vector))
    origin = params.get("origin")
    if path == "/sync/ops" and origin in scene.victims and honest.status == 200:
        after = int(params.get("after", 0))
        held = scene.own_held.get(str(origin), 0)
        events = [forged_own(str(origin), s) for s in forged_seqs(held) if s > after]
        return _page(honest, events[: int(params.get("limit", UPSTREAM_PAGE))])
    return honest


NUMERIC_METADATA = ({"approved": 1}, {"ratio": 1}, {"zero": 0})


def numeric_fork_mode(scene: Scene, path: str, params: dict[str, Any],
                      honest: Answer) -> Answer:
    """Finding 13: the victim authored ops with `NUMERIC_METADATA`; we hold them with
    numerically equal, byte-different metadata ({"approved": true}, 1.0, -0.0), plus one
    more op of its origin it lost (so it pulls its own origin from 0, restore recovery).
    The test puts the victim's authored ops in `scene.held[victim]` as `twins` builds them.
    """
    return honest


def twins(authored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The victim's ops as a numeric-fork peer serves them (`NUMERIC_METADATA` order)."""
    out = []
    for op, twin in zip(authored, ({"approved": True}, {"ratio": 1.0}, {"zero": -0.0}),
                        strict=False):
        out.append(dict(op, metadata=twin))
    return out + [dict(op) for op in authored[len(out):]]


def _setup_numeric_fork(scene: Scene) -> None:
    scene.held[BAD_ORIGIN] = chain(BAD_ORIGIN, 2)


MODES: dict[str, Callable[[Scene, str, dict[str, Any], Answer], Answer]] = {
    "honest": honest_mode,
    "seq_overflow": seq_overflow_mode,
    "deep_metadata": honest_mode,
    "trailing_newline_origin": honest_mode,
    "huge_page": honest_mode,
    "bad_page_seq": bad_page_seq_mode,
    "endless_pages": endless_mode,
    "sse_no_newline": sse_no_newline_mode,
    "drip": drip_mode,
    "sse_far_origin": sse_far_origin_mode,
    "msgpack_bomb": msgpack_bomb_mode,
    "json_bomb": json_bomb_mode,
    "forged_own_far_future": forged_own_mode,
    "numeric_fork": numeric_fork_mode,
}

SETUP: dict[str, Callable[[Scene], None]] = {
    "seq_overflow": _setup_seq_overflow,
    "deep_metadata": _setup_deep_metadata,
    "trailing_newline_origin": _setup_trailing_newline,
    "huge_page": _setup_huge_page,
    "bad_page_seq": _setup_bad_page_seq,
    "endless_pages": _setup_endless,
    "drip": _setup_one_bad,
    "sse_far_origin": _setup_sse_far_origin,
    "msgpack_bomb": _setup_bomb,
    "json_bomb": _setup_bomb,
    "numeric_fork": _setup_numeric_fork,
}

# Which finding of issue 8 each mode reproduces.
FINDINGS: dict[str, tuple[int, ...]] = {
    "seq_overflow": (1,), "deep_metadata": (2,), "trailing_newline_origin": (6,),
    "huge_page": (7,), "bad_page_seq": (8,), "endless_pages": (9,), "sse_no_newline": (10,),
    "drip": (10,), "sse_far_origin": (10,), "msgpack_bomb": (11,), "json_bomb": (11,),
    "forged_own_far_future": (12, 14), "numeric_fork": (13,),
}
