"""Scenario files: every mistake is one sentence naming the key and what is allowed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from logsync.cli import cli
from logsync.sim import faults, summarise
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
    # values of the wrong TOML type where a node or a name is wanted
    ("[network]\nlatency = { dist = ['uniform'] }", ["latency.dist=['uniform'] is not allowed"]),
    ("[topology]\nkind = 'hub-and-spoke'\nhub = ['n0']", ["topology.hub=['n0'] is not a node"]),
    ("[topology]\nkind = 'edges'\nedges = [[['n0'], 'n1']]", ["must be a pair of two"]),
    ("[[fault]]\nkind = 'partition'\ngroups = [[['n0']], ['n1']]", ["fault[0].groups="]),
    ("[[workload]]\nnodes = [['n0']]", ["workload[0].nodes=[['n0']] names ['n0']"]),
    ("[nodes]\nupstream = 5", ["nodes.upstream=5 must be a list of node names"]),
    ("[nodes]\nupstream = 'n0'", ["nodes.upstream='n0' must be a list of node names"]),
    # times the virtual clocks cannot hold
    ("[[fault]]\nkind = 'clock_jump'\nnode = 'n1'\nby = '500000w'",
     ["fault[0].by='500000w' must be at most 3650 days"]),
    ("[nodes]\nskew = { n1 = 1.0e300 }", ["nodes.skew.n1=1e+300 must be at most 3650 days"]),
    ("[nodes]\nskew_max = '3651d'", ["nodes.skew_max='3651d' must be at most 3650 days"]),
    ("[random]\nwindow = [0, 5]\nclock_jumps = 3\nmax_jump = '2000d'",
     ["skews and jumps add up to 518400000 s", "3650 days"]),
    ("duration = '" + "9" * 400 + "s'", ["duration='999", "must be seconds as a number"]),
    ("sample_every = '1ms'", ["sample_every=0.001 s would take more than 20000 lag samples",
                              "at least 0.009 s"]),
])
def test_a_malformed_scenario_is_one_sentence_naming_the_key(text: str,
                                                             needles: list[str]) -> None:
    body = text if text.startswith(("duration", "name", "sample_every")) else MINIMAL + text
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


def test_a_workload_patch_is_as_large_as_asked_and_never_past_what_a_store_holds() -> None:
    """`patch_bytes` up to its maximum makes a patch the store takes, in linear time (the
    text's length was summed again per line: a 4 MiB patch never finished), and the
    texts are those of the seeds' earlier runs."""
    import random

    from logsync.model import MAX_ARTIFACT_BYTES
    from logsync.sim.workload import _patch_text

    def as_before(serial: int, size: int, rng: random.Random) -> str:
        lines = [f"--- a/file{serial}.txt", f"+++ b/file{serial}.txt", "@@ -1 +1 @@"]
        while sum(len(line) + 1 for line in lines) < size:
            lines.append(f"+{rng.getrandbits(64):016x} line {len(lines)}")
        return "\n".join(lines) + "\n"

    for size in (1, 400, 5000):
        assert _patch_text(7, size, random.Random(size)) == as_before(7, size, random.Random(size))
    largest = _patch_text(7, MAX_ARTIFACT_BYTES, random.Random(1))
    assert MAX_ARTIFACT_BYTES - 64 <= len(largest.encode()) <= MAX_ARTIFACT_BYTES


def _variants(path: Path) -> list[str | None]:
    import tomllib
    return [None, *sorted(tomllib.loads(path.read_text()).get("variants", {}))]


@pytest.mark.parametrize("path", sorted(LIBRARY.glob("*.toml")), ids=lambda p: p.stem)
def test_every_library_scenario_and_variant_has_its_own_digest(path: Path) -> None:
    digests = [load_scenario(path, variant).digest() for variant in _variants(path)]
    assert all(len(d) == 64 for d in digests)
    assert len(set(digests)) == len(digests)  # each variant runs something else


def test_the_digest_is_what_runs_not_the_seed_names_paths_comments_or_prose(
        tmp_path: Path) -> None:
    text = ('duration = "5s"\n[nodes]\ncount = 3\nskew = { n1 = "1s", n2 = "2s" }\n'
            '[network]\nlatency = "10ms"\n')
    (tmp_path / "a.toml").write_text(text)  # nameless: named after the file
    (tmp_path / "b.toml").write_text('name = "other"\ndescription = "prose"\n# a note\n'
                                     + text.replace('n1 = "1s", n2 = "2s"',
                                                    'n2 = "2s", n1 = "1s"'))
    base = load_scenario(tmp_path / "a.toml")
    assert base.name == "a"
    assert load_scenario(tmp_path / "b.toml").with_seed(7).digest() == base.digest()
    assert parse_scenario(text.replace("10ms", "11ms")).digest() != base.digest()
    assert parse_scenario(text.replace('"2s"', '"3s"')).digest() != base.digest()
    same = text + '[variants.same.sync]\n[variants.slower.network]\nlatency = "20ms"\n'
    assert parse_scenario(same, variant="same").digest() == base.digest()
    assert parse_scenario(same, variant="slower").digest() != base.digest()


def test_reports_and_sweeps_carry_the_scenario_digest(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text('name = "tiny"\nduration = "2s"\n[nodes]\ncount = 2\n'
                    '[[workload]]\nnodes = "all"\nrate = 2\n')
    digest = load_scenario(path).digest()
    one = CliRunner().invoke(cli, ["simulate", str(path)])
    assert one.exit_code == 0, one.output
    assert f"  scenario sha256 {digest} (what runs: seed, names and path aside)" \
        in one.output.splitlines()
    sweep = CliRunner().invoke(cli, ["simulate", str(path), "--seeds", "1..2", "--json"])
    assert sweep.exit_code == 0, sweep.output
    assert json.loads(sweep.output)["scenario_digest"] == digest
    single = CliRunner().invoke(cli, ["simulate", str(path), "--json"])
    assert json.loads(single.output)["scenario_digest"] == digest
    # a sweep whose every seed failed to run still names what it swept
    assert summarise([], {1: "boom"}, scenario_digest=digest)["scenario_digest"] == digest
