"""What an operator sees of bulk mode's checkpoints (`checkpoints.LogState`): the log's
size and its copies on `/metrics` and the status page; a failed copy counted, said once
in the log, shown until a copy succeeds."""

from __future__ import annotations

import logging
import re
import sqlite3

import pytest

from logsync.server import create_app
from logsync.store import Store
from tests.test_checkpoints import write_pages
from tests.test_statuspage import (  # noqa: F401 - the page tests' fixtures
    BEARER,
    TOKEN,
    anyio_backend,
    client,
    store,
)


class Failing:
    """The checkpointer's connection, failing its copies while `failing`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn, self.failing = conn, True

    def execute(self, sql: str) -> sqlite3.Cursor:
        if self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        return self.conn.execute(sql)


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"{name} is not in /metrics"
    return float(found.group(1))


def test_a_bulk_counts_its_copies_and_no_failure(store: Store) -> None:  # noqa: F811
    assert store.log_state().checkpoints == 0
    with store.bulk_writes():
        write_pages(store, 4)
    assert store.log_copied(30)
    state = store.log_state()
    assert state.checkpoints >= 1 and state.busy == 0
    assert (state.failures, state.failure) == (0, None)
    assert state.log_bytes == (store.db_path.parent / f"{store.db_path.name}-wal").stat().st_size


def test_a_failed_copy_is_counted_said_once_and_cleared_by_the_next(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    checkpointer = store._checkpointer
    conn = sqlite3.connect(store.db_path)
    failing = Failing(conn)
    try:
        with caplog.at_level(logging.WARNING, logger="logsync.store"):
            checkpointer._checkpoint(failing)  # type: ignore[arg-type]
            checkpointer._checkpoint(failing)  # type: ignore[arg-type]
        state = store.log_state()
        assert state.failures == 2 and state.checkpoints == 0
        assert state.failure == (f"copying {store.db_path.name}-wal into the database failed "
                                 "(disk I/O error): the next commit tries again")
        said = [r.getMessage() for r in caplog.records if r.name == "logsync.store"]
        assert said == [state.failure]  # once, however often it fails
        failing.failing = False
        checkpointer._checkpoint(failing)  # type: ignore[arg-type]
        state = store.log_state()
        assert (state.checkpoints, state.failures, state.failure) == (1, 2, None)
        failing.failing = True  # failing again after a copy is said again
        with caplog.at_level(logging.WARNING, logger="logsync.store"):
            checkpointer._checkpoint(failing)  # type: ignore[arg-type]
        said = [r.getMessage() for r in caplog.records if r.name == "logsync.store"]
        assert len(said) == 2 and said[0] == said[1] == store.log_state().failure
    finally:
        conn.close()


@pytest.mark.anyio
async def test_metrics_and_the_status_page_show_the_log_and_its_last_failure(
        store: Store) -> None:  # noqa: F811 - the imported fixture
    with store.bulk_writes():
        write_pages(store, 2)
    assert store.log_copied(30)
    copies = store.log_state().checkpoints
    conn = sqlite3.connect(store.db_path)
    try:
        store._checkpointer._checkpoint(Failing(conn))  # type: ignore[arg-type]
    finally:
        conn.close()
    app = create_app(store, token=TOKEN)
    async with client(app) as c:
        text = (await c.get("/metrics", headers=BEARER)).text
        page = (await c.get("/", headers=BEARER)).text
    state = store.log_state()
    assert metric(text, "logsync_store_log_checkpoints_total") == copies >= 1
    assert metric(text, "logsync_store_log_checkpoint_failures_total") == 1
    assert metric(text, "logsync_store_log_checkpoints_busy_total") == 0
    assert metric(text, "logsync_store_log_bytes") == state.log_bytes > 0
    assert f'<td class="num" id="log-bytes">{state.log_bytes // 1024} KiB</td>' in page
    assert f"{copies} copies beside pulls, 1 failed" in page
    assert "disk I/O error): the next commit tries again</span>" in page
