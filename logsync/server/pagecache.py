"""Whole encoded `/sync/ops` answers, kept (issue 12, item 2): a replica far behind pulls
pages of megabytes, and building one (reading thousands of rows into dicts, sizing each
op's JSON for the byte budget, reading its artifacts) cost about as much as its apply,
on a second core a puller's own threads need.

An answer is a pure function of what the responder read (`responder.answer` does no
other I/O): the ops by `(origin_seq, seq)`, which of the artifacts they name are held,
our chain at `after` and the signatures at the page's seqs. A stored op and a stored
artifact never change under their key (`opcache.py` relies on the same). So an entry
keeps the answer's bytes with a log of those reads and their results, and is served only
when every read, replayed cheaply (keys from the index, held artifact ids, digests,
signatures), gives the same result again: an op stored into a gap, an artifact or a
signature arrived since, a longer origin under a page that was short, all make the
replay differ and the page is built afresh. Any other read (one the responder may come
to make) leaves the answer uncached; so does a page joined from `OpCache` by key alone
(upstream's plain page, already cheap).

Bounds: `max_bytes` of answers (LRU; one larger than a quarter of it is never kept); a
puller asking many distinct pages only makes the cache evict. A cache meeting another
store object than the last forgets everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logsync.defaults import DEFAULT_CACHE_MIB, MIB
from logsync.server.lru import BoundedLRU

DEFAULT_PAGE_CACHE_BYTES = DEFAULT_CACHE_MIB * MIB // 2
ENTRY_OVERHEAD = 1024  # the entry's own objects
# Python objects counted per item of the key and of a logged read's arguments and result
# (a `(origin_seq, seq)` tuple of ints: ~120 bytes; a signature and its seq: ~230; an
# artifact id of 128 characters: ~190)
ITEM_BYTES = 256

REPLAYED = ("op_keys", "missing_artifacts", "chain_digests_at", "chain_signatures")
Read = tuple[str, tuple[Any, ...], Any]  # (replay method, its arguments, the result)
Key = tuple[str, tuple[tuple[str, str], ...]]  # (encoding and coding asked, the query)


@dataclass(frozen=True)
class Entry:
    """One answer: its bytes, the encoding they are in (and the content coding over it),
    and the reads it was built from."""

    data: bytes
    encoding: str
    reads: tuple[Read, ...]
    size: int  # what it holds in memory, the key and the read log included (`held_bytes`)
    coding: str = ""  # "" (identity) or "zstd"


class ReadLog:
    """The store as the responder reads it, each read logged with what replays it; any
    read not known here marks the answer `replayable` False."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.reads: list[Read] = []
        self.replayable = True

    def list_ops(self, origin: str, after: int = 0, limit: int = 500, *,
                 max_limit: int = 500) -> list[Any]:
        ops = self._store.list_ops(origin, after, limit, max_limit=max_limit)
        keys = op_keys_of(ops)
        if keys is None:
            self.replayable = False
        else:
            self.reads.append(("op_keys", (origin, after, limit, max_limit), keys))
        return ops

    def get_artifacts(self, ids: Iterable[str]) -> list[dict[str, Any]]:
        wanted = sorted(set(ids))
        found = self._store.get_artifacts(wanted)
        held = {artifact["id"] for artifact in found}
        self.reads.append(("missing_artifacts", (wanted,), [i for i in wanted if i not in held]))
        return found

    def chain_digests_at(self, origin: str, seqs: Sequence[int]) -> list[bytes | None]:
        seqs = list(seqs)
        found = list(self._store.chain_digests_at(origin, seqs))
        self.reads.append(("chain_digests_at", (origin, seqs), found))
        return found

    def chain_signatures(self, origin: str, seqs: Sequence[int]) -> dict[int, bytes]:
        seqs = list(seqs)
        found = dict(self._store.chain_signatures(origin, seqs))
        self.reads.append(("chain_signatures", (origin, seqs), found))
        return found

    def __getattr__(self, name: str) -> Any:
        self.replayable = False
        return getattr(self._store, name)


def op_keys_of(ops: Sequence[Any]) -> list[tuple[int, int]] | None:
    """`(origin_seq, seq)` of ops read as dicts, as `Store.op_keys` reads them; None when
    an op is not such a dict (a `HeldOp`, a fake store's shape)."""
    keys = []
    for op in ops:
        if type(op) is not dict:
            return None
        origin_seq, seq = op.get("origin_seq"), op.get("seq")
        if type(origin_seq) is not int or type(seq) is not int:
            return None
        keys.append((origin_seq, seq))
    return keys


def replays(store: Any, reads: Iterable[Read]) -> bool:
    """Whether every logged read gives the same result from `store` now."""
    for method, args, result in reads:
        if method == "op_keys":
            origin, after, limit, max_limit = args
            now = store.op_keys(origin, after, limit, max_limit=max_limit)
            now = [(int(a), int(b)) for a, b in now]
        elif method == "missing_artifacts":
            now = list(store.missing_artifacts(*args))
        elif method == "chain_digests_at":
            now = list(store.chain_digests_at(*args))
        elif method == "chain_signatures":
            now = dict(store.chain_signatures(*args))
        else:
            return False
        if now != result:
            return False
    return True


def page_key(encoding: str, params: Mapping[str, Any], coding: str = "") -> Key:
    """A page's key: what was asked (a zstd-coded answer is kept apart from a plain one)."""
    asked = f"{encoding}+{coding}" if coding else encoding
    return asked, tuple(sorted((str(k), str(v)) for k, v in params.items()))


class PageCache(BoundedLRU[Entry]):
    """A bytes-bounded LRU of encoded answers (`lru.BoundedLRU`), each served only after
    its reads replay."""

    def __init__(self, max_bytes: int = DEFAULT_PAGE_CACHE_BYTES) -> None:
        super().__init__(max_bytes, _size, 4)

    def answer(self, store: Any, key: Key) -> Entry | None:
        """The kept answer for `key` if its reads replay the same from `store`, else None
        (a stale entry is dropped)."""
        entry = self.peek(store, key)
        if entry is not None and not replays(store, entry.reads):
            self.drop(key, entry)
            entry = None
        self.used(key, entry)
        return entry

    def put(self, store: Any, key: Key, log: ReadLog, data: bytes, encoding: str,
            coding: str = "") -> None:
        """Keep an answer built from `store` through `log` (if its reads replay)."""
        if log.replayable and all(hasattr(store, name) for name in REPLAYED):
            reads = tuple(log.reads)
            self.keep(store, key, Entry(data, encoding, reads, held_bytes(key, data, reads),
                                        coding))


def held_bytes(key: Key, data: bytes, reads: Sequence[Read]) -> int:
    """What an entry holds, counted generously: its bytes, and `ITEM_BYTES` plus the text
    for each query parameter (a client chooses them) and each item a read logged, in its
    arguments (the ids a page looked up) as in its result."""
    query = sum(ITEM_BYTES + _text_bytes(k) + _text_bytes(v) for k, v in key[1])
    logged = sum(ITEM_BYTES * (1 + sum(map(_items, args)) + _items(result))
                 for _, args, result in reads)
    return ENTRY_OVERHEAD + len(data) + query + logged


def _text_bytes(text: str) -> int:
    """At least what a str holds a character (1, 2 or 4 bytes): its UTF-8 length."""
    return len(text.encode("utf-8", "surrogatepass"))


def _items(result: Any) -> int:
    return len(result) if isinstance(result, list | tuple | dict | set) else 1


def _size(entry: Entry) -> int:
    return entry.size
