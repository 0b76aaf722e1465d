"""The simulator itself: replayable from a seed, its faults happen, its checks catch bugs.

Small scenarios written inline; the scenario library lives in test_sim_library.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from logsync.cli import cli
from logsync.effects import ApplyPage
from logsync.keyfile import read_signing_key
from logsync.sim import parse_scenario, run_scenario
from logsync.sim.driver import Driver
from logsync.sim.node import SimNode
from logsync.sim.runner import Simulation

SMALL = """
name = "small"
duration = "12s"
[nodes]
count = 4
[network]
latency = { dist = "uniform", min = "5ms", max = "60ms" }
loss = 0.05
duplicate = 0.05
reorder = 0.1
[sync]
interval = "2s"
backoff_cap = "2s"
timeout = "1s"
[[workload]]
rate = 15
[[fault]]
kind = "partition"
at = "3s"
until = "8s"
groups = [["n0"], ["n1", "n2", "n3"]]
[expect]
converge_within = "20s"
"""


def small(extra: str = "", seed: int = 1) -> Any:
    return parse_scenario(SMALL + extra, source="small.toml").with_seed(seed)


def test_one_seed_replays_byte_for_byte_and_seeds_differ() -> None:
    first, again, other = (run_scenario(small(seed=s)) for s in (7, 7, 8))
    assert first.ok, first.text()
    assert first.trace_hash == again.trace_hash
    assert first.trace_lines == again.trace_lines and first.events == again.events
    assert other.trace_hash != first.trace_hash


def signed_chains(workdir: Path, seed: int) -> dict[str, list[tuple[str, int, str]]]:
    """Each node's public key and every signature its chain holds, after one run."""
    Simulation(small(seed=seed), workdir).run()
    out = {}
    for palace in sorted(p for p in workdir.iterdir() if (p / "logstream.sqlite3").exists()):
        key = read_signing_key(palace)
        assert key is not None
        conn = sqlite3.connect(palace / "logstream.sqlite3")
        try:
            rows = conn.execute("SELECT origin, origin_seq, hex(signature) FROM logsync_chain "
                                "WHERE signature IS NOT NULL ORDER BY 1, 2").fetchall()
        finally:
            conn.close()
        out[palace.name] = [("key", 0, bytes(key.verify_key).hex()), *rows]
    return out


def test_signing_keys_and_signatures_replay_from_the_seed(tmp_path: Path) -> None:
    """A node's key comes from the run's seed, not the OS: the same seed signs the same
    chains with the same keys, another seed gives other keys."""
    first, again, other = (signed_chains(tmp_path / name, seed)
                           for name, seed in (("a", 7), ("b", 7), ("c", 8)))
    assert len(first) == 4 and all(len(rows) > 1 for rows in first.values())
    assert first == again
    keys = {name: rows[0] for name, rows in first.items()}
    assert len(set(keys.values())) == 4  # one key per node
    assert not set(keys.values()) & {rows[0] for rows in other.values()}


def test_the_trace_does_not_depend_on_the_process(tmp_path: Path) -> None:
    """Another interpreter with another string-hash seed writes the same trace."""
    scenario = tmp_path / "small.toml"
    scenario.write_text(SMALL)
    hashes = []
    for hash_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run(
            [sys.executable, "-m", "logsync", "simulate", str(scenario), "--seed", "3", "--json"],
            capture_output=True, text=True, env=env, timeout=120, check=True,
        )
        hashes.append(json.loads(out.stdout)["trace_hash"])
    assert hashes[0] == hashes[1]


def test_a_clean_run_converges_with_identical_views_and_reports_its_figures() -> None:
    report = run_scenario(small())
    assert report.ok, report.text()
    assert report.convergence_s is not None and report.convergence_s < 20
    assert report.lost == 0 and report.reach_count == report.events > 50
    assert report.views["agents_seen"] == 8 and report.views["claims"] >= 1
    assert report.requests_total > 0 and report.bytes > 0 and report.notifications > 0
    assert report.net["lost"] > 0 and report.net["duplicated"] > 0 and report.net["cut"] > 0
    assert report.windows == [{"kind": "partition", "start": 3.0, "end": 8.0,
                               "label": "partition n0|n1,n2,n3"}]
    assert max(report.max_lag().values()) > 0
    assert "trace sha256" in report.text() and report.as_dict()["ok"] is True


def test_messages_count_requests_answers_and_change_frames_as_maelstrom_does() -> None:
    """On a clean link every request is answered; under loss and a partition some are not.
    Either way a message is a request, an answer or a change frame, nothing else."""
    clean = parse_scenario(
        'name = "clean"\nduration = "4s"\n[nodes]\ncount = 3\n[network]\nlatency = "20ms"\n'
        '[[workload]]\nrate = 10\n[expect]\nconverge_within = "10s"\n', source="clean.toml")
    lossy = run_scenario(small())
    for report in (run_scenario(clean), lossy):
        assert report.ok, report.text()
        assert report.messages_total == report.requests_total + report.answers \
            + report.notifications
        assert report.messages_per_event == report.messages_total / report.events
        shown = report.as_dict()["messages"]
        assert shown["total"] == report.messages_total and shown["answers"] == report.answers
        assert f"messages {report.messages_total} (" in report.text()
    clean_report = run_scenario(clean)
    assert clean_report.answers == clean_report.requests_total > 0
    assert 0 < lossy.answers < lossy.requests_total


def test_a_repeated_request_is_answered_as_the_responder_would_answer_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node reuses an answer only while its store is unchanged: every reuse equals a
    fresh answer from the responder, and a change of the store forgets them all."""
    from logsync.sim import runner

    reused: list[str] = []
    serve_once = runner.Simulation._serve

    def checked(sim: Any, node: Any, msg: Any) -> None:
        key = (msg.path, *msg.params.items())
        kept = node.answered(key) if node.byzantine is None and node.overload is None else None
        if kept is not None:
            assert sim._answer(node, msg) == kept, (node.name, key)
            reused.append(msg.path)
        serve_once(sim, node, msg)

    monkeypatch.setattr(runner.Simulation, "_serve", checked)
    pulls = parse_scenario(SMALL.replace("[sync]\n", "[sync]\npages = false\n"),
                           source="small.toml").with_seed(2)  # every op pulled: ops reused
    report = run_scenario(pulls)
    assert report.ok, report.text()
    assert len(reused) > 20 and "/sync/ops" in reused
    probe = SimNode.__new__(SimNode)
    probe.answers, probe._vector, probe.page_frames = {}, None, {}
    probe.remember_answer(("/sync/ops", ("after", 0)), (200, {"events": []}, 13))
    assert probe.answered(("/sync/ops", ("after", 0))) == (200, {"events": []}, 13)
    probe.store_changed()
    assert probe.answered(("/sync/ops", ("after", 0))) is None


def test_every_fault_decision_is_in_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    result = CliRunner().invoke(cli, ["simulate", str(_write(tmp_path, SMALL)), "--trace",
                                      str(trace)])
    assert result.exit_code == 0, result.output
    lines = trace.read_text().splitlines()
    assert any(" fault start partition " in line for line in lines)
    assert any(" net drop " in line and " loss" in line for line in lines)
    assert any(" dup" in line for line in lines)
    assert any("cut=partition" in line for line in lines)
    assert lines[0].split()[0] == "0" and lines[0].split()[1] == "setup"


def test_crash_inside_an_apply_transaction_commits_nothing_and_restarts_clean() -> None:
    extra = """
[[fault]]
kind = "crash"
node = "n2"
at = "1s"
until = "2s"
mid_apply = true
[[fault]]
kind = "crash"
node = "n3"
at = "9s"
until = "10s"
"""
    report = run_scenario(small(extra))
    assert report.ok, report.text()
    assert any("inside an apply transaction" in f for f in report.faults)
    assert any("start crash at=9" in f for f in report.faults)


def test_replayed_pages_change_nothing() -> None:
    report = run_scenario(parse_scenario("replay = 0.5\n" + SMALL, source="replay.toml"))
    assert report.ok, report.text()
    assert report.replays > 10


def test_an_upstream_hub_node_gets_plain_requests_and_artifacts_one_by_one() -> None:
    text = SMALL.replace("count = 4", 'count = 3\nupstream = ["n1"]') \
        .replace("[[workload]]\nrate = 15", "[[workload]]\nrate = 15\nmix = { patch = 1 }") \
        .replace('groups = [["n0"], ["n1", "n2", "n3"]]', 'groups = [["n0"], ["n1", "n2"]]')
    report = run_scenario(parse_scenario(text, source="hub.toml"))
    assert report.ok, report.text()
    assert report.requests.get("/sync/artifact", 0) > 0
    assert report.artifacts == report.events


@pytest.mark.parametrize("mode", ["round", "targeted"])
def test_both_sync_modes_converge_on_every_topology(mode: str) -> None:
    for topology in ("ring", "hub-and-spoke", "random-k"):
        text = SMALL.replace("count = 4", "count = 5") + \
            f'[topology]\nkind = "{topology}"\nk = 1\n'
        text = text.replace("[sync]", f'[sync]\nmode = "{mode}"')
        report = run_scenario(parse_scenario(text, source=f"{topology}.toml"))
        assert report.ok, report.text()


def test_skew_jumps_oneway_flaps_slow_peers_and_isolation_keep_every_invariant() -> None:
    extra = """
[[fault]]
kind = "clock_jump"
node = "n1"
at = "2s"
by = "-30m"
[[fault]]
kind = "oneway"
src = ["n2"]
dst = ["n3"]
at = "1s"
until = "6s"
[[fault]]
kind = "flap"
nodes = ["n1", "n3"]
at = "2s"
until = "9s"
period = "500ms"
[[fault]]
kind = "slow"
node = "n3"
at = "0s"
until = "10s"
serve_delay = "700ms"
[[fault]]
kind = "isolate"
node = "n2"
at = "9s"
"""
    text = SMALL.replace("count = 4", 'count = 4\nskew = { n0 = "2m", n3 = "-90s" }')
    report = run_scenario(parse_scenario(text + extra, source="mix.toml"))
    assert report.ok, report.text()
    assert report.rounds_failed > 0


def test_a_byzantine_peer_is_quarantined_or_refused_and_never_stored() -> None:
    extra = """
[[fault]]
kind = "byzantine"
node = "n3"
at = "0s"
until = "10s"
rate = 0.5
tamper = ["corrupt", "wrong_origin", "stale_fork", "id_reuse", "bad_artifact"]
"""
    text = SMALL.replace("rate = 15", "rate = 15\nmix = { ask = 1, patch = 1 }")
    report = run_scenario(parse_scenario(text + extra, source="byz.toml"))
    assert report.ok, report.text()
    assert report.tampered > 5
    # Refused ops are quarantined; an id-reusing op is an `id_collision` conflict, unless
    # the page's chain or signature check refuses it first (the sim applies as the client
    # does, `effects.perform`): either way it is never stored (report.ok).
    assert sum(report.quarantined.values()) > 0


def test_the_checks_catch_an_undetectable_fork_and_name_seed_and_scenario() -> None:
    """A peer serving a forked op to a replica that lacks it cannot be told from the truth;
    the simulator still sees the op was never authored so and reports it. (Pulled: a
    page frame carries the digests its publisher's chain holds, which give the fork away.)"""
    extra = """
[[fault]]
kind = "byzantine"
node = "n3"
at = "0s"
until = "10s"
rate = 0.5
tamper = ["fork"]
"""
    pulled = SMALL.replace("[sync]\n", "[sync]\npages = false\n")
    report = run_scenario(parse_scenario(pulled + extra, source="small.toml").with_seed(5))
    assert not report.ok
    assert {v.invariant for v in report.violations} & {3, 5}
    assert "logsync simulate small.toml --seed 5" in report.text()


def test_the_checks_catch_a_store_that_skips_an_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant 1 is checked as the run goes: a store that drops the first op of a page
    (leaving a hole below what it then holds) is caught at that apply."""
    real = Driver._perform

    def lossy(self: Driver, node: Any, effect: Any, source: str, applied: Any = None) -> Any:
        if isinstance(effect, ApplyPage) and len(effect.events) > 1:
            effect = ApplyPage(effect.events[1:], effect.artifacts)
        return real(self, node, effect, source, applied)

    monkeypatch.setattr(Driver, "_perform", lossy)
    report = run_scenario(small())
    assert any(v.invariant == 1 for v in report.violations), report.text()


def test_plot_and_json(tmp_path: Path) -> None:
    plot = tmp_path / "lag.png"
    result = CliRunner().invoke(cli, ["simulate", str(_write(tmp_path, SMALL)), "--plot",
                                      str(plot), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["ok"] and payload["plot"] == str(plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert payload["lag_samples"][0]["t"] == 0 and len(payload["lag_samples"][0]["lag"]) == 4


def test_sweep_summarises_and_fails_when_a_seed_fails(tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(cli, ["simulate", str(_write(tmp_path, SMALL)), "--seeds", "1..3",
                               "--json"])
    assert good.exit_code == 0, good.output
    summary = json.loads(good.output)
    assert summary["runs"] == 3 and summary["failed_seeds"] == []
    assert len({s["trace_hash"] for s in summary["seeds"]}) == 3
    # n0 cut off until the heal cannot catch up within a millisecond: every seed fails
    stuck = SMALL.replace('"20s"', '"1ms"') + '[[fault]]\nkind = "isolate"\nnode = "n0"\nat = 1\n'
    bad = runner.invoke(cli, ["simulate", str(_write(tmp_path, stuck, "stuck.toml")),
                              "--seeds", "1..2"])
    assert bad.exit_code == 1 and "2 failed (1, 2)" in bad.output


def _write(tmp_path: Path, text: str, name: str = "small.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path
