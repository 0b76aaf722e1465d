"""`simulate`: the deterministic network simulator, one run or a sweep of seeds.

`simulate` exits 0 when every run kept every invariant and met the scenario's targets,
1 otherwise (the failing seeds and violations are printed), so CI can run it as is.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from logsync.cli._common import (
    EXIT_ERROR,
    emit_json,
    fail,
    handles_errors,
    json_option,
)
from logsync.cli.group import cli
from logsync.errors import ConfigError
from logsync.files import is_special, whole_or_none

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

_SEEDS_RE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")
MAX_SWEEP = 10_000
MAX_JOBS = 64  # worker processes, whatever --jobs asks (and never more than the seeds)


def parse_seeds(raw: str) -> range:
    """`A..B`, inclusive, as a range; one sentence on anything else."""
    match = _SEEDS_RE.match(raw)
    if not match or int(match.group(1)) > int(match.group(2)):
        raise click.BadParameter(f"{raw!r} must be A..B with integers 0 <= A <= B, e.g. 1..20",
                                 param_hint="--seeds")
    first, last = int(match.group(1)), int(match.group(2))
    if last - first + 1 > MAX_SWEEP:
        raise click.BadParameter(f"{raw!r} spans {last - first + 1} seeds; at most {MAX_SWEEP}",
                                 param_hint="--seeds")
    return range(first, last + 1)


def parse_jobs(ctx: click.Context | None, param: Any, raw: str | None) -> int | None:
    """--jobs N: N >= 0 worker processes, 0 for every core; one sentence on anything else."""
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < 0:
        raise click.BadParameter(f"{raw!r} is not allowed: --jobs takes a whole number >= 0 "
                                 f"(worker processes; 0 = every core), e.g. --jobs 2",
                                 param_hint="--jobs")
    return value


def worker_count(jobs: int | None, seeds: int) -> int:
    """Processes to run `seeds` seeds on: --jobs (0 = every core), at most the seeds and
    MAX_JOBS, at least 1."""
    if jobs is None:
        return 1
    if jobs == 0:
        affinity = getattr(os, "sched_getaffinity", None)
        jobs = len(affinity(0)) if affinity else (os.cpu_count() or 1)
    return max(1, min(jobs, seeds, MAX_JOBS))


@cli.command()
@click.argument("scenario_file", metavar="SCENARIO.toml", type=click.Path(dir_okay=False))
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Run this seed (default: the scenario's `seed`).")
@click.option("--seeds", default=None, metavar="A..B",
              help="Sweep seeds A to B inclusive and summarise.")
@click.option("--jobs", default=None, metavar="N", callback=parse_jobs,
              help="Run the --seeds sweep on N worker processes (default 1; 0 = every core; "
                   f"at most the seeds and {MAX_JOBS}); the output is the same as a serial "
                   "run's but for wall-clock time.")
@click.option("--variant", default=None, help="Run the scenario's [variants.NAME] settings.")
@click.option("--plot", "plot_file", default=None, type=click.Path(dir_okay=False),
              metavar="FILE.png", help="Draw per-node lag over virtual time (one seed).")
@click.option("--trace", "trace_file", default=None, type=click.Path(dir_okay=False),
              metavar="FILE", help="Write the full trace (one seed).")
@json_option
@handles_errors
def simulate(scenario_file: str, seed: int | None, seeds: str | None, jobs: int | None,
             variant: str | None, plot_file: str | None, trace_file: str | None,
             as_json: bool) -> None:
    """Run a scenario over a virtual network with the real engine and store.

    Example:

    \b
      logsync simulate simulations/partition-and-heal.toml --seed 1 --plot partition.png
      logsync simulate simulations/partition-and-heal.toml --seeds 1..40 --jobs 0
    """
    from logsync.sim import load_scenario, run_scenario
    from logsync.sim.report import summary_text

    if seed is not None and seeds is not None:
        raise click.UsageError("pass --seed or --seeds, not both")
    sweep = parse_seeds(seeds) if seeds is not None else None
    if sweep is None and jobs is not None:
        raise click.UsageError("--jobs runs the seeds of a sweep in parallel; pass --seeds A..B")
    if sweep is not None and (plot_file or trace_file):
        raise click.UsageError("--plot and --trace draw one run; pass --seed, not --seeds")
    scenario = load_scenario(scenario_file, variant=variant)
    if sweep is None:
        for target, what in ((trace_file, "trace"), (plot_file, "plot")):
            if target is not None:  # before the run: a typo must not cost the whole run
                _check_output(Path(target), what)
        if plot_file:
            from logsync.sim.plot import check_plot_format, plot_lag

            check_plot_format(Path(plot_file))
        one = scenario if seed is None else scenario.with_seed(seed)
        try:
            report = _run_one(one, trace_file, run_scenario)
        except KeyboardInterrupt:
            fail("interrupted: the run was stopped and its stores removed", as_json,
                 code=EXIT_INTERRUPTED)
        if not as_json:
            click.echo(report.text())  # first: a plot that fails loses no report
        if plot_file:
            plot_lag(report, plot_file)
        if as_json:
            emit_json(report.as_dict() | ({"plot": plot_file} if plot_file else {}))
        elif plot_file:
            click.echo(f"  plot written to {plot_file}")
        good = report.ok and report.targets_met()
    else:
        progress = not as_json and sys.stderr.isatty()
        started = time.perf_counter()
        try:
            summary = sweep_summary(scenario, sweep, worker_count(jobs, len(sweep)),
                                    run_scenario, progress)
        except SweepInterrupted as stop:
            if progress:
                click.echo("", err=True)
            fail(str(stop), as_json, code=EXIT_INTERRUPTED)
        summary["elapsed_seconds"] = round(time.perf_counter() - started, 3)
        if as_json:
            emit_json(summary)
        else:
            if progress:
                click.echo("", err=True)
            click.echo(summary_text(summary, scenario.name))
        good = not summary["failed_seeds"] and not summary["targets_missed_seeds"]
    if not good:
        sys.exit(EXIT_ERROR)


class _Named:
    """The trace's sink: a failed write names the file (a full disk says no file)."""

    def __init__(self, sink: Any, path: Path) -> None:
        self.sink, self.path = sink, path

    def write(self, text: str) -> int:
        try:
            return int(self.sink.write(text))
        except OSError as exc:
            raise ConfigError(f"cannot write the trace to {self.path}: "
                              f"{exc.strerror or exc}") from None

    def flush(self) -> None:
        self.sink.flush()


def _check_output(target: Path, what: str) -> None:
    """A file the run will write: its directory must exist and the name be no directory
    (a device or a FIFO is written in place: `files.whole_or_none`)."""
    if target.is_dir():
        raise ConfigError(f"cannot write the {what} to {target}: it is a directory")
    if is_special(target):
        return
    parent = Path(os.path.realpath(target)).parent
    if not parent.is_dir():
        raise ConfigError(f"cannot write the {what} to {target}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write the {what} to {target}: {parent} is not writable")


# ── a sweep, serial or on worker processes ─────────────────────────────
# A seed's run is a function of the scenario and the seed alone, so where it runs changes
# nothing: results are kept by seed and summarised in seed order. A run that raises, or
# whose worker dies, becomes one sentence in its seed's place.

Outcome = tuple[Any, str | None]  # (the SimReport, None) or (None, what went wrong)
EXIT_INTERRUPTED = 130


class SweepInterrupted(Exception):
    """Ctrl-C during a sweep: the workers are stopped; says how far it got."""


def sweep_summary(scenario: Any, seeds: range, workers: int, run: Callable[[Any], Any],
                  progress: bool = False) -> dict[str, Any]:
    """`summarise` over every seed; `run(scenario_with_seed)` returns a SimReport (a
    module-level function: with workers > 1 it is pickled to each worker process)."""
    from logsync.sim import summarise

    done: dict[int, Outcome] = {}

    def record(seed: int, outcome: Outcome) -> None:
        done[seed] = outcome
        if progress:
            state = "error" if outcome[1] else ("ok" if outcome[0].ok else "FAILED")
            click.echo(f"\r  seed {seed}: {state} ({len(done)}/{len(seeds)})", err=True,
                       nl=False)

    try:
        if workers <= 1:
            for seed in seeds:
                record(seed, run_seed(run, scenario, seed))
        else:
            with _terminate_as_interrupt():
                _run_on_workers(scenario, list(seeds), workers, run, record)
    except KeyboardInterrupt:
        raise SweepInterrupted(f"interrupted: {len(done)} of {len(seeds)} seeds had finished "
                               f"and no run was left going") from None
    reports = [done[s][0] for s in seeds if done[s][1] is None]
    return summarise(reports, {s: done[s][1] for s in seeds if done[s][1] is not None},
                     scenario_digest=scenario.digest())


def run_seed(run: Callable[[Any], Any], scenario: Any, seed: int) -> Outcome:
    """One seed, in this process or a worker: its report, or one sentence on why none."""
    try:
        return run(scenario.with_seed(seed)), None
    except Exception as exc:  # a bug the sweep reports in the seed's place, then goes on
        return None, _sentence(f"the run raised {type(exc).__name__}: {exc}")


def _sentence(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (`timeout`, a service manager, a CI cancel) ends a sweep as Ctrl-C does:
    the workers stopped and the sweep's directory removed, not orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _quiet_worker(workdir: str) -> None:
    """Ctrl-C reaches the whole process group: the parent alone handles it. Runs make
    their directories in the sweep's own `workdir`."""
    from logsync.sim.runner import use_workdir

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    use_workdir(Path(workdir))


DIED = "its worker process died before the run finished"


def _run_on_workers(scenario: Any, seeds: list[int], workers: int, run: Callable[[Any], Any],
                    record: Callable[[int, Outcome], None]) -> None:
    """The sweep's workers run in a directory of its own, removed when the sweep ends
    however it ends: a worker stopped mid-run (Ctrl-C, a crash) cannot clean up after
    itself, and its stores would stay in tmpfs (RAM) until the machine restarts. A sweep
    killed outright is removed by the next run (`sim/scratch.py`)."""
    from logsync.sim.scratch import claimed_dir, remove_abandoned

    remove_abandoned()
    with claimed_dir("logsync-sweep-") as workdir:
        _sweep(scenario, seeds, workers, run, record, workdir)


def _sweep(scenario: Any, seeds: list[int], workers: int, run: Callable[[Any], Any],
           record: Callable[[int, Outcome], None], workdir: Path) -> None:
    """At most `workers` seeds in flight. When a worker dies, the pool breaks and every seed
    then in flight fails with it; each of those is rerun alone in a fresh process, so the
    one that kills its process is the one reported, and the sweep goes on in a new pool."""
    todo = seeds
    while todo:
        suspects, todo = _pool_pass(scenario, todo, workers, run, record, workdir)
        for batch in range(0, len(suspects), workers):
            group = suspects[batch:batch + workers]
            pools = {seed: _pool(1, workdir) for seed in group}
            try:
                futures = {seed: _submit(pools[seed], run, scenario, seed) for seed in group}
                for seed in group:
                    wait([futures[seed]])
                    record(seed, _outcome(futures[seed]) or (None, DIED))
            finally:
                for pool in pools.values():
                    _stop(pool)


def _pool_pass(scenario: Any, todo: list[int], workers: int, run: Callable[[Any], Any],
               record: Callable[[int, Outcome], None],
               workdir: Path) -> tuple[list[int], list[int]]:
    """Run `todo` on one pool until done or broken: (the seeds in flight when it broke,
    the seeds not yet started)."""
    pool = _pool(workers, workdir)
    pending = iter(todo)
    flight: dict[Future[Outcome], int] = {}
    suspects: list[int] = []
    try:
        while True:
            while not suspects and len(flight) < workers:
                seed = next(pending, None)
                if seed is None:
                    break
                flight[_submit(pool, run, scenario, seed)] = seed
            if not flight:
                break
            finished, _ = wait(flight, return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=flight.__getitem__):
                seed = flight.pop(future)
                outcome = _outcome(future)
                if outcome is None:
                    suspects.append(seed)
                else:
                    record(seed, outcome)
    except BaseException:  # Ctrl-C above all: no seed runs on
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    return sorted(suspects), list(pending)


def _pool(workers: int, workdir: Path) -> ProcessPoolExecutor:
    # Imported here: multiprocessing costs every other command's start ~5 ms.
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    # spawn: a worker is a fresh interpreter, whatever threads or state this process holds
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                               initializer=_quiet_worker, initargs=(str(workdir),))


def _submit(pool: ProcessPoolExecutor, run: Callable[[Any], Any], scenario: Any,
            seed: int) -> Future[Outcome]:
    """Submit (which may start a worker) with Ctrl-C ignored, so a worker starts ignoring it
    (an ignored signal stays ignored across exec) and never prints a traceback."""
    if threading.current_thread() is not threading.main_thread():
        return pool.submit(run_seed, run, scenario, seed)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return pool.submit(run_seed, run, scenario, seed)
    finally:
        signal.signal(signal.SIGINT, previous)


def _outcome(future: Future[Outcome]) -> Outcome | None:
    """The seed's outcome; None when its worker died (the pool broke under it)."""
    from concurrent.futures.process import BrokenProcessPool  # loaded with the pool

    error = future.exception()
    if isinstance(error, BrokenProcessPool):
        return None
    if error is not None:  # e.g. a report that could not be sent back
        return None, _sentence(f"the run raised {type(error).__name__}: {error}")
    return future.result()


def _stop(pool: ProcessPoolExecutor) -> None:
    """Shut the pool down now: queued seeds cancelled, running workers ended (after a
    normal finish there are none running; after Ctrl-C they must not run on)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def _run_one(scenario: Any, trace_file: str | None, run: Any) -> Any:
    """One run, its trace (if asked) named only once the run ended: Ctrl-C, SIGTERM or a
    full disk leaves no partial trace, and an existing file stays until replaced whole.
    SIGTERM ends it as Ctrl-C does, so its stores are removed (`sim/scratch.py`)."""
    with _terminate_as_interrupt():
        if trace_file is None:
            return run(scenario)
        target = Path(trace_file)
        with whole_or_none(target) as sink:
            return run(scenario, trace_sink=_Named(sink, target))
