"""Encoded ops for `/sync/ops` answers: a stored op's JSON and msgpack bytes never change,
so they are kept (bounded) and a page is joined from them instead of encoded again.

Only the *encoding* of each op is cached, never a page: which ops a page holds is read
from the store on every request (`responder.answer`), so an op stored later (our own op
recovered into a gap after a restore) is never missed. An entry is keyed by
`(encoding, origin, origin_seq)` and used only for the row it was made from (the same
local seq, i.e. rowid: stored ops are never rewritten, and a row moved by a VACUUM has
another); a cache meeting another store object than the last forgets everything.
The answer bytes equal `json_bytes(body)` / `msgpack.packb(body)` exactly
(`tests/test_opcache.py`).

Bounds: `max_bytes` of fragments (LRU; an op bigger than `max_bytes // 8` is never kept,
so one large op cannot flush the rest). A puller asking many distinct `after` values, or
many origins, only makes the cache evict: each request still reads at most one page from
the store, and memory stays at `max_bytes` plus `ENTRY_OVERHEAD` per entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from logsync.defaults import DEFAULT_CACHE_MIB, MIB
from logsync.responder import json_bytes
from logsync.server.lru import BoundedLRU
from logsync.wire import EXT_CHAIN, EXT_INLINE_ARTIFACTS, EXT_LARGE_PAGES

JSON = "json"
MSGPACK = "msgpack"
DEFAULT_OP_CACHE_BYTES = DEFAULT_CACHE_MIB * MIB // 2
ENTRY_OVERHEAD = 200  # the key, the entry tuple and their strings, roughly
EVENTS_KEY = "events"

Key = tuple[str, str, int]  # (encoding, origin, origin_seq)
OpKey = tuple[int, int]  # (origin_seq, seq) of a stored op, as `Store.op_keys` reads


class OpCache(BoundedLRU[tuple[int, bytes]]):
    """A bytes-bounded LRU of encoded ops (`lru.BoundedLRU`): (seq, bytes) by key."""

    def __init__(self, max_bytes: int = DEFAULT_OP_CACHE_BYTES) -> None:
        super().__init__(max_bytes, lambda entry: len(entry[1]) + ENTRY_OVERHEAD, 8)

    def get(self, encoding: str, origin: str, origin_seq: int, seq: int) -> bytes | None:
        """The op's encoded bytes if held for exactly this row, else None."""
        key = (encoding, origin, origin_seq)
        entry = self.peek(None, key)
        held = entry if entry is not None and entry[0] == seq else None
        self.used(key, held)
        return held[1] if held is not None else None

    def put(self, encoding: str, origin: str, origin_seq: int, seq: int, data: bytes
            ) -> None:
        self.keep(None, (encoding, origin, origin_seq), (seq, data))

    # ── answers ───────────────────────────────────────────────────────

    def held_page(self, encoding: str, origin: str, keys: Sequence[OpKey]
                  ) -> list[HeldOp] | None:
        """The page's ops as held bytes when every one is held, else None (read them)."""
        out = []
        for origin_seq, seq in keys:
            data = self.get(encoding, origin, origin_seq, seq)
            if data is None:
                return None
            out.append(HeldOp(data))
        return out

    def encode(self, body: Mapping[str, Any], encoding: str) -> bytes:
        """`body` (a `/sync/ops` answer) encoded, its ops from the cache where held and
        kept for next time where not. Raises what `json_bytes` or `msgpack.packb` raise
        for the same body."""
        one = _encode_json if encoding == JSON else _encode_msgpack

        def op_bytes(event: Any) -> bytes:
            if isinstance(event, HeldOp):
                return event.data
            if not _keyed(event):
                return one(event)
            origin, origin_seq = event["origin_replica"], event["origin_seq"]
            seq = event["seq"]
            data = self.get(encoding, origin, origin_seq, seq)
            if data is None:
                data = one(event)
                self.put(encoding, origin, origin_seq, seq, data)
            return data

        if encoding == JSON:
            return _join_json(body, op_bytes)
        return _join_msgpack(body, op_bytes)


class HeldOp:
    """An op of a page as its held encoded bytes (the page was read by key only)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _keyed(event: Any) -> bool:
    """An op read from the store (only those are cached): its key fields are exact."""
    return (type(event) is dict and type(event.get("origin_replica")) is str
            and type(event.get("origin_seq")) is int and type(event.get("seq")) is int)


def _encode_json(value: Any) -> bytes:
    return json_bytes(value)


def _encode_msgpack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _join_json(body: Mapping[str, Any], op_bytes: Callable[[Any], bytes]) -> bytes:
    """`json_bytes(body)`: default separators, so an object is `{k: v, k: v}` and an
    array `[a, b]` -- the events' bytes are spliced in as they are, in one join (a page
    is a megabyte: every intermediate copy costs)."""
    parts = [b"{"]
    for key, value in body.items():
        if len(parts) > 1:
            parts.append(b", ")
        parts.append(json_bytes(key) + b": ")
        if key == EVENTS_KEY and isinstance(value, list):
            parts.append(b"[")
            for index, event in enumerate(value):
                if index:
                    parts.append(b", ")
                parts.append(op_bytes(event))
            parts.append(b"]")
        else:
            parts.append(json_bytes(value))
    parts.append(b"}")
    return b"".join(parts)


def _join_msgpack(body: Mapping[str, Any], op_bytes: Callable[[Any], bytes]) -> bytes:
    """`msgpack.packb(body)`: a map header, then each key and value packed in order."""
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_map_header(len(body))]
    for key, value in body.items():
        parts.append(packer.pack(key))
        if key == EVENTS_KEY and isinstance(value, list):
            parts.append(packer.pack_array_header(len(value)))
            parts.extend([op_bytes(e) for e in value])
        else:
            parts.append(packer.pack(value))
    return b"".join(parts)


# Extensions under which the responder looks into a page's ops (a byte budget, their
# artifacts, the chain at their seqs): those pages are read in full, their ops as dicts.
LOOKS_INTO_OPS = frozenset({EXT_LARGE_PAGES, EXT_INLINE_ARTIFACTS, EXT_CHAIN})


def page_reads(store: Any, cache: OpCache, encoding: str, asked: set[str]) -> Any:
    """What the responder reads a `/sync/ops` page from: for a plain page (upstream's
    shape: nothing asked that looks into its ops) a view whose `list_ops` reads only the
    ops' keys when the cache holds every op of the page; else the store itself."""
    cache.bind(store)
    if asked & LOOKS_INTO_OPS or not hasattr(store, "op_keys"):
        return store
    return _KeyedReads(store, cache, encoding)


class _KeyedReads:
    """The store, but `list_ops` answers with `HeldOp`s when every op is held."""

    def __init__(self, store: Any, cache: OpCache, encoding: str) -> None:
        self._store, self._cache, self._encoding = store, cache, encoding

    def list_ops(self, origin: str, after: int = 0, limit: int = 500, *,
                 max_limit: int = 500) -> list[Any]:
        keys = self._store.op_keys(origin, after, limit, max_limit=max_limit)
        held = self._cache.held_page(self._encoding, str(origin), keys)
        if held is not None:
            return held
        return self._store.list_ops(origin, after, limit, max_limit=max_limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
