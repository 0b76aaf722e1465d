"""The bounded memory under the server's caches (`opcache.py`, `pagecache.py`): an LRU
of entries counted in bytes, bound to one store object (meeting another forgets
everything), thread-safe (answers are built in worker threads).

Bounds: at most `max_bytes` of entries as `size(entry)` counts them; an entry bigger
than `max_bytes // largest` is never kept, so one large entry cannot flush the rest.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class BoundedLRU(Generic[V]):
    """Entries by key, least recently used evicted first past `max_bytes`."""

    def __init__(self, max_bytes: int, size: Callable[[V], int], largest: int) -> None:
        self.max_bytes = max_bytes
        self._size = size
        self._largest = largest
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._store_id: int | None = None
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def bind(self, store: Any) -> None:
        """Forget everything when asked about another store object than the last."""
        with self._lock:
            self._bind(store)

    def peek(self, store: Any, key: Hashable) -> V | None:
        """The entry for `key` of `store`, not yet counted as used (see `used`)."""
        with self._lock:
            self._bind(store)
            return self._entries.get(key)

    def used(self, key: Hashable, entry: V | None) -> None:
        """Count a lookup: a hit moves `entry` to the back, a miss (None) is counted."""
        with self._lock:
            if entry is None:
                self.misses += 1
                return
            if self._entries.get(key) is entry:
                self._entries.move_to_end(key)
            self.hits += 1

    def drop(self, key: Hashable, entry: V) -> None:
        """Drop `entry` if it is still the one held for `key` (a stale one)."""
        with self._lock:
            if self._entries.get(key) is entry:
                del self._entries[key]
                self._bytes -= self._size(entry)

    def keep(self, store: Any, key: Hashable, entry: V) -> None:
        """Hold `entry` for `key` of `store`, evicting the least recently used past the
        bound; an entry past `max_bytes // largest` is not kept."""
        size = self._size(entry)
        if self.max_bytes <= 0 or size > self.max_bytes // self._largest:
            return
        with self._lock:
            self._bind(store)
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= self._size(old)
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= self._size(gone)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._store_id = None

    def _bind(self, store: Any) -> None:
        if store is not None and self._store_id != id(store):
            self._entries.clear()
            self._bytes = 0
            self._store_id = id(store)
