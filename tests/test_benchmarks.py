"""The benchmarks run end to end at a reduced size and print their figures.

No timing thresholds here: on a shared machine a threshold is either loose
enough to be meaningless or flaky. What is checked is that every benchmark
completes, verifies its replicas (a benchmark exits 1 when a replica ends
incomplete), and reports every figure it promises, in JSON and as text.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
RUN_TIMEOUT_S = 420


def run_benchmark(name: str, *args: str) -> dict[str, Any]:
    """Run benchmarks/<name>.py --json; its JSON document, or a failure with its stderr."""
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / f"{name}.py"), *args, "--json"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=BENCH_DIR.parent, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def rendered(name: str, result: dict[str, Any]) -> str:
    """The benchmark's own text rendering of a result (what a human run prints)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return "\n".join(importlib.import_module(name).render(result))


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bootstrap_pulls_every_way_and_reports_ratios() -> None:
    result = run_benchmark("bootstrap", "--events", "600", "--patches", "15", "--repeat", "1")
    assert (result["events"], result["artifacts"]) == (600, 15)
    runs = result["runs"]
    assert set(runs) == {"raw", "a_inproc", "a_inproc_nobulk", "b_inproc", "b_inproc_capped",
                         "a_cli", "b_cli", "c_upstream"}
    for key, run in runs.items():
        assert positive(run["seconds"]) and positive(run["events_per_s"]), key
    for key in ("a_cli", "b_cli", "c_upstream"):
        assert positive(runs[key]["noop_seconds"]), key
    # (a) negotiated the extensions; (b) spoke plain upstream shapes to the hub.
    assert {"msgpack", "inline_artifacts"} <= set(runs["a_inproc"]["extensions"])
    assert runs["b_inproc"]["extensions"] == []
    assert runs["b_inproc"]["requests"] > runs["a_inproc"]["requests"]
    ratios = result["ratios"]
    for value in (ratios["upstream_over_a"]["wall"], ratios["upstream_over_a"]["net"],
                  ratios["a_over_raw"]["inproc"], ratios["a_over_raw"]["first_round"],
                  ratios["a_over_raw"]["without_bulk"], *ratios["a_over_raw"]["per_round"],
                  ratios["upstream_over_b"]["wall"]):
        assert positive(value)
    text = rendered("bootstrap", result)
    assert "upstream/(a)" in text and "(a)/raw" in text and "upstream/(b)" in text
    assert "in round 1" in text and "round by round" in text and "no bulk" in text
    assert "mempalace logstream sync" in text and "fsync" in text


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_link_pulls_through_a_slow_link_and_coded_pages_cross_fewer_bytes() -> None:
    result = run_benchmark("link", "--events", "600", "--patches", "15", "--repeat", "1",
                           "--mbit", "50")
    assert (result["events"], result["artifacts"]) == (600, 15)
    runs = result["runs"]
    assert set(runs) == {"a_zstd", "a_plain", "c_upstream"}
    for key, run in runs.items():
        assert positive(run["seconds"]) and run["link_bytes"] > 0, key
    # the same replica pulled both ways; coded pages cross the link in fewer bytes
    assert runs["a_zstd"]["link_bytes"] * 3 < runs["a_plain"]["link_bytes"]
    assert all(positive(v) for v in result["ratios"].values())
    text = rendered("link", result)
    assert "plain/zstd" in text and "upstream/zstd" in text and "50 Mbit/s" in text


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_latency_reports_median_and_p99_for_each_topology() -> None:
    result = run_benchmark("latency", "--appends", "6", "--upstream-samples", "1")
    for key in ("daemon_to_daemon", "daemon_to_daemon_cli", "daemon_to_daemon_poll",
                "daemon_to_daemon_cli_poll", "hub_to_daemon", "hub_to_hub_upstream"):
        summary = result[key]
        expected = 1 if key == "hub_to_hub_upstream" else 6
        assert summary["count"] == expected, key
        assert 0 < summary["min_s"] <= summary["median_s"] <= summary["p99_s"] <= summary["max_s"]
    text = rendered("latency", result)
    assert "median" in text and "p99" in text and "MemPalace hub -> logsync" in text
    assert "logsync -> logsync, CLI" in text and "lower than poll only" in text


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_memory_reports_peak_rss_of_a_complete_bootstrap() -> None:
    result = run_benchmark("memory", "--events", "3000")
    assert (result["events"], result["artifacts"]) == (3000, 75)
    assert result["samples"] > 0
    assert 0 < result["idle_rss_mb"] <= result["peak_rss_mb"]
    assert result["peak_rss_mb"] >= result["max_sampled_rss_mb"]
    assert positive(result["bootstrap_seconds"]) and positive(result["source_peak_rss_mb"])
    assert "sink RSS peak" in rendered("memory", result)


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_serving_measures_each_target_at_each_concurrency() -> None:
    result = run_benchmark("serving", "--events", "1000", "--patches", "20",
                           "--pullers", "1,3", "--seconds", "0.5", "--warm-up", "0.1")
    runs = result["runs"]
    seen = {(r["target"], r["pullers"]) for r in runs}
    targets = {"logsync daemon, JSON", "logsync daemon, msgpack", "MemPalace hub, JSON"}
    assert seen == {(t, k) for t in targets for k in (1, 3)}
    for run in runs:
        assert run["errors"] == 0, run
        assert positive(run["requests_per_s"]) and positive(run["p99_ms"]), run
    assert len(result["ratios"]) == 4
    assert "req/s" in rendered("serving", result)


@pytest.mark.parametrize(
    ("name", "args", "says"),
    [
        ("bootstrap", ["--events", "0"], "0 is invalid: must be a positive integer"),
        ("bootstrap", ["--events", "10", "--patches", "11"], "--patches 11 is invalid"),
        ("latency", ["--appends", "x"], "'x' is not an integer"),
        ("memory", ["--timeout", "-1"], "-1.0 is invalid: must be a positive number"),
        ("serving", ["--pullers", "2,0"], "every level must be >= 1"),
        ("growth", ["--sizes", "100,10"], "must be increasing positive integers"),
        ("growth", ["--idle-seconds", "0"], "--idle-seconds 0 is invalid"),
        ("page_frames", ["--per-write", "0"], "0 is invalid: must be a positive integer"),
        ("sim_floor", ["--nodes", "0"], "0 is invalid: must be a positive integer"),
        ("sim_floor", ["--scenario", "no/such.toml"], "'no/such.toml' is not a file"),
    ],
)
def test_bad_arguments_are_one_sentence_not_a_traceback(
    name: str, args: list[str], says: str
) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / f"{name}.py"), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_snapshot_join_reports_its_ratios() -> None:
    result = run_benchmark("snapshot_join", "--events", "800", "--compare-events", "600",
                           "--patches", "10")
    assert result["compare"]["events"] == 600 and result["large"]["events"] == 800
    for key in ("s_snapshot", "p_op_by_op", "u_upstream"):
        assert positive(result["compare"]["runs"][key]["seconds"]), key
    for key in ("upstream_over_snapshot", "op_by_op_over_snapshot", "join_over_plain_get",
                "joiner_peak_rss_mb", "cached_join_over_plain_get"):
        assert positive(result["ratios"][key]["value"]), key
    text = rendered("snapshot_join", result)
    assert "upstream/(s)" in text and "join/GET" in text and "peak RSS" in text
    assert "a second joiner" in text


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_growth_reports_each_size_fleet_and_peer_count() -> None:
    result = run_benchmark("growth", "--sizes", "2000,6000", "--nodes", "3,5",
                           "--peers", "1,3", "--idle-seconds", "2")
    assert [s["events"] for s in result["store"]] == [2000, 6000]
    for row in result["store"]:
        for key in ("version_vector_ms", "ops_page_ms", "apply_page_ms", "disk_mb"):
            assert positive(row[key]), (key, row)
        assert row["ops_page_ops"] == 500 and row["events_after"] > row["events"]
    assert result["store"][1]["disk_mb"] > result["store"][0]["disk_mb"]
    assert [s["nodes"] for s in result["sim"]] == [3, 5]
    for row in result["sim"]:
        assert row["messages_per_event"] > row["requests_per_event"] > 0, row
    assert [s["peers"] for s in result["idle"]] == [1, 3]
    for row in result["idle"]:  # every peer was asked for its vector and its stream
        assert row["vector_requests"] >= row["peers"] and row["stream_connects"] >= row["peers"]
        assert row["cpu_s"] >= 0
    text = rendered("growth", result)
    assert "| stored events |" in text and "| simulated nodes |" in text and "idle daemon" in text


def test_page_frames_times_both_ways_and_prints_the_ratio() -> None:
    """Small enough for the default suite: every op reaches each subscriber both ways."""
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / "page_frames.py"), "--events", "15", "--repeat", "1",
         "--per-write", "3"], capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "pages=30 per_write=3" in done.stdout
    ratio = float(done.stdout.split("ratio (b)/(a)")[1].split(":")[1].split("x")[0])
    assert ratio > 0


def test_sim_floor_runs_the_scenario_and_its_sqlite_floor() -> None:
    """Small enough for the default suite: a 3-node broadcast and its floors."""
    result = run_benchmark("sim_floor", "--nodes", "3")
    sim = result["sim"]
    assert sim["nodes"] == 3 and sim["events"] > 0 and positive(sim["wall_s"])
    # every node stores every event: the applies are the events the others wrote
    assert sim["applies"] == sim["events"] * 2
    assert [f["per_write"] for f in result["floors"]] == sorted({1, result["own_per_write"], 10})
    assert all(positive(f["seconds"]) for f in result["floors"]) and positive(result["appends_s"])
    text = rendered("sim_floor", result)
    assert "<- the run's own ops per frame" in text and "run/floor" in text


@pytest.mark.parametrize(("toml", "says"), [
    ('name = "idle"\nseed = 1\n', "the run applied no remote op"),
    ('name = "bad"\nseed = 1\n[nodes]\ncount = "a"\n', "nodes.count='a' must be an integer"),
])
def test_sim_floor_refuses_a_scenario_it_cannot_measure_in_one_sentence(
        tmp_path: Path, toml: str, says: str) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text(toml, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(BENCH_DIR / "sim_floor.py"), "--scenario", str(scenario)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and says in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
