"""The interpreter settings of a pull that overlaps its work (`prefetch.Prefetcher`): the
page being written in one thread while the next is fetched, decoded and prepared in
others. CPython has one of each setting per process, so overlapping rounds share them:
the values found before the first are restored when the last ends.

- Switch interval 0.2 ms (default 5 ms): the writing thread takes the GIL back after
  every SQLite step (dozens a page) and waits up to the interval each time behind the
  busy thread; beside one, a pull's writes took 2.7x as long (1.3x at 0.2 ms).
- First-generation GC threshold at least 100 000 (default 700): a pull allocates some
  200 000 containers per 20 000 ops that live a page's time (the decoded page, its rows);
  at 700 they were traversed over a hundred times and fully once, 0.1-0.3 s of a 1 s
  pull under the GIL. Cycles are still collected, only in larger batches.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_INTERVAL_S = 0.0002
GC_YOUNG_THRESHOLD = 100_000

_lock = threading.Lock()
_users: list[tuple[float, tuple[int, int, int]]] = []  # what each user found


@contextmanager
def bulk_settings() -> Iterator[None]:
    """Inside: the switch interval at most `SWITCH_INTERVAL_S`, the first GC threshold at
    least `GC_YOUNG_THRESHOLD`; the settings found by the first of overlapping users come
    back when the last leaves."""
    with _lock:
        found = _users[0] if _users else (sys.getswitchinterval(), gc.get_threshold())
        _users.append(found)
        interval, (young, middle, old) = found
        sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
        if young:  # 0: the process turned automatic collection off; it stays off
            gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)
    try:
        yield
    finally:
        with _lock:
            _users.pop()
            if not _users:
                sys.setswitchinterval(found[0])
                gc.set_threshold(*found[1])
