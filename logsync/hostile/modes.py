"""One hostile peer (`Scene`) and its modes: (scene, path, params, honest answer) -> answer."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logsync.hostile.encode import (
    Answer,
    Stream,
    sse_frame,
)
from logsync.hostile.ops import (
    ADVERTISEMENT,
    BAD_ORIGIN,
    BAD_PAGE_SEQ_VARIANTS,
    GOOD_COUNT,
    GOOD_ORIGIN,
    JSON,
    MAX_SEQ,
    MSGPACK,
    PEER_ID,
    SSE,
    T0_MS,
    UPSTREAM_PAGE,
    arabic_created_at,
    arabic_hlc,
    bad_origin,
    bad_page,
    chain,
    deep_metadata,
    forged_own,
    make_event,
    newline_id,
    newline_type,
    overflow_seq,
)
from logsync.responder import SYNC_ROUTES, Profile, answer

# ── one hostile peer ─────────────────────────────────────────────────

# What the honest peer is: a logsync server with the advertised extensions and page.
PROFILE = Profile(extensions=tuple(ADVERTISEMENT["extensions"]),
                  max_page=int(ADVERTISEMENT["max_page"]))


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

    # the store the responder reads (the ops held are kept in memory: some are invalid)

    def version_vector(self) -> dict[str, int]:
        return self.vector()

    def list_ops(self, origin: str, after: int = 0, limit: int = UPSTREAM_PAGE, *,
                 max_limit: int = UPSTREAM_PAGE) -> list[dict[str, Any]]:
        ops = [e for e in self.held.get(origin, []) if e["origin_seq"] > after]
        return ops[: max(1, min(limit, max_limit))]

    def get_artifact(self, artifact_id: str) -> dict[str, Any] | None:
        return None

    def get_artifacts(self, ids: Any) -> list[dict[str, Any]]:
        return []

    def honest(self, path: str, params: Mapping[str, Any]) -> Answer:
        """What an honest logsync peer holding these ops answers (`logsync.responder`)."""
        if path in SYNC_ROUTES:
            status, body = answer(self, path, params, profile=PROFILE)
            return Answer(status, JSON, body)
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


SSE_DRIP_LINE_BYTES = 1024 * 1024


def sse_drip_chunks_mode(scene: Scene, path: str, params: dict[str, Any],
                         honest: Answer) -> Answer:
    """A page frame's data line of 1 MiB, in one-byte HTTP chunks sent 64 KiB of the
    wire at a time: each chunk is one read of the victim's parser (review, 2026-12-03:
    the line's reassembly was quadratic in its reads and froze the victim's loop)."""
    if path == "/logstream/stream":
        return Answer(200, SSE, Stream("chunked", length=SSE_DRIP_LINE_BYTES, chunk=1,
                                       prefix=b"event: logsync-page\ndata: ", fill=b"x"))
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
    "sse_drip_chunks": sse_drip_chunks_mode,
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
    "sse_drip_chunks": (10,),
    "drip": (10,), "sse_far_origin": (10,), "msgpack_bomb": (11,), "json_bomb": (11,),
    "forged_own_far_future": (12, 14), "numeric_fork": (13,),
}
