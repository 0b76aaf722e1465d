"""simulations/README.md's figures come from scripts/sim_figures.py and cannot go stale
silently: `--check` passes on the committed README, fails on a figure edited by hand and
names it, and ignores only wall clock. One row is checked here; every row under `-m slow`
(about 3 minutes)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sim_figures.py"
README = ROOT / "simulations" / "README.md"
ROW = "partition-and-heal"  # about a second of simulation


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sim_figures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def with_cell(text: str, row: str, column: int, change: object) -> str:
    """The README with one cell of the row whose first cell is `row` passed through change."""
    pattern = re.compile(rf"^\| `{re.escape(row)}` \|.*$", re.M)
    line = pattern.search(text)
    assert line is not None, f"no row {row} in the README"
    cells = line.group(0).strip("|").split("|")
    cells[column] = f" {change(cells[column].strip())} "  # type: ignore[operator]
    return text.replace(line.group(0), "|" + "|".join(cells) + "|")


def test_the_committed_row_matches_a_fresh_run() -> None:
    done = check("--only", ROW)
    assert done.returncode == 0, done.stderr


def test_a_figure_edited_by_hand_fails_the_check_and_is_named(tmp_path: Path) -> None:
    planted = tmp_path / "README.md"
    planted.write_text(with_cell(README.read_text(encoding="utf-8"), ROW, 1,
                                 lambda ops: int(ops) + 1), encoding="utf-8")
    done = check("--only", ROW, "--readme", str(planted))
    assert done.returncode == 1
    assert f"`{ROW}`" in done.stderr and "stale" in done.stderr


def test_only_wall_clock_is_left_out_of_the_comparison() -> None:
    module = script()
    text = README.read_text(encoding="utf-8")
    have = module.read_block(text, "library", README)
    slower = module.read_block(with_cell(text, ROW, 9, lambda s: float(s) + 7), "library",
                               README)
    assert module.check("library", have, slower, False) == []
    for column in range(1, 9):  # every other column is a figure of the run
        edited = module.read_block(with_cell(text, ROW, column, lambda s: s + "0"), "library",
                                   README)
        assert module.check("library", have, edited, False), column
        assert module.check("library", have, edited, True), column


def test_a_block_without_markers_is_one_sentence(tmp_path: Path) -> None:
    bare = tmp_path / "README.md"
    bare.write_text("# nothing here\n", encoding="utf-8")
    done = check("--only", ROW, "--readme", str(bare))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"{bare}: no figures block 'library' (<!-- figures:begin library --> ... "
        "<!-- figures:end library -->)")


def test_unknown_rows_are_refused_with_the_list() -> None:
    done = check("--only", "nope")
    assert done.returncode == 2 and "'nope' is not a row" in done.stderr
    assert "broadcast-25/3d/round" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_committed_figure_matches_a_fresh_run() -> None:
    """About 3 minutes on a quick 2-core machine, over 5 on a slow one (2026-12-01: the
    suite's 300 s default cut it off): its own bound."""
    done = check(timeout=1500)
    assert done.returncode == 0, done.stderr
