"""Progress of long work (issue 11 item 3): the numbers, the lines a pipe gets, and the
daemon's catch-up entry that `status` shows."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner

from logsync import progress
from logsync.cli import cli
from logsync.peers import add_peer
from logsync.peerstate import PeerBook
from logsync.push import PushReport
from logsync.report import OriginProgress, RoundReport


def report_at(done: int, total: int) -> RoundReport:
    report = RoundReport(peer="desk")
    report.origins["rep_" + "a" * 32] = OriginProgress(
        origin="rep_" + "a" * 32, start=100, target=100 + total, reached=100 + done)
    return report


def test_snapshot_counts_done_and_total_of_pulls_and_pushes() -> None:
    pull = report_at(65_000, 200_000)
    pull.origins["rep_" + "b" * 32] = OriginProgress(origin="rep_" + "b" * 32, start=5,
                                                      target=5, reached=5)
    assert progress.snapshot(pull).done == 65_000 and progress.snapshot(pull).total == 200_000
    push = PushReport(peer="desk")
    push.origins["o"] = OriginProgress(origin="o", start=10, target=30, reached=25)
    assert (progress.snapshot(push).done, progress.snapshot(push).total) == (15, 20)


def test_a_line_says_counts_rate_and_time_left() -> None:
    snap = progress.snapshot(report_at(65_000, 200_000))
    assert progress.line("pulling from", "desk", snap, 5.0) == (
        "pulling from desk: 65000/200000 ops (13000 ops/s, about 10 s left)")
    assert progress.rate_and_eta(0, 10, 0.0) == (0.0, None)


def watched_lines(report: RoundReport, *, terminal: bool, steps: int) -> list[str]:
    """The lines `progress.watch` emits over `steps` short sleeps, each step moving the
    report's origin 200 ops on."""
    lines: list[str] = []

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: progress.watch(report, "pulling from", "desk",
                                                 terminal=terminal, emit=lines.append))
            for step in range(1, steps + 1):
                await anyio.sleep(0.03)
                report.origins["rep_" + "a" * 32].reached += 200 * (step > 1)
            tg.cancel_scope.cancel()

    anyio.run(run)
    return lines


def test_a_pipe_gets_a_line_every_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "EVERY_S", 0.01)
    lines = watched_lines(report_at(200, 1000), terminal=False, steps=5)
    assert lines and all(ln.startswith("pulling from desk: ") for ln in lines)
    assert lines[-1].split()[3].endswith("/1000")


def test_a_terminal_whose_display_fails_still_gets_lines(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A fault of the display stays with the display: the round it watches goes on."""
    async def broken(*_: object) -> None:
        raise ImportError("no module named 'rich'")

    monkeypatch.setattr(progress, "_rich", broken)
    monkeypatch.setattr(progress, "EVERY_S", 0.01)
    with caplog.at_level(logging.WARNING, logger="logsync.progress"):
        lines = watched_lines(report_at(500, 1000), terminal=True, steps=1)
    assert lines and lines[0].startswith("pulling from desk: 500/1000 ops")
    assert "progress display failed (ImportError" in caplog.text


def test_the_daemon_saves_its_catch_up_and_status_shows_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    from logsync.daemon import Daemon, DaemonConfig

    monkeypatch.setattr(progress, "EVERY_S", 0.01)
    palace = tmp_path / "p"
    add_peer(palace, "desk", "http://127.0.0.1:9", None)
    daemon = Daemon(DaemonConfig(palace=palace, port=0))
    try:
        state = daemon.book.get("desk", "http://127.0.0.1:9")
        report = report_at(500, 2000)

        class Task:
            label = "desk"

        async def run() -> None:
            with anyio.move_on_after(0.2):
                await daemon._catching_up(Task(), state, report)  # type: ignore[arg-type]

        with caplog.at_level(logging.INFO, logger="logsync.daemon"):
            anyio.run(run)
        assert any("catching up from desk: 500/2000 ops" in r.getMessage()
                   for r in caplog.records)
        saved = PeerBook.load(palace).peers["desk"].catchup
        assert saved is not None and (saved["done"], saved["total"]) == (500, 2000)
        shown = CliRunner().invoke(cli, ["--palace", str(palace), "status", "--cached"])
        assert "catching up: 500/2000 ops" in shown.output
    finally:
        daemon.store.close()
