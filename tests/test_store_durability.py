"""Each write transaction commits with the durability its kind needs: a local append with
`synchronous=FULL` (the only copy), a remote page with NORMAL (it can be pulled again),
whatever ran on the connection before; the pragma is issued only when the mode changes."""

from __future__ import annotations

from pathlib import Path

from logsync.store import Store


def statements(store: Store) -> list[str]:
    seen: list[str] = []
    store._writer.set_trace_callback(seen.append)
    return seen


def mode(store: Store) -> int:
    return int(store._writer.execute("PRAGMA synchronous").fetchone()[0])


def test_appends_commit_full_and_pages_normal_in_any_order(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a") as origin, Store.open(tmp_path / "b") as store:
        for i in range(4):
            origin.append_event("note", "s", "r", "me@host", body=f"note {i}")
        ops = origin.list_ops(origin.replica_id, 0, 10)
        seen = statements(store)
        store.append_event("note", "s", "r", "me@host", body="local first")
        assert mode(store) == 2  # FULL
        store.apply_remote(ops[:2], [])
        assert mode(store) == 1  # NORMAL
        store.apply_remote(ops[2:], [])
        assert mode(store) == 1
        store.append_event("note", "s", "r", "me@host", body="local after pages")
        assert mode(store) == 2
        pragmas = [s for s in seen if s.startswith("PRAGMA synchronous=")]
        # FULL from the open, so the first append sets nothing; then NORMAL once for two
        # pages, FULL again for the append after them
        assert pragmas == ["PRAGMA synchronous=NORMAL", "PRAGMA synchronous=FULL"]
        begins = [i for i, s in enumerate(seen) if s == "BEGIN IMMEDIATE"]
        assert len(begins) == 4
        last_full = max(i for i, s in enumerate(seen) if s == "PRAGMA synchronous=FULL")
        assert last_full < begins[-1] and last_full > begins[-2]


def test_the_writer_keeps_a_page_sized_cache_and_readers_the_default(tmp_path: Path) -> None:
    """A pulled page (one ~10 MB transaction) fits the writer's page cache, so SQLite does
    not spill it to the WAL mid-way; read connections keep SQLite's default."""
    from logsync.store.core import WRITER_CACHE_KIB

    with Store.open(tmp_path / "a") as store:
        assert store._writer.execute("PRAGMA cache_size").fetchone()[0] == -WRITER_CACHE_KIB
        assert store._reader().execute("PRAGMA cache_size").fetchone()[0] == -2000
