"""Commits by other processes wake the change stream (`server.commits.CommitWatch`), and
the daemon's accepted sockets have TCP_NODELAY (`server.limits.listen_socket`)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from logsync.server.commits import CommitWatch
from logsync.server.limits import listen_socket
from logsync.store import Store
from tests.test_server_limits import TOKEN, LiveApp, until

NEVER_S = 3600.0  # the streams' own poll and heartbeat: only the commit watch can wake them


def cli_append(palace: Path, body: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "logsync", "--palace", str(palace), "append", "--json",
         "--type", "t", "--stream", "s", "--room", "r", "--from-agent", "cli@test",
         "--body", body], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


class Frames:
    """The event ids a `/logstream/stream` client has received, read on a thread."""

    def __init__(self, url: str) -> None:
        self.ids: list[str] = []
        self.connected = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._thread.start()
        assert self.connected.wait(10), "the stream never answered"

    def _read(self, url: str) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.stream("GET", url + "/logstream/stream", headers=headers,
                          timeout=httpx.Timeout(5, read=None)) as response:
            self.connected.set()
            for line in response.iter_lines():
                if self._stop:
                    return
                if line.startswith("data:"):
                    self.ids.append(json.loads(line[5:])["id"])


@pytest.mark.parametrize("watched", [True, False])
def test_a_cli_append_wakes_the_stream_only_through_the_commit_watch(
    tmp_path: Path, watched: bool
) -> None:
    """The stream's poll and heartbeat are an hour: a frame for the CLI's event can only
    come from the commit watch poking the notifier. Unwatched (the planted defect), the
    same append sends no frame, which proves the check can fail."""
    palace = tmp_path / "palace"
    with Store.open(palace) as store, \
            LiveApp(store, sse_poll_s=NEVER_S, sse_heartbeat_s=NEVER_S) as live:
        watch = CommitWatch(store.db_path, live.srv.notifier.notify, interval=0.005)
        if watched:
            watch.start()
        try:
            frames = Frames(live.url)
            event = cli_append(palace, "from another process")
            arrived = until(lambda: event["id"] in frames.ids, 20 if watched else 1.5)
        finally:
            watch.stop()
            live.srv.begin_shutdown()  # wakes the stream, which ends (its poll is an hour)
    assert arrived is watched, frames.ids
    if watched:
        assert watch.changes >= 1


def test_the_watch_notifies_for_a_commit_on_another_connection_and_stops(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store:
        poked = threading.Event()
        watch = CommitWatch(store.db_path, poked.set, interval=0.002)
        watch.start()
        try:
            assert until(lambda: watch.checks >= 2, 10)
            assert not poked.is_set()  # nothing committed yet: no notification
            other = Store.open(tmp_path / "p")
            try:
                other.append_event("t", "s", "r", "a@b")
            finally:
                other.close()
            assert poked.wait(10)
        finally:
            began = time.monotonic()
            watch.stop()
        assert time.monotonic() - began < 2.5
        assert not watch._thread.is_alive()  # type: ignore[union-attr]


def test_an_unreadable_store_is_logged_once_and_the_first_good_check_notifies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While checks fail nothing is lost: the first good one notifies (whatever happened
    meanwhile goes out), and the failure is one log line, not one per check."""
    import logsync.server.commits as commits

    monkeypatch.setattr(commits, "RETRY_S", 0.01)
    db = tmp_path / "later.sqlite3"
    poked = threading.Event()
    watch = CommitWatch(db, poked.set, interval=0.002)
    with caplog.at_level("WARNING", logger="logsync.server"):
        watch.start()
        try:
            assert until(lambda: "cannot watch the store" in caplog.text, 10)
            time.sleep(0.1)  # many more failing checks
            assert caplog.text.count("cannot watch the store") == 1
            assert not poked.is_set()
            sqlite3.connect(db).close()  # the file appears
            assert poked.wait(10)
        finally:
            watch.stop()


def test_a_bad_interval_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interval=0 is invalid: must be > 0 seconds"):
        CommitWatch(tmp_path / "x.sqlite3", lambda: None, interval=0)


def test_accepted_connections_have_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; without it,
    Nagle holds an answer's second write until the client's delayed ACK (~40 ms)."""
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            raw = writer.get_extra_info("socket")
            seen.append(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_serve_refuses_a_bad_commit_check(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "logsync", "--palace", str(tmp_path / "p"), "serve",
         "--port", "0", "--commit-check-ms", "-1"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--commit-check-ms" in done.stderr and "-1" in done.stderr
    assert "Traceback" not in done.stderr


def _idle_checks(db: Path, seconds: float, **options: object) -> tuple[int, bool]:
    watch = CommitWatch(db, lambda: None, interval=0.005, **options)  # type: ignore[arg-type]
    watch.start()
    try:
        time.sleep(0.3)  # started, first checks done
        before = watch.checks
        time.sleep(seconds)
        return watch.checks - before, watch.woken_by_kernel
    finally:
        watch.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_an_idle_watch_reads_rarely_when_the_kernel_wakes_it(tmp_path: Path) -> None:
    """Polling every 5 ms cost an idle daemon 3.4 % of a core; woken by inotify, an idle
    watch reads about 4 times a second. Polling (the planted contrast) reads ~200."""
    with Store.open(tmp_path / "p") as store:
        woken, by_kernel = _idle_checks(store.db_path, 1.0)
        polled, by_poll = _idle_checks(store.db_path, 1.0, use_inotify=False)
    assert by_kernel and not by_poll
    assert woken <= 8, woken
    assert polled >= 50, polled


def _notice_latencies(store: Store, other: Store, watch: CommitWatch, poked: threading.Event,
                      commits: int) -> list[float]:
    """From each append's return (its fsync is the disk's time, not the watch's) to the
    notification (0 when it came first)."""
    latencies = []
    for i in range(commits):
        time.sleep(0.03)
        poked.clear()
        other.append_event("t", "s", "r", "a@b", body=str(i))
        returned, already = time.monotonic(), poked.is_set()
        assert poked.wait(10), f"commit {i} never noticed"
        latencies.append(0.0 if already else time.monotonic() - returned)
    return latencies


@pytest.mark.parametrize("use_inotify", [True, False])
def test_commits_are_noticed_as_they_land(tmp_path: Path, use_inotify: bool) -> None:
    """Another connection's commits wake the watch within milliseconds, not at its idle
    check: the WAL write wakes it, and it keeps reading for `SETTLE_S` because SQLite
    publishes the commit in shared memory (which inotify cannot see) after that write."""
    with Store.open(tmp_path / "p") as store:
        poked = threading.Event()
        watch = CommitWatch(store.db_path, poked.set, interval=0.005, use_inotify=use_inotify)
        watch.start()
        other = Store.open(tmp_path / "p")
        try:
            assert until(lambda: watch.checks >= 1, 10)
            latencies = sorted(_notice_latencies(store, other, watch, poked, 21))
        finally:
            other.close()
            watch.stop()
    assert watch.woken_by_kernel is (use_inotify and sys.platform.startswith("linux"))
    assert latencies[10] < 0.06, latencies  # the median; the idle check is 0.25 s


@pytest.mark.parametrize("refusal", [OSError(24, "Too many open files"),
                                     AttributeError("inotify_init1 not found")],
                         ids=["emfile", "no-syscall"])
def test_without_inotify_the_watch_polls_and_still_notices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: Exception) -> None:
    """inotify refusing (the per-user instance limit: EMFILE; or, off Linux, a library
    that imports but has no syscall to call) leaves the 5 ms poll."""
    import logsync.server.commits as commits

    def refuse() -> None:
        raise refusal

    monkeypatch.setattr(commits, "INotify", refuse)
    with Store.open(tmp_path / "p") as store:
        poked = threading.Event()
        watch = CommitWatch(store.db_path, poked.set, interval=0.005)
        watch.start()
        other = Store.open(tmp_path / "p")
        try:
            assert until(lambda: watch.checks >= 20, 10)  # polling: many checks at once
            assert not watch.woken_by_kernel
            other.append_event("t", "s", "r", "a@b")
            assert poked.wait(10)
        finally:
            other.close()
            watch.stop()


class _OneWrite:
    """A kernel that reports one write at `t0`, then nothing (as inotify reports a WAL
    write and cannot report the commit's publication in shared memory)."""

    def __init__(self, t0: float) -> None:
        self.t0, self.reported = t0, False

    def wait(self, timeout_s: float) -> bool:
        if not self.reported:
            time.sleep(max(0.0, min(timeout_s, self.t0 - time.monotonic())))
            if time.monotonic() >= self.t0:
                self.reported = True
                return True
            return False
        time.sleep(timeout_s)
        return False

    def close(self) -> None:
        pass


class _LateCommit:
    """data_version changes only at `shows`, well after the write (a slow fsync)."""

    def __init__(self, shows: float) -> None:
        self.shows = shows

    def version(self) -> int:
        return 2 if time.monotonic() >= self.shows else 1

    def close(self) -> None:
        pass


def test_a_commit_published_long_after_its_write_is_read_as_it_shows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow fsync puts 120 ms between the WAL write (which wakes the watch) and the
    commit showing: the watch keeps reading every interval until it shows, instead of
    waiting for its idle check (which would see it ~0.25 s after the write)."""
    import logsync.server.commits as commits

    t0 = time.monotonic() + 0.5
    shows = t0 + 0.12
    monkeypatch.setattr(commits._FileWake, "open", classmethod(lambda cls, path: _OneWrite(t0)))
    noticed: list[float] = []
    watch = CommitWatch(tmp_path / "x.sqlite3", lambda: noticed.append(time.monotonic()),
                        interval=0.005)
    watch._probe = _LateCommit(shows)  # type: ignore[assignment]
    watch.start()
    try:
        assert until(lambda: bool(noticed), 10)
    finally:
        watch.stop()
    assert watch.woken_by_kernel
    assert 0 <= noticed[0] - shows < 0.08, noticed[0] - shows
