"""The caller's `meanwhile` work during a snapshot join (`join_if_empty`): run once, on a
thread beside the checks, and never deciding the join (RFC 004 §9.6 checks unchanged)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_snapshot import FakePeer, build, content

from logsync.peers import Peer
from logsync.snapshot.joining import join_if_empty
from logsync.store import Store


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Store]:
    store = build(tmp_path / "source", 60, patches=2)
    yield store
    store.close()


@pytest.fixture
def peer(source: Store) -> Iterator[FakePeer]:
    fake = FakePeer(source)
    yield fake
    fake.server.close()


def test_meanwhile_runs_once_beside_the_checks(source: Store, peer: FakePeer,
                                               tmp_path: Path) -> None:
    threads: list[str] = []
    joiner = tmp_path / "joiner"
    joined = join_if_empty(joiner, [Peer(url=peer.server.url)],
                           meanwhile=lambda: threads.append(threading.current_thread().name))
    assert joined is not None
    assert len(threads) == 1 and threads[0].startswith("snapshot-check")
    assert content(joiner) == content(source.palace)


def test_a_failing_meanwhile_does_not_decide_the_join(source: Store, peer: FakePeer,
                                                      tmp_path: Path) -> None:
    def fails() -> None:
        raise RuntimeError("not the join's business")

    said: list[str] = []
    joiner = tmp_path / "joiner"
    joined = join_if_empty(joiner, [Peer(url=peer.server.url)], say=said.append,
                           meanwhile=fails)
    assert joined is not None and said == []
    assert content(joiner) == content(source.palace)


def test_meanwhile_does_not_run_when_no_snapshot_is_taken(source: Store, peer: FakePeer,
                                                          tmp_path: Path) -> None:
    ran: list[bool] = []
    peer.advertise = False  # a MemPalace hub: nothing to join from
    assert join_if_empty(tmp_path / "joiner", [Peer(url=peer.server.url)],
                         meanwhile=lambda: ran.append(True)) is None
    assert ran == []
