"""The nemesis schedule is a pure function of its inputs (a failing seed replays exactly),
places every kind of its mix, keeps its exclusions, and the replay command a run prints
parses back to the very same schedule."""

from __future__ import annotations

import re
import shlex
import threading
import time
from pathlib import Path

import pytest

from logsync.chaos.__main__ import parser
from logsync.chaos.nemesis import Nemesis
from logsync.chaos.run import RunConfig
from logsync.chaos.schedule import (
    MIXES,
    NETWORK,
    PROCESS,
    REQUEST_TIMEOUT_S,
    Fault,
    make_schedule,
    parse_mix,
)
from logsync.chaos.timeline import Timeline

MEMBERS = ["n1", "n2", "n3", "n4", "n5", "hub"]
LINKS = [("n1", "n2"), ("n2", "n1")]


def schedule(seed: int, mix: str, window: float = 40.0, round_no: int = 0) -> list:
    return make_schedule(seed, parse_mix(mix), window, MEMBERS, disk_nodes=["n2"],
                         links=LINKS, round_no=round_no)


def test_the_same_inputs_give_the_same_schedule_and_other_seeds_another() -> None:
    first = [f.as_dict() for f in schedule(7, "all")]
    assert first == [f.as_dict() for f in schedule(7, "all")]
    assert first != [f.as_dict() for f in schedule(8, "all")]
    assert first != [f.as_dict() for f in schedule(7, "all", round_no=1)]
    assert schedule(7, "none") == []


@pytest.mark.parametrize("mix", ["standard", "hub", "disk"])
def test_every_kind_is_placed_and_the_exclusions_hold(mix: str) -> None:
    for seed in range(1, 60):
        faults = schedule(seed, mix)
        assert {f.kind for f in faults} == set(MIXES[mix]), seed
        net = sorted((f for f in faults if f.kind in NETWORK), key=lambda f: f.start)
        assert all(a.end <= b.start for a, b in zip(net, net[1:], strict=False)), seed
        for member in MEMBERS:
            mine = sorted((f for f in faults if f.kind in PROCESS and member in f.targets),
                          key=lambda f: f.start)
            assert all(a.end <= b.start for a, b in zip(mine, mine[1:], strict=False)), seed
        final = max(net, key=lambda f: f.start)
        assert 31.0 <= final.start <= 35.0 and final.end > 40.0, "a split is on at the heal"
        for fault in faults:
            assert 0 < fault.start < 40.0
            if fault.kind == "pause":
                assert REQUEST_TIMEOUT_S < fault.duration and fault.end <= 40.0
            if fault.kind in ("kill", "skew"):
                assert fault.targets != ["hub"]
            if fault.kind == "partition":
                p = fault.params
                assert len(p["minority"]) < len(p["majority"])
                assert sorted(p["minority"] + p["majority"]) == sorted(MEMBERS)
            if fault.kind == "bridge":
                p = fault.params
                assert sorted([p["bridge"], *p["a"], *p["b"]]) == sorted(MEMBERS)


def test_the_printed_replay_command_gives_the_same_schedule(tmp_path: Path) -> None:
    cfg = RunConfig(seed=11, out=tmp_path, topology="ring", mix="disk", nodes=4, window=45)
    args = parser().parse_args(shlex.split(cfg.replay("netns"))[3:])
    again = RunConfig(seed=args.seed, out=tmp_path, topology=args.topology, mix=args.mix,
                      nodes=args.nodes, window=args.window, rounds=args.rounds)
    assert again == cfg
    assert again.disk_nodes() == cfg.disk_nodes() and again.lossy_links("netns") == \
        cfg.lossy_links("netns")


def test_the_replay_command_reads_back_every_setting_whatever_its_value(
        tmp_path: Path) -> None:
    for rate, interval, timeout, window, duration in ((8.0, 0.5, 30.0, 1e6, 1e6),
                                                      (0.25, 1e-7, 1e20, 40.5, 0.0),
                                                      (4.0, 2.0, 120.0, 40.0, 90.0)):
        cfg = RunConfig(seed=3, out=tmp_path, rate=rate, interval=interval,
                        converge_timeout=timeout, window=window, duration=duration)
        line = cfg.replay("loopback")
        args = parser().parse_args(shlex.split(line)[3:])
        assert (args.rate, args.interval, args.converge_timeout, args.window,
                args.duration) == (rate, interval, timeout, window, duration), line
        assert not re.search(r"\de[+-]?\d", line), line  # no exponent anywhere
    assert "--rate" not in RunConfig(seed=3, out=tmp_path).replay("netns")


def test_a_bad_mix_is_one_sentence() -> None:
    with pytest.raises(ValueError, match="unknown: netem"):
        parse_mix("partition,netem")
    assert parse_mix("kill, pause") == ("kill", "pause")


class _Clock:
    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def heal_network(self) -> None:
        pass

    def pause(self, name: str) -> None:
        self.at["stop"] = time.monotonic()

    def resume(self, name: str) -> None:
        self.at["cont"] = time.monotonic()


def test_a_pause_that_began_runs_its_length_after_the_window_closes() -> None:
    """The window closing (``stop``) ends nothing but the schedule: a pause that began is
    ended by the nemesis at its time, not cut short by the heal."""
    clock, stop, timeline = _Clock(), threading.Event(), Timeline()
    faults = [Fault("pause", 0.0, 0.8, ["n1"]), Fault("pause", 5.0, 1.0, ["n2"])]
    nemesis = threading.Thread(target=Nemesis(clock, timeline, faults).run,  # type: ignore[arg-type]
                               args=(timeline.now(), stop))
    nemesis.start()
    time.sleep(0.3)
    stop.set()
    nemesis.join(5)
    assert not nemesis.is_alive() and clock.at["cont"] - clock.at["stop"] >= 0.75
    assert [e["index"] for e in timeline.of("fault")] == [0, 0]  # the second never began
