"""Shared fixtures for the foundation tests (issue 2).

Everything non-deterministic is pinned: the wall clock is a `FakeClock` the
test moves by hand, ids come from a counter, remote ops are built by
`RemoteKit` with valid provenance so a test only spells out what it breaks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from logsync.store import Store

# A per-example deadline (hypothesis' default: 200 ms) fails a test on a descheduled
# process or a garbage-collection pause, not on a defect; pytest's timeout bounds a test.
settings.register_profile("logsync", deadline=None)
settings.load_profile("logsync")

# 2026-07-02T03:24:43Z, the RFC's example instant.
T0_MS = 1_782_962_683_000


class FakeClock:
    """An injected wall clock (unix ms) that only moves when told to."""

    def __init__(self, ms: int = T0_MS) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, delta_ms: int) -> None:
        self.ms += delta_ms


class CountingIds:
    """Deterministic, upstream-shaped ids: `evt_20260702T032443_000000000001`."""

    def __init__(self, tag: str = "0") -> None:
        self._n = 0
        self._tag = tag
        self._lock = threading.Lock()

    def __call__(self, prefix: str) -> str:
        with self._lock:
            self._n += 1
            return f"{prefix}_20260702T032443_{self._tag}{self._n:011d}"


def origin_id(n: int) -> str:
    """A well-formed 32-hex replica id, distinct per n."""
    return f"rep_{n:032x}"


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RemoteKit:
    """Builds valid remote ops and artifacts in the upstream wire shape."""

    origin = staticmethod(origin_id)

    @staticmethod
    def op(origin: str, seq: int, *, ms: int | None = None, counter: int = 0,
           **over: Any) -> dict[str, Any]:
        stamp_ms = T0_MS + seq * 1000 if ms is None else ms
        event = {
            "id": f"evt_{origin[-8:]}_{seq:08d}",
            "seq": seq * 7,  # the sender's local seq: never ours
            "origin_replica": origin,
            "origin_seq": seq,
            "hlc": f"{stamp_ms:013d}-{counter:06x}-{origin}",
            "type": "task.note",
            "stream": "proj",
            "room": "general",
            "topic": None,
            "from_agent": f"agent-{origin[-4:]}",
            "to_agent": None,
            "correlation_id": None,
            "branch": None,
            "base_commit": None,
            "status": None,
            "artifact_ids": [],
            "body": f"op {seq} of {origin}",
            "created_at": iso(stamp_ms),
            "metadata": {"n": seq},
        }
        event.update(over)
        return event

    def chain(self, origin: str, count: int, start: int = 1, **over: Any) -> list[dict[str, Any]]:
        return [self.op(origin, s, **over) for s in range(start, start + count)]

    @staticmethod
    def artifact(content: str, *, kind: str = "patch", art_id: str | None = None,
                 **over: Any) -> dict[str, Any]:
        digest = hashlib.sha256(content.encode("utf-8")).hexdigest()
        art = {
            "id": art_id or f"art_20260702T032443_{digest[:12]}",
            "kind": kind,
            "sha256": digest,
            "size_bytes": len(content.encode("utf-8")),
            "content": content,
            "created_by": "coder",
            "created_at": "2026-07-02T03:24:43Z",
            "origin_replica": origin_id(99),
            "metadata": {},
        }
        art.update(over)
        return art

    @staticmethod
    def pages(ops: Sequence[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
        return [list(ops[i : i + size]) for i in range(0, len(ops), size)]


def snapshot(store: Store) -> dict[str, Any]:
    """What must converge: events by id (every field but local seq), artifacts, vector."""
    events = {}
    for event in store.iter_events():
        events[event["id"]] = {k: v for k, v in event.items() if k != "seq"}
    artifacts = {a["id"]: a for a in store.iter_artifacts()}
    return {"events": events, "artifacts": artifacts, "vector": store.version_vector()}


def held_seqs(store: Store, origin: str) -> list[int]:
    """Every origin_seq stored for one origin, ascending."""
    out: list[int] = []
    after = 0
    while True:
        page = store.list_ops(origin, after=after, limit=500)
        if not page:
            return out
        out.extend(e["origin_seq"] for e in page)
        after = page[-1]["origin_seq"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ids() -> CountingIds:
    return CountingIds()


@pytest.fixture
def palace(tmp_path: Path) -> Path:
    return tmp_path / "palace"


@pytest.fixture
def store(palace: Path, clock: FakeClock, ids: CountingIds) -> Iterator[Store]:
    """A fresh store with a pinned clock and ids."""
    with Store.open(palace, wall_ms=clock, new_id=ids) as opened:
        yield opened


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[Callable[..., Store]]:
    """Open more stores (other replicas); every one is closed at teardown."""
    opened: list[Store] = []

    def factory(name: str = "other", *, wall_ms: Callable[[], int] | None = None,
                **kwargs: Any) -> Store:
        s = Store.open(tmp_path / name, wall_ms=wall_ms or FakeClock(),
                       new_id=kwargs.pop("new_id", CountingIds(name[:1])), **kwargs)
        opened.append(s)
        return s

    yield factory
    for s in opened:
        s.close()


@pytest.fixture(scope="session")
def remote() -> RemoteKit:
    return RemoteKit()


STRICT_ENV = "LOGSYNC_TESTS_STRICT"


def unavailable(reason: str) -> None:
    """Skip a test whose system tool or privilege is missing here, with the reason; under
    `.ci/run` (LOGSYNC_TESTS_STRICT=1), which installs and runs everything as root, the
    same absence fails the test instead, so a green CI never hides a check that did not
    run."""
    if os.environ.get(STRICT_ENV) == "1":
        pytest.fail(f"{reason} (required under {STRICT_ENV}=1)")
    pytest.skip(reason)


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A size-limited tmpfs at `where` (root only; skips with the reason otherwise),
    unmounted afterwards: a real full disk for the store-fault tests."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        unavailable("mounting a size-limited tmpfs needs root and mount(8)")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
