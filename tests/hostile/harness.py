"""Victim daemons, a /healthz watchdog and read-only checks of what a victim stored."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from procs import stop_process
from test_daemon import PY, free_port, wait_for

from logsync.model import MAX_METADATA_BYTES

# A victim that decodes a bomb must fail inside the test, not take the machine with it.
VICTIM_DATA_LIMIT = 2 * 1024**3
HEALTH_EVERY_S = 0.1
HEALTH_TIMEOUT_S = 5.0

REPLICA = r"rep_(?:[0-9a-f]{12}|[0-9a-f]{32})"
STORED_RULES = {
    "id": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"),
    "type": re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}"),
    "origin_replica": re.compile(REPLICA),
    "created_at": re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"),
}
HLC_RULE = re.compile(r"[0-9]{13}-[0-9a-f]{6}-(" + REPLICA + r")")


def _limited() -> list[str]:
    """prlimit execs the command (same pid); preexec_fn is unsafe with threads running."""
    if shutil.which("prlimit"):
        return ["prlimit", f"--data={VICTIM_DATA_LIMIT}"]
    return []


class Victim:
    """One real `logsync serve` subprocess (memory-limited), its log kept for messages."""

    def __init__(self, palace: Path, *, token: str, interval: float = 1.0,
                 extra: tuple[str, ...] = ()) -> None:
        self.palace, self.token, self.port = palace, token, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        palace.mkdir(parents=True, exist_ok=True)
        self.log = palace.parent / f"{palace.name}.log"
        self._log_file = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*_limited(), *PY, "--palace", str(palace), "serve", "--port", str(self.port),
             "--token", token, "--interval", str(interval), *extra],
            stdout=self._log_file, stderr=subprocess.STDOUT,
        )
        try:
            wait_for(self._healthy, 30, f"victim on {self.url} never became healthy")
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"victim exited early:\n{self.log_text()}")
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.url + path, params=params, timeout=10,
                         headers={"Authorization": f"Bearer {self.token}"})

    def vector(self) -> dict[str, int]:
        return dict(self.get("/sync/version_vector").json()["version_vector"])

    def peak_rss_mb(self) -> float:
        """VmHWM of the live process, in MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM in /proc status")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop(self) -> None:
        stop_process(self.proc)
        if not self._log_file.closed:
            self._log_file.close()


class HealthWatch:
    """Polls /healthz every 100 ms in a thread; keeps the worst latency and any failure."""

    def __init__(self, url: str) -> None:
        self.url = url + "/healthz"
        self.max_latency = 0.0
        self.samples = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthz-watch", daemon=True)

    def start(self) -> HealthWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(HEALTH_TIMEOUT_S + 2)

    def _run(self) -> None:
        with httpx.Client(timeout=HEALTH_TIMEOUT_S) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    ok = client.get(self.url).status_code == 200
                    problem = "" if ok else "non-200"
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                took = time.monotonic() - started
                self.samples += 1
                self.max_latency = max(self.max_latency, took)
                if problem and len(self.failures) < 20:
                    self.failures.append(f"after {took:.2f} s: {problem}")
                self._stop.wait(max(0.0, HEALTH_EVERY_S - took))


def _read_only(palace: Path, sql: str) -> list[dict[str, Any]]:
    """Rows straight from SQLite, read-only (no migration, no validation)."""
    db = palace / "logstream.sqlite3"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()


def stored_rows(palace: Path) -> list[dict[str, Any]]:
    """Every event row."""
    return _read_only(palace, "SELECT id, type, origin_replica, origin_seq, hlc, created_at, "
                              "metadata_json FROM events")


def conflicts(palace: Path) -> list[dict[str, Any]]:
    return _read_only(palace, "SELECT kind, origin_replica, origin_seq, item_id "
                              "FROM logsync_conflicts")


def invalid_stored(palace: Path) -> list[str]:
    """What a store must never hold: each problem as one line (empty: all valid)."""
    problems = []
    for row in stored_rows(palace):
        where = f"{row['id']!r}"
        for name, rule in STORED_RULES.items():
            value = row[name]
            if not isinstance(value, str) or rule.fullmatch(value) is None:
                problems.append(f"{where}: {name}={value!r}")
        seq = row["origin_seq"]
        if not isinstance(seq, int) or not 1 <= seq <= 2**62:
            problems.append(f"{where}: origin_seq={seq!r}")
        stamp = HLC_RULE.fullmatch(row["hlc"] or "")
        if stamp is None or stamp.group(1) != row["origin_replica"]:
            problems.append(f"{where}: hlc={row['hlc']!r}")
        meta = row["metadata_json"]
        try:
            json.dumps(json.loads(meta))
        except (ValueError, RecursionError) as exc:
            problems.append(f"{where}: metadata does not round-trip ({type(exc).__name__})")
        if len(meta.encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
            problems.append(f"{where}: metadata of {len(meta)} chars")
    return problems


def wait_until(predicate: Callable[[], bool], timeout: float, message: str,
               log: Callable[[], str] = str) -> None:
    """wait_for with a victim log attached; predicate errors count as 'not yet'."""
    def guarded() -> bool:
        try:
            return predicate()
        except (httpx.HTTPError, sqlite3.Error, KeyError, ValueError):
            return False

    try:
        wait_for(guarded, timeout, message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- victim log ---\n{log()}") from None
