"""The fixed-seed chaos runs (issue 13): real daemons and a real MemPalace hub under a
nemesis, a workload, and the checker's verdict. Each seed's schedule replays exactly with
the command its failure prints (``python -m logsync.chaos --seed ...``).

- mesh, seed 1: partitions (majority/minority, bridge, one node isolated), kill -9, a pause
  longer than the request timeout, clock skew with a jump, a lossy proxied link;
- hub-and-spoke (the hub at the centre), seed 2: the same faults and the hub killed;
- mesh in loopback mode (a proxy on every link), seed 3: the same plus a full disk.

Each must lose, duplicate and diverge nothing, converge after the heal, and leave no
namespace, link, mount or process behind.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from logsync.chaos import netns
from logsync.chaos.run import RunConfig, run
from logsync.chaos.schedule import REQUEST_TIMEOUT_S, parse_mix

FIXED = [
    pytest.param(1, "mesh", "partition,bridge,isolate,kill,pause,skew,lossy", "netns",
                 id="mesh-seed1"),
    pytest.param(2, "star", "partition,isolate,kill,pause,skew,hub_kill", "netns",
                 id="hub-and-spoke-seed2"),
    pytest.param(3, "mesh", "partition,kill,pause,skew,disk,lossy", "loopback",
                 id="mesh-full-disk-loopback-seed3"),
]

FAKETIME_FILES = "/dev/shm/*faketime_*"


@pytest.mark.chaos
@pytest.mark.parametrize(("seed", "topology", "mix", "mode"), FIXED)
def test_a_fixed_seed_loses_nothing_and_leaves_nothing(
    seed: int, topology: str, mix: str, mode: str, tmp_path: Path, mempalace_exe: Path,
    request: pytest.FixtureRequest, record_line,
) -> None:
    request.getfixturevalue("need_faketime")
    if mode == "netns":
        request.getfixturevalue("need_netns")
    if "disk" in mix:
        request.getfixturevalue("need_mount")
    out = tmp_path / "run"
    faketime_files = set(glob.glob(FAKETIME_FILES))
    result = run(RunConfig(seed=seed, out=out, topology=topology, mix=mix, mode=mode),
                 mempalace_exe)
    s = result.summary
    record_line(f"{result.line()} [{s['mode_reason']}]")
    problems = [p for r in s["rounds"] for p in r["verdict"]["problems"]]
    assert result.ok, (f"{result.line()}\n  " + "\n  ".join(problems[:10])
                       + f"\n  cleanup: {s['cleanup_problems']} {s['leftovers']}"
                       + f"\n  run directory {out}\n  replay: {result.replay}")
    assert s["mode"] == mode, s["mode_reason"]
    assert (s["lost"], s["duplicated"], s["divergent"]) == (0, 0, 0)
    assert s["convergence_s"]["max"] is not None
    ran = [f for r in s["rounds"] for f in r["faults"] if f["ran"]]
    assert {f["kind"] for f in ran} == set(parse_mix(mix)), "every fault of the mix ran"
    assert all(f["ran"][1] - f["ran"][0] > REQUEST_TIMEOUT_S for f in ran
               if f["kind"] == "pause"), "pauses outlast the request timeout"
    acked = [o for o in s["history"] if o["outcome"] == "ok"]
    assert len(acked) >= 40, f"a thin workload: {len(acked)} acknowledged appends"
    assert {o["node"] == "hub" for o in acked} == {True, False}, "both CLIs acknowledged"
    assert not result.leftovers and netns.find([s["tag"]]).describe() == []
    assert set(glob.glob(FAKETIME_FILES)) - faketime_files == set(), \
        "libfaketime's files of a skewed daemon are left in /dev/shm"
    assert json.loads((out / "verdict.json").read_text())["ok"] is True
    assert (out / "timeline.png").stat().st_size > 10_000
