"""Fixtures for the interop tests: a session-wide MemPalace install and a
per-test ``lab`` that starts hubs and logsync daemons and always stops them.

When a test fails, the tail of every log the lab captured is attached to
the report, so a hub or daemon problem is visible without rerunning.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from .hub import (
    STOP_TIMEOUT_S,
    HarnessError,
    LogsyncCli,
    MemPalaceCli,
    ServerProcess,
    child_env,
    ensure_mempalace,
    free_port,
    hub_argv,
    logsync_argv,
    logsync_env,
)

LAB_KEY = pytest.StashKey["Lab"]()
STARTUPS_KEY = pytest.StashKey[list[tuple[str, float]]]()
FIGURES_KEY = pytest.StashKey[list[str]]()
_PORT_ATTEMPTS = 3


class Lab:
    """Starts real processes for one test under ``root``; ``close`` stops them all."""

    def __init__(self, root: Path, mempalace_exe: Path) -> None:
        self.root = root
        self.mempalace_exe = mempalace_exe
        self.servers: list[ServerProcess] = []
        self.figures: list[str] = []
        self.mp = MemPalaceCli(mempalace_exe, self._dir("home-mempalace-cli"))
        self.ls = LogsyncCli(self._dir("home-logsync-cli"))

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def figure(self, text: str) -> None:
        """A measured figure (e.g. a convergence time) for the session summary."""
        self.figures.append(text)

    def palace(self, name: str) -> Path:
        """A fresh, empty palace directory."""
        path = self.root / "palaces" / name
        path.mkdir(parents=True, exist_ok=False)
        return path

    def hub(
        self,
        name: str,
        *,
        palace: Path | None = None,
        sync_interval: float | None = None,
        port: int | None = None,
        token: str | None = None,
        start: bool = True,
    ) -> ServerProcess:
        """A MemPalace hub (``mempalace serve``), own HOME, optional sync interval.

        ``sync_interval`` sets MEMPALACE_SYNC_INTERVAL (default upstream: 15 s;
        the hub's first pull round happens only after one interval).
        """
        extra = {} if sync_interval is None else {"MEMPALACE_SYNC_INTERVAL": str(sync_interval)}
        home = self._dir(f"home-{name}")
        return self._server(
            name, "hub", palace, port, token, start,
            lambda pal, p, tok: hub_argv(self.mempalace_exe, pal, p, tok),
            child_env(home, extra), home,
        )  # fmt: skip

    def daemon(
        self,
        name: str,
        *,
        palace: Path | None = None,
        port: int | None = None,
        token: str | None = None,
        extra_args: Sequence[str] = (),
        start: bool = True,
    ) -> ServerProcess:
        """A logsync daemon (``python -m logsync serve``), own HOME."""
        home = self._dir(f"home-{name}")
        return self._server(
            name, "logsync daemon", palace, port, token, start,
            lambda pal, p, tok: logsync_argv(pal, p, tok, extra_args),
            logsync_env(home), home,
        )  # fmt: skip

    def _server(
        self,
        name: str,
        kind: str,
        palace: Path | None,
        port: int | None,
        token: str | None,
        start: bool,
        argv_for: Callable[[Path, int, str], list[str]],
        env: dict[str, str],
        home: Path,
    ) -> ServerProcess:
        """Build (and start) one server, retrying on a fresh port if ours was taken."""
        palace = palace if palace is not None else self.palace(name)
        token = token or f"tok-{name}-{secrets.token_hex(8)}"
        fixed_port = port is not None
        for attempt in range(1 if fixed_port else _PORT_ATTEMPTS):
            chosen = port if fixed_port else free_port()
            server = ServerProcess(
                name=name, kind=kind, palace=palace, home=home, port=chosen, token=token,
                argv=argv_for(palace, chosen, token), env=env,
                log_path=self.root / f"{name}.{attempt}.log",
            )  # fmt: skip
            self.servers.append(server)
            if not start:
                return server
            try:
                server.start()
                return server
            except HarnessError:
                if fixed_port or "in use" not in server.log_tail().lower():
                    raise
        raise HarnessError(f"{kind} {name}: no free loopback port after {_PORT_ATTEMPTS} tries")

    def close(self) -> None:
        """Stop every server, newest first; one that needs SIGKILL fails the test."""
        errors = []
        for server in reversed(self.servers):
            try:
                if not server.stop():
                    errors.append(
                        f"{server.kind} {server.name} ignored SIGTERM for "
                        f"{STOP_TIMEOUT_S:.0f} s and was killed; log tail:\n{server.log_tail(8)}"
                    )
            except Exception as exc:  # keep stopping the others
                errors.append(f"{server.name}: {exc!r}")
        if errors:
            raise HarnessError("unclean shutdown: " + "\n".join(errors))


@pytest.fixture(scope="session")
def mempalace_exe() -> Path:
    """The MemPalace 3.11.0 executable, installed once per session if missing."""
    try:
        return ensure_mempalace()
    except HarnessError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)


@pytest.fixture
def lab(request: pytest.FixtureRequest, tmp_path: Path, mempalace_exe: Path) -> Iterator[Lab]:
    the_lab = Lab(tmp_path, mempalace_exe)
    request.node.stash[LAB_KEY] = the_lab
    try:
        yield the_lab
    finally:
        startups = request.config.stash.setdefault(STARTUPS_KEY, [])
        startups += [(s.kind, s.startup_s) for s in the_lab.servers if s.startup_s]
        request.config.stash.setdefault(FIGURES_KEY, []).extend(the_lab.figures)
        the_lab.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    the_lab = item.stash.get(LAB_KEY, None)
    if the_lab is None or not report.failed or report.when == "teardown":
        return
    for server in the_lab.servers:
        report.sections.append((f"{server.kind} {server.name} log", server.log_tail(60)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long hubs and daemons took to answer /healthz (start-up cost of the suite)."""
    startups = terminalreporter.config.stash.get(STARTUPS_KEY, [])
    for kind in sorted({k for k, _ in startups}):
        times = sorted(t for k, t in startups if k == kind)
        terminalreporter.write_line(
            f"interop: {len(times)} {kind} start(s), median {times[len(times) // 2]:.2f} s, "
            f"max {times[-1]:.2f} s"
        )
    for text in terminalreporter.config.stash.get(FIGURES_KEY, []):
        terminalreporter.write_line(f"interop: {text}")
