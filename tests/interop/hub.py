"""Harness for the interop tests: real MemPalace 3.11 hubs, the upstream CLI,
and logsync daemons, each a real subprocess on loopback.

Why subprocesses and a private venv: interop means talking to MemPalace the
way a user's hub does, so it is never imported into logsync's environment.
Its venv is found through ``LOGSYNC_MEMPALACE_VENV`` (default
``~/.cache/logsync/mempalace-3.11.0``) and created by
``scripts/install-mempalace.sh`` when missing.

Every process gets its own ``HOME`` (the hub writes ``~/.mempalace`` and
``~/.config``), a log file for failure messages, and is stopped with SIGTERM
then SIGKILL. Every wait is bounded and fails with a sentence naming what
was awaited and the tail of the relevant log.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MEMPALACE_VERSION = "3.11.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install-mempalace.sh"
INSTALL_TIMEOUT_S = 900.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 120.0
HTTP_TIMEOUT_S = 10.0
LIST_PAGE = 500
LOOPBACK = "127.0.0.1"

_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class HarnessError(AssertionError):
    """The harness could not do its job (install, start, a CLI call, a wait).

    An AssertionError so pytest reports it as a failure with its message,
    not as an internal error with a traceback through the harness.
    """


# ── Locating / installing MemPalace ──────────────────────────────────────


def mempalace_venv() -> Path:
    """Where the MemPalace venv lives (same rule as the install script)."""
    configured = os.environ.get("LOGSYNC_MEMPALACE_VENV")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "logsync" / f"mempalace-{MEMPALACE_VERSION}"


def _reports_version(exe: Path) -> bool:
    if not exe.is_file():
        return False
    try:
        done = subprocess.run(
            [str(exe), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.stdout.strip() == f"MemPalace {MEMPALACE_VERSION}"


def ensure_mempalace() -> Path:
    """Return the ``mempalace`` executable, installing its venv if needed."""
    exe = mempalace_venv() / "bin" / "mempalace"
    if _reports_version(exe):
        return exe
    try:
        done = subprocess.run(
            ["bash", str(INSTALL_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise HarnessError(
            f"{INSTALL_SCRIPT} did not finish within {INSTALL_TIMEOUT_S:.0f} s; "
            f"install mempalace=={MEMPALACE_VERSION} by hand and set LOGSYNC_MEMPALACE_VENV"
        ) from None
    if done.returncode != 0:
        raise HarnessError(
            f"{INSTALL_SCRIPT} failed (exit {done.returncode}): {_tail(done.stderr, 15)}\n"
            f"The interop tests need mempalace=={MEMPALACE_VERSION} in its own venv: run the "
            "script by hand (it needs PyPI) or set LOGSYNC_MEMPALACE_VENV to such a venv."
        )
    exe = Path(done.stdout.strip().splitlines()[-1]) / "bin" / "mempalace"
    if not _reports_version(exe):
        raise HarnessError(f"{exe} does not report MemPalace {MEMPALACE_VERSION} after install")
    return exe


# ── Environment, ports, logs ─────────────────────────────────────────────


def child_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment: own HOME, no proxies, no leaked palace settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key.lower() not in _PROXY_VARS
        and not key.startswith(("MEMPALACE_", "LOGSYNC_PALACE"))
        and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        HOME=str(home),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def logsync_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Like :func:`child_env`, running the very ``logsync`` this test process imported.

    Why: an editable install can resolve ``logsync`` differently (or not at
    all) from another working directory; PYTHONPATH pins the checkout.
    """
    import logsync

    source_root = Path(next(iter(logsync.__path__))).resolve().parent
    return child_env(home, {"PYTHONPATH": str(source_root), **(extra or {})})


_HANDED_OUT: set[int] = set()
_BELOW_EPHEMERAL = 8000  # ports picked from this many below the kernel's ephemeral range
_PICK = random.SystemRandom()  # not the shared generator, which a test may seed


def free_port() -> int:
    """A port a server started next can bind: free now, below the kernel's ephemeral range
    (an outgoing connection's port, which the kernel picks from that range, cannot take
    it between this pick and the server's bind: a chaos run lost a daemon that way) and
    never handed out before by this process (a node restarted keeps its port)."""
    low = _ephemeral_low()
    for _ in range(500):
        port = _PICK.randrange(max(1024, low - _BELOW_EPHEMERAL), low)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded machine
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def read_tail(path: Path, lines: int = 80) -> str:
    try:
        return _tail(path.read_text(encoding="utf-8", errors="replace"), lines)
    except FileNotFoundError:
        return "(no log written)"


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    state: Callable[[], str] | None = None,
    interval: float = 0.25,
) -> float:
    """Poll ``check`` until true; return seconds taken, fail after ``timeout``."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            detail = f"; last state: {state()}" if state else ""
            raise HarnessError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


# ── HTTP ─────────────────────────────────────────────────────────────────


def http_get_json(url: str, token: str | None, path: str, params: Mapping | None = None) -> Any:
    """One GET like a peer would make; non-200 or non-JSON is a HarnessError."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(
            url.rstrip("/") + path,
            params=dict(params or {}),
            headers=headers,
            timeout=HTTP_TIMEOUT_S,
            trust_env=False,
        )
    except httpx.HTTPError as exc:
        raise HarnessError(f"GET {url}{path} failed: {exc!r}") from None
    if response.status_code != 200:
        raise HarnessError(
            f"GET {url}{path} answered {response.status_code}: {response.text[:300]}"
        )
    try:
        return response.json()
    except ValueError:
        raise HarnessError(f"GET {url}{path} answered non-JSON: {response.text[:300]}") from None


# ── Server processes (hubs and logsync daemons) ──────────────────────────


@dataclass
class ServerProcess:
    """One loopback HTTP server subprocess with its log and its own HOME."""

    name: str
    kind: str
    palace: Path
    home: Path
    port: int
    token: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    startup_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Spawn and wait for ``/healthz``; fail with the log tail if it dies."""
        self.home.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_healthy(began, timeout)
        self.startup_s = time.monotonic() - began

    def _wait_healthy(self, began: float, timeout: float) -> None:
        assert self.proc is not None
        while time.monotonic() - began < timeout:
            code = self.proc.poll()
            if code is not None:
                self.proc.wait()
                raise HarnessError(
                    f"{self.kind} {self.name} exited with code {code} before answering "
                    f"/healthz; command {' '.join(self.argv)}; log {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            if self._healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise HarnessError(
            f"{self.kind} {self.name} did not answer {self.url}/healthz within {timeout:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )

    def _healthy(self) -> bool:
        try:
            response = httpx.get(self.url + "/healthz", timeout=1.0, trust_env=False)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> bool:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; always reaps the child.

        Returns False when SIGKILL was needed: a graceful shutdown is part of
        what is under test, so the caller reports it.
        """
        if self.proc is None:
            return True
        if self.proc.poll() is not None:
            self.proc.wait()
            return True
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)
            return False

    def log_tail(self, lines: int = 80) -> str:
        return read_tail(self.log_path, lines)

    def get_json(self, path: str, params: Mapping | None = None) -> Any:
        return http_get_json(self.url, self.token, path, params)

    def version_vector(self) -> dict[str, int]:
        return dict(self.get_json("/sync/version_vector")["version_vector"])

    def replica_id(self) -> str:
        return str(self.get_json("/sync/version_vector")["replica_id"])


def hub_argv(exe: Path, palace: Path, port: int, token: str) -> list[str]:
    """``serve`` takes its own --palace; a global one before ``serve`` is ignored."""
    return [
        str(exe), "serve", "--palace", str(palace),
        "--host", LOOPBACK, "--port", str(port), "--token", token,
    ]  # fmt: skip


def logsync_argv(palace: Path, port: int, token: str, extra: Sequence[str] = ()) -> list[str]:
    """logsync takes the global ``--palace`` (before ``serve``), like its other commands."""
    return [
        sys.executable, "-m", "logsync", "--palace", str(palace), "serve",
        "--host", LOOPBACK, "--port", str(port), "--token", token, *extra,
    ]  # fmt: skip


def write_peers_json(palace: Path, peers: Iterable[ServerProcess | Mapping[str, str]]) -> Path:
    """Write ``<palace>/peers.json`` in the upstream format (name, url, token)."""
    entries = []
    for peer in peers:
        if isinstance(peer, ServerProcess):
            entries.append({"name": peer.name, "url": peer.url, "token": peer.token})
        else:
            entries.append(dict(peer))
    palace.mkdir(parents=True, exist_ok=True)
    path = palace / "peers.json"
    path.write_text(json.dumps({"peers": entries}, indent=2) + "\n", encoding="utf-8")
    return path


# ── CLIs ─────────────────────────────────────────────────────────────────


@dataclass
class Cli:
    """Runs one program's CLI against a palace, with its own HOME."""

    label: str
    prefix: list[str]
    home: Path
    env: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    seconds: float = 0.0

    def run(
        self,
        palace: Path,
        *args: str,
        stdin: bytes | None = None,
        check: bool = True,
        timeout: float = CLI_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[bytes]:
        argv = [*self.prefix, "--palace", str(palace), *args]
        began = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                input=stdin if stdin is not None else b"",
                capture_output=True,
                env=self.env or child_env(self.home),
                cwd=self.home,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise HarnessError(f"`{self._show(args)}` did not finish in {timeout:.0f} s") from None
        finally:
            self.calls += 1
            self.seconds += time.monotonic() - began
        if check and done.returncode != 0:
            raise HarnessError(
                f"`{self._show(args)}` exited {done.returncode}: "
                f"{_tail(done.stderr.decode(errors='replace') or '', 20)} "
                f"{_tail(done.stdout.decode(errors='replace') or '', 20)}"
            )
        return done

    def run_json(self, palace: Path, *args: str, stdin: bytes | None = None) -> Any:
        done = self.run(palace, *args, stdin=stdin)
        try:
            return json.loads(done.stdout.decode("utf-8"))
        except ValueError:
            raise HarnessError(
                f"`{self._show(args)}` printed non-JSON: {done.stdout[:300]!r}"
            ) from None

    def _show(self, args: Sequence[str]) -> str:
        shown = " ".join(a if len(a) < 60 else a[:57] + "..." for a in args)
        return f"{self.label} {shown}"


_APPEND_FLAGS = (
    "topic", "to_agent", "correlation_id", "branch", "base_commit", "status",
)  # fmt: skip


class MemPalaceCli(Cli):
    """The upstream ``mempalace`` logstream/artifact commands, ``--json`` everywhere."""

    def __init__(self, exe: Path, home: Path) -> None:
        super().__init__(label="mempalace", prefix=[str(exe)], home=home)
        self.exe = exe

    def append(
        self,
        palace: Path,
        *,
        type: str,
        stream: str,
        room: str,
        from_agent: str,
        body: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        artifact_ids: Sequence[str] = (),
        **optional: str | None,
    ) -> dict:
        """``logstream append``; the body goes through stdin so it stays byte-exact."""
        args = ["logstream", "append", "--type", type, "--stream", stream, "--room", room,
                "--from-agent", from_agent, "--json"]  # fmt: skip
        for name in _APPEND_FLAGS:
            if optional.get(name) is not None:
                args += ["--" + name.replace("_", "-"), str(optional[name])]
        unknown = set(optional) - set(_APPEND_FLAGS)
        if unknown:
            raise HarnessError(f"append() got unknown fields {sorted(unknown)}")
        if metadata is not None:
            args += ["--metadata", json.dumps(metadata, ensure_ascii=False)]
        for artifact_id in artifact_ids:
            args += ["--artifact-id", artifact_id]
        stdin = None
        if body is not None:
            args += ["--body-file", "-"]
            stdin = body.encode("utf-8")
        return dict(self.run_json(palace, *args, stdin=stdin))

    def put_artifact(
        self,
        palace: Path,
        kind: str,
        content: str,
        created_by: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict:
        args = ["artifact", "put", "--kind", kind, "--created-by", created_by,
                "--file", "-", "--json"]  # fmt: skip
        if metadata is not None:
            args += ["--metadata", json.dumps(metadata, ensure_ascii=False)]
        return dict(self.run_json(palace, *args, stdin=content.encode("utf-8")))

    def get_artifact(self, palace: Path, artifact_id: str) -> dict:
        return dict(self.run_json(palace, "artifact", "get", artifact_id, "--json"))

    def artifact_bytes(self, palace: Path, artifact_id: str) -> bytes:
        """``artifact get ID``: exact content bytes on stdout."""
        return self.run(palace, "artifact", "get", artifact_id).stdout

    def ack(
        self,
        palace: Path,
        event_id: str,
        from_agent: str,
        *,
        status: str | None = None,
        body: str | None = None,
        topic: str | None = None,
    ) -> dict:
        args = ["logstream", "ack", event_id, "--from-agent", from_agent, "--json"]
        for flag, value in (("--status", status), ("--body", body), ("--topic", topic)):
            if value is not None:
                args += [flag, value]
        return dict(self.run_json(palace, *args))

    def list_events(self, palace: Path) -> list[dict]:
        """Every event, ascending, paging ``--limit 500`` by ``--since-event-id``."""
        events: list[dict] = []
        while True:
            args = ["logstream", "list", "--json", "--limit", str(LIST_PAGE)]
            if events:
                args += ["--since-event-id", events[-1]["id"]]
            page = self.run_json(palace, *args)
            if page["count"] != len(page["events"]):
                raise HarnessError(f"logstream list count {page['count']} != events listed")
            events.extend(page["events"])
            if len(page["events"]) < LIST_PAGE:
                return events

    def sync(self, palace: Path, peer_url: str, token: str) -> list[dict]:
        """``logstream sync --peer URL --token T --json``: per-peer stats list."""
        return list(
            self.run_json(
                palace, "logstream", "sync", "--peer", peer_url, "--token", token, "--json"
            )  # fmt: skip
        )

    def bulk_append(self, palace: Path, specs: Sequence[Mapping[str, Any]]) -> int:
        """Append many events through upstream's own ``Logstream`` in ONE process.

        Why: paging tests need more than 500 events from a hub origin and one
        CLI process per event would take minutes. This runs the upstream
        library inside the MemPalace venv (never in ours); each spec holds
        ``append_event`` keyword arguments.
        """
        script = (
            "import json, sys\n"
            "from mempalace.logstream import Logstream\n"
            "specs = json.load(sys.stdin)\n"
            "ls = Logstream(db_path=sys.argv[1])\n"
            "for spec in specs:\n"
            "    ls.append_event(**spec)\n"
            "ls.close()\n"
            "print(len(specs))\n"
        )
        python = self.exe.parent / "python"
        argv = [str(python), "-c", script, str(palace / "logstream.sqlite3")]
        done = subprocess.run(
            argv,
            input=json.dumps(list(specs)).encode("utf-8"),
            capture_output=True,
            env=child_env(self.home),
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise HarnessError(f"bulk append failed: {_tail(done.stderr.decode(), 20)}")
        return int(done.stdout.decode().strip())


class LogsyncCli(Cli):
    """``python -m logsync`` with the global ``--palace`` (the project's own CLI)."""

    def __init__(self, home: Path) -> None:
        super().__init__(
            label="logsync",
            prefix=[sys.executable, "-m", "logsync"],
            home=home,
            env=logsync_env(home),
        )

    def sync(self, palace: Path, peer_url: str, token: str) -> list[dict]:
        """``logsync sync --peer URL --token T --json``: the upstream per-peer stats list."""
        stats = self.run_json(palace, "sync", "--peer", peer_url, "--token", token, "--json")
        if not isinstance(stats, list):
            raise HarnessError(
                f"`logsync sync --json` printed {type(stats).__name__}, expected the upstream "
                f"shape (a list of per-peer stats): {str(stats)[:300]}"
            )
        return stats

    def peers_add(self, palace: Path, name: str, url: str, token: str) -> None:
        self.run(palace, "peers", "add", name, url, "--token", token)


# ── Reading replicas for comparison ──────────────────────────────────────


@dataclass
class Snapshot:
    """Everything one replica holds: events and artifacts by id."""

    label: str
    events: dict[str, dict] = field(default_factory=dict)
    artifacts: dict[str, dict] = field(default_factory=dict)


def hub_snapshot(cli: MemPalaceCli, palace: Path, label: str) -> Snapshot:
    """Read a MemPalace palace with the upstream CLI (events, then referenced artifacts)."""
    events = cli.list_events(palace)
    snap = Snapshot(label, events={e["id"]: e for e in events})
    for artifact_id in sorted({a for e in events for a in e["artifact_ids"]}):
        snap.artifacts[artifact_id] = cli.get_artifact(palace, artifact_id)
    return snap


def logsync_snapshot(palace: Path, label: str) -> Snapshot:
    """Read a logsync palace through ``logsync.store.Store`` (WAL: safe beside a daemon)."""
    from logsync.store import Store

    with Store.open(palace) as store:
        events = list(store.iter_events())
        artifacts = list(store.iter_artifacts())
    return Snapshot(
        label,
        events={e["id"]: e for e in events},
        artifacts={a["id"]: a for a in artifacts},
    )


def without_seq(event: Mapping[str, Any]) -> dict:
    """The event minus ``seq``, the one field that is each replica's own."""
    return {key: value for key, value in event.items() if key != "seq"}


def record_diffs(
    expected: Mapping, actual: Mapping, *, label: str, ignore: Iterable[str] = ()
) -> list[str]:
    """Field-by-field differences (values and key order) between two records."""
    skip = set(ignore)
    want = [k for k in expected if k not in skip]
    got = [k for k in actual if k not in skip]
    diffs = []
    if want != got:
        diffs.append(f"{label}: key order {got} != {want}")
    for key in want:
        if key not in actual:
            continue
        a, b = expected[key], actual[key]
        if a != b or json.dumps(a, ensure_ascii=False) != json.dumps(b, ensure_ascii=False):
            diffs.append(f"{label}.{key}: {_short(b)} != expected {_short(a)}")
    return diffs


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


def collection_diffs(
    expected: Mapping[str, Mapping],
    actual: Mapping[str, Mapping],
    *,
    label: str,
    ignore: Iterable[str] = (),
) -> list[str]:
    """Differences between two id-keyed collections: missing, extra, per field."""
    ignore = tuple(ignore)
    diffs = []
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    if missing:
        diffs.append(f"{label}: {len(missing)} missing, e.g. {missing[:3]}")
    if extra:
        diffs.append(f"{label}: {len(extra)} unexpected, e.g. {extra[:3]}")
    for key in sorted(set(expected) & set(actual)):
        diffs += record_diffs(expected[key], actual[key], label=f"{label}[{key}]", ignore=ignore)
    return diffs


def assert_no_diffs(diffs: Sequence[str], what: str) -> None:
    if diffs:
        shown = "\n  ".join(diffs[:15])
        more = f"\n  ... and {len(diffs) - 15} more" if len(diffs) > 15 else ""
        raise AssertionError(f"{what}: {len(diffs)} difference(s)\n  {shown}{more}")


def assert_same_replica_content(expected: Snapshot, actual: Snapshot) -> None:
    """Same events (every field but ``seq``, same key order) and same artifacts."""
    diffs = collection_diffs(expected.events, actual.events, label="event", ignore=("seq",))
    diffs += collection_diffs(expected.artifacts, actual.artifacts, label="artifact")
    assert_no_diffs(diffs, f"{actual.label} differs from {expected.label}")


# ── Sample data: every field, unicode, exact bytes ───────────────────────

PATCH_OK = (
    "diff --git a/notes.txt b/notes.txt\n"
    "--- a/notes.txt\n"
    "+++ b/notes.txt\n"
    "@@ -1 +1 @@\n"
    "-old line\n"
    "+nëw line — ✓ 日本語\n"
)
PATCH_NO_NEWLINE = PATCH_OK.rstrip("\n")
FILE_CRLF = "first line\r\nzweite Zeile — ü\r\n\tindented 🚀\r\n"


def sample_artifacts(tag: str) -> list[dict[str, Any]]:
    """Artifact specs of every kind, with the byte-level traps patches hit."""
    return [
        {"kind": "patch", "content": PATCH_OK, "created_by": f"coder-{tag}",
         "metadata": {"files": ["notes.txt"], "lang": "ünïcode"}},
        {"kind": "patch", "content": PATCH_NO_NEWLINE, "created_by": f"coder-{tag}"},
        {"kind": "file", "content": FILE_CRLF, "created_by": f"writer-{tag}",
         "metadata": {"path": "docs/Ärger.txt"}},
        {"kind": "note", "content": f"note {tag}: 🚀 שלום мир", "created_by": f"writer-{tag}"},
        {"kind": "json", "content": '{"k": "v", "n": [1, 2]}', "created_by": f"bot-{tag}"},
        {"kind": "log", "content": "12:00:01 started\n12:00:02 done", "created_by": f"bot-{tag}"},
    ]  # fmt: skip


def sample_events(tag: str, artifact_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Event specs covering every field, defaults, broadcasts and unicode.

    ``artifact_ids`` are referenced in reverse order so a reader that does
    not sort them on read shows up.
    """
    refs = sorted(artifact_ids, reverse=True)
    return [
        {"type": "task.request", "stream": f"projekt/bücher-{tag}", "room": "délégation",
         "from_agent": f"lead-{tag}", "to_agent": f"coder-{tag}", "topic": "auth-v2 ✓",
         "correlation_id": f"corr-{tag}-1", "branch": "feature/ü", "base_commit": "0123abcd",
         "status": "open", "body": "Do the thing.\nSecond line — naïve café 日本語 🚀\r\n\tend",
         "metadata": {"z": 1, "a": {"ü": [1, 2.5, None, True, "日本"]}, "m": "x"},
         "artifact_ids": refs},
        {"type": "status.update", "stream": f"projekt/bücher-{tag}", "room": "general",
         "from_agent": f"coder-{tag}"},
        {"type": "presence", "stream": f"projekt/bücher-{tag}", "room": "general",
         "from_agent": f"coder-{tag}", "to_agent": "*", "status": "claimed", "body": ""},
        {"type": "patch.ready", "stream": f"projekt/bücher-{tag}", "room": "patches",
         "from_agent": f"coder-{tag}", "to_agent": f"lead-{tag}", "status": "ready",
         "correlation_id": f"corr-{tag}-1", "body": "-- starts with dashes", "metadata": {},
         "artifact_ids": refs[:1]},
        {"type": "note.x_y-z", "stream": "s", "room": "r", "from_agent": "a",
         "topic": "t", "status": "blocked", "body": "x" * 5000},
    ]  # fmt: skip


def bulk_specs(tag: str, count: int) -> list[dict[str, Any]]:
    """Many small events (for paging past the 500-event page limit)."""
    return [
        {
            "type": "bulk.item",
            "stream": f"bulk-{tag}",
            "room": "r",
            "from_agent": f"bot-{tag}",
            "body": f"item {i} — ü",
            "metadata": {"i": i},
        }
        for i in range(count)
    ]
