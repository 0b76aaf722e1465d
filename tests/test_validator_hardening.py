"""One validator (issue 8, findings 1, 2, 6, 13).

The fast path of remote-op validation and the careful path accept exactly the
same inputs: a differential property over generated and mutated ops. Fork
detection compares canonical bytes, so `1`, `true`, `1.0` and `-0.0` are
different content.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import hlc, model, remoteops
from logsync.errors import ValidationError
from logsync.replica import is_replica_id
from tests.conftest import T0_MS, RemoteKit, origin_id

ORIGIN = origin_id(7)
ARABIC_13 = "١٧٨٢٩٦٢٦٨٣٠٠٠"  # 13 Arabic-Indic digits: `\d` matches them, [0-9] does not


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


HOSTILE_VALUES: list[Any] = [
    None, "", " ", "\n", "x\n", "x\r", "a" * 257, "\ud800", "é", 0, -1, 1, 2**62, 2**62 + 1,
    2**63, 2**64 - 1, 1.0, float("nan"), float("inf"), True, False, [], ["x"], {}, {"k": 1},
    f"{ORIGIN}\n", ORIGIN + "0", "evt_1\n", "task.note\n", ARABIC_13,
    f"{ARABIC_13}-000000-{ORIGIN}", "2026-07-02T03:24:43Z\n", "٢٠٢٦-07-02T03:24:43Z",
    {"n": float("nan")}, {1: "int key"}, _nested(64), _nested(65), _nested(990),
    ["art_1", "art_1"], ["art\n"], [1], "open", "applied", "bogus",
]
FIELDS = (*model.EVENT_KEYS, "artifacts")


def _careful(op: Any) -> dict[str, Any] | str:
    try:
        return model.checked_remote_row(op)
    except ValidationError as exc:
        return f"invalid: {exc}"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seq=st.integers(min_value=1, max_value=10**6),
    mutations=st.lists(
        st.tuples(st.sampled_from(FIELDS), st.sampled_from(range(len(HOSTILE_VALUES)))),
        max_size=3,
    ),
    drop=st.lists(st.sampled_from(model.EVENT_KEYS), max_size=2),
)
def test_fast_and_careful_paths_accept_exactly_the_same_ops(
    seq: int, mutations: list[tuple[str, int]], drop: list[str]
) -> None:
    op = RemoteKit.op(ORIGIN, seq, metadata={"approved": True, "n": 1.5})
    for name, index in mutations:
        op[name] = copy.deepcopy(HOSTILE_VALUES[index])
    for name in drop:
        op.pop(name, None)
    fast = remoteops._fast_remote_row(op)
    careful = _careful(op)
    if fast is not None:
        assert careful == fast, "the fast path accepted what the careful path judges otherwise"
    # And the public entry point always agrees with the careful path.
    try:
        public: dict[str, Any] | str = remoteops.validate_remote_event(op)
    except ValidationError as exc:
        public = f"invalid: {exc}"
    assert public == careful
    if isinstance(careful, dict):
        _assert_storable(careful)


def _assert_storable(row: dict[str, Any]) -> None:
    """Whatever validates can be stored, served and validated again by a peer."""
    assert is_replica_id(row["origin_replica"]) and "\n" not in row["origin_replica"]
    assert 1 <= row["origin_seq"] <= model.MAX_SEQ
    assert hlc.parse(row["hlc"]) is not None and row["hlc"].isascii()
    assert row["created_at"].isascii() and row["id"].isascii() and row["type"].isascii()
    served = {k: row.get(k) for k in model.EVENT_KEYS if k != "metadata"}
    served["metadata"] = __import__("json").loads(row["metadata_json"])
    assert remoteops.validate_remote_event(served) == row


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("origin_replica", f"{ORIGIN}\n", "origin_replica"),
        ("id", "evt_20260702T032443_abc\n", "id="),
        ("type", "task.note\n", "type="),
        ("hlc", f"{ARABIC_13}-000000-{ORIGIN}", "hlc="),
        ("created_at", "٢٠٢٦-٠٧-٠٢T03:24:43Z", "created_at="),
        ("origin_seq", 2**63, "origin_seq="),
        ("origin_seq", 2**64 - 1, "origin_seq="),
        ("metadata", _nested(990), "nest at most 64"),
        ("metadata", {"x": float("nan")}, "NaN"),
        ("metadata", {1: "x"}, "keys must be strings"),
    ],
)
def test_each_looseness_is_refused_with_one_sentence(field: str, value: Any, rule: str) -> None:
    op = RemoteKit.op(ORIGIN, 3)
    op[field] = value
    if field == "origin_replica":
        op["hlc"] = op["hlc"].replace(ORIGIN, value)
    assert remoteops._fast_remote_row(op) is None
    with pytest.raises(ValidationError) as caught:
        remoteops.validate_remote_event(op)
    message = str(caught.value)
    assert rule in message and "\n" not in message and len(message) < 300


def test_metadata_at_the_depth_limit_is_accepted() -> None:
    op = RemoteKit.op(ORIGIN, 1, metadata=_nested(model.MAX_METADATA_DEPTH))
    assert remoteops.validate_remote_event(op)["metadata_json"].count("{") == 64


# ── canonical-bytes fork detection (finding 13) ──────────────────────────


@pytest.fixture
def store_factory(make_store: Any) -> Any:
    names = iter(range(10**6))
    return lambda: make_store(f"s{next(names)}")


NUMERIC_TWINS = [
    ({"approved": 1}, {"approved": True}),
    ({"approved": 0}, {"approved": False}),
    ({"n": 1}, {"n": 1.0}),
    ({"n": 0}, {"n": -0.0}),
    ({"n": 0.0}, {"n": -0.0}),
    ({"l": [1, 2]}, {"l": [1.0, 2]}),
    ({"nested": {"a": True}}, {"nested": {"a": 1}}),
]


@pytest.mark.parametrize(("stored", "incoming"), NUMERIC_TWINS)
def test_values_equal_in_python_but_not_in_bytes_are_a_recorded_fork(
    store_factory: Any, stored: dict, incoming: dict
) -> None:
    store = store_factory()
    store.apply_remote([RemoteKit.op(ORIGIN, 1, metadata=stored)])
    result = store.apply_remote([RemoteKit.op(ORIGIN, 1, metadata=incoming)])
    assert (result.duplicates, result.conflicts) == (0, 1)
    conflict = store.list_conflicts()[0]
    assert conflict["kind"] == "fork"
    assert conflict["local"]["metadata"] == stored  # the local copy is never overwritten
    assert [e["metadata"] for e in store.list_events()] == [stored]
    if any(isinstance(v, float) and math.copysign(1, v) < 0 for v in incoming.values()):
        assert "-0.0" in store._read("SELECT remote_json FROM logsync_conflicts")[0][0]


@given(
    meta=st.dictionaries(
        st.text(min_size=1, max_size=4),
        st.one_of(st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False,
                  allow_infinity=False, width=16), st.text(max_size=3)),
        max_size=4,
    )
)
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_same_canonical_bytes_are_duplicates_whatever_the_key_order(
    store_factory: Any, meta: dict
) -> None:
    """Key order on the wire is not content: the authored, stored form is the canonical
    (sorted) JSON, as upstream stores it. Anything else that differs is a fork."""
    store = store_factory()
    store.apply_remote([RemoteKit.op(ORIGIN, 1, metadata=meta)])
    reordered = dict(reversed(list(meta.items())))
    again = store.apply_remote([RemoteKit.op(ORIGIN, 1, metadata=reordered)])
    assert (again.duplicates, again.conflicts) == (1, 0)
    twisted = {k: _twin(v) for k, v in meta.items()}
    if model.metadata_json(twisted) != model.metadata_json(meta):
        forked = store.apply_remote([RemoteKit.op(ORIGIN, 1, metadata=twisted)])
        assert (forked.duplicates, forked.conflicts) == (0, 1)


def _twin(value: Any) -> Any:
    """A value Python calls equal but whose JSON differs, where one exists."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float) and value == 0:
        return -value
    return value


def test_older_writers_spelling_of_the_same_metadata_is_a_duplicate(store_factory: Any) -> None:
    store = store_factory()
    store.apply_remote([RemoteKit.op(ORIGIN, 1, metadata={"b": "é", "a": 1})])
    store._writer.execute(
        "UPDATE events SET metadata_json = ? WHERE origin_seq = 1",
        ('{"b":"\\u00e9","a":1}',),
    )
    again = store.apply_remote([RemoteKit.op(ORIGIN, 1, metadata={"a": 1, "b": "é"})])
    assert (again.duplicates, again.conflicts) == (1, 0)


@pytest.mark.parametrize("seq", [2**62 + 1, 2**63, 2**64 - 1, 10**30])
def test_a_seq_beyond_sqlite_is_quarantined_not_an_overflow(store_factory: Any, seq: int) -> None:
    """Finding 1: the seq reached SQL before validation (OverflowError killed the daemon)."""
    store = store_factory()
    good = origin_id(8)
    page = [RemoteKit.op(ORIGIN, 1), RemoteKit.op(ORIGIN, seq, ms=T0_MS), RemoteKit.op(good, 1)]
    result = store.apply_remote(page)
    assert result.applied == 2 and result.quarantined == 1
    assert store.version_vector() == {ORIGIN: 1, good: 1}
    assert "origin_seq" in store.list_quarantine()[0]["reason"]


def test_deep_metadata_is_quarantined_and_the_quarantine_row_is_storable(
    store_factory: Any,
) -> None:
    """Finding 2: 990-deep metadata raised RecursionError inside the validator."""
    store = store_factory()
    page = [RemoteKit.op(ORIGIN, 1, metadata=_nested(990)), RemoteKit.op(origin_id(8), 1)]
    result = store.apply_remote(page)
    assert (result.applied, result.quarantined) == (1, 1)
    assert store.list_quarantine()[0]["reason"].startswith("metadata=")
