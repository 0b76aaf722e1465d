"""Each rule of `streamframes.py` on its own, where mutation testing found it unguarded:
what a write names when its page cannot carry everything, the parsers' bounds, a paused
store taking nothing, and a refused frame always pulled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from logsync import streamframes
from logsync.model import MAX_SEQ
from logsync.outbox import Write
from logsync.responder import push_page
from logsync.store import Store
from logsync.streamframes import (
    MAX_OWED,
    PAGE_FRAME_OPS,
    parse_page_frame,
    parse_tops,
    take_pages,
    write_parts,
)

ORIGIN = "rep_" + "1" * 32


def _append(store: Store, n: int) -> None:
    for i in range(n):
        store.append_event("task.request", "s", "r", "a@b", body=f"op {i}")


# ── what a write sends ────────────────────────────────────────────────


def test_a_page_that_stops_short_of_the_top_names_the_rest(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as pub:
        _append(pub, PAGE_FRAME_OPS + 4)
        me = pub.replica_id
        bodies, named = write_parts(pub, Write(pages={me: (0, PAGE_FRAME_OPS + 4)}), me)
        assert len(bodies) == 1
        assert json.loads(bodies[0])["events"][-1]["origin_seq"] == PAGE_FRAME_OPS
        assert named == {me: PAGE_FRAME_OPS + 4}  # the subscriber pulls what is past it
        bodies, named = write_parts(pub, Write(pages={me: (0, 3)}), me)
        assert len(bodies) == 1 and named == {}  # a page that reaches the top: not named


def test_an_origin_that_cannot_be_encoded_does_not_silence_the_next(tmp_path: Path,
                                                                   monkeypatch: Any) -> None:
    with Store.open(tmp_path / "a") as first, Store.open(tmp_path / "b") as second:
        _append(first, 2)
        _append(second, 2)
        for op in first.list_ops(first.replica_id, 0, 2):  # one store holds both origins
            second.apply_remote([op], [])
        real = streamframes.push_page

        def refuse_first(store: Any, origin: str, *args: Any) -> Any:
            if origin == first.replica_id:
                raise ValueError("nests too deeply to encode")
            return real(store, origin, *args)

        monkeypatch.setattr(streamframes, "push_page", refuse_first)
        write = Write(pages={first.replica_id: (0, 2), second.replica_id: (0, 2)})
        bodies, named = write_parts(second, write, second.replica_id)
        assert named == {first.replica_id: 2}
        assert [json.loads(b)["origin"] for b in bodies] == [second.replica_id]


def test_an_incomplete_page_is_named_not_sent(tmp_path: Path, monkeypatch: Any) -> None:
    with Store.open(tmp_path / "p") as pub:
        _append(pub, 3)
        me = pub.replica_id
        real = streamframes.push_page

        def incomplete(*args: Any) -> Any:
            page = real(*args)
            return type(page)(page.body, page.count, page.last_seq, False)

        monkeypatch.setattr(streamframes, "push_page", incomplete)
        bodies, named = write_parts(pub, Write(pages={me: (0, 3)}), me)
        assert bodies == [] and named == {me: 3}


# ── the parsers' bounds ───────────────────────────────────────────────


@pytest.mark.parametrize(("data", "want"), [
    (json.dumps({"tops": {ORIGIN: 1}}), ({ORIGIN: 1}, False)),
    (json.dumps({"tops": {ORIGIN: MAX_SEQ}, "more": True}), ({ORIGIN: MAX_SEQ}, True)),
    (json.dumps({"tops": {ORIGIN: 3}, "more": 1}), ({ORIGIN: 3}, False)),  # only true
    (json.dumps({"tops": {ORIGIN: 0}}), None),
    (json.dumps({"tops": {ORIGIN: MAX_SEQ + 1}}), None),
    (json.dumps({"tops": {ORIGIN: True}}), None),
    (json.dumps({"no tops": 1}), None),
    (json.dumps({"tops": [ORIGIN]}), None),
    (json.dumps({"tops": {f"rep_{i:032x}": 1 for i in range(MAX_OWED + 1)}}), None),
    ("{not json", None),
    ("[" * 100_000 + "]" * 100_000, None),  # nested past the stack
])
def test_a_tops_frame_is_taken_only_within_its_bounds(data: str, want: Any) -> None:
    assert parse_tops(data) == want


def test_a_tops_frame_of_max_owed_origins_is_taken() -> None:
    tops = {f"rep_{i:032x}": 1 for i in range(MAX_OWED)}
    assert parse_tops(json.dumps({"tops": tops})) == (tops, False)


def _frame(last: Any, *, before: Any = None) -> str:
    events = ([before] if before is not None else []) + [{"origin_seq": last}]
    return json.dumps({"origin": ORIGIN, "events": events})


@pytest.mark.parametrize(("data", "last"), [
    (_frame(1), 1), (_frame(MAX_SEQ), MAX_SEQ), (_frame(0), None),
    (_frame(MAX_SEQ + 1), None), (_frame(True), None), (_frame("3"), None),
    (json.dumps({"origin": ORIGIN, "events": [{"origin_seq": 1}, "not an op"]}), None),
    (json.dumps({"origin": ORIGIN, "events": []}), None),
    (json.dumps({"origin": "nobody", "events": [{"origin_seq": 1}]}), None),
    ("[" * 100_000 + "]" * 100_000, None),
])
def test_a_page_frame_names_its_last_seq_only_within_bounds(data: str, last: Any) -> None:
    frame = parse_page_frame(data)
    assert (frame.last if frame is not None else None) == last


# ── taking frames ─────────────────────────────────────────────────────


def test_a_paused_store_takes_no_frame_and_pulls_each(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub:
        _append(pub, 2)
        me = pub.replica_id
        pages = [push_page(pub, me, 0, 1, 1 << 20, me).body,
                 push_page(pub, me, 1, 1, 1 << 20, me).body]
        noted: list = []
        took = take_pages(sub, pages, me, paused=True, served=noted.append)
        assert [t.pull for t in took] == [(me, 1), (me, 2)]
        assert sub.version_vector() == {} and noted == []
        took = take_pages(sub, pages, me, served=noted.append)  # unpaused: taken
        assert [t.applied for t in took] == [1, 1] and noted == [{me: 2}]


@pytest.mark.parametrize("refusal", ["an invalid op", "no chain"])
def test_a_refused_first_op_is_pulled(tmp_path: Path, refusal: str) -> None:
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub:
        _append(pub, 1)
        me = pub.replica_id
        body = json.loads(push_page(pub, me, 0, 1, 1 << 20, me).body)
        if refusal == "an invalid op":  # the apply quarantines it
            body["events"][0]["type"] = "NOT A TYPE"
        else:  # the push path refuses the page before anything is applied
            body["chain"] = "none"
        (took,) = take_pages(sub, [json.dumps(body)], me)
        assert took.applied == 0 and took.pull == (me, 1)
        assert sub.version_vector() == {}


def test_a_frame_below_what_we_hold_asks_for_nothing(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub:
        _append(pub, 3)
        me = pub.replica_id
        sub.apply_remote(pub.list_ops(me, 0, 3), [])
        (took,) = take_pages(sub, [push_page(pub, me, 0, 1, 1 << 20, me).body], me)
        assert took.pull is None and took.applied == 0
