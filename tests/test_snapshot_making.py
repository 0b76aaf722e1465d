"""The snapshot copy a server makes keeps only the signatures a joiner keeps (each
origin's checkpoints and its highest signed op), so no joiner rewrites the others."""

from __future__ import annotations

import sqlite3

from logsync.pagechain import CHECKPOINT
from logsync.snapshot.making import make_copy
from logsync.store import Store


def _signed(path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute(
            "SELECT origin_seq FROM logsync_chain WHERE signature IS NOT NULL "
            "ORDER BY origin_seq")]
    finally:
        conn.close()


def test_the_copy_keeps_checkpoint_and_top_signatures_only(tmp_path) -> None:
    with Store.open(tmp_path / "p") as store:
        for i in range(2 * CHECKPOINT + 5):
            store.append_event("task.request", "s", "r", "a@b", body=f"op {i}")
        held = _signed(store.db_path)
        copy = make_copy(store.db_path, store.replica_id)
    try:
        top = 2 * CHECKPOINT + 5
        assert len(held) > 3  # the store signs more than the joiner keeps
        assert _signed(copy.path) == [CHECKPOINT, 2 * CHECKPOINT, top]
        assert _signed(store.db_path) == held  # the live store is untouched
    finally:
        copy.path.unlink()
