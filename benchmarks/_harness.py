"""Shared plumbing for the benchmarks: real processes on loopback, cleaned up always.

Why real processes: the figures must include what a user pays (HTTP, JSON or
msgpack, SQLite in another process), and the comparison with MemPalace must
use its real hub and CLI, from its own venv, never imported here. The process
helpers come from ``tests/interop/hub.py`` (imported, not copied), so the
benchmarks start hubs and daemons exactly the way the interop tests do.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(REPO_ROOT), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from tests.interop.hub import (  # noqa: E402
    STOP_TIMEOUT_S,
    HarnessError,
    ServerProcess,
    child_env,
    ensure_mempalace,
    free_port,
    hub_argv,
    logsync_argv,
    logsync_env,
    write_peers_json,
)

__all__ = [
    "Bench", "BenchError", "HarnessError", "run_main", "ServerProcess", "copy_palace", "count_rows",
    "emit", "machine", "percentile", "positive_int", "positive_float", "rss_kb",
    "run_timed", "wait_for", "write_peers_json",
]  # fmt: skip

PORT_ATTEMPTS = 3


class BenchError(RuntimeError):
    """A benchmark could not produce a trustworthy figure (wrong count, timeout, crash)."""


# ── argument checks: one sentence naming the value and the rule ─────────


def positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be a positive integer")
    return value


def positive_float(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be a positive number")
    return value


def pull_parser(description: str, repeat: int) -> Any:
    """The arguments every pull benchmark takes (`bootstrap.py`, `link.py`): the origin's
    size, interleaved rounds, the bound on a CLI run, `--json`, `--keep`."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--events", type=positive_int, default=20_000)
    parser.add_argument("--patches", type=positive_int, default=500)
    parser.add_argument("--repeat", type=positive_int, default=repeat,
                        help="rounds of every variant; each figure is the best round")
    parser.add_argument("--cli-timeout", type=positive_float, default=1800.0,
                        help="bound on any one sync CLI run, seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    return parser


def parse_pull_args(parser: Any, argv: list[str] | None) -> Any:
    """`parser`'s arguments, with the patches no more than the events."""
    args = parser.parse_args(argv)
    if args.patches > args.events:
        parser.error(f"--patches {args.patches} is invalid: must be <= --events {args.events}")
    return args


# ── processes ────────────────────────────────────────────────────────────


class Bench:
    """A temp root plus every server and helper process started under it.

    Use as a context manager: on exit every process is stopped (SIGTERM, then
    SIGKILL) and the root is removed unless ``keep`` is set.
    """

    def __init__(self, keep: bool = False, prefix: str = "logsync-bench-") -> None:
        compile_logsync()
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        self.keep = keep
        self.servers: list[ServerProcess] = []
        self.helpers: list[subprocess.Popen[bytes]] = []
        self._mempalace: Path | None = None

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def mempalace_exe(self) -> Path:
        """The MemPalace 3.11 executable (installed in its own venv on first use)."""
        if self._mempalace is None:
            self._mempalace = ensure_mempalace()
        return self._mempalace

    def path(self, name: str) -> Path:
        """A fresh directory under the root."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=False)
        return path

    def daemon(self, name: str, palace: Path, *, extra_args: Sequence[str] = ()) -> ServerProcess:
        """A `logsync serve` subprocess on a free loopback port (own HOME)."""
        home = self.path(f"home-{name}")
        return self._server(name, "logsync daemon", palace, home, logsync_env(home),
                            lambda port, tok: logsync_argv(palace, port, tok, extra_args))

    def hub(self, name: str, palace: Path, env: Mapping[str, str] | None = None) -> ServerProcess:
        """A MemPalace hub (`mempalace serve`) on a free loopback port (own HOME)."""
        exe = self.mempalace_exe
        home = self.path(f"home-{name}")
        return self._server(name, "hub", palace, home, child_env(home, env),
                            lambda port, tok: hub_argv(exe, palace, port, tok))

    def _server(self, name: str, kind: str, palace: Path, home: Path, env: dict[str, str],
                argv_for: Callable[[int, str], list[str]]) -> ServerProcess:
        token = f"tok-{name}-{secrets.token_hex(8)}"
        for attempt in range(PORT_ATTEMPTS):
            port = free_port()
            server = ServerProcess(
                name=name, kind=kind, palace=palace, home=home, port=port, token=token,
                argv=argv_for(port, token), env=env, log_path=self.root / f"{name}.{attempt}.log",
            )  # fmt: skip
            self.servers.append(server)
            try:
                server.start()
                return server
            except HarnessError:
                if "in use" not in server.log_tail().lower():
                    raise
        raise BenchError(f"{kind} {name}: no free loopback port after {PORT_ATTEMPTS} tries")

    def helper(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """A long-lived helper with pipes on stdin/stdout, killed at close."""
        proc = subprocess.Popen(list(argv), env=dict(env), cwd=self.root, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.helpers.append(proc)
        return proc

    def close(self) -> None:
        """Stop helpers and servers (newest first), then remove the root."""
        for proc in reversed(self.helpers):
            _stop_popen(proc)
        unclean = []
        for server in reversed(self.servers):
            try:
                if not server.stop():
                    unclean.append(server.name)
            except Exception as exc:  # keep stopping the others
                unclean.append(f"{server.name} ({exc!r})")
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        if unclean:
            print(f"warning: needed SIGKILL after {STOP_TIMEOUT_S:.0f} s: {', '.join(unclean)}",
                  file=sys.stderr)


def _stop_popen(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def run_timed(argv: Sequence[str], env: Mapping[str, str], cwd: Path,
              timeout: float) -> tuple[float, str]:
    """Run a CLI to completion; (wall seconds, stdout). Non-zero exit is a BenchError."""
    began = time.perf_counter()
    try:
        done = subprocess.run(list(argv), env=dict(env), cwd=cwd, capture_output=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BenchError(f"`{' '.join(argv[-8:])}` did not finish in {timeout:.0f} s") from None
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).decode(errors="replace")[-800:]
        raise BenchError(f"`{' '.join(argv[-8:])}` exited {done.returncode}: {tail}")
    return elapsed, done.stdout.decode(errors="replace")


def wait_for(check: Callable[[], bool], timeout: float, what: str,
             interval: float = 0.05) -> float:
    """Poll until true; seconds taken. A timeout is a BenchError naming what was awaited."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - began


# ── palaces ──────────────────────────────────────────────────────────────


def copy_palace(src: Path, dst: Path) -> None:
    """A consistent copy (SQLite backup API, so WAL contents are included) + replica.json."""
    dst.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(src / "logstream.sqlite3")
    target = sqlite3.connect(dst / "logstream.sqlite3")
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    shutil.copy2(src / "replica.json", dst / "replica.json")


def count_rows(palace: Path, table: str = "events") -> int:
    """Rows in one table of a palace, read-only (safe beside a running writer)."""
    if table not in ("events", "artifacts"):
        raise ValueError(f"table={table!r} is invalid: must be 'events' or 'artifacts'")
    db = palace / "logstream.sqlite3"
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # schema not created yet
        return 0
    finally:
        conn.close()


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak so far) of a process, in kB, from /proc."""
    fields: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


# ── figures ──────────────────────────────────────────────────────────────


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    if not values:
        raise ValueError("percentile of an empty sample is undefined")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return float(ordered[int(rank) - 1])


def machine(fsync_dir: Path | None = None) -> dict[str, Any]:
    """What the figures were measured on (they are only comparable within one run).

    With ``fsync_dir``, also the median fsync latency there: upstream commits
    every pulled event in its own durable transaction, so its speed (and any
    ratio against it) depends on the disk's fsync far more than ours does.
    """
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    info: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_1m": round(load[0], 2),
                            "python": sys.version.split()[0]}
    if fsync_dir is not None:
        info["fsync_ms"] = fsync_latency_ms(fsync_dir)
    return info


def fsync_latency_ms(directory: Path, rounds: int = 100) -> float:
    """Median time to write 4 KB and fsync it, in ms."""
    path = directory / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(rounds):
            began = time.perf_counter()
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            times.append(time.perf_counter() - began)
    finally:
        os.close(fd)
        path.unlink()
    return round(percentile(times, 50) * 1000, 3)


def emit(result: Mapping[str, Any], lines: Sequence[str], as_json: bool) -> None:
    """Print the figures: human lines, or one JSON document."""
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=False))
    else:
        print("\n".join(lines))


def compile_logsync() -> None:
    """Byte-compile the logsync under test, as `pip install` does for MemPalace's venv:
    with PYTHONDONTWRITEBYTECODE set and an editable install, every `logsync` child would
    otherwise compile its modules from source (~0.1 s a process) and the upstream
    baseline would not."""
    import compileall

    import logsync

    compileall.compile_dir(next(iter(logsync.__path__)), quiet=1, workers=1)


def run_main(name: str, args: Any, measure: Callable[[Any, Bench], Mapping[str, Any]],
             render: Callable[[Mapping[str, Any]], Sequence[str]]) -> int:
    """The shared shape of a benchmark's main(): measure in a Bench, print, exit code."""
    try:
        with Bench(keep=args.keep) as bench:
            result = measure(args, bench)
    except (BenchError, HarnessError) as exc:
        print(f"{name} benchmark failed: {exc}", file=sys.stderr)
        return 1
    emit(result, render(result), args.json)
    return 0
