"""Page frames and tops frames: what a logsync change stream sends a subscriber that asks
for them, and how the subscriber takes them (`outbox.py` decides what is owed).

A subscriber asks with `X-Logsync-Frames: pages` (and names the origins it streams from
directly in `X-Logsync-Direct`). Its stream then carries, instead of one upstream
`logstream` frame per event:

    event: logsync-page        data: a push page (`responder.push_page`): ops above
                               `after` with `chain`, signatures and artifacts inline
    event: logsync-tops        data: {"tops": {origin: top, ...}, "more": bool}

A page frame is taken exactly as a pushed page (`pushed.accept_push`: the pull path's
checks, apply and quarantine), so carrying an op inline trusts the publisher no more
than pulling it would. Whatever a frame leaves us lacking (a gap, a refused page, a name)
becomes a frame for the peer loop, which pulls it; `more` asks for a full round. A peer
that ignores the header (a MemPalace hub) sends its ordinary frames.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from logsync.errors import ValidationError
from logsync.ids import is_replica_id
from logsync.model import MAX_SEQ
from logsync.outbox import MAX_OWED, Write
from logsync.pushed import accept_push
from logsync.responder import push_page

log = logging.getLogger("logsync.frames")

FRAMES_HEADER = "X-Logsync-Frames"  # "pages": this subscriber takes page and tops frames
DIRECT_HEADER = "X-Logsync-Direct"  # origins the subscriber streams from directly
PAGES = "pages"
PAGE_EVENT = "logsync-page"
TOPS_EVENT = "logsync-tops"
PAGE_FRAME_OPS = 256  # ops one page frame carries at most; the rest is named and pulled
PAGE_FRAME_BYTES = 256 * 1024  # a page frame's JSON at most (a subscriber's line cap is 1 MiB)
WRITE_BYTES = 1024 * 1024  # pages in one write at most (past it, origins are named)


def write_parts(store: Any, write: Write, own: str, cache: dict[tuple[Any, ...], Any] | None
                = None) -> tuple[list[bytes], dict[str, int]]:
    """A write's page bodies and named tops (blocking: SQLite). A page that cannot go
    whole (an op or an artifact past the frame cap, an artifact we lack) is named
    instead, and so is whatever lies past a page: the subscriber pulls those. `cache`
    (cleared by the caller when the store changes) shares a page among subscribers."""
    bodies: list[bytes] = []
    named = dict(write.named)
    room = WRITE_BYTES
    for origin, (after, top) in write.pages.items():
        if room <= 0:  # the write is full: the rest is named, and pulled
            named[origin] = top
            continue
        key = ("page-frame", origin, after, min(top - after, PAGE_FRAME_OPS))
        page = cache.get(key) if cache is not None else None
        if page is None:
            try:
                page = push_page(store, origin, after, key[3], PAGE_FRAME_BYTES, own)
            except ValueError as exc:  # an op that cannot be encoded: the pull reports it
                log.warning("origin %s above %d cannot go in a page frame (%s); named "
                            "instead", origin, after, exc)
                named[origin] = top
                continue
            if cache is not None:
                cache[key] = page
        if page.count and page.complete:
            bodies.append(page.body)
            room -= len(page.body)
            if page.last_seq >= top:
                continue
        named[origin] = top
    return bodies, named


def encode_write(store: Any, write: Write, own: str) -> bytes:
    """A write as SSE frames: its pages, then one tops frame if it names anything."""
    bodies, named = write_parts(store, write, own)
    frames = [page_frame(body) for body in bodies]
    if named or write.more:
        frames.append(tops_frame(named, write.more))
    return b"".join(frames)


def page_frame(body: bytes) -> bytes:
    """One encoded page (JSON without a raw line break) as an SSE frame."""
    return b"event: " + PAGE_EVENT.encode() + b"\ndata: " + body + b"\n\n"


def tops_frame(named: Mapping[str, int], more: bool = False) -> bytes:
    data = json.dumps({"tops": dict(named), "more": more}, separators=(",", ":"))
    return f"event: {TOPS_EVENT}\ndata: {data}\n\n".encode()


def tops_frames(tops: Iterable[tuple[str, int]], more: bool
                ) -> list[tuple[str | None, int | None]]:
    """What a tops frame tells the peer loop: each named (origin, top), then (None, None)
    for `more` (a full round, as a reconnection). The daemon's and the simulator's rule."""
    frames: list[tuple[str | None, int | None]] = list(tops)
    if more:
        frames.append((None, None))
    return frames


def parse_tops(data: bytes | str) -> tuple[dict[str, int], bool] | None:
    """(origin -> top, more) of a tops frame; None if it is not one (too many origins, an
    origin that is not a replica id, a top that is not a seq)."""
    try:
        frame = json.loads(data)
    except (ValueError, RecursionError):
        return None
    tops = frame.get("tops") if isinstance(frame, dict) else None
    if not isinstance(tops, dict) or len(tops) > MAX_OWED:
        return None
    for origin, top in tops.items():
        if not is_replica_id(origin) or type(top) is not int or not 1 <= top <= MAX_SEQ:
            return None
    return tops, frame.get("more") is True


@dataclass(frozen=True)
class PageFrame:
    """A page frame's decoded body, with the origin and the last seq it names."""

    body: dict[str, Any]
    origin: str
    last: int


def parse_page_frame(data: bytes | str) -> PageFrame | None:
    """The page a frame carries; None if it names no origin and last seq (not a page)."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    origin, events = body.get("origin"), body.get("events")
    if not is_replica_id(origin) or not isinstance(events, list) or not events:
        return None
    last = events[-1].get("origin_seq") if isinstance(events[-1], dict) else None
    if type(last) is not int or not 1 <= last <= MAX_SEQ:
        return None
    return PageFrame(body, origin, last)


@dataclass(frozen=True)
class Taken:
    """What one page frame did: our top of its origin after it, and how many ops it
    added (0 and 0: it was refused)."""

    frame: PageFrame
    top: int
    applied: int

    @property
    def lacking(self) -> bool:
        """We still lack some of what the frame carried: the peer loop pulls it."""
        return self.top < self.frame.last


def apply_page_frame(store: Any, frame: PageFrame, publisher: str,
                     perform: Callable[[Any], Any] | None = None) -> Taken:
    """Apply one page frame from `publisher` as a pushed page (blocking: SQLite). A page
    that is not from `publisher`, or that the pull path refuses, applies nothing (the
    caller pulls what it named, and the pull reports why)."""
    if frame.body.get("from") != publisher:
        log.info("a page frame of origin %s names sender %.80r, not the stream's peer %s: "
                 "pulled instead", frame.origin, frame.body.get("from"), publisher)
        return Taken(frame, 0, 0)
    try:
        answer = accept_push(store, frame.body, publisher, perform=perform)
    except ValidationError as exc:
        log.info("a page frame of origin %s from %s was refused (%s): pulled instead",
                 frame.origin, publisher, exc)
        return Taken(frame, 0, 0)
    return Taken(frame, int(answer["top"]), int(answer["applied"]))


@dataclass(frozen=True)
class Took:
    """What taking one page frame asks of its caller: `pull` (origin, seq) for the peer
    loop (None: nothing; (None, None): a full round), and how many ops it added."""

    pull: tuple[str | None, int | None] | None
    applied: int = 0


def take_page(store: Any, data: bytes | str, publisher: str | None, *, paused: bool = False,
              served: Callable[[dict[str, int]], None] | None = None,
              perform: Callable[[Any], Any] | None = None) -> Took:
    """One page frame by `take_pages`."""
    return take_pages(store, [data], publisher, paused=paused, served=served,
                      perform=perform)[0]


def take_pages(store: Any, pages: Sequence[bytes | str], publisher: str | None, *,
               paused: bool = False, served: Callable[[dict[str, int]], None] | None = None,
               perform: Callable[[Any], Any] | None = None) -> list[Took]:
    """The one rule for the page frames of one stream write, the daemon's and the
    simulator's (blocking: SQLite).

    A frame that is not a page asks for a full round, as an unreadable frame does. A page
    we cannot take now (the stream's peer is not known yet: `publisher` None; pulls are
    `paused` by a store fault) or whose `from` is not the stream's peer is pulled
    instead. Otherwise `served({origin: last})` notes, once for the write, that the peer
    holds what it sent: before any apply (so our own stream never sends it back) and
    outside the transaction (so the note never waits while the writer is held). The
    pages are then applied as pushed pages in one store transaction (`Store.batch`: a
    commit costs about as much as a small page's apply), and whatever they leave us
    lacking is pulled. A page the store refuses applies nothing; an exception (a store
    fault) loses the whole write, which the pull recovers."""
    judged = [_judge(data, publisher, paused) for data in pages]
    frames = [frame for frame in judged if isinstance(frame, PageFrame)]
    if served is not None and frames:
        held: dict[str, int] = {}
        for frame in frames:
            held[frame.origin] = max(frame.last, held.get(frame.origin, 0))
        served(held)
    with store.batch() if len(frames) > 1 else nullcontext():
        return [_take(store, item, publisher, perform) if isinstance(item, PageFrame)
                else item for item in judged]


def _judge(data: bytes | str, publisher: str | None, paused: bool) -> PageFrame | Took:
    """The page a frame carries if we take it now, else what to do instead."""
    frame = parse_page_frame(data)
    if frame is None:
        return Took((None, None))
    if publisher is None or paused:
        return Took((frame.origin, frame.last))
    if frame.body.get("from") != publisher:
        log.info("a page frame of origin %s names sender %.80r, not the stream's peer %s: "
                 "pulled instead", frame.origin, frame.body.get("from"), publisher)
        return Took((frame.origin, frame.last))
    return frame


def _take(store: Any, frame: PageFrame, publisher: str,
          perform: Callable[[Any], Any] | None) -> Took:
    taken = apply_page_frame(store, frame, publisher, perform)
    return Took((frame.origin, frame.last) if taken.lacking else None, taken.applied)
