"""`--plot`: per-node lag (ops behind the fleet) over virtual time, faults shaded."""

from __future__ import annotations

import gzip
import io
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from logsync.errors import ConfigError
from logsync.sim.report import SimReport

_SHADES = {"partition": "tab:red", "oneway": "tab:orange", "isolate": "tab:purple",
           "flap": "tab:pink", "crash": "tab:gray", "link": "tab:olive"}


def _unit(span: float) -> tuple[float, str]:
    for size, name in ((86400.0, "days"), (3600.0, "hours"), (60.0, "minutes")):
        if span >= 5 * size:
            return size, name
    return 1.0, "seconds"


# The same run draws the same bytes: no date in the file, and SVG's element ids salted
# with a constant (matplotlib draws them from a random uuid otherwise).
_UNDATED: dict[str, dict[str, Any]] = {"pdf": {"CreationDate": None},
                                       "svg": {"Date": None}, "svgz": {"Date": None}}
_SVG_SALT = "logsync-sim"


@contextmanager
def _epoch_zero(suffix: str) -> Iterator[None]:
    """PostScript takes its date only from `SOURCE_DATE_EPOCH`: 0 while it is written."""
    if suffix not in ("ps", "eps"):
        yield
        return
    was = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = "0"
    try:
        yield
    finally:
        if was is None:
            del os.environ["SOURCE_DATE_EPOCH"]
        else:
            os.environ["SOURCE_DATE_EPOCH"] = was


def _save(fig: Any, target: Path) -> None:
    """`savefig` with nothing of the moment in the file (`_UNDATED`, `_epoch_zero`; an
    `.svgz` gzipped here with mtime 0, where matplotlib stamps the time)."""
    import matplotlib

    suffix = target.suffix.lower().lstrip(".")
    with matplotlib.rc_context({"svg.hashsalt": _SVG_SALT}), _epoch_zero(suffix):
        if suffix == "svgz":
            svg = io.BytesIO()
            fig.savefig(svg, format="svg", dpi=110, metadata=_UNDATED["svg"])
            target.write_bytes(gzip.compress(svg.getvalue(), mtime=0))
        else:
            undated = _UNDATED.get(suffix)  # pgf takes no metadata at all
            fig.savefig(target, dpi=110, **({"metadata": undated} if undated else {}))


def check_plot_format(path: Path) -> None:
    """The file name's suffix must be a format matplotlib writes (checked before a run)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        raise ConfigError(f"cannot draw the plot as {path}: {suffix or 'no suffix'!r} is not "
                          f"an image format; name the file .png (or {', '.join(sorted(formats))})")
    if suffix == "pgf":  # matplotlib measures the text with a TeX program, after the run
        import matplotlib

        tex = matplotlib.rcParams["pgf.texsystem"]
        if shutil.which(tex) is None:
            raise ConfigError(f"cannot draw the plot as {path}: matplotlib writes .pgf "
                              f"through {tex}, which is not installed here; name the file "
                              ".png, .svg or .pdf")


def plot_lag(report: SimReport, path: str | Path) -> Path:
    """Write the plot in the format its suffix names (PNG for `.png`), the same bytes for
    the same report; an unwritable path is one ConfigError sentence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = Path(path)
    times = [t for t, _ in report.samples]
    span = max(times) if times else 1.0
    scale, unit = _unit(span)
    fig, ax = plt.subplots(figsize=(10, 5))
    try:
        for index, name in enumerate(report.nodes):
            ax.plot([t / scale for t in times], [lags[index] for _, lags in report.samples],
                    label=name if len(report.nodes) <= 10 else None,
                    linewidth=1.0 if len(report.nodes) <= 10 else 0.6)
        seen: set[str] = set()
        for window in report.windows:
            color = _SHADES.get(window["kind"], "tab:blue")
            label = window["kind"] if window["kind"] not in seen else None
            seen.add(window["kind"])
            ax.axvspan(window["start"] / scale, window["end"] / scale, color=color,
                       alpha=0.15, label=label)
        if report.heal_at is not None:
            ax.axvline(report.heal_at / scale, color="black", linestyle="--", linewidth=1,
                       label="heal")
        if report.converged_at is not None:
            ax.axvline(report.converged_at / scale, color="tab:green", linestyle=":",
                       linewidth=1.5, label="converged")
        name = report.scenario + (f" [{report.variant}]" if report.variant else "")
        ax.set_title(f"{name}, seed {report.seed}: ops behind per node "
                     f"(trace {report.trace_hash[:12]})")
        ax.set_xlabel(f"virtual time ({unit})")
        ax.set_ylabel("ops behind the fleet")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", ncol=2, loc="upper left")
        fig.tight_layout()
        try:
            _save(fig, target)
        except OSError as exc:
            raise ConfigError(f"cannot write the plot to {target}: "
                              f"{exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return target
