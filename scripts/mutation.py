#!/usr/bin/env python3
"""Mutation testing of logsync's core with cosmic-ray (issue 9).

    .venv/bin/python scripts/mutation.py                    # every default module
    .venv/bin/python scripts/mutation.py logsync/hlc.py     # one module
    .venv/bin/python scripts/mutation.py --rev HEAD logsync/hlc.py   # committed code only
    .venv/bin/python scripts/mutation.py logsync/engine.py \
        --tests logsync/engine.py=tests/test_engine.py      # other tests for a module

Needs the project installed with its test extra plus the tool:
``pip install -e '.[test,mutation]'`` (the `mutation` extra is cosmic-ray 8.x).

The script never touches the working tree: it copies the repository's files (tracked
and untracked-but-not-ignored, so uncommitted tests count; with ``--rev COMMIT`` that
commit's files plus the untracked ones, so others' uncommitted edits in a shared
checkout stay out) to a temporary directory, on /dev/shm when there is one (the store
tests fsync), and runs there with the copy first on PYTHONPATH.

Each mutant is one cosmic-ray job: the module is rewritten on disk in the copy, the
module's chosen tests run in a fresh interpreter (`pytest -x`, one process at a time:
cosmic-ray's `local` distributor is serial), the file is restored. A test run that
fails kills the mutant; one that passes lets it survive; one that overruns the timeout
(a multiple of the unmutated run, 30 s at least) is a timeout.

Hypothesis runs derandomized with no example database and no deadline inside the copy
(a plugin loaded with ``-p``), so a table is reproducible and a loaded machine does not
kill mutants through flaky deadlines.

Mutations inside annotations are not run when the module has ``from __future__ import
annotations`` (every core module does): an annotation is then a string nothing
evaluates, so ``int | None`` -> ``int - None`` is equivalent by construction. They are
counted as `skipped`.

Prints a table (module, mutants, killed, survived, timeout, ...) and every survivor
with file:line, the operator and the diff. ``--markdown FILE`` / ``--json FILE`` also
write them out.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_MODULES = [
    "logsync/engine.py",
    "logsync/hlc.py",
    "logsync/store/apply.py",
    "logsync/peerloop.py",  # skipped (with a note) while it does not exist
]

# module -> the tests that exercise it; files that do not exist (yet) are left out.
# Order matters a little: with -x the first failing file ends the run, so the
# focused, fast files come first.
TESTS: dict[str, list[str]] = {
    "logsync/hlc.py": [
        "tests/test_hlc.py",
        "tests/test_mutants_hlc.py",
    ],
    "logsync/store/apply.py": [
        "tests/test_mutants_apply.py",
        "tests/test_apply_remote.py",
        "tests/test_store.py",
    ],
    "logsync/engine.py": [
        "tests/test_mutants_engine.py",
        "tests/test_engine.py",
    ],
    "logsync/peerloop.py": [
        "tests/test_peerloop.py",
        "tests/test_mutants_peerloop.py",
    ],
}

HYPOTHESIS_PLUGIN = '''\
"""Loaded with -p by scripts/mutation.py inside its temporary copy only."""
from hypothesis import settings

settings.register_profile("mutation", database=None, derandomize=True, deadline=None)
settings.load_profile("mutation")
'''
PLUGIN_NAME = "_logsync_mutation_profile"
TIMEOUT_OUTPUT = "timeout"  # what cosmic-ray stores as the output of a timed-out run


@dataclass
class Survivor:
    where: str
    operator: str
    diff: str


@dataclass
class ModuleResult:
    module: str
    tests: list[str]
    mutants: int = 0
    killed: int = 0
    survived: int = 0
    timeout: int = 0
    skipped: int = 0
    incompetent: int = 0
    seconds: float = 0.0
    baseline_seconds: float = 0.0
    note: str = ""
    survivors: list[Survivor] = field(default_factory=list)
    timeouts: list[Survivor] = field(default_factory=list)
    killed_by: dict[str, int] = field(default_factory=dict)  # first failing test -> kills
    kills: list[dict[str, str]] = field(default_factory=list)  # where, operator, test


def repo_files(root: Path) -> list[Path]:
    """Tracked files plus untracked ones git does not ignore (new tests count)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root, check=True, capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "__pycache__", ".hypothesis", ".ruff_cache", ".pytest_cache"}
        return [
            p.relative_to(root) for p in root.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(root).parts)
        ]
    return [Path(p) for p in out.decode().split("\0") if p]


def untracked_files(root: Path) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout
    return [Path(p) for p in out.decode().split("\0") if p]


def copy_from_worktree(root: Path, work: Path, rels: list[Path]) -> None:
    for rel in rels:
        src = root / rel
        if src.is_dir():
            copy_from_worktree(root, work, [p.relative_to(root) for p in src.rglob("*")
                                            if p.is_file() and "__pycache__" not in p.parts])
            continue
        if not src.is_file():  # deleted in the working tree
            continue
        dst = work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def scratch_dir() -> str | None:
    """tmpfs when there is one: the store tests fsync (synchronous=FULL), which on a
    loaded disk makes every mutant's run several times slower."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def make_copy(root: Path, rev: str | None, overlay: list[Path]) -> Path:
    """The working tree; or, with `rev`, that commit's files plus the working tree's
    untracked (not ignored) files and the `overlay` paths, so others' uncommitted edits
    in a shared checkout stay out while new tests still count."""
    work = Path(tempfile.mkdtemp(prefix="logsync-mutation-", dir=scratch_dir()))
    if rev is None:
        copy_from_worktree(root, work, repo_files(root))
    else:
        archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=root,
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(work, filter="data")
        copy_from_worktree(root, work, untracked_files(root) + overlay)
    (work / f"{PLUGIN_NAME}.py").write_text(HYPOTHESIS_PLUGIN)
    return work


def test_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The copy first on the path (an editable install of the original tree must not
    # win), and for subprocesses the tests start too.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(work)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    tmp = work / "tmp"  # the tests' tmp_path and tempfiles, beside the copy (tmpfs if any)
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return env


def check_import_location(python: str, work: Path, env: dict[str, str]) -> None:
    out = subprocess.run(
        [python, "-c", "import logsync; print(logsync.__file__)"],
        cwd=work, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(work.resolve()):
        sys.exit(f"mutation: the tests would import logsync from {out}, not the copy {work}")


def test_command(python: str, tests: list[str]) -> list[str]:
    return [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", PLUGIN_NAME,
            *tests]


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions, 1-based lines and 0-based columns like parso's, of every
    annotation; empty unless the module postpones annotation evaluation."""
    tree = ast.parse(source)
    postponed = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if not postponed:
        return []
    nodes: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            nodes.append(node.annotation)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            nodes.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            nodes.append(node.returns)
    return [((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0))
            for n in nodes]


def skip_annotation_mutants(db_path: Path, module_file: Path) -> int:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans = annotation_spans(module_file.read_text())
    skipped = 0
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item in list(db.work_items):
            inside = all(
                any(lo <= m.start_pos and m.end_pos <= hi for lo, hi in spans)
                for m in item.mutations
            )
            if spans and inside:
                db.set_result(item.job_id, WorkResult(
                    worker_outcome=WorkerOutcome.SKIPPED,
                    output="annotation: never evaluated (from __future__ import annotations)",
                ))
                skipped += 1
    return skipped


def run_module(module: str, tests: list[str], work: Path, python: str, env: dict[str, str],
               args: argparse.Namespace) -> ModuleResult:
    result = ModuleResult(module=module, tests=tests)
    if not (work / module).is_file():
        result.note = "does not exist: skipped"
        return result
    if not tests:
        result.note = "no test file of its mapping exists: skipped"
        return result
    command = test_command(python, tests)
    started = time.monotonic()
    base = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    result.baseline_seconds = time.monotonic() - started
    if base.returncode != 0:
        result.note = "the unmutated tests fail: not run\n" + base.stdout[-3000:]
        return result
    timeout = max(args.min_timeout, args.timeout_factor * result.baseline_seconds)

    slug = module.replace("/", "_").removesuffix(".py")
    config = work / f"mutation-{slug}.toml"
    db_path = work / f"mutation-{slug}.sqlite"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {timeout:.1f}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(shlex.join(command))}\n"
        "\n[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )
    cr = [python, "-m", "cosmic_ray.cli"]
    subprocess.run([*cr, "init", str(config), str(db_path)], cwd=work, env=env, check=True)
    result.skipped = skip_annotation_mutants(db_path, work / module)
    print(f"== {module}: {pending(db_path)} mutants to run against {' '.join(tests)} "
          f"(unmutated run {result.baseline_seconds:.1f} s, timeout {timeout:.0f} s)",
          flush=True)
    proc = subprocess.Popen([*cr, "exec", str(config), str(db_path)], cwd=work, env=env)
    while proc.poll() is None:
        time.sleep(args.progress_every)
        if proc.poll() is None:
            print(f"   {module}: {pending(db_path)} to go "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    if proc.returncode != 0:
        result.note = f"cosmic-ray exec exited {proc.returncode}"
    collect(db_path, module, result)
    result.seconds = time.monotonic() - started
    return result


def pending(db_path: Path) -> int:
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        return sum(1 for _ in db.pending_work_items)


def collect(db_path: Path, module: str, result: ModuleResult) -> None:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        items = {item.job_id: item for item in db.work_items}
        result.mutants = len(items)
        for job_id, res in db.results:
            if res.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            if res.test_outcome == TestOutcome.SURVIVED:
                result.survived += 1
                m = items[job_id].mutations[0]
                result.survivors.append(Survivor(
                    where=f"{module}:{m.start_pos[0]}",
                    operator=m.operator_name,
                    diff=(res.diff or "").strip(),
                ))
            elif res.test_outcome == TestOutcome.KILLED and res.output == TIMEOUT_OUTPUT:
                result.timeout += 1
                m = items[job_id].mutations[0]
                result.timeouts.append(Survivor(where=f"{module}:{m.start_pos[0]}",
                                                operator=m.operator_name, diff=""))
            elif res.test_outcome == TestOutcome.KILLED:
                result.killed += 1
                test = first_failure(res.output or "")
                result.killed_by[test] = result.killed_by.get(test, 0) + 1
                m = items[job_id].mutations[0]
                result.kills.append({"where": f"{module}:{m.start_pos[0]}",
                                     "operator": m.operator_name, "test": test})
            else:  # incompetent, exception, no-test
                result.incompetent += 1
    result.survivors.sort(key=lambda s: (int(s.where.rsplit(":", 1)[1]), s.operator))


def first_failure(output: str) -> str:
    """The test whose failure killed a mutant (pytest's short summary), so a kill by a
    flaky or unrelated test can be spotted in the JSON."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split()[1]
    return "(no FAILED line: collection error or crash)"


COLUMNS = ["module", "mutants", "killed", "survived", "timeout", "skipped", "incompetent",
           "time"]


def table_rows(results: list[ModuleResult]) -> list[list[str]]:
    rows = []
    for r in results:
        if r.note and not r.mutants:
            rows.append([r.module, "-", "-", "-", "-", "-", "-", r.note.splitlines()[0]])
            continue
        rows.append([r.module, str(r.mutants), str(r.killed), str(r.survived), str(r.timeout),
                     str(r.skipped), str(r.incompetent), f"{r.seconds:.0f} s"])
    return rows


def render_text(results: list[ModuleResult]) -> str:
    rows = [COLUMNS, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        if "\n" in r.note or (r.note and r.mutants):
            lines.append(f"\n{r.module}: {r.note}")
        if r.timeouts:
            lines.append(f"\nTimeouts in {r.module} (counted as detected): "
                         + ", ".join(f"{t.where} {t.operator}" for t in r.timeouts))
        if r.survivors:
            lines.append(f"\nSurvivors in {r.module} (tests: {' '.join(r.tests)}):")
            for s in r.survivors:
                lines.append(f"\n-- {s.where}  {s.operator}")
                lines.append(s.diff)
    return "\n".join(lines)


def render_markdown(results: list[ModuleResult]) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    for r in results:
        if r.timeouts:
            out.append(f"\nTimeouts in `{r.module}` (counted as detected): "
                       + ", ".join(f"`{t.where}` {t.operator}" for t in r.timeouts))
        if r.survivors:
            out.append(f"\nSurvivors in `{r.module}`:\n")
            for s in r.survivors:
                out.append(f"- `{s.where}` {s.operator}\n\n```diff\n{s.diff}\n```")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=DEFAULT_MODULES,
                        help="module paths relative to the repository (default: the core)")
    parser.add_argument("--tests", action="append", default=[], metavar="MODULE=FILE[,FILE]",
                        help="override the test files for a module")
    parser.add_argument("--timeout-factor", type=float, default=4.0,
                        help="timeout per mutant as a multiple of the unmutated run")
    parser.add_argument("--min-timeout", type=float, default=30.0)
    parser.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("--rev", metavar="COMMIT",
                        help="mutate the files of this commit (e.g. HEAD) instead of the "
                        "working tree; untracked files still come from the working tree")
    parser.add_argument("--overlay", action="append", default=[], type=Path, metavar="PATH",
                        help="with --rev: also take this path from the working tree")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy")
    parser.add_argument("--markdown", type=Path, help="also write the table and survivors")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)

    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        sys.exit("mutation: cosmic-ray is not installed: pip install -e '.[test,mutation]'")

    mapping = {k: list(v) for k, v in TESTS.items()}
    for spec in args.tests:
        module, _, files = spec.partition("=")
        mapping[module] = [f for f in files.split(",") if f]

    python = sys.executable
    work = make_copy(ROOT, args.rev, args.overlay)
    source = "the working tree"
    if args.rev:
        source = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT,
                                check=True, capture_output=True, text=True).stdout.strip()
        source = f"commit {source}" + (f" + {', '.join(map(str, args.overlay))}"
                                       if args.overlay else "")
    print(f"mutation: {source}, copied to {work}", flush=True)
    env = test_env(work)
    results: list[ModuleResult] = []
    try:
        check_import_location(python, work, env)
        for module in args.modules:
            tests = [t for t in mapping.get(module, []) if (work / t).is_file()]
            results.append(run_module(module, tests, work, python, env, args))
    finally:
        if args.keep:
            print(f"mutation: the copy is kept at {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(render_text(results))
    if args.markdown:
        args.markdown.write_text(render_markdown(results))
    if args.json:
        args.json.write_text(json.dumps(
            [r.__dict__ | {"survivors": [s.__dict__ for s in r.survivors],
                           "timeouts": [t.__dict__ for t in r.timeouts]} for r in results],
            indent=2,
        ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
