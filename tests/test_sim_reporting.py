"""What a run tells the person who must trust and replay it: a missed target is named
and exits 1 with a replay command that reproduces the run (variant included); a fleet
that never converged is a liveness failure, not silent divergence; a flap ends at its
`until`; `--trace` and `--plot` are checked before the run and never leave half a file."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from logsync.files import whole_or_none
from logsync.sim import parse_scenario, run_scenario
from logsync.sim.checks import Snapshot, check_fleet
from logsync.sim.scratch import scratch_base

TINY = """
name = "tiny"
duration = "4s"
[nodes]
count = 3
[network]
latency = "20ms"
[sync]
interval = "1s"
[[workload]]
rate = 10
[expect]
converge_within = "10s"
[variants.strict.expect]
median_reach = "1ms"
"""


def _simulate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "logsync", "simulate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def test_a_missed_target_is_named_and_its_replay_command_reproduces_the_run(
        tmp_path: Path) -> None:
    (tmp_path / "my tiny.toml").write_text(TINY)
    done = _simulate("my tiny.toml", "--variant", "strict", "--seed", "3", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    header = done.stdout.splitlines()[0]
    assert header.endswith("seed=3: TARGETS MISSED (median_reach_s)")
    (replay,) = re.findall(r"replay with `([^`]+)`", done.stdout)
    assert replay == "logsync simulate 'my tiny.toml' --variant strict --seed 3"
    again = _simulate(*shlex.split(replay)[2:], cwd=tmp_path)
    assert again.stdout.splitlines()[:2] == done.stdout.splitlines()[:2]
    sweep = _simulate("my tiny.toml", "--variant", "strict", "--seeds", "1..2", "--json",
                      cwd=tmp_path)
    summary = json.loads(sweep.stdout)
    assert sweep.returncode == 1 and summary["targets_missed_seeds"] == [1, 2]
    assert [s["targets_missed"] for s in summary["seeds"]] == [["median_reach_s"]] * 2
    text = _simulate("my tiny.toml", "--variant", "strict", "--seeds", "1..2", cwd=tmp_path)
    assert "2 missed targets (1, 2)" in text.stdout.splitlines()[0]
    assert "  seed 1: missed median_reach_s" in text.stdout.splitlines()


def test_a_fleet_that_never_converged_is_reported_as_lag_not_divergence() -> None:
    scenario = parse_scenario(TINY.replace('converge_within = "10s"', 'converge_within = "1ms"')
                              + '[[fault]]\nkind = "partition"\nat = "1s"\nuntil = "4s"\n'
                              'groups = [["n0"], ["n1", "n2"]]\n', source="tiny.toml")
    report = run_scenario(scenario.with_seed(2))
    lines = [v.line() for v in report.violations]
    assert report.convergence_s is None and any("not converged" in line for line in lines)
    assert not [line for line in lines if "invariant 5" in line or "after convergence" in line]
    assert "never reached every node" in report.text()


def test_a_flap_heals_at_its_until_not_at_its_next_flip() -> None:
    scenario = parse_scenario(TINY + """
[[fault]]
kind = "flap"
nodes = ["n0", "n1"]
at = "1s"
until = "1.7s"
period = "1s"
""", source="tiny.toml")
    sink = io.StringIO()
    run_scenario(scenario.with_seed(1), trace_sink=sink)
    lines = sink.getvalue().splitlines()
    (healed,) = [i for i, line in enumerate(lines) if "heal flap n0,n1" in line]
    assert lines[healed].split()[0] == "1700000", lines[healed]  # virtual us
    assert not [line for line in lines[healed:] if "cut=flap" in line]


def test_trace_and_plot_targets_are_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "tiny.toml").write_text(TINY)
    for args, says in ((("--trace", "nodir/t.txt"), "cannot write the trace to nodir/t.txt"),
                       (("--plot", "out.txt"), "'txt' is not an image format"),
                       (("--plot", "nodir/x.png"), "cannot write the plot to nodir/x.png")):
        done = _simulate("tiny.toml", *args, cwd=tmp_path)
        assert done.returncode == 1 and says in done.stderr, done.stderr
        assert "trace sha256" not in done.stdout  # refused before any run


def test_a_file_written_whole_or_none_keeps_the_old_one_when_the_writer_fails(
        tmp_path: Path) -> None:
    target = tmp_path / "trace.txt"
    target.write_text("the old trace\n")
    with pytest.raises(KeyboardInterrupt), whole_or_none(target) as sink:
        sink.write("half of a new one")
        raise KeyboardInterrupt
    assert target.read_text() == "the old trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.txt"]
    with whole_or_none(target) as sink:
        sink.write("a whole new one\n")
    assert target.read_text() == "a whole new one\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_single_run_stopped_by_a_signal_exits_130_and_leaves_no_store(
        tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C was 'Error: aborted', exit 1 (a failing seed's code); SIGTERM left the run's
    stores in /dev/shm for the next run to clean."""
    (tmp_path / "long.toml").write_text(TINY.replace('duration = "4s"', 'duration = "2h"'))
    trace = tmp_path / "t.txt"
    proc = subprocess.Popen([sys.executable, "-m", "logsync", "simulate", "long.toml",
                             "--trace", str(trace)], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not _held_scratch_dirs(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)  # until the run has made its stores
        mine = _held_scratch_dirs(proc.pid)  # its own: another run may come and go too
        assert mine, "the run never started"
        time.sleep(0.5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err and "Traceback" not in err
    assert not [path for path in mine if path.exists()] and not trace.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.toml"]


def _held_scratch_dirs(pid: int) -> set[Path]:
    """The run directories process `pid` holds open (its lock file: `sim/scratch.py`)."""
    base, held = scratch_base(), set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
                if target.parent.parent == base and target.parent.name.startswith(
                        "logsync-sim-"):
                    held.add(target.parent)
    return held


def test_a_run_too_large_for_its_bound_is_refused_before_it_starts(tmp_path: Path) -> None:
    """200 nodes at 100 000 events/s for ten years was accepted and ran until killed."""
    huge = TINY.replace('count = 3', 'count = 200').replace('rate = 10', 'rate = 100000') \
        .replace('duration = "4s"', 'duration = "3650d"')
    (tmp_path / "huge.toml").write_text(huge)
    started = time.monotonic()
    done = _simulate("huge.toml", cwd=tmp_path)
    assert done.returncode == 1 and time.monotonic() - started < 60
    assert "applies in all; a run is bounded to 2,000,000" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_trace_to_a_device_a_fifo_or_a_symlink_is_written_there_not_replaced(
        tmp_path: Path) -> None:
    """`--trace /dev/null` renamed a file over the device (as root, the real /dev/null);
    a FIFO takes the same path as a device here (a test must not risk the real one)."""
    fifo, real, link = tmp_path / "fifo", tmp_path / "real.txt", tmp_path / "link.txt"
    os.mkfifo(fifo)
    real.write_text("old\n")
    link.symlink_to(real)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    with whole_or_none(fifo) as sink:
        sink.write("through the pipe\n")
    reader.join(timeout=10)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(fifo.lstat().st_mode)
    with whole_or_none(link) as sink:
        sink.write("new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.txt", "real.txt"]


def _note(said: list[str], invariant: int, line: str) -> None:
    said.append(f"{invariant} {line}")


def _snap(node: str, ops: list[dict], artifacts: dict[str, dict]) -> Snapshot:
    return Snapshot(node, f"rep_{node}", {}, ops,
                    by_key={(op["origin_replica"], op["origin_seq"]): op for op in ops},
                    artifacts=artifacts)


def test_a_fleet_that_never_converged_still_reports_what_is_unsafe() -> None:
    """Lag is excused before convergence; two contents for one artifact id are not, even
    when a third replica has not received the op naming it yet."""
    op = {"id": "evt_1", "origin_replica": "rep_o", "origin_seq": 1, "artifact_ids": ["art1"]}
    snaps = [_snap("n0", [op], {"art1": {"content": "a"}}),
             _snap("n1", [op], {"art1": {"content": "b"}}),
             _snap("n2", [], {})]
    for converged in (True, False):
        said: list[str] = []
        check_fleet(snaps, functools.partial(_note, said), converged=converged)
        assert any("artifact art1 differs between n0 and n1" in line for line in said), said
        lag = [line for line in said if "not by n2" in line]
        assert bool(lag) is converged, said  # n2's lag is a finding only once converged



@pytest.mark.parametrize("suffix", ["png", "svg", "svgz", "pdf", "ps", "eps"])
def test_a_plot_is_the_same_bytes_whenever_it_is_drawn(
        tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No date and no random id in the file (matplotlib stamps the moment and salts SVG
    ids with a uuid by default): the same run draws the same bytes."""
    import gzip

    from logsync.sim.plot import plot_lag

    report = run_scenario(parse_scenario(TINY))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # the same name: PostScript writes it in its title
    first = plot_lag(report, tmp_path / "a" / f"lag.{suffix}").read_bytes()
    second = plot_lag(report, tmp_path / "b" / f"lag.{suffix}").read_bytes()
    assert first == second
    text = gzip.decompress(first) if suffix == "svgz" else first
    if suffix == "svgz":
        assert first[4:8] == bytes(4)  # gzip's mtime
    if suffix in ("svg", "svgz"):
        assert b"<svg" in text and b"<dc:date>" not in text
    if suffix == "pdf":
        assert text.startswith(b"%PDF") and b"/CreationDate" not in text
    if suffix in ("ps", "eps"):
        assert b"%%CreationDate: Thu Jan 01 00:00:00 1970" in text
    assert "SOURCE_DATE_EPOCH" not in os.environ  # put back as it was


def test_a_plot_format_needing_a_missing_program_is_refused_before_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib's .pgf needs a TeX program: without one the run would end in a traceback
    after all its work, so the suffix is refused up front, naming the program."""
    import shutil as shutil_mod

    from logsync.errors import ConfigError
    from logsync.sim.plot import check_plot_format

    monkeypatch.setattr(shutil_mod, "which", lambda name, *a, **k: None)
    with pytest.raises(ConfigError, match=r"cannot draw the plot as x\.pgf: matplotlib writes "
                       r"\.pgf through xelatex, which is not installed here"):
        check_plot_format(Path("x.pgf"))
    check_plot_format(Path("x.svg"))  # needs no program
    monkeypatch.setattr(shutil_mod, "which", lambda name, *a, **k: f"/usr/bin/{name}")
    check_plot_format(Path("x.pgf"))
