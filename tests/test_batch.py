"""One transaction per stream write (`Store.batch`, `streamframes.take_pages`): the
pages of a write end exactly as if taken one by one, in one transaction whose reads see
its own writes and whose failure commits nothing."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import streamframes
from logsync.responder import push_page
from logsync.store import Store, chainreads
from logsync.store.transactions import Transactions


def _append(store: Store, n: int) -> None:
    for i in range(n):
        store.append_event("task.request", "s", "r", "a@b", body=f"op {i}")


def _page(store: Store, after: int, limit: int, sender: str | None = None) -> bytes:
    return push_page(store, store.replica_id, after, limit, 1 << 20,
                     sender or store.replica_id).body


def _begins(store: Store) -> list[str]:
    begun: list[str] = []
    store._writer.set_trace_callback(
        lambda sql: begun.append(sql) if sql.startswith(("BEGIN", "SAVEPOINT")) else None)
    return begun


def _held(store: Store) -> list[tuple]:
    return [(e["origin_replica"], e["origin_seq"], e["id"]) for e in store.iter_events()]


def test_a_write_of_pages_is_one_transaction_whose_reads_see_its_writes(tmp_path) -> None:
    """Three consecutive pages of one origin in one write: the second and third read the
    top the first wrote (inside the batch), so nothing is left to pull."""
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub:
        _append(pub, 6)
        pages = [_page(pub, 0, 2), _page(pub, 2, 2), _page(pub, 4, 2)]
        begun = _begins(sub)
        noted: list = []  # each page noted before any apply, never while the writer is held
        taken = streamframes.take_pages(sub, pages, pub.replica_id, served=lambda held: (
            noted.append((held, sub._batch_thread, sub.version_vector()))))
        assert [(t.pull, t.applied) for t in taken] == [(None, 2)] * 3
        assert noted == [({pub.replica_id: 6}, None, {})]  # once for the write
        assert begun == ["BEGIN IMMEDIATE"]
        assert sub.version_vector() == {pub.replica_id: 6}


def test_the_batch_reads_inside_it_are_what_the_planted_defect_breaks(tmp_path,
                                                                      monkeypatch) -> None:
    """Planted defect: reads inside a batch through the thread's reader connection see
    the committed store only, so the second page looks like a gap and is pulled."""
    def stale_reader(self):  # type: ignore[no-untyped-def]
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    monkeypatch.setattr(Transactions, "_reader", stale_reader)
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub:
        _append(pub, 4)
        taken = streamframes.take_pages(sub, [_page(pub, 0, 2), _page(pub, 2, 2)],
                                        pub.replica_id)
        assert taken[1].applied == 0 and taken[1].pull == (pub.replica_id, 4)


def test_a_write_that_fails_inside_a_batch_commits_none_of_it(tmp_path, monkeypatch) -> None:
    """A failure in the second page's apply (a bug, a store fault) rolls the first back
    too, and the batch raises it even when a caller inside swallowed it; the store is
    usable afterwards and other threads never saw the uncommitted page."""
    real = chainreads.apply_prepared
    calls: list[int] = []
    seen_elsewhere: list[dict] = []

    def failing(conn, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("planted failure")
        return real(conn, *args, **kwargs)

    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub, \
            Store.open(tmp_path / "o") as other:
        _append(pub, 4)
        _append(other, 2)
        # a third page of another origin, relayed by pub: after a swallowed failure its
        # write must not go in on its own
        pages = [_page(pub, 0, 2), _page(pub, 2, 2), _page(other, 0, 2, pub.replica_id)]
        monkeypatch.setattr("logsync.store.chainreads.apply_prepared", failing)
        with pytest.raises(RuntimeError, match="planted failure"):
            streamframes.take_pages(sub, pages, pub.replica_id)
        assert sub.version_vector() == {}

        calls.clear()

        def swallowing(effect):  # type: ignore[no-untyped-def]
            from logsync.effects import perform
            from logsync.store.apply import ApplyResult
            reader = threading.Thread(target=lambda: seen_elsewhere.append(
                sub.version_vector()))
            reader.start()
            reader.join()
            try:
                return perform(sub, effect)
            except RuntimeError:
                return ApplyResult()  # a caller inside the batch that swallows the failure

        with pytest.raises(RuntimeError, match="planted failure"):
            streamframes.take_pages(sub, pages, pub.replica_id, perform=swallowing)
        assert sub.version_vector() == {}
        # other threads never saw the batch's uncommitted page
        assert seen_elsewhere and all(v == {} for v in seen_elsewhere)

        monkeypatch.setattr("logsync.store.chainreads.apply_prepared", real)
        taken = streamframes.take_pages(sub, pages, pub.replica_id)
        assert [t.applied for t in taken] == [2, 2, 2]
        assert sub.version_vector() == {pub.replica_id: 4, other.replica_id: 2}


def test_a_local_append_never_waits_inside_a_batch(tmp_path) -> None:
    with Store.open(tmp_path / "s") as sub:
        with pytest.raises(RuntimeError, match="durable write inside a batch"), sub.batch():
            _append(sub, 1)
        assert sub.version_vector() == {}
        _append(sub, 1)  # the writer is free again
        assert sub.version_vector() == {sub.replica_id: 1}


# Each page: (origin index, after, limit, sender index or None for the origin itself,
# garbled). Origins 0 and 1 hold 8 ops each; a stranger's `from` or garbage is refused.
PAGE = st.tuples(st.integers(0, 1), st.integers(0, 8), st.integers(1, 4),
                 st.sampled_from([None, 2]), st.booleans())


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PAGE, min_size=1, max_size=8))
def test_taking_a_write_together_ends_as_taking_its_pages_one_by_one(tmp_path_factory,
                                                                     specs) -> None:
    """Invariant: whatever the pages of a write (in order, out of order, repeated,
    overlapping, from a stranger, garbled), one transaction ends with the same store and
    the same answers as one transaction per page."""
    root = tmp_path_factory.mktemp("batch")
    with Store.open(root / "a") as a, Store.open(root / "b") as b, \
            Store.open(root / "together") as together, Store.open(root / "alone") as alone:
        _append(a, 8)
        _append(b, 8)
        origins, stranger = [a, b], "rep_" + "e" * 32
        publisher = a.replica_id
        pages = []
        for index, after, limit, sender, garbled in specs:
            origin = origins[index]
            if after >= 8:
                pages.append(b"{not json" if garbled else b'{"origin": 1}')
                continue
            body = _page(origin, after, limit, stranger if sender else publisher)
            pages.append(body[:-3] if garbled else body)
        both = streamframes.take_pages(together, pages, publisher)
        each = [streamframes.take_page(alone, page, publisher) for page in pages]
        assert [(t.pull, t.applied) for t in both] == [(t.pull, t.applied) for t in each]
        assert _held(together) == _held(alone)
        assert together.version_vector() == alone.version_vector()


def test_an_inner_batch_ends_by_raising_a_failure_and_none_outlives_the_batch(tmp_path) -> None:
    """A batch inside a batch (re-entrant) raises a swallowed failure where it ends, so
    nothing inside it counts as applied; the failure is not kept past the outer batch."""
    with Store.open(tmp_path / "s") as sub:
        with pytest.raises(RuntimeError, match="planted"), sub.batch():
            with pytest.raises(RuntimeError, match="planted"), sub.batch():
                try:
                    with sub._atomic(durable=False):
                        raise RuntimeError("planted")
                except RuntimeError:
                    pass  # swallowed inside
        assert sub._batch_failure is None and sub._batch_thread is None
        with sub.batch():  # the next batch starts clean
            pass


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2**64) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=12)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.binary(max_size=64),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.sampled_from(["origin", "after", "from", "events", "chain", "count"]),
              JSONISH),
), min_size=1, max_size=6))
def test_a_hostile_write_never_raises_and_stores_only_valid_pages(tmp_path_factory,
                                                                   frames) -> None:
    """Invariant 9: whatever a peer's stream writes (bytes, any JSON, a real page with one
    field replaced), taking it raises nothing (so it can never pause our pulls as a store
    fault does) and stores nothing but the real pages' ops."""
    root = tmp_path_factory.mktemp("hostile")
    with Store.open(root / "p") as pub, Store.open(root / "s") as sub:
        _append(pub, 3)
        real = json.loads(_page(pub, 0, 3))
        pages = []
        for frame in frames:
            if isinstance(frame, tuple):
                field, value = frame
                pages.append(json.dumps({**real, field: value}).encode())
            else:
                pages.append(frame)
        pages.append(_page(pub, 0, 3))  # a real page after the hostile ones still goes in
        taken = streamframes.take_pages(sub, pages, pub.replica_id)
        assert len(taken) == len(pages)
        assert sub.version_vector() == {pub.replica_id: 3}
        assert _held(sub) == _held(pub)
