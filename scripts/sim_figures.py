"""Regenerate the figures of simulations/README.md from fresh simulator runs, or check them.

    python scripts/sim_figures.py                      # run every scenario, rewrite the tables
    python scripts/sim_figures.py --check              # exit 1 if a figure differs from a run
    python scripts/sim_figures.py --check --only partition-and-heal

The simulator is deterministic per seed (one `random.Random(seed)` makes every choice), so
every figure but wall clock is a function of the code and the scenario files: a table that
differs from a fresh run is stale, and `--check` says which row and column. Wall clock is
the regenerating machine's and is not compared. The tables live between
`<!-- figures:begin NAME -->` and `<!-- figures:end NAME -->`; nothing else is touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from logsync.sim import load_scenario, run_scenario  # noqa: E402
from logsync.sim.report import SimReport  # noqa: E402

README = ROOT / "simulations" / "README.md"
COMMAND = "python scripts/sim_figures.py"


@dataclass(frozen=True)
class Run:
    """One row: a scenario file, optionally a variant and a sync mode, run at its seed."""

    file: str
    variant: str | None = None
    mode: str | None = None  # replaces [sync] mode (no variant holds it)
    label: str | None = None  # the row's first cell (default: the file name)
    graded: bool = False  # the label names the file's [expect] bar: show it, met or missed

    @property
    def key(self) -> str:
        """The name `--only` takes: file, then /variant and /mode when set."""
        return "/".join(p for p in (self.file, self.variant, self.mode) if p)

    def report(self) -> SimReport:
        scenario = load_scenario(ROOT / "simulations" / f"{self.file}.toml", self.variant)
        if self.mode is not None:
            scenario = dataclasses.replace(
                scenario, sync=dataclasses.replace(scenario.sync, mode=self.mode))
        return run_scenario(scenario)


LIBRARY = [Run(name) for name in (
    "partition-and-heal", "offline-laptop", "flapping-link", "clock-skew", "crash-mid-apply",
    "hub-and-spoke-hub-dies", "restored-from-backup", "relayed-fork", "clones",
    "forked-replica")]
# Why ops do not reach every node where histories part for good (logsync/sim/forks.py).
LOST_WHY = {"restored-from-backup": "n2's history from its first re-used slot, on n2 only",
            "relayed-fork": "each side's history of x after they part",
            "clones": "the clones' histories after they part"}
BROADCAST = [
    Run("broadcast-25", label="base: hub-and-spoke (24 edges), targeted rounds, no debounce"
                              " — **3e bar**", graded=True),
    Run("broadcast-25", "3d", label="`--variant 3d`: full mesh — **3d bar**", graded=True),
    Run("broadcast-25", "mesh-k4", label="`--variant mesh-k4`: random 4-peer mesh"),
    Run("broadcast-25", "nemesis", label="`--variant nemesis`: 2 % loss, 3 partitions, "
                                         "2 crashes (mid-apply), a flapping link"),
    Run("broadcast-25", mode="round", label='`mode = "round"` (full rounds only), '
                                             "hub-and-spoke"),
    Run("broadcast-25", "3d", "round", label='`mode = "round"`, full mesh'),
]
TABLES = {"library": LIBRARY, "broadcast": BROADCAST}


# ── rendering ──────────────────────────────────────────────────────────────


def _num(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}".replace(",", " ")


def _seconds(value: float | None, decimals: int = 2) -> str:
    if value is None:
        return "never"
    shown = _num(value, 0 if value >= 10_000 else decimals)
    return shown + (f" ({value / 86400:.1f} days)" if value >= 86400 else "")


def _bar(report: SimReport) -> str:
    """The graded targets of a run, and whether it met them."""
    targets = report.targets()
    if not targets:
        return ""
    shown = []
    for name, target in targets.items():
        wanted = target["target"]
        if name == "requests_per_event":
            shown.append(f"< {wanted:g} requests/op")
        elif name == "messages_per_event":
            shown.append(f"< {wanted:g} messages/op")
        else:
            shown.append(f"< {wanted * 1000:g} ms" if wanted < 1 else f"< {wanted:g} s")
    return f" ({', '.join(shown)}: {'met' if report.targets_met() else 'MISSED'})"


def library_row(run: Run, r: SimReport) -> list[str]:
    lost = str(r.lost) + (f" ({LOST_WHY[run.file]})" if r.lost and run.file in LOST_WHY else "")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.conflict_kinds.items()) if n) or "0"
    return [f"`{run.label or run.key}`", str(r.events), _seconds(r.convergence_s),
            _num(r.requests_per_event or 0, 2), _num(r.bytes_per_event or 0, 0),
            f"{_seconds(r.reach_median)} / {_seconds(r.reach_max)}", lost, kinds,
            str(sum(r.quarantined.values())), f"{r.wall_seconds:.1f}"]


def broadcast_row(run: Run, r: SimReport) -> list[str]:
    per_op = r.notifications / r.events if r.events else 0.0
    return [(run.label or run.key) + (_bar(r) if run.graded else ""),
            _seconds(r.reach_median, 3) + " s",
            _seconds(r.reach_max, 3) + " s", _num(r.requests_per_event or 0, 1),
            _num(per_op, 0 if per_op >= 100 else 1), _num(r.messages_per_event or 0, 1),
            f"{r.wall_seconds:.0f} s"]


HEADERS = {
    "library": ["scenario", "ops", "converged after heal (s)", "requests/op", "bytes/op",
                "reach every node, median / max (s)", "lost", "conflicts", "quarantined",
                "wall (s)"],
    "broadcast": ["settings", "median", "max", "requests/op", "notifications/op",
                  "messages/op", "wall clock"],
}
ROW = {"library": library_row, "broadcast": broadcast_row}


def table(name: str, rows: list[list[str]]) -> list[str]:
    header = HEADERS[name]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def body(name: str, runs: list[Run], reports: list[SimReport]) -> list[str]:
    """A block's lines after its date line: the table, and for broadcast its frame."""
    lines = table(name, [ROW[name](run, r) for run, r in zip(runs, reports, strict=True)])
    if name == "library":
        return lines
    base = reports[0]
    lost = [f"{run.label or run.key} {r.lost}" for run, r in zip(runs, reports, strict=True)
            if r.lost]
    return [f"**broadcast-25** ({len(base.nodes)} nodes, 100 ms one-way, {_num(base.events, 0)}"
            f" ops at 100/s for 20 s, {_num(base.applies, 0)} applies in the base run):", "",
            *lines, "",
            "Ops lost: " + "; ".join(lost) + "." if lost else "No op is lost in any of them."]


def dated(name: str, today: str) -> str:
    how = ("each row `logsync simulate simulations/NAME.toml --json` at the file's seed (1)"
           if name == "library" else
           "`logsync simulate simulations/broadcast-25.toml [--variant V] --json`; the "
           '`mode = "round"` rows set [sync] mode')
    return (f"<!-- generated by `{COMMAND}` on {today}: {how}; `{COMMAND} --check` fails when "
            "a figure here differs from a fresh run (wall clock is not compared) -->")


# ── the README's blocks ────────────────────────────────────────────────────


def block_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- figures:begin {name} -->\n)(.*?)(<!-- figures:end {name} -->)",
                      re.S)


def read_block(text: str, name: str, source: Path) -> list[str]:
    match = block_re(name).search(text)
    if match is None:
        raise SystemExit(f"{source}: no figures block {name!r} (<!-- figures:begin {name} --> "
                         f"... <!-- figures:end {name} -->)")
    lines = match.group(2).rstrip("\n").split("\n")
    return lines[1:] if lines and lines[0].startswith("<!-- generated") else lines


def write_block(text: str, name: str, lines: list[str], today: str) -> str:
    new = "\n".join([dated(name, today), *lines]) + "\n"
    return block_re(name).sub(lambda m: m.group(1) + new + m.group(3), text, count=1)


def masked(lines: list[str]) -> list[str]:
    """The lines with every wall-clock cell replaced by '*' (it is this machine's)."""
    out, wall = [], set()
    for line in lines:
        if not line.startswith("|"):
            out.append(line)
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if any(c.startswith("wall") for c in cells):
            wall = {i for i, c in enumerate(cells) if c.startswith("wall")}
        elif not set(line) <= set("|-"):
            cells = ["*" if i in wall else c for i, c in enumerate(cells)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def first_cell(line: str) -> str:
    return line.strip("|").split("|")[0].strip()


def data_rows(lines: list[str]) -> list[str]:
    """Table rows other than a header (the line above a |---| line) and the separator."""
    def rule(line: str) -> bool:
        return line.startswith("|") and set(line) <= set("|- ")

    return [line for i, line in enumerate(lines) if line.startswith("|") and not rule(line)
            and not (i + 1 < len(lines) and rule(lines[i + 1]))]


def check(name: str, want: list[str], have: list[str], only: bool) -> list[str]:
    """Differences, as lines; with --only, only the rows that were run are compared."""
    want, have = masked(want), masked(have)
    if not only:
        if want == have:
            return []
        return [f"{name}:", *difflib.unified_diff(have, want, "README", "fresh run",
                                                   lineterm="")]
    held = {first_cell(line): line for line in data_rows(have)}
    return [f"{name}: the README has {held.get(first_cell(line))!r}\n"
            f"  where a fresh run gives {line!r}"
            for line in data_rows(want) if held.get(first_cell(line)) != line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="Compare instead of rewriting; exit 1 when a figure differs.")
    parser.add_argument("--only", action="append", metavar="KEY",
                        help="With --check: only these rows (e.g. partition-and-heal, "
                             "broadcast-25/3d, broadcast-25/3d/round); repeatable.")
    parser.add_argument("--readme", type=Path, default=README, help="The file to rewrite.")
    args = parser.parse_args(argv)
    keys = {run.key for runs in TABLES.values() for run in runs}
    if args.only and not args.check:
        parser.error("--only checks some rows; a rewrite runs them all")
    for key in args.only or ():
        if key not in keys:
            parser.error(f"--only {key!r} is not a row; rows: {', '.join(sorted(keys))}")
    text = args.readme.read_text(encoding="utf-8")
    today = datetime.date.today().isoformat()
    problems: list[str] = []
    for name, runs in TABLES.items():
        chosen = [r for r in runs if not args.only or r.key in args.only]
        if not chosen:
            continue
        reports = []
        for run in chosen:
            report = run.report()
            print(f"  {run.key}: {report.events} ops, {report.wall_seconds:.1f} s",
                  file=sys.stderr)
            if not report.ok:
                problems.append(f"{run.key} broke an invariant: {report.violations[0].line()}")
            reports.append(report)
        want = body(name, chosen, reports)
        have = read_block(text, name, args.readme)
        if args.check:
            problems += check(name, want, have, bool(args.only))
        else:
            text = write_block(text, name, want, today)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        if args.check:
            print(f"the figures are stale: run `{COMMAND}` and commit the README",
                  file=sys.stderr)
        return 1
    if not args.check:
        args.readme.write_text(text, encoding="utf-8")
        print(f"rewrote the figures in {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
