"""A logsync build with a planted defect, for the checker's own test.

``python -m tests.chaos.planted --palace P serve ...`` is ``logsync`` whose daemon loses
every tenth op it applies from a peer (``CHAOS_DROP_EVERY``, default 10), pulled or taken
from a stream's page frame or a push alike: once a later op of
the same origin is stored, the earlier one's row is deleted, as a storage layer with a
lost-write bug would. The vector still names the later op, so no round ever pulls the lost
one again, and nothing in the replication protocol notices. A green chaos run against this
build would mean the checker is blind.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
from typing import Any

from logsync import client, effects, pushed
from logsync.cli import main

EVERY = int(os.environ.get("CHAOS_DROP_EVERY", "10"))
_counted = itertools.count(1)
_doomed: list[tuple[str, str, int]] = []  # (id, origin, origin_seq) to lose when covered
_perform = effects.perform


def perform(store: Any, effect: Any) -> Any:
    answer = _perform(store, effect)
    if isinstance(effect, effects.ApplyPage) and effect.events:
        _doomed.extend((e["id"], e["origin_replica"], int(e["origin_seq"]))
                       for e in effect.events if next(_counted) % EVERY == 0)
        _lose(store.db_path)
    return answer


def _lose(db_path: Any) -> None:
    """Delete each doomed op once a later op of its origin is stored."""
    conn = sqlite3.connect(db_path, timeout=10)
    with contextlib.suppress(sqlite3.Error), contextlib.closing(conn), conn:
        for item in list(_doomed):
            event_id, origin, seq = item
            top = conn.execute("SELECT max(origin_seq) FROM events WHERE origin_replica = ?",
                               (origin,)).fetchone()[0]
            if top is not None and top > seq:
                conn.execute("DELETE FROM event_artifacts WHERE event_id = ?", (event_id,))
                conn.execute("DELETE FROM events WHERE id = ?", (event_id,))
                _doomed.remove(item)


# Every way an op reaches the store: the rounds' pulls, and the page frames and pushes
# (which arrive first on a quiet mesh, so hooking the pull alone lost nothing there).
client.perform = perform
pushed.effects_perform = perform

if __name__ == "__main__":
    main()
