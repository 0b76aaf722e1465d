"""Cleanup is guaranteed (issue 13): a run that raises midway, with a node isolated, a
pair cut, a process stopped, a disk full and a link lossy, leaves no namespace, veth,
bridge, mount or process behind; a harness killed outright (no finally, no atexit) leaves
its resources, and the next harness's sweep removes them -- while a live harness's
resources are never swept."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logsync.chaos import netns
from logsync.chaos.cluster import Cluster, ClusterConfig
from logsync.chaos.interop import REPO_ROOT
from logsync.chaos.timeline import Timeline

START_TIMEOUT_S = 90.0


def _settled(tag: str, processes: int, timeout: float = 10.0) -> netns.Found:
    """The run's resources once its tagged processes number `processes` (bounded): a
    child a node starts inherits the tag, and one short-lived (CI once counted 4 of 3
    right after the start) must not fail the count."""
    deadline = time.monotonic() + timeout
    held = netns.find([tag])
    while len(held.processes) != processes and time.monotonic() < deadline:
        time.sleep(0.1)
        held = netns.find([tag])
    return held


@pytest.mark.chaos
@pytest.mark.parametrize("mode", ["netns", "loopback"])
def test_a_run_that_raises_midway_leaves_nothing(
    mode: str, tmp_path: Path, mempalace_exe: Path, need_mount: None,
    request: pytest.FixtureRequest,
) -> None:
    if mode == "netns":
        request.getfixturevalue("need_netns")
    cluster = Cluster(ClusterConfig(root=tmp_path, nodes=2, mode=mode, disk_nodes=("n1",),
                                    proxied=(("n2", "n1"),)), Timeline(), mempalace_exe)
    with pytest.raises(RuntimeError, match="planted failure"), cluster:
        assert cluster.mode == mode
        held = _settled(cluster.tag, 3)
        assert len(held.processes) == 3 and held.mounts, held.processes
        if mode == "netns":
            assert len(held.namespaces) == 3 and len(held.links) == 4  # bridge + 3 veths
        cluster.isolate("n1")
        cluster.cut([("n2", "hub")])
        cluster.pause("n2")
        cluster.fill_disk("n1")
        cluster.degrade(("n2", "n1"), loss=0.5, delay=0.1)
        assert all(cluster.tag not in line for line in netns.sweep()), "a live run is swept"
        assert netns.find([cluster.tag]).describe() == held.describe()
        raise RuntimeError("planted failure mid-run")
    assert netns.find([cluster.tag]).describe() == []
    assert not any(node.server and node.server.running for node in cluster.nodes.values())
    assert not (netns.owner_dir() / f"{cluster.tag}.owner").exists()
    assert cluster.problems == []


@pytest.mark.chaos
def test_a_harness_killed_outright_is_swept_by_the_next(
    tmp_path: Path, mempalace_exe: Path, need_netns: None, need_mount: None,
) -> None:
    out = tmp_path / "run"
    harness = subprocess.Popen(
        [sys.executable, "-m", "logsync.chaos", "--seed", "9", "--nodes", "2", "--mix",
         "disk,partition", "--window", "120", "--out", str(out), "--quiet"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        tag = _wait_cluster_up(out / "timeline.jsonl", harness)
        time.sleep(1.0)
    finally:
        harness.kill()
        harness.wait(10)
    left = netns.find([tag])
    assert left.processes and left.namespaces and left.links and left.mounts, left.describe()
    removed = netns.sweep()
    # a process may exit on its own between the find and the sweep (its parent was
    # killed): the sweep cannot report it, and the find below shows it gone
    unreported = set(left.describe()) - set(removed)
    assert all(item.startswith("process ") for item in unreported), unreported
    assert netns.find([tag]).describe() == []
    assert not (netns.owner_dir() / f"{tag}.owner").exists()


def _wait_cluster_up(timeline: Path, harness: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if harness.poll() is not None:
            raise AssertionError(f"the harness exited ({harness.returncode}) before its "
                                 "cluster was up")
        if timeline.exists():
            for line in timeline.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if entry["kind"] == "cluster_up":
                    return str(entry["tag"])
        time.sleep(0.2)
    raise AssertionError(f"no cluster_up in {timeline} within {START_TIMEOUT_S:.0f} s")


def test_mount_points_with_escaped_characters_are_read_back() -> None:
    """/proc/self/mounts writes a space in a mount point as \\040 (tab, newline and
    backslash likewise); the sweep must umount the real path."""
    assert netns._unescape(r"/tmp/run\040dir/lscabc123-n1-disk") == "/tmp/run dir/lscabc123-n1-disk"
    assert netns._unescape(r"/a\134b\011c") == "/a\\b\tc"
