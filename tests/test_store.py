"""The store's local side: upstream shapes, gap-free local seqs, acks, patches,
every list filter and cursor, the long poll, the vector, concurrency across
threads and processes, and migrating a pre-provenance store.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import T0_MS, CountingIds, FakeClock, RemoteKit, held_seqs, iso

from logsync import hlc, model
from logsync.errors import NotFoundError, StoreError, ValidationError
from logsync.store import Store
from logsync.store.waiting import wait_events

# Written out, not imported from logsync: the upstream wire order is the contract.
UPSTREAM_EVENT_KEYS = [
    "id", "seq", "origin_replica", "origin_seq", "hlc", "type", "stream", "room", "topic",
    "from_agent", "to_agent", "correlation_id", "branch", "base_commit", "status",
    "artifact_ids", "body", "created_at", "metadata",
]
UPSTREAM_ARTIFACT_KEYS = [
    "id", "kind", "sha256", "size_bytes", "content", "created_by", "created_at",
    "origin_replica", "metadata",
]
PUT_RECORD_KEYS = ["id", "kind", "sha256", "size_bytes", "created_by", "created_at",
                   "origin_replica"]
GOOD_PATCH = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"


def note(store: Store, **kw: Any) -> dict[str, Any]:
    args = {"type": "task.note", "stream": "proj", "room": "general", "from_agent": "lead"}
    args.update(kw)
    return store.append_event(args.pop("type"), args.pop("stream"), args.pop("room"),
                              args.pop("from_agent"), **args)


# ── shapes ────────────────────────────────────────────────────────────


def test_event_dict_has_the_upstream_key_order_everywhere(store: Store) -> None:
    event = note(store, to_agent="coder", metadata={"b": 1, "a": 2})
    assert list(event) == UPSTREAM_EVENT_KEYS
    assert list(store.get_event(event["id"]) or {}) == UPSTREAM_EVENT_KEYS
    assert [list(e) for e in store.list_events()] == [UPSTREAM_EVENT_KEYS]
    assert [list(e) for e in store.list_ops(store.replica_id)] == [UPSTREAM_EVENT_KEYS]
    assert [list(e) for e in store.iter_events()] == [UPSTREAM_EVENT_KEYS]
    assert event["metadata"] == {"a": 2, "b": 1}
    assert list(model.EVENT_KEYS) == UPSTREAM_EVENT_KEYS


def test_local_event_fields(store: Store, clock: FakeClock) -> None:
    event = note(store, to_agent="coder", body="hello\r\n", status="open", topic="t1",
                 correlation_id="c-1", branch="main", base_commit="abc123")
    assert event == {
        "id": "evt_20260702T032443_000000000001", "seq": 1,
        "origin_replica": store.replica_id, "origin_seq": 1,
        "hlc": hlc.render(clock.ms, 0, store.replica_id),
        "type": "task.note", "stream": "proj", "room": "general", "topic": "t1",
        "from_agent": "lead", "to_agent": "coder", "correlation_id": "c-1", "branch": "main",
        "base_commit": "abc123", "status": "open", "artifact_ids": [], "body": "hello\r\n",
        "created_at": iso(clock.ms), "metadata": {},
    }


def test_artifact_shapes_and_exact_content(store: Store) -> None:
    content = "line one\r\nzwei ✓\n\ttab\n"
    record = store.put_artifact("file", content, "coder", metadata={"path": "a.txt"})
    assert list(record) == PUT_RECORD_KEYS
    assert "content" not in record
    art = store.get_artifact(record["id"])
    assert art is not None
    assert list(art) == UPSTREAM_ARTIFACT_KEYS
    assert art["content"] == content
    assert art["size_bytes"] == len(content.encode("utf-8"))
    assert art["sha256"] == model.sha256_hex(content)
    assert art["metadata"] == {"path": "a.txt"}
    assert art["origin_replica"] == store.replica_id
    assert store.get_artifact("art_unknown") is None
    assert store.missing_artifacts(["art_unknown", record["id"], "art_b"]) == [
        "art_b", "art_unknown",
    ]


def test_artifact_ids_are_sorted_on_every_read(palace: Path, clock: FakeClock) -> None:
    names = iter(["art_c", "art_a", "art_b", "evt_1"])
    with Store.open(palace, wall_ms=clock, new_id=lambda prefix: next(names)) as store:
        for _ in range(3):
            store.put_artifact("note", "x", "lead")
        event = note(store, artifact_ids=["art_c", "art_a", "art_b", "art_a"])
        expected = ["art_a", "art_b", "art_c"]
        assert event["artifact_ids"] == expected
        assert store.get_event("evt_1")["artifact_ids"] == expected  # type: ignore[index]
        assert store.list_events()[0]["artifact_ids"] == expected
        assert store.list_ops(store.replica_id)[0]["artifact_ids"] == expected


# ── local appends: gap-free seqs, HLC, durability ─────────────────────


def test_local_appends_get_gap_free_origin_seqs_and_rising_hlcs(store: Store,
                                                               clock: FakeClock) -> None:
    stamps = []
    for i, step in enumerate([0, 5, -3_600_000, 0, 10, -1]):
        clock.advance(step)
        event = note(store, body=str(i))
        assert (event["origin_seq"], event["seq"]) == (i + 1, i + 1)
        stamps.append(event["hlc"])
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert store.version_vector() == {store.replica_id: 6}
    assert held_seqs(store, store.replica_id) == [1, 2, 3, 4, 5, 6]


def test_local_seq_continues_after_remote_ops_and_reopen(palace: Path, remote: RemoteKit) -> None:
    with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds("a")) as store:
        note(store)
        store.apply_remote(remote.chain(remote.origin(1), 3))
        assert note(store)["origin_seq"] == 2
    with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds("b")) as store:
        assert note(store)["origin_seq"] == 3
        assert held_seqs(store, store.replica_id) == [1, 2, 3]


def test_reopen_with_a_regressed_wall_clock_still_ticks_past_stored_stamps(
    palace: Path, remote: RemoteKit
) -> None:
    with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds("a")) as store:
        last = note(store)["hlc"]
        far = remote.op(remote.origin(1), 1, ms=T0_MS + 30_000)
        store.apply_remote([far])
    earlier = FakeClock(T0_MS - 50_000)
    with Store.open(palace, wall_ms=earlier, new_id=CountingIds("b")) as store:
        nxt = note(store)["hlc"]
    # Our own stamp lies within the 60 s bound of the regressed wall: absorbed.
    assert nxt == hlc.render(T0_MS, 1, store.replica_id)
    assert nxt > last
    # The peer's stamp is 80 s ahead of the regressed wall: stored, not absorbed.
    assert nxt < far["hlc"]


def test_our_own_stamps_are_absorbed_after_a_regression_beyond_the_drift_bound(
    palace: Path,
) -> None:
    """Invariant 7 across a restart: a wall clock 10 minutes back never reorders our ops."""
    with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds("a")) as store:
        last = note(store)["hlc"]
    with Store.open(palace, wall_ms=FakeClock(T0_MS - 600_000), new_id=CountingIds("b")) as store:
        nxt = note(store)["hlc"]
    assert nxt == hlc.render(T0_MS, 1, store.replica_id)
    assert nxt > last


def test_another_process_ticks_are_absorbed_before_each_append(palace: Path) -> None:
    """Two writers on one palace: each append first catches up with the other's stamps."""
    ahead = FakeClock(T0_MS + 5_000)
    with Store.open(palace, wall_ms=ahead, new_id=CountingIds("a")) as first, Store.open(
        palace, wall_ms=FakeClock(), new_id=CountingIds("b")
    ) as second:
        a = note(first)
        b = note(second)
    assert b["hlc"] > a["hlc"] and b["origin_seq"] == a["origin_seq"] + 1


def test_failed_append_leaves_no_trace_and_no_seq_gap(store: Store) -> None:
    note(store)
    with pytest.raises(ValidationError):
        note(store, artifact_ids=["art_missing"])
    assert note(store)["origin_seq"] == 2
    assert store.counts()["events"] == 2


def test_repeated_id_from_the_factory_is_a_store_error(palace: Path) -> None:
    with Store.open(palace, wall_ms=FakeClock(), new_id=lambda prefix: "evt_same") as store:
        note(store)
        with pytest.raises(StoreError, match="event id 'evt_same' already exists"):
            note(store)
        assert store.counts()["events"] == 1
        assert store.version_vector() == {store.replica_id: 1}


# ── ack and patch ─────────────────────────────────────────────────────


def test_ack_is_routed_back_to_the_author_with_its_correlation(store: Store) -> None:
    target = note(store, type="task.request", from_agent="lead", to_agent="coder",
                  correlation_id="job-7", topic="t-9", stream="proj/x", room="tasks")
    ack = store.ack_event(target["id"], "coder", status="claimed", body="on it")
    assert ack["type"] == "event.ack"
    assert (ack["from_agent"], ack["to_agent"]) == ("coder", "lead")
    assert (ack["stream"], ack["room"], ack["topic"]) == ("proj/x", "tasks", "t-9")
    assert ack["correlation_id"] == "job-7"
    assert ack["metadata"] == {"ack_of": target["id"]}
    assert (ack["status"], ack["body"]) == ("claimed", "on it")
    assert ack["origin_seq"] == 2
    assert store.get_event(target["id"]) == target  # the target is never touched


def test_ack_without_correlation_uses_the_target_id_and_topic_can_be_overridden(
    store: Store,
) -> None:
    target = note(store, topic="orig")
    ack = store.ack_event(target["id"], "coder", topic="override")
    assert ack["correlation_id"] == target["id"]
    assert ack["topic"] == "override"
    assert ack["status"] is None and ack["body"] == ""
    assert store.ack_event(target["id"], "b")["topic"] == "orig"


def test_ack_of_an_unknown_or_malformed_id_is_a_clear_error(store: Store) -> None:
    with pytest.raises(NotFoundError, match="^event 'evt_nope' not found$"):
        store.ack_event("evt_nope", "coder")
    with pytest.raises(ValidationError, match="^event_id='bad id' is invalid"):
        store.ack_event("bad id", "coder")
    target = note(store)
    with pytest.raises(ValidationError, match="^status='done' is invalid"):
        store.ack_event(target["id"], "coder", status="done")
    assert store.counts()["events"] == 1


def test_submit_patch_stores_the_artifact_and_its_ready_event(store: Store) -> None:
    result = store.submit_patch(GOOD_PATCH, "coder", "proj", to_agent="lead",
                                correlation_id="job-7", branch="feat", base_commit="abc",
                                body="please review", topic="t")
    assert set(result) == {"artifact", "event"}
    art, event = result["artifact"], result["event"]
    assert "warnings" not in art
    assert event["type"] == "patch.ready" and event["status"] == "ready"
    assert event["room"] == "patches"
    assert event["artifact_ids"] == [art["id"]]
    assert (event["to_agent"], event["correlation_id"], event["branch"], event["base_commit"],
            event["body"], event["topic"]) == ("lead", "job-7", "feat", "abc", "please review", "t")
    assert store.get_artifact(art["id"])["content"] == GOOD_PATCH  # type: ignore[index]


def test_submit_patch_validates_the_event_before_storing_anything(store: Store) -> None:
    with pytest.raises(ValidationError, match="^stream='' is invalid"):
        store.submit_patch(GOOD_PATCH, "coder", "")
    with pytest.raises(ValidationError, match="^content='' is invalid"):
        store.submit_patch("", "coder", "proj")
    assert store.counts() == {"events": 0, "artifacts": 0, "conflicts": 0, "quarantined": 0}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (GOOD_PATCH, []),
        (GOOD_PATCH.rstrip("\n"), ["does not end with a trailing newline"]),
        (GOOD_PATCH.replace("\n", "\r\n"), ["contains carriage returns (CRLF line endings)"]),
        (GOOD_PATCH.replace("\n", "\r\n").rstrip("\n"),
         ["does not end with a trailing newline", "contains carriage returns"]),
    ],
)
def test_patch_warnings_are_advisory_and_content_is_never_altered(
    store: Store, content: str, expected: list[str]
) -> None:
    record = store.put_artifact("patch", content, "coder")
    warnings = record.get("warnings", [])
    assert len(warnings) == len(expected)
    for warning, fragment in zip(warnings, expected, strict=True):
        assert fragment in warning
    assert store.get_artifact(record["id"])["content"] == content  # type: ignore[index]
    submitted = store.submit_patch(content, "coder", "proj")
    assert submitted["artifact"].get("warnings", []) == warnings
    stored = store.get_artifact(submitted["artifact"]["id"])
    assert stored is not None and stored["content"] == content


def test_other_kinds_never_warn(store: Store) -> None:
    for kind in ("file", "log", "json", "note"):
        assert "warnings" not in store.put_artifact(kind, "no newline\r", "coder")


# ── list_events ───────────────────────────────────────────────────────


@pytest.fixture
def varied(store: Store, clock: FakeClock) -> dict[str, dict[str, Any]]:
    """Six events differing in every filterable field."""
    made = {}
    specs = {
        "a": {"stream": "s1", "room": "r1", "type": "task.request", "to_agent": "coder",
              "correlation_id": "c1", "status": "open", "topic": "tp1"},
        "b": {"stream": "s1", "room": "r2", "type": "task.note", "to_agent": "*",
              "from_agent": "coder"},
        "c": {"stream": "s2", "room": "r1", "type": "task.request", "to_agent": "other",
              "correlation_id": "c1", "status": "claimed"},
        "d": {"stream": "s2", "room": "r2", "type": "event.ack", "topic": "tp1",
              "status": "applied"},
        "e": {"stream": "s1", "room": "r1", "type": "task.note", "from_agent": "coder",
              "to_agent": "coder"},
        "f": {"stream": "s1", "room": "r1", "type": "task.note"},
    }
    for name, spec in specs.items():
        clock.advance(1000)
        made[name] = note(store, body=name, **spec)
    return made


def _bodies(events: list[dict[str, Any]]) -> str:
    return "".join(e["body"] for e in events)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, "abcdef"),
        ({"stream": "s1"}, "abef"),
        ({"room": "r2"}, "bd"),
        ({"topic": "tp1"}, "ad"),
        ({"type": "task.request"}, "ac"),
        ({"to_agent": "coder"}, "abe"),  # '*' broadcasts match every agent
        ({"to_agent": "nobody"}, "b"),
        ({"from_agent": "coder"}, "be"),
        ({"correlation_id": "c1"}, "ac"),
        ({"status": "applied"}, "d"),
        ({"stream": "s1", "room": "r1", "type": "task.note"}, "ef"),
        ({"stream": "s3"}, ""),
        ({"stream": "", "room": None}, "abcdef"),  # empty filters are no filter
    ],
)
def test_list_events_filters(store: Store, varied: dict, filters: dict, expected: str) -> None:
    assert _bodies(store.list_events(**filters)) == expected


def test_list_events_since_created_at_is_inclusive(store: Store, varied: dict) -> None:
    assert _bodies(store.list_events(since_created_at=varied["c"]["created_at"])) == "cdef"
    assert _bodies(store.list_events(since_created_at=iso(T0_MS)[:10])) == "abcdef"
    assert _bodies(store.list_events(since_created_at="2099-01-01")) == ""
    with pytest.raises(ValidationError, match="^created_at='last week' is invalid"):
        store.list_events(since_created_at="last week")


def test_list_events_cursors_are_local_seq_not_hlc(store: Store, varied: dict,
                                                   remote: RemoteKit) -> None:
    # remote ops stamped long before our events arrive after them
    store.apply_remote(remote.chain(remote.origin(1), 2, ms=T0_MS - 10**7))
    after_f = store.list_events(since_event_id=varied["f"]["id"])
    assert [e["origin_replica"] for e in after_f] == [remote.origin(1)] * 2
    assert _bodies(store.list_events(since_event_id=varied["b"]["id"], limit=2)) == "cd"
    assert _bodies(store.list_events(before_event_id=varied["c"]["id"])) == "ab"
    assert _bodies(store.list_events(since_event_id=varied["a"]["id"],
                                     before_event_id=varied["d"]["id"])) == "bc"
    assert _bodies(store.list_events(before_event_id=varied["d"]["id"], order="desc")) == "cba"


@pytest.mark.parametrize("name", ["since_event_id", "before_event_id"])
def test_unknown_cursor_is_not_found(store: Store, varied: dict, name: str) -> None:
    with pytest.raises(NotFoundError) as info:
        store.list_events(**{name: "evt_nope"})
    assert str(info.value) == f"{name} 'evt_nope' not found in this replica"


def test_list_events_orders(store: Store, varied: dict, remote: RemoteKit) -> None:
    old = remote.op(remote.origin(1), 1, ms=T0_MS - 10**7, body="R")
    store.apply_remote([old])
    assert _bodies(store.list_events()) == "abcdefR"
    assert _bodies(store.list_events(order="asc")) == "abcdefR"
    assert _bodies(store.list_events(order="desc")) == "Rfedcba"
    assert _bodies(store.list_events(order=" DESC ")) == "Rfedcba"
    assert _bodies(store.list_events(order="hlc")) == "Rabcdef"
    assert _bodies(store.list_events(order="hlc", stream="s1")) == "abef"


@pytest.mark.parametrize("order", ["sideways", "", None, 1, "created_at"])
def test_invalid_order_is_refused(store: Store, order: Any) -> None:
    with pytest.raises(ValidationError) as info:
        store.list_events(order=order)
    assert str(info.value).startswith(f"order={order!r} is invalid: must be asc, desc or hlc")


@pytest.mark.parametrize("limit", [0, -1, "5", 2.5, True, None])
def test_invalid_limit_is_refused(store: Store, limit: Any) -> None:
    with pytest.raises(ValidationError) as info:
        store.list_events(limit=limit)
    assert str(info.value) == f"limit={limit!r} is invalid: must be a positive integer"


def test_limit_defaults_to_50_and_is_capped_at_500(store: Store, remote: RemoteKit) -> None:
    store.apply_remote(remote.chain(remote.origin(1), 520))
    assert len(store.list_events()) == 50
    assert len(store.list_events(limit=500)) == 500
    assert len(store.list_events(limit=10_000)) == 500
    assert len(store.list_events(limit=7)) == 7
    assert store.list_events(limit=1, order="desc")[0]["origin_seq"] == 520


@pytest.mark.parametrize(
    ("filters", "fragment"),
    [
        ({"type": "Bad"}, "type='Bad' is invalid"),
        ({"status": "done"}, "status='done' is invalid"),
        ({"stream": "a\nb"}, "stream='a\\nb' is invalid: must not contain control"),
        ({"to_agent": "x" * 300}, "must be at most 256 characters"),
    ],
)
def test_invalid_filter_values_are_refused(store: Store, filters: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        store.list_events(**filters)
    assert fragment in str(info.value)


def test_latest_event_id_and_counts(store: Store) -> None:
    assert store.latest_event_id() is None
    first = note(store)
    second = note(store)
    assert store.latest_event_id() == second["id"] != first["id"]
    store.put_artifact("note", "n", "lead")
    assert store.counts() == {"events": 2, "artifacts": 1, "conflicts": 0, "quarantined": 0}


# ── wait_events ───────────────────────────────────────────────────────


def test_wait_times_out_with_the_upstream_shape(store: Store) -> None:
    note(store, stream="elsewhere")
    started = time.monotonic()
    result = wait_events(store, timeout_ms=150, stream="proj")
    elapsed = time.monotonic() - started
    assert result == {"timed_out": True, "events": []}
    assert 0.14 <= elapsed < 2.0


def test_wait_returns_at_once_when_events_match(store: Store) -> None:
    event = note(store)
    started = time.monotonic()
    result = wait_events(store, timeout_ms=5_000, stream="proj")
    assert time.monotonic() - started < 1.0
    assert result["timed_out"] is False
    assert [e["id"] for e in result["events"]] == [event["id"]]


def test_wait_wakes_when_another_thread_appends(palace: Path) -> None:
    with Store.open(palace) as waiter:
        anchor = note(waiter)

        def later() -> None:
            time.sleep(0.3)
            with Store.open(palace) as writer:
                note(writer, to_agent="coder", body="wake")

        thread = threading.Thread(target=later)
        started = time.monotonic()
        thread.start()
        result = wait_events(waiter, timeout_ms=10_000, since_event_id=anchor["id"],
                             to_agent="coder")
        elapsed = time.monotonic() - started
        thread.join(timeout=10)
    assert result["timed_out"] is False
    assert [e["body"] for e in result["events"]] == ["wake"]
    assert 0.25 <= elapsed < 5.0


@pytest.mark.parametrize("timeout", [-1, "10", True, None])
def test_wait_refuses_a_bad_timeout(store: Store, timeout: Any) -> None:
    with pytest.raises(ValidationError) as info:
        wait_events(store, timeout_ms=timeout)
    assert str(info.value) == (
        f"timeout_ms={timeout!r} is invalid: must be a non-negative number"
    )


def test_wait_with_an_unknown_cursor_fails_at_once(store: Store) -> None:
    with pytest.raises(NotFoundError, match="since_event_id 'evt_nope' not found"):
        wait_events(store, timeout_ms=5_000, since_event_id="evt_nope")


# ── vector and list_ops ───────────────────────────────────────────────


def test_version_vector_and_list_ops(store: Store, remote: RemoteKit) -> None:
    assert store.version_vector() == {}
    one, two = remote.origin(1), remote.origin(2)
    store.apply_remote(remote.chain(one, 5) + remote.chain(two, 2))
    note(store)
    assert store.version_vector() == {one: 5, two: 2, store.replica_id: 1}
    assert [e["origin_seq"] for e in store.list_ops(one)] == [1, 2, 3, 4, 5]
    assert [e["origin_seq"] for e in store.list_ops(one, after=2, limit=2)] == [3, 4]
    assert [e["origin_seq"] for e in store.list_ops(one, after=1, limit=99, max_limit=3)] == [
        2, 3, 4,
    ]
    assert store.list_ops(one, after=5) == []
    assert store.list_ops(remote.origin(3)) == []
    assert all(e["origin_replica"] == two for e in store.list_ops(two))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"after": -1}, "after=-1 is invalid: must be a non-negative integer"),
        ({"after": "3"}, "after='3' is invalid: must be a non-negative integer"),
        ({"limit": 0}, "limit=0 is invalid: must be a positive integer"),
        ({"limit": True}, "limit=True is invalid: must be a positive integer"),
    ],
)
def test_list_ops_refuses_bad_arguments(store: Store, kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        store.list_ops(store.replica_id, **kwargs)
    assert str(info.value) == message


# ── concurrency ───────────────────────────────────────────────────────


def _assert_gap_free_with_rising_hlcs(store: Store, count: int) -> None:
    ops = []
    after = 0
    while page := store.list_ops(store.replica_id, after=after):
        ops.extend(page)
        after = page[-1]["origin_seq"]
    assert [e["origin_seq"] for e in ops] == list(range(1, count + 1))
    stamps = [e["hlc"] for e in ops]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False)), "HLC not rising"
    assert len({e["id"] for e in ops}) == count


def test_many_threads_appending_to_one_store(palace: Path) -> None:
    with Store.open(palace) as store:
        errors: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                for i in range(20):
                    note(store, body=f"{n}-{i}")
            except BaseException as exc:  # asserted below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        _assert_gap_free_with_rising_hlcs(store, 160)


def test_threads_with_their_own_store_objects_on_one_palace(palace: Path) -> None:
    Store.open(palace).close()  # mint the replica id first
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            with Store.open(palace) as own:
                for i in range(15):
                    note(own, body=f"{n}-{i}")
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    with Store.open(palace) as store:
        _assert_gap_free_with_rising_hlcs(store, 60)


def _append_in_child(palace: str, count: int, start: Any) -> None:
    start.wait()
    with Store.open(palace) as store:
        for i in range(count):
            note(store, body=f"child-{i}")


def test_two_processes_appending_to_one_palace(palace: Path) -> None:
    Store.open(palace).close()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_append_in_child, args=(str(palace), 60, start))
             for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    with Store.open(palace) as store:
        _assert_gap_free_with_rising_hlcs(store, 120)
        assert store.counts()["events"] == 120


# ── opening old and broken stores ─────────────────────────────────────

OLD_SCHEMA = """
CREATE TABLE events (
    id TEXT PRIMARY KEY, type TEXT NOT NULL, stream TEXT NOT NULL, room TEXT NOT NULL,
    from_agent TEXT NOT NULL, to_agent TEXT, correlation_id TEXT, branch TEXT,
    base_commit TEXT, status TEXT, body TEXT NOT NULL DEFAULT '', created_at TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE artifacts (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, sha256 TEXT NOT NULL, size_bytes INTEGER NOT NULL,
    content TEXT NOT NULL, created_by TEXT NOT NULL, created_at TEXT NOT NULL,
    metadata_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE event_artifacts (
    event_id TEXT NOT NULL, artifact_id TEXT NOT NULL, PRIMARY KEY (event_id, artifact_id)
);
"""


def _write_old_store(palace: Path) -> None:
    palace.mkdir(parents=True)
    conn = sqlite3.connect(palace / "logstream.sqlite3")
    conn.executescript(OLD_SCHEMA)
    content = "old patch\n"
    conn.execute(
        "INSERT INTO artifacts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ("art_old", "patch", model.sha256_hex(content), len(content), content, "lead",
         "2025-01-01T00:00:00Z", "{}"),
    )
    for i in range(1, 4):
        conn.execute(
            "INSERT INTO events (id, type, stream, room, from_agent, body, created_at, "
            "metadata_json) VALUES (?, 'task.note', 'proj', 'general', 'lead', ?, ?, '{\"i\": 1}')",
            (f"evt_old_{i}", f"old {i}", f"2025-01-01T00:00:0{i}Z"),
        )
    conn.execute("INSERT INTO event_artifacts VALUES ('evt_old_2', 'art_old')")
    conn.commit()
    conn.close()


def test_old_schema_store_is_migrated_and_backfilled_as_ours(palace: Path) -> None:
    _write_old_store(palace)
    with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds()) as store:
        me = store.replica_id
        events = store.list_events()
        assert [list(e) for e in events] == [UPSTREAM_EVENT_KEYS] * 3
        assert [(e["id"], e["origin_replica"], e["origin_seq"], e["topic"]) for e in events] == [
            (f"evt_old_{i}", me, i, None) for i in (1, 2, 3)
        ]
        stamps = [hlc.parse(e["hlc"]) for e in events]
        assert all(s is not None and s.replica_id == me for s in stamps)
        assert [e["hlc"] for e in events] == sorted(e["hlc"] for e in events)
        assert events[1]["artifact_ids"] == ["art_old"]
        assert store.get_artifact("art_old")["origin_replica"] == me  # type: ignore[index]
        assert store.version_vector() == {me: 3}
        fresh = note(store)
        assert fresh["origin_seq"] == 4
        assert fresh["hlc"] > events[-1]["hlc"]
    conn = sqlite3.connect(palace / "logstream.sqlite3")
    index = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'events_origin_seq_idx'"
    ).fetchone()
    conn.close()
    assert index is not None and "UNIQUE" in index[0]


def test_migration_is_idempotent_across_reopens(palace: Path) -> None:
    _write_old_store(palace)
    with Store.open(palace) as store:
        first = [(e["origin_seq"], e["hlc"]) for e in store.list_events()]
    with Store.open(palace) as store:
        assert [(e["origin_seq"], e["hlc"]) for e in store.list_events()] == first


def test_a_file_that_is_not_sqlite_is_a_store_error(palace: Path) -> None:
    palace.mkdir()
    (palace / "logstream.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="^cannot open .*logstream.sqlite3: "):
        Store.open(palace)


def test_a_palace_path_that_is_a_file_is_a_store_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(StoreError, match="^cannot create palace directory"):
        Store.open(target)


def test_list_ops_refuses_an_after_beyond_sqlite_integers(store: Store) -> None:
    """A hostile `after` must be a clear 400-style error, never an OverflowError (a 500)."""
    with pytest.raises(ValidationError, match=r"after=\d+ is invalid: .* below 2\*\*63"):
        store.list_ops(store.replica_id, 2**70)
    assert store.list_ops(store.replica_id, 2**63 - 1) == []


def test_applied_stamps_are_observed_by_the_local_clock(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    """Invariant 7: a remote op stamped ahead of our wall clock (within the drift bound)
    must be followed by a local tick above it, or the merged timeline puts our later event
    first. (One rule: the next local tick absorbs the newest stored stamp; the separate
    observe in `apply_remote` was an equivalent copy, a surviving mutant, and is gone.)"""
    origin = remote.origin(9)
    ahead = clock.ms + 30_000
    store.apply_remote([remote.op(origin, 1, ms=ahead)])
    mine = store.append_event("task.note", "proj", "general", "lead")
    assert mine["hlc"] > f"{ahead:013d}"
