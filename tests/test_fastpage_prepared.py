"""The fast path's checks (`store/fastpage.py`, `chainreads._fast_apply`) one by one, each
on the page that needs it and checked by planting its removal: the hypothesis test of
`tests/test_fastpage.py` draws these pages too rarely to catch any of those plants (a
page whose op reuses a held id on an origin whose key is unknown; a page prepared ahead
that meets a changed store or other events; two artifacts under one id)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from logsync import model
from logsync.store import Store
from tests.test_fastpage import DEFECTS, apply, dump, reference_only, replica, served
from tests.test_fastpage import author as _author  # noqa: F401 - the `author` fixture


@pytest.fixture(scope="module")
def origin(_author: Store) -> Store:  # noqa: F811 - the imported fixture
    """`tests/test_fastpage.py`'s signed origin: 40 ops, every fifth naming an artifact."""
    return _author


def _both(tmp_path: Path, origin: Store, pinned: bool = False) -> tuple[Store, Store]:
    return (replica(tmp_path, "fast", origin, pinned=pinned),
            replica(tmp_path, "slow", origin, pinned=pinned))


def _other_content(artifact: dict) -> dict:
    """Another valid artifact under the same id."""
    other = dict(artifact, content=artifact["content"] + "other\n")
    other["sha256"] = model.sha256_hex(other["content"])
    other["size_bytes"] = len(other["content"].encode())
    return other


def test_an_op_reusing_a_held_id_is_judged_by_the_reference(origin, tmp_path):
    """Ops 6..8 of an origin whose key we do not know, op 7 under op 1's id: the
    reference stores op 6 and records an id collision. Planted defect: `fresh` without
    its held-id check -> the page is inserted whole (a primary key violation)."""
    fast, slow = _both(tmp_path, origin)
    with reference_only():
        for store in (fast, slow):
            apply(store, served(origin, 0, 5), chained=True)
    page = served(origin, 5, 3)
    page["events"][1]["id"] = origin.list_ops(origin.replica_id, 0, 1)[0]["id"]
    got = apply(fast, copy.deepcopy(page), chained=True)
    with reference_only():
        want = apply(slow, copy.deepcopy(page), chained=True)
    assert (want.applied, want.conflicts) == (1, 1)
    assert got == want and dump(fast) == dump(slow)


def test_a_page_prepared_before_another_artifact_took_its_id(origin, tmp_path):
    """Prepared while the artifact op 1 names was not held (its sha from the page); then
    another artifact under that id is stored. The reference chains op 1 over the held
    artifact (and records the page's as a conflict). Planted defect: `fresh` without its
    sha check -> the prepared chain digests are written."""
    fast, slow = _both(tmp_path, origin)
    page = served(origin, 0, 5)
    prepared = fast.prepare_chained(page["events"], page["artifacts"], page["origin"], 0,
                                    page["prev"], page["signatures"])
    assert prepared is not None
    for store in (fast, slow):
        store.apply_remote([], [_other_content(page["artifacts"][0])])
    got = fast.apply_chained(page["events"], page["artifacts"], page["origin"], 0,
                             page["prev"], page["signatures"], prepared=prepared)
    with reference_only():
        want = apply(slow, copy.deepcopy(page), chained=True)
    assert want.conflicts == 1
    assert got == want and dump(fast) == dump(slow)


def test_a_page_prepared_before_its_origins_key_was_pinned_is_verified(origin, tmp_path):
    """Prepared while the origin's key was unknown (no signature checked), with an op
    altered; the key is pinned before the apply. Planted defect: `_fast_apply` not
    comparing the prepared key with the one held -> the forgery is stored."""
    store = replica(tmp_path, "r", origin, pinned=False)
    page = served(origin, 0, 10)
    DEFECTS["body altered"](page, 3)
    prepared = store.prepare_chained(page["events"], page["artifacts"], page["origin"], 0,
                                     page["prev"], page["signatures"])
    assert prepared is not None and prepared.key is None
    store.pin_keys({origin.replica_id: origin.public_key}, "peer")
    result = store.apply_chained(page["events"], page["artifacts"], page["origin"], 0,
                                 page["prev"], page["signatures"], prepared=prepared)
    assert (result.applied, result.quarantined) == (0, 1)
    assert store.version_vector() == {}


def test_a_page_prepared_for_other_events_of_the_same_place_is_not_written(origin, tmp_path):
    """Prepared from ops 1..4; the page applied is ops 1..2 (the same origin, `after`,
    `prev` and artifacts). Planted defect: `_fast_apply` without its `events is` check
    -> the four prepared rows are written."""
    store = replica(tmp_path, "r", origin, pinned=False)
    four, two = served(origin, 0, 4), served(origin, 0, 2)
    prepared = store.prepare_chained(four["events"], four["artifacts"], four["origin"], 0,
                                     four["prev"], four["signatures"])
    assert prepared is not None and prepared.last == 4
    result = store.apply_chained(two["events"], two["artifacts"], two["origin"], 0,
                                 two["prev"], two["signatures"], prepared=prepared)
    assert result.applied == 2 and store.version_vector() == {origin.replica_id: 2}


def test_two_artifacts_under_one_id_are_taken_as_the_reference_takes_them(origin, tmp_path):
    """A page (ops 2..4, naming none) carrying two valid artifacts under one id: the
    reference keeps the first. Planted defect: `carried_artifacts` without its count
    check -> the fast path stores the last."""
    fast, slow = _both(tmp_path, origin)
    with reference_only():
        for store in (fast, slow):
            apply(store, served(origin, 0, 1), chained=True)
    page = served(origin, 1, 3)
    first = served(origin, 0, 1)["artifacts"][0]
    first = dict(first, id="art_carried_twice")
    page["artifacts"] = [first, _other_content(first)]
    got = apply(fast, copy.deepcopy(page), chained=True)
    with reference_only():
        want = apply(slow, copy.deepcopy(page), chained=True)
    assert got == want and dump(fast) == dump(slow)
    assert slow.get_artifact("art_carried_twice")["content"] == first["content"]
