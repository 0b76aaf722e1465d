"""Scenario files: every mistake is one sentence naming the key and what is allowed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from logsync.cli import cli
from logsync.sim import faults
from logsync.sim.scenario import (
    FAULT_KINDS,
    ScenarioError,
    load_scenario,
    parse_duration,
    parse_scenario,
    render_scenario,
)

LIBRARY = Path(__file__).resolve().parents[1] / "simulations"
MINIMAL = 'duration = "5s"\n'


@pytest.mark.parametrize(("text", "needles"), [
    ("duration = 'forever'", ["duration='forever'", "'250ms', '30s'"]),
    ("[nodes]\ncount = 0", ["nodes.count=0", "integer in [1, 200]"]),
    ("[nodes]\ncuont = 3", ["nodes.cuont is not a known key", "allowed in nodes: count"]),
    ("colour = 1", ["colour is not a known key", "allowed in the top level"]),
    ("[topology]\nkind = 'star'", ["topology.kind='star'", "full-mesh, hub-and-spoke"]),
    ("[network]\nloss = 1.5", ["network.loss=1.5", "between 0 and 1"]),
    ("[network]\nlatency = { dist = 'pareto' }", ["latency.dist='pareto'", "lognormal"]),
    ("[sync]\nmode = 'push'", ["sync.mode='push'", "round, targeted"]),
    ("[[fault]]\nkind = 'meteor'", ["fault[0].kind='meteor'", "partition, oneway"]),
    ("[[fault]]\nkind = 'crash'\nat = 1", ["fault[0] is a 'crash' fault and needs 'node'"]),
    ("[[fault]]\nkind = 'crash'\nnode = 'n9'", ["fault[0].node='n9' is not a node", "n0, n1"]),
    ("[[fault]]\nkind = 'crash'\nnode = 'n0'\ngroups = [['n0']]",
     ["fault[0].groups is not used by a 'crash' fault", "allowed: kind, at, until, node"]),
    ("[[fault]]\nkind = 'partition'\ngroups = [['n0'], ['n0']]", ["must not list a node in two"]),
    ("[[fault]]\nkind = 'isolate'\nnode = 'n0'\nat = 5\nuntil = 2", ["until=2", "later than 'at'"]),
    ("[[fault]]\nkind = 'byzantine'\nnode = 'n0'\ntamper = ['lie']", ["tamper", "corrupt"]),
    ("[[fault]]\nkind = 'clone'\nnode = 'n1'", ["fault[0] is a 'clone' fault and needs 'of'"]),
    ("[[fault]]\nkind = 'clone'\nnode = 'n1'\nof = 'n1'", ["fault[0].of='n1'", "another node"]),
    ("[[fault]]\nkind = 'clone'\nnode = 'n1'\nof = 'n7'", ["fault[0].of='n7' is not a node"]),
    ("[[fault]]\nkind = 'restore'\nnode = 'n1'\nbackup_at = 1\nof = 'n0'",
     ["fault[0].of is not used by a 'restore' fault"]),
    ("[[workload]]\nmix = { dance = 1 }", ["workload[0].mix.dance is not a known key"]),
    ("[[workload]]\nfrom = '10s'", ["starts at 10 s, at or after duration=5 s"]),
    ("[expect]\nmedian_reach = -1", ["expect.median_reach=-1", "at least 0 s"]),
    ("[random]\ncrashes = 2", ["random.window", "non-empty span"]),
    ("name = ", ["not valid TOML"]),
])
def test_a_malformed_scenario_is_one_sentence_naming_the_key(text: str,
                                                             needles: list[str]) -> None:
    body = text if text.startswith(("duration", "name")) else MINIMAL + text
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(body, source="bad.toml")
    message = str(caught.value)
    assert message.startswith("bad.toml: ") and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_durations() -> None:
    assert parse_duration("250ms") == 0.25
    assert parse_duration("2w") == 1_209_600
    assert parse_duration("-5m") == -300
    assert parse_duration(3) == 3.0
    assert parse_duration("soon") is None and parse_duration(True) is None


def test_variants_override_tables_key_by_key() -> None:
    text = MINIMAL + "[sync]\ndebounce = '10ms'\ninterval = '3s'\n" \
        "[variants.fast.sync]\ndebounce = '0ms'\n"
    base = parse_scenario(text)
    fast = parse_scenario(text, variant="fast")
    assert (base.sync.debounce, fast.sync.debounce) == (0.01, 0.0)
    assert fast.sync.interval == 3.0 and fast.variant == "fast"
    with pytest.raises(ScenarioError, match="variant 'slow' is not defined; allowed: fast"):
        parse_scenario(text, variant="slow")


@pytest.mark.parametrize("path", sorted(LIBRARY.glob("*.toml")), ids=lambda p: p.stem)
def test_the_library_parses_and_renders_back_to_the_same_scenario(path: Path) -> None:
    scenario = load_scenario(path)
    again = parse_scenario(render_scenario(scenario), source=str(path))
    assert replace(again, description=scenario.description) == scenario


def test_every_fault_kind_a_file_may_name_has_a_handler() -> None:
    assert sorted(faults.HANDLERS) == sorted(FAULT_KINDS)


def test_simulate_cli_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(MINIMAL + "[sync]\nmode = 'push'\n")
    runner = CliRunner()
    result = runner.invoke(cli, ["simulate", str(bad), "--json"])
    assert result.exit_code == 1
    message = json.loads(result.output)["error"]
    assert "sync.mode='push' is not allowed; allowed: round, targeted" in message
    both = runner.invoke(cli, ["simulate", str(bad), "--seed", "1", "--seeds", "1..2"])
    assert both.exit_code != 0 and "--seed or --seeds" in both.output
    sweep = runner.invoke(cli, ["simulate", str(bad), "--seeds", "9"])
    assert sweep.exit_code != 0 and "must be A..B" in sweep.output
    missing = runner.invoke(cli, ["simulate", str(tmp_path / "none.toml")])
    assert missing.exit_code == 1 and "cannot read the scenario file" in missing.output
