"""Regenerate the measured part of docs/measurements.md: the benchmarks and the simulator.

Runs every script in `benchmarks/` at a stated size and `logsync simulate` on each
scenario of `simulations/` (seed 1), then rewrites the block of docs/measurements.md
between the two marker lines with the figures, each under the exact command that made
it, with the date, the machine's CPU count and load. The rest of the file is kept.

Everything is bounded: each command has a time limit (a command that passes it is
killed and reported in one line, and the script exits 1 after writing what it has),
and the sizes are fixed here, not read from anywhere. `--quick` runs reduced sizes
(a few minutes on two cores); the default runs the scripts' own default sizes.

    .venv/bin/python scripts/measurements.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "measurements.md"
BEGIN = "<!-- measurements:begin (scripts/measurements.py rewrites this block) -->"
END = "<!-- measurements:end -->"
PY = sys.executable

# (script, arguments) at each size; the default size is the script's own.
BENCHMARKS: dict[str, dict[str, list[str]]] = {
    "apply": {"quick": ["--events", "5000", "--patches", "125"], "full": []},
    "bootstrap": {"quick": ["--events", "2000", "--patches", "50", "--repeat", "1"],
                  "full": ["--repeat", "1"]},
    "latency": {"quick": ["--appends", "20", "--upstream-samples", "0"],
                "full": ["--upstream-samples", "0"]},
    "memory": {"quick": ["--events", "10000"], "full": ["--events", "50000"]},
    "serving": {"quick": ["--events", "2000", "--patches", "50", "--pullers", "1,4",
                          "--seconds", "1"],
                "full": ["--events", "5000", "--patches", "125", "--pullers", "1,4",
                         "--seconds", "3"]},
    "chain_backfill": {"quick": ["--ops", "10000", "--apply-ops", "2000"], "full": []},
    "signed_sync": {"quick": ["--ops", "2000", "--appends", "50"], "full": []},
    "snapshot_join": {"quick": ["--events", "2000", "--compare-events", "1000",
                                "--patches", "20"], "full": []},
}
# broadcast-25's variants are long (the full mesh ~20 s); the default run adds them.
VARIANTS = {"quick": [], "full": ["3d", "nemesis"]}
LIMIT_S = {"quick": 300.0, "full": 3600.0}


def run(command: list[str], limit: float) -> tuple[str, float, str | None]:
    """Run `command` from the repository root: its stdout, its wall seconds, and None or
    one sentence saying why it failed (non-zero exit, or killed at `limit` seconds)."""
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return "", time.monotonic() - start, f"killed after {limit:.0f} s (its time limit)"
    wall = time.monotonic() - start
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return done.stdout, wall, f"exit {done.returncode}: {last}"
    return done.stdout, wall, None


def shown(command: list[str]) -> str:
    """The command as a reader would type it (the venv's Python as `python`)."""
    return " ".join(["python" if part == PY else part for part in command])


def benchmark_section(size: str, limit: float) -> tuple[list[str], bool]:
    lines, ok = ["### Benchmarks", ""], True
    for name, sizes in BENCHMARKS.items():
        command = [PY, f"benchmarks/{name}.py", *sizes[size]]
        out, wall, failure = run(command, limit)
        lines += [f"#### `{name}.py`", "", f"`{shown(command)}` — {wall:.1f} s wall", ""]
        if failure:
            ok = False
            lines += [f"**Failed:** {failure}", ""]
        lines += ["```", out.rstrip() or "(no output)", "```", ""]
    return lines, ok


def scenarios() -> list[Path]:
    return sorted((ROOT / "simulations").glob("*.toml"))


def figure(value: Any) -> str:
    """A figure as a table shows it: floats to at most 3 decimals, None as a dash."""
    if value is None:
        return "—"
    return f"{value:.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def simulation_row(result: dict[str, Any], label: str, wall: float) -> str:
    reach = result.get("reach", {})
    kinds = result.get("conflict_kinds", {})
    conflicts = sum(kinds.values()) if isinstance(kinds, dict) else 0
    quarantined = result.get("quarantined", {})
    held = sum(quarantined.values()) if isinstance(quarantined, dict) else quarantined
    after = result.get("virtual_time", {}).get("convergence_after_heal_s")
    return (f"| {label} | {'OK' if result.get('ok') else 'FAILED'} | {result.get('events')} | "
            f"{result.get('applies')} | {figure(after)} | "
            f"{figure(reach.get('median_s'))} / {figure(reach.get('max_s'))} | "
            f"{figure(result.get('requests', {}).get('per_event'))} | {conflicts} / {held} | "
            f"`{result.get('trace_hash')}` | {wall:.1f} s |")


def simulation_section(size: str, limit: float) -> tuple[list[str], bool]:
    lines = ["### Simulator: the scenario library, seed 1", "",
             "Each row: `python -m logsync simulate simulations/<scenario>.toml --seed 1 "
             "--json [--variant V]`. Reach is virtual seconds from an append until every "
             "node holds it; req/event is all requests over events; the trace sha256 "
             "replays byte for byte from the same seed; wall is real seconds.", "",
             "| scenario | result | events | applies | converged after heal (s) | "
             "reach median / max (s) | req/event | conflicts / quarantined | trace sha256 "
             "| wall |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ok = True
    runs = [(path, None) for path in scenarios()]
    runs += [(ROOT / "simulations" / "broadcast-25.toml", v) for v in VARIANTS[size]]
    for path, variant in runs:
        rel = path.relative_to(ROOT).as_posix()
        command = [PY, "-m", "logsync", "simulate", rel, "--seed", "1", "--json"]
        command += ["--variant", variant] if variant else []
        label = f"`{path.stem}`" + (f" `--variant {variant}`" if variant else "")
        out, wall, failure = run(command, limit)
        try:
            result = json.loads(out) if out.strip() else None
        except ValueError:
            result = None
        if not isinstance(result, dict):
            ok = False
            lines.append(f"| {label} | FAILED: {failure or 'no JSON result'} |"
                         + " — |" * 8)
            continue
        ok = ok and failure is None and bool(result.get("ok"))
        lines.append(simulation_row(result, label, wall))
    return lines + [""], ok


def header(size: str, argv: list[str]) -> list[str]:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [f"Generated {now} by `python scripts/measurements.py {' '.join(argv)}`".rstrip()
            + f" ({size} sizes) on {os.cpu_count()} CPUs, load average {load} at the "
            "start. One run each, on a machine shared with other work: compare ratios "
            "within one run, not absolute figures across runs.", ""]


def rewrite(doc: Path, block: list[str]) -> None:
    """Replace the marked block of `doc` (append it, with markers, if there is none)."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else "# Measurements\n"
    body = "\n".join([BEGIN, "", *block, END])
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + body + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    doc.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (minutes)")
    parser.add_argument("--output", type=Path, default=DOC, help="the document to rewrite")
    args = parser.parse_args()
    size = "quick" if args.quick else "full"
    limit = LIMIT_S[size]
    block = header(size, sys.argv[1:])
    sims, sims_ok = simulation_section(size, limit)
    benches, benches_ok = benchmark_section(size, limit)
    rewrite(args.output, block + sims + benches)
    print(f"wrote {args.output}")
    if not (sims_ok and benches_ok):
        print("some runs failed; their rows say why", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
