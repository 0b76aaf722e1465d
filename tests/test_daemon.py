"""`logsync serve`, `sync` and `status` as real processes on loopback."""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from logsync.store import Store
from tests.interop.hub import free_port

PY = [sys.executable, "-m", "logsync"]



def run(palace: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*PY, "--palace", str(palace), *args], capture_output=True,
                          text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"logsync {' '.join(args)} failed: {proc.stderr}")
    return proc


class Daemon:
    """One `logsync serve` subprocess with its log kept for failure messages."""

    def __init__(self, palace: Path, port: int, token: str, interval: float = 5.0,
                 tls: tuple[Path, Path] | None = None, notify: bool = True,
                 log_dir: Path | None = None) -> None:
        self.palace, self.port, self.token = palace, port, token
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.verify: bool | ssl.SSLContext = (
            ssl.create_default_context(cafile=str(tls[0])) if tls else True)
        extra = ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])] if tls else []
        extra += [] if notify else ["--no-notify"]
        self.log = (log_dir or palace.parent) / f"{palace.name}.log"
        palace.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [*PY, "--palace", str(palace), "serve", "--port", str(port), "--token", token,
             "--interval", str(interval), *extra],
            stdout=self._log_file, stderr=subprocess.STDOUT,
        )
        try:
            wait_for(self._healthy, 20, f"daemon on {self.url} never became healthy", self)
        except BaseException:
            self.proc.kill()
            self.proc.wait(5)
            self.close()
            raise

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited early:\n{self.log.read_text()}")
        try:
            return httpx.get(self.url + "/healthz", timeout=1,
                             verify=self.verify).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str, **params: object) -> httpx.Response:
        return httpx.get(self.url + path, params=params, timeout=5,
                         headers={"Authorization": f"Bearer {self.token}"})

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError(f"daemon ignored {sig}:\n{self.log.read_text()}") from None
        self.close()
        return self.proc.returncode

    def close(self) -> None:
        if not self._log_file.closed:
            self._log_file.close()


def wait_for(predicate: Callable[[], bool], timeout: float, message: str,
             daemon: Daemon | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    log = daemon.log.read_text() if daemon else ""
    raise AssertionError(f"{message} within {timeout} s\n{log[-3000:]}")


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(name: str, port: int | None = None, token: str | None = None,
              interval: float = 5.0) -> Daemon:
        d = Daemon(tmp_path / name, port or free_port(), token or f"tok-{name}", interval)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(5)
        d.close()


def event_ids(palace: Path) -> set[str]:
    with Store.open(palace) as store:
        return {e["id"] for e in store.iter_events()}


def peer(a: Daemon, b: Daemon) -> None:
    """a pulls from b."""
    run(a.palace, "peers", "add", b.palace.name, b.url, "--token", b.token)


def test_two_daemons_converge_by_notification_and_report_status(daemons) -> None:
    a, b = daemons("a", interval=60), daemons("b", interval=60)
    peer(a, b)
    peer(b, a)
    # Long interval: only the change notification can deliver within the deadline.
    time.sleep(1.5)  # peers.json is polled every second
    appended = json.loads(run(a.palace, "append", "--type", "task.request", "--stream", "s",
                              "--room", "r", "--from-agent", "pi@a", "--json").stdout)
    wait_for(lambda: appended["id"] in event_ids(b.palace), 5, "b never got a's event", b)
    peers_answer = b.get("/sync/peers").json()
    entry = next(p for p in peers_answer["peers"] if p["name"] == "a")
    assert entry["reachable"] is True and entry["url"] == a.url
    assert a.token not in json.dumps(peers_answer)
    status = json.loads(run(b.palace, "status", "--json").stdout)
    assert status["peers"][0]["name"] == "a"
    assert status["version_vector"][appended["origin_replica"]] == 1
    assert a.stop() == 0 and b.stop() == 0


def test_sigterm_stops_promptly_and_persists_peer_state(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    peer(b, a)
    wait_for(lambda: (b.palace / "peer_state.json").exists(), 10, "no peer state saved", b)
    started = time.monotonic()
    assert b.stop(signal.SIGTERM) == 0
    assert a.stop(signal.SIGINT) == 0
    assert time.monotonic() - started < 12
    state = json.loads((b.palace / "peer_state.json").read_text())
    assert state["peers"]["a"]["reachable"] is True


def test_peers_json_is_reread_while_running(daemons) -> None:
    a, b = daemons("a", interval=1), daemons("b", interval=1)
    run(a.palace, "append", "--type", "note", "--stream", "s", "--room", "r",
        "--from-agent", "pi@a")
    time.sleep(1.5)
    assert event_ids(b.palace) == set()
    peer(b, a)
    wait_for(lambda: len(event_ids(b.palace)) == 1, 10, "b did not pick up its new peer", b)


@pytest.mark.parametrize("damage, said", [
    (b"\xff", "is not UTF-8 text"),
    (b'{"peers": ' + b"[" * 100_000, "nests its JSON deeper than can be read"),
    (b'{"peers": [', "is not valid JSON"),
], ids=["not-utf8", "nested", "truncated"])
def test_a_damaged_peers_json_keeps_the_daemon_and_its_peers(daemons, damage: bytes,
                                                             said: str) -> None:
    """A hand edit gone wrong while the daemon runs: one logged sentence naming the file,
    the current peers kept, the daemon serving and pulling on."""
    a, b = daemons("a", interval=1), daemons("b", interval=1)
    peer(b, a)
    wait_for(lambda: [p["name"] for p in b.get("/sync/peers").json()["peers"]] == ["a"], 10,
             "b never took a as its peer", b)  # the damage must come after the good file
    (b.palace / "peers.json").write_bytes(damage)
    wait_for(lambda: said in b.log.read_text(), 10, "the damaged file was never reported", b)
    appended = json.loads(run(a.palace, "append", "--type", "note", "--stream", "s",
                              "--room", "r", "--from-agent", "pi@a", "--json").stdout)
    wait_for(lambda: appended["id"] in event_ids(b.palace), 10, "b stopped pulling a", b)
    log = b.log.read_text()
    assert b.proc.poll() is None and "Traceback" not in log, log[-3000:]
    assert "peers.json" in log and "keeping the current peers" in log
    assert b.stop() == 0


def test_sync_once_then_nothing_and_failure_exit_code(daemons, tmp_path: Path) -> None:
    a = daemons("a")
    for i in range(3):
        run(a.palace, "append", "--type", "note", "--stream", "s", "--room", "r",
            "--from-agent", "pi@a", "--body", f"n{i}")
    fresh = tmp_path / "fresh"
    first = json.loads(run(fresh, "sync", "--peer", a.url, "--token", a.token, "--json").stdout)
    assert first[0]["pulled_events"] == 3 and first[0]["peer_url"] == a.url
    again = json.loads(run(fresh, "sync", "--peer", a.url, "--token", a.token, "--json").stdout)
    assert again[0]["pulled_events"] == 0
    bad = run(fresh, "sync", "--peer", a.url, "--token", "wrong", check=False)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr + bad.stdout
    closed = run(fresh, "sync", "--peer", f"http://127.0.0.1:{free_port()}", "--json",
                 check=False)
    assert closed.returncode == 1
    assert "error" in json.loads(closed.stdout)[0]


def test_sync_of_several_peers_syncs_each_and_names_each_once(daemons, tmp_path: Path) -> None:
    """Finding 4: one broken peer stopped `sync` from reaching the others."""
    a = daemons("a")
    run(a.palace, "append", "--type", "note", "--stream", "s", "--room", "r",
        "--from-agent", "pi@a", "--body", "x")
    fresh = tmp_path / "fresh"
    run(fresh, "peers", "add", "down", f"http://127.0.0.1:{free_port()}")
    run(fresh, "peers", "add", "up", a.url, "--token", a.token)
    done = run(fresh, "sync", check=False)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert "up (" in done.stdout and "+1 events" in done.stdout
    (line,) = [ln for ln in done.stderr.splitlines() if "down" in ln]
    assert line.count("down") == 1 and "ERROR (transport)" in line
    assert "down" not in done.stdout


def test_non_loopback_bind_without_token_is_refused(tmp_path: Path) -> None:
    proc = run(tmp_path / "p", "serve", "--host", "0.0.0.0", "--port", str(free_port()),
               check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: refusing to bind '0.0.0.0' without a token")
    assert "Traceback" not in proc.stderr


def test_kill_9_during_bootstrap_then_restart_converges(daemons, tmp_path: Path) -> None:
    source = tmp_path / "source"
    with Store.open(source) as store:
        for i in range(3000):
            store.append_event("note", "s", "r", "pi@a", body="x" * 200 + str(i))
    a = daemons("source", token="tok-src")
    b = daemons("b", interval=0.2)
    peer(b, a)
    wait_for(lambda: 0 < _count(b.palace), 20, "b never started pulling", b)
    b.stop(signal.SIGKILL)
    with Store.open(b.palace) as store:
        vector = store.version_vector()
        seqs = sorted(e["origin_seq"] for e in store.iter_events())
    assert seqs == list(range(1, len(seqs) + 1))  # a per-origin prefix, nothing torn
    assert sum(vector.values()) == len(seqs)
    b.close()
    b2 = Daemon(b.palace, free_port(), "tok-b2", 0.2)
    try:
        wait_for(lambda: _count(b.palace) == 3000, 60, "restarted b did not converge", b2)
    finally:
        b2.stop()
    assert event_ids(b.palace) == event_ids(source)


def _count(palace: Path) -> int:
    if not (palace / "logstream.sqlite3").exists():
        return 0
    with Store.open(palace) as store:
        return store.counts()["events"]



def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_tls_serving_and_pulling_with_a_ca_file(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    a = Daemon(tmp_path / "a", free_port(), "tok-a", tls=(cert, key))
    try:
        run(a.palace, "append", "--type", "note", "--stream", "s", "--room", "r",
            "--from-agent", "pi@a")
        pulled = json.loads(run(tmp_path / "b", "sync", "--peer", a.url, "--token", a.token,
                                "--ca-file", str(cert), "--json").stdout)
        assert pulled[0]["pulled_events"] == 1
        unverified = run(tmp_path / "c", "sync", "--peer", a.url, "--token", a.token,
                         check=False)
        assert unverified.returncode == 1 and "Traceback" not in unverified.stderr
        half = run(tmp_path / "d", "serve", "--tls-cert", str(cert), check=False)
        assert half.returncode == 1
        assert "--tls-cert and --tls-key go together" in half.stderr
    finally:
        a.stop()


def test_anti_entropy_alone_delivers_every_interval(tmp_path: Path) -> None:
    """Without change notifications the timer's rounds are full rounds: an event
    appended at any moment arrives within about one (jittered) interval."""
    a = Daemon(tmp_path / "a", free_port(), "tok-a", interval=60)
    b = Daemon(tmp_path / "b", free_port(), "tok-b", interval=2.0, notify=False)
    try:
        peer(b, a)
        for i in range(4):
            time.sleep(1.5)
            appended = json.loads(run(a.palace, "append", "--type", "note", "--stream", "s",
                                      "--room", "r", "--from-agent", "pi@a", "--body", str(i),
                                      "--json").stdout)
            wait_for(lambda e=appended: e["id"] in event_ids(b.palace), 3.0,
                     f"anti-entropy missed event {i}", b)
    finally:
        a.stop()
        b.stop()
