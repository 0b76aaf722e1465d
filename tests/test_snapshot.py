"""Snapshot join (RFC 004 §7.6, §9.6): serving, joining, refusing, and surviving kill -9.

Real processes where a process boundary is crossed (`logsync serve`, `logsync sync`, a
joiner killed with SIGKILL); a small fake peer (the real app with `/sync/snapshot` or its
advertisement replaced) serves tampered snapshots on loopback. Every wait is bounded.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from logsync import model
from logsync.client import sync_once
from logsync.peers import Peer
from logsync.server import create_app
from logsync.snapshot import JOIN_PREFIX, SERVE_PREFIX
from logsync.snapshot.joining import join_if_empty
from logsync.snapshot.making import make_copy
from logsync.store import Store
from tests.interop.hub import free_port

PY = [sys.executable, "-m", "logsync"]
WAIT_S = 30.0


# ── fixtures: stores, servers, processes ─────────────────────────────────


def build(palace: Path, events: int, patches: int = 0, seed: int = 1) -> Store:
    """A store authoring `events` events (every `events // patches`th with a patch), in
    one transaction (the fixture's speed; each op is chained and signed as an append)."""
    rng = random.Random(seed)
    store = Store.open(palace)
    every = max(1, events // max(patches, 1))
    with store._atomic(durable=False) as conn:
        for i in range(events):
            arts = []
            if patches and i % every == 0 and i // every < patches:
                content = f"--- a/{i}\n+++ b/{i}\n" + "+x\n" * rng.randint(5, 50)
                arts = [store._new_id("art")]
                conn.execute(
                    "INSERT INTO artifacts (id, kind, sha256, size_bytes, content, created_by, "
                    "created_at, metadata_json, origin_replica) VALUES (?, 'patch', ?, ?, ?, "
                    "'pi@laptop', '2026-09-01T00:00:00Z', '{}', ?)",
                    (arts[0], model.sha256_hex(content), len(content.encode()), content,
                     store.replica_id))
            store._insert_local_event(conn, {
                "type": "task.request", "stream": "s", "room": "r", "topic": None,
                "from_agent": "pi@laptop", "to_agent": "codex@desk",
                "correlation_id": f"t{i // 4}", "branch": None, "base_commit": None,
                "status": None, "body": f"event {i} " * rng.randint(1, 20),
                "metadata_json": "{}", "artifact_ids": arts})
    return store


def relay(source: Store, into: Store) -> None:
    """`into` pulls `source` (in-process, over ASGI): a relayed, signed origin."""
    transport = httpx.ASGITransport(app=create_app(source))
    report = sync_once(into, "http://127.0.0.1", transport=transport)
    assert report.applied and not report.conflicts and not report.quarantined



class ThreadServer:
    """An ASGI app on loopback in a thread (the fake peers)."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="off",
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, "the fake peer never started")

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout} s")


class FakePeer:
    """The real app over `store`, with `/sync/snapshot` answered by `body` when set
    (bytes, or `stall` to send half the file and hang), and the advertisement removed
    when `advertise` is False (a MemPalace hub advertises nothing)."""

    def __init__(self, store: Store) -> None:
        self.inner = create_app(store)
        self.body: bytes | None = None
        self.stall: bytes | None = None
        self.advertise = True
        self.headers: list[tuple[bytes, bytes]] = []  # sent with `body` or `stall`
        self.snapshot_requests = 0
        self.server = ThreadServer(self)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope["type"] == "http" and path == "/sync/snapshot":
            self.snapshot_requests += 1
            if self.body is not None or self.stall is not None:
                return await self._send_raw(send, self.body or self.stall or b"")
        if scope["type"] == "http" and path == "/sync/version_vector" and not self.advertise:
            return await self.inner(scope, receive, _without_advert(send))
        await self.inner(scope, receive, send)

    async def _send_raw(self, send: Any, data: bytes) -> None:
        size = len(data) if self.stall is None else len(data) * 2
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(size).encode()), *self.headers]})
        await send({"type": "http.response.body", "body": data, "more_body": True})
        if self.stall is not None:
            await anyio.sleep(WAIT_S)
        await send({"type": "http.response.body", "body": b""})


def _without_advert(send: Any) -> Any:
    held: list[bytes] = []

    async def strip(message: dict) -> None:
        if message["type"] == "http.response.start":
            held.append(b"")
            strip.start = message  # type: ignore[attr-defined]
            return
        held.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = json.loads(b"".join(held))
        body.pop("logsync", None)
        raw = json.dumps(body).encode()
        start = dict(strip.start)  # type: ignore[attr-defined]
        start["headers"] = [(k, v) for k, v in start["headers"] if k != b"content-length"]
        start["headers"].append((b"content-length", str(len(raw)).encode()))
        await send(start)
        await send({"type": "http.response.body", "body": raw})
    return strip


def snapshot_bytes(store: Store, edit: Callable[[sqlite3.Connection], None] | None = None,
                   *, flip: bool = False) -> bytes:
    """What `/sync/snapshot` would send, after `edit` (re-hashed: only the edit is wrong)
    or with one byte flipped after hashing (`flip`: only the digest is wrong)."""
    made = make_copy(store.db_path, store.replica_id)
    try:
        if edit is not None:
            conn = sqlite3.connect(made.path, isolation_level=None)
            edit(conn)
            conn.close()
        data = bytearray(made.path.read_bytes())
    finally:
        made.path.unlink()
    import hashlib

    digest = hashlib.sha256(data).hexdigest()
    if flip:
        data[len(data) // 2] ^= 0x01
    vector = made.vector
    preamble = json.dumps({"format": "logsync-snapshot-1", "replica_id": store.replica_id,
                           "vector": vector, "size": len(data), "sha256": digest})
    return preamble.encode() + b"\n" + bytes(data)


def rows(palace: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"{(palace / 'logstream.sqlite3').as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def content(palace: Path) -> dict[str, list[tuple]]:
    """Events, artifacts and their links, every column (not the local arrival order)."""
    return {
        "events": rows(palace, "SELECT * FROM events ORDER BY origin_replica, origin_seq"),
        "artifacts": rows(palace, "SELECT * FROM artifacts ORDER BY id"),
        "links": rows(palace, "SELECT * FROM event_artifacts ORDER BY event_id, artifact_id"),
    }


def run_cli(palace: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, "--palace", str(palace), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Store]:
    """A small source: 130 signed ops, 3 patches, and a relayed signed origin."""
    other = build(tmp_path / "other", 7, patches=1, seed=2)
    store = build(tmp_path / "source", 130, patches=3)
    relay(other, store)
    other.close()
    yield store
    store.close()


@pytest.fixture
def fake(source: Store) -> Iterator[FakePeer]:
    peer = FakePeer(source)
    yield peer
    peer.server.close()


# ── serving ──────────────────────────────────────────────────────────────


def test_the_snapshot_is_advertised_cached_and_holds_nothing_local(source: Store) -> None:
    with source._atomic(durable=True) as conn:  # rows that are the source's own
        conn.execute("INSERT INTO logsync_conflicts (detected_at, kind, reason, remote_json, "
                     "digest) VALUES ('t', 'fork', 'r', '{}', 'd')")
    assert source.health_problem() is None
    palace = source.palace

    async def go() -> tuple[list, list, list]:
        for token in (None, "tok"):
            app = create_app(source, token=token)
            headers = {"Authorization": "Bearer tok"} if token else {}
            headers["Accept-Encoding"] = "identity"  # the plain answer (zstd: its own test)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://127.0.0.1", headers=headers) as c:
                advert = (await c.get("/sync/version_vector")).json()["logsync"]
                assert "snapshot" in advert["extensions"]
                first = await c.get("/sync/snapshot")
                again = await c.get("/sync/snapshot")
                made = [p.name for p in palace.iterdir() if p.name.startswith(SERVE_PREFIX)]
                source.append_event(type="t.x", stream="s", room="r", from_agent="a@b")
                stale = await c.get("/sync/snapshot")  # one op behind: fresh enough
                assert stale.headers["x-logsync-snapshot-sha256"] == \
                    first.headers["x-logsync-snapshot-sha256"]
                app.state.logsync.snapshots.cache.stale_ops = 0
                moved = await c.get("/sync/snapshot")
                after = [p.name for p in palace.iterdir() if p.name.startswith(SERVE_PREFIX)]
            app.state.logsync.close()
            left = [p.name for p in palace.iterdir() if p.name.startswith(SERVE_PREFIX)]
        return [first, again, moved], [made, after], left

    (first, again, moved), (made, after), left = anyio.run(go)
    assert first.status_code == 200
    sha = first.headers["x-logsync-snapshot-sha256"]
    assert again.headers["x-logsync-snapshot-sha256"] == sha  # cached: the vector held
    assert moved.headers["x-logsync-snapshot-sha256"] != sha  # too stale: a new copy
    # one copy and its zstd frame at a time, both replaced by the next and gone at close
    for names in (made, after):
        assert sorted(n.rsplit(".", 1)[-1] for n in names) == ["sqlite3", "zst"], names
    assert not set(made) & set(after) and left == []
    line, _, data = moved.content.partition(b"\n")
    preamble = json.loads(line)
    assert preamble["vector"] == source.version_vector()
    assert len(data) == preamble["size"] == int(moved.headers["x-logsync-snapshot-size"])
    copy = palace.parent / "copy.sqlite3"
    copy.write_bytes(data)
    conn = sqlite3.connect(copy)
    assert conn.execute("SELECT count(*) FROM logsync_conflicts").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM logsync_health").fetchone()[0] == 0
    sources = dict(conn.execute("SELECT origin, source FROM logsync_keys").fetchall())
    conn.close()
    assert "self" not in sources.values() and sources[source.replica_id] == "certified"


# ── joining ──────────────────────────────────────────────────────────────


def test_a_replica_joins_from_a_snapshot_under_its_own_identity(source: Store,
                                                                 fake: FakePeer,
                                                                 tmp_path: Path) -> None:
    said: list[str] = []
    joiner = tmp_path / "joiner"
    joined = join_if_empty(joiner, [Peer(url=fake.server.url)], say=said.append)
    assert joined is not None and said == [] and joined.peer_id == source.replica_id
    assert content(joiner) == content(source.palace)
    with Store.open(joiner) as store:
        assert store.replica_id != source.replica_id
        keys = dict(store._read("SELECT origin, source FROM logsync_keys"))
        assert keys[store.replica_id] == "self" and keys[source.replica_id] == "certified"
        assert store.version_vector() == source.version_vector() and store.audit().ok
        assert store.counts()["conflicts"] == store.counts()["quarantined"] == 0
        source.append_event(type="t.after", stream="s", room="r", from_agent="a@b")
        report = sync_once(store, fake.server.url)
        assert report.applied == 1  # then it tails by vector
        assert join_if_empty(joiner, [Peer(url=fake.server.url)]) is None  # not empty now
    assert not [p for p in joiner.iterdir() if p.name.startswith(JOIN_PREFIX)]


def _drop_keys(conn: sqlite3.Connection) -> None:
    conn.execute("DROP TABLE logsync_keys")


def _gap(conn: sqlite3.Connection) -> None:
    origin = conn.execute("SELECT origin FROM logsync_keys WHERE source = 'certified' "
                          "ORDER BY origin LIMIT 1").fetchone()[0]
    conn.execute("DELETE FROM events WHERE origin_replica = ? AND origin_seq = 5", (origin,))


def _short(conn: sqlite3.Connection) -> None:
    origin, top = conn.execute("SELECT origin_replica, max(origin_seq) FROM events GROUP BY "
                               "origin_replica ORDER BY 2 DESC LIMIT 1").fetchone()
    conn.execute("DELETE FROM events WHERE origin_replica = ? AND origin_seq = ?", (origin, top))


def _altered(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE events SET body = body || '!' WHERE origin_seq = 70")


def _conflict(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO logsync_conflicts (detected_at, kind, reason, remote_json, "
                 "digest) VALUES ('t', 'fork', 'r', '{}', 'd')")


def _trigger(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TRIGGER t AFTER INSERT ON events BEGIN DELETE FROM events; END")


def _infinite_seq(conn: sqlite3.Connection) -> None:
    """A signed chain entry at seq -9e999: SQLite keeps it as REAL -inf, and -inf % 64 = 0
    puts it among the signatures checked (it once ended the join in an OverflowError)."""
    origin = conn.execute("SELECT origin FROM logsync_keys WHERE source = 'certified' "
                          "ORDER BY origin LIMIT 1").fetchone()[0]
    conn.execute("INSERT INTO logsync_chain VALUES (?, -9e999, zeroblob(32), zeroblob(64))",
                 (origin,))


@pytest.mark.parametrize(("edit", "flip", "named"), [
    (None, True, "SHA-256"),
    (_drop_keys, False, "lacks the table logsync_keys"),
    (_gap, False, "departs from its ops at seq 5"),
    (_short, False, "its preamble names"),
    (_altered, False, "departs from its ops at seq 70"),
    (_conflict, False, "rows of logsync_conflicts"),
    (_trigger, False, "holds a trigger"),
    (_infinite_seq, False, "holds a chain entry at seq -inf, not an integer"),
], ids=["digest", "schema", "gap", "vector", "altered", "conflicts", "trigger", "inf-seq"])
def test_a_bad_snapshot_is_refused_in_one_line_and_nothing_is_installed(
        source: Store, fake: FakePeer, tmp_path: Path, edit: Any, flip: bool,
        named: str) -> None:
    fake.body = snapshot_bytes(source, edit, flip=flip)
    said: list[str] = []
    joiner = tmp_path / "joiner"
    assert join_if_empty(joiner, [Peer(url=fake.server.url)], say=said.append) is None
    assert len(said) == 1 and named in said[0] and "\n" not in said[0], said
    assert said[0].startswith(f"snapshot from {fake.server.url}")
    assert said[0].endswith("; pulling op by op instead")
    assert sorted(p.name for p in joiner.iterdir()) == [
        "logstream.sqlite3", "logsync-signing-key", "replica.json"]
    with Store.open(joiner) as store:
        assert store.latest_event_id() is None


def test_sync_refuses_a_bad_snapshot_then_pulls_op_by_op(source: Store, fake: FakePeer,
                                                         tmp_path: Path) -> None:
    fake.body = snapshot_bytes(source, flip=True)
    joiner = tmp_path / "joiner"
    done = run_cli(joiner, "sync", "--peer", fake.server.url, "--pull-only")
    refused = [line for line in done.stderr.splitlines() if "snapshot" in line]
    assert len(refused) == 1 and "SHA-256" in refused[0], done.stderr
    assert "Traceback" not in done.stderr and done.returncode == 0, done.stderr
    assert content(joiner) == content(source.palace)


def test_a_peer_without_snapshot_and_no_snapshot_get_the_ordinary_pull(
        source: Store, fake: FakePeer, tmp_path: Path) -> None:
    fake.advertise = False  # as a MemPalace hub: no advertisement at all
    assert join_if_empty(tmp_path / "a", [Peer(url=fake.server.url)]) is None
    assert fake.snapshot_requests == 0
    fake.advertise = True
    done = run_cli(tmp_path / "b", "sync", "--peer", fake.server.url, "--pull-only",
                   "--no-snapshot", "--json")
    assert done.returncode == 0, done.stderr
    assert fake.snapshot_requests == 0 and "snapshot" not in json.loads(done.stdout)[0]
    assert content(tmp_path / "b") == content(source.palace)


def test_a_store_open_in_another_process_is_not_replaced(source: Store, fake: FakePeer,
                                                         tmp_path: Path) -> None:
    joiner = tmp_path / "joiner"
    Store.open(joiner).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from logsync.store import Store; "
         "s = Store.open(sys.argv[1]); print('open', flush=True); time.sleep(60)", str(joiner)],
        stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        said: list[str] = []
        assert join_if_empty(joiner, [Peer(url=fake.server.url)], say=said.append) is None
        assert len(said) == 1 and "open in another process" in said[0], said
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    with Store.open(joiner) as store:
        assert store.latest_event_id() is None


# ── kill -9 ──────────────────────────────────────────────────────────────


def test_kill_during_download_leaves_an_empty_usable_store(source: Store, fake: FakePeer,
                                                           tmp_path: Path) -> None:
    whole = snapshot_bytes(source)
    fake.stall = whole[: len(whole) // 2]
    joiner = tmp_path / "joiner"
    proc = subprocess.Popen([*PY, "--palace", str(joiner), "sync", "--peer", fake.server.url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(p.name.startswith(JOIN_PREFIX) and p.stat().st_size > 0
                             for p in joiner.iterdir()) if joiner.exists() else False,
                 "the download never started")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with Store.open(joiner) as store:
        assert store.latest_event_id() is None
    fake.stall = None
    assert join_if_empty(joiner, [Peer(url=fake.server.url)]) is not None
    assert content(joiner) == content(source.palace)
    assert not [p for p in joiner.iterdir() if p.name.startswith(JOIN_PREFIX)]


KILLER = """
import os, signal, sys
from pathlib import Path
from logsync.peers import Peer
from logsync.snapshot import joining
real, when = os.replace, sys.argv[3]
def replace(a, b):
    if when == "after":
        real(a, b)
    os.kill(os.getpid(), signal.SIGKILL)
joining.os.replace = replace
joining.join_if_empty(Path(sys.argv[1]), [Peer(url=sys.argv[2])])
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_kill_during_install_leaves_an_empty_or_a_whole_store(
        source: Store, fake: FakePeer, tmp_path: Path, when: str) -> None:
    joiner = tmp_path / "joiner"
    done = subprocess.run([sys.executable, "-c", KILLER, str(joiner), fake.server.url, when],
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    with Store.open(joiner) as store:
        if when == "before":
            assert store.latest_event_id() is None
        else:
            assert store.version_vector() == source.version_vector() and store.audit().ok
            assert store.replica_id != source.replica_id
    if when == "before":
        assert join_if_empty(joiner, [Peer(url=fake.server.url)]) is not None
    assert content(joiner) == content(source.palace)
    assert not [p for p in joiner.iterdir() if p.name.startswith(JOIN_PREFIX)] or when == "after"


# ── the 20 000-event join, real daemons ──────────────────────────────────



def test_sigterm_while_a_daemon_joins_ends_it_cleanly(source: Store, fake: FakePeer,
                                                      tmp_path: Path) -> None:
    """A daemon still joining (here from a peer that sent half the file and hangs) and
    told to stop exits 0 as after serving, logs why, and leaves no download behind."""
    whole = snapshot_bytes(source)
    fake.stall = whole[: len(whole) // 2]
    joiner = tmp_path / "joiner"
    joiner.mkdir()
    (joiner / "peers.json").write_text(json.dumps({"peers": [{"name": "src",
                                                               "url": fake.server.url}]}))
    log = tmp_path / "joiner.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*PY, "--palace", str(joiner), "serve", "--port",
                                 str(free_port())], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: any(p.name.startswith(JOIN_PREFIX) and p.stat().st_size > 0
                             for p in joiner.iterdir()), "the download never started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert "joining from src's snapshot" in text and "stopped (SIGTERM) while joining" in text
    assert "Traceback" not in text, text
    assert not [p for p in joiner.iterdir() if p.name.startswith(JOIN_PREFIX)]
    with Store.open(joiner) as store:
        assert store.latest_event_id() is None


class Serve:
    """`logsync serve` as a process, its log in a file."""

    def __init__(self, palace: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        palace.mkdir(parents=True, exist_ok=True)
        self.log = palace.parent / f"{palace.name}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([*PY, "--palace", str(palace), "serve", "--port",
                                          str(self.port), "--interval", "1", *extra],
                                         stdout=out, stderr=subprocess.STDOUT)
        wait_for(self._healthy, f"{palace.name} never became healthy", 60)

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited:\n{self.log.read_text()[-3000:]}")
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def test_a_daemon_joins_20000_events_like_an_op_by_op_pull_then_tails(tmp_path: Path) -> None:
    other = build(tmp_path / "other", 40, patches=4, seed=3)
    origin = build(tmp_path / "origin", 20_000, patches=60)
    relay(other, origin)
    other.close()
    origin.close()
    servers: list[Serve] = []
    try:
        servers.append(src := Serve(tmp_path / "origin"))
        joiner = tmp_path / "joiner"
        joiner.mkdir()
        (joiner / "peers.json").write_text(json.dumps({"peers": [{"name": "src",
                                                                   "url": src.url}]}))
        servers.append(Serve(joiner))  # joins before it serves: healthy means joined
        log = (tmp_path / "joiner.log").read_text()
        assert "joined from a snapshot of src" in log and "20040 events" in log, log[-2000:]
        pulled = run_cli(tmp_path / "pulled", "sync", "--peer", src.url, "--pull-only",
                         "--no-snapshot", "--json")
        assert pulled.returncode == 0 and "snapshot" not in json.loads(pulled.stdout)[0]
        assert content(joiner) == content(tmp_path / "pulled")
        with Store.open(joiner, read_only=True) as j, Store.open(tmp_path / "origin",
                                                                  read_only=True) as o:
            assert j.version_vector() == o.version_vector()
            assert j.replica_id not in (o.replica_id,) and j.public_key != o.public_key
            assert j.audit().ok
        appended = json.loads(run_cli(tmp_path / "origin", "append", "--type", "t.after",
                                      "--stream", "s", "--room", "r", "--from-agent", "a@b",
                                      "--json").stdout)
        tailed = f"SELECT count(*) FROM events WHERE id = '{appended['id']}'"
        wait_for(lambda: rows(joiner, tailed) == [(1,)], "the joiner never tailed the append")
    finally:
        for server in servers:
            server.stop()


def test_a_fleet_of_empty_daemons_started_together_all_serve_at_once(tmp_path: Path) -> None:
    """Found by the chaos suite: each empty daemon looked for a snapshot at its peers, which
    had bound their ports but were looking too, so every look hung for its timeout (with
    retries) and no daemon served within 30 s. The port is now held only after the join,
    a look is one short try, and an empty peer is not joined from."""
    names = ("a", "b", "c", "d")
    ports = {name: free_port() for name in names}
    for name in names:
        palace = tmp_path / name
        palace.mkdir()
        (palace / "peers.json").write_text(json.dumps({"peers": [
            {"name": other, "url": f"http://127.0.0.1:{ports[other]}", "token": "tok"}
            for other in names if other != name]}))
    procs = [subprocess.Popen(
        [sys.executable, "-m", "logsync", "--palace", str(tmp_path / name), "serve",
         "--port", str(ports[name]), "--token", "tok", "--interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name in names]
    began = time.monotonic()
    try:
        def all_serve() -> bool:
            try:
                return all(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                           .status_code == 200 for port in ports.values())
            except httpx.HTTPError:
                return False
        wait_for(all_serve, "every daemon serving", timeout=20)
        assert time.monotonic() - began < 15
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
