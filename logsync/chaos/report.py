"""The verdict and timeline of a run: ``verdict.json`` and ``timeline.png`` in its directory.

The plot has one lane per replica (and one for the network): faults as bars on the lanes
they hit, appends as marks where they returned (acknowledged, failed, indeterminate), and
for each round the heal (dashed) and convergence (dotted) lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLORS = {"isolate": "tab:purple", "partition": "tab:red", "bridge": "tab:orange",
          "flap": "tab:pink", "kill": "black", "pause": "tab:gray", "skew": "tab:cyan",
          "disk": "tab:brown", "lossy": "tab:olive", "hub_kill": "black"}
NET = "network"


def write_json(summary: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n",
                    encoding="utf-8")
    return path


def _bars(fault: dict[str, Any], began: float) -> list[tuple[str, float, float]]:
    """(lane, start, width) for one fault, as it ran (as scheduled if it never began)."""
    ran = fault.get("ran")
    start, width = (ran[0], ran[1] - ran[0]) if ran else (began + fault["start"],
                                                           fault["duration"])
    kind, p = fault["kind"], fault["params"]
    if kind == "partition":
        return [(NET, start, width)] + [(m, start, width) for m in p["minority"]]
    if kind == "bridge":
        return [(NET, start, width), (p["bridge"], start, width)]
    if kind == "lossy":
        return [(NET, start, width), (fault["targets"][0], start, width)]
    return [(fault["targets"][0], start, width)]


def plot(summary: dict[str, Any], entries: list[dict[str, Any]], path: Path) -> Path | None:
    """Write the PNG; returns None (and says why in the summary) if matplotlib fails."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = [*summary["members"], NET]
    row = {name: i for i, name in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.55 * len(lanes)))
    try:
        seen: set[str] = set()
        for rnd in summary["rounds"]:
            for fault in rnd["faults"]:
                color = COLORS.get(fault["kind"], "tab:blue")
                for lane, start, width in _bars(fault, rnd["began"]):
                    if lane not in row:
                        continue
                    label = fault["kind"] if fault["kind"] not in seen else None
                    seen.add(fault["kind"])
                    ax.broken_barh([(start, width)], (row[lane] - 0.35, 0.7), color=color,
                                   alpha=0.35, label=label)
            ax.axvline(rnd["heal_at"], color="black", linestyle="--", linewidth=1,
                       label="heal" if "heal" not in seen else None)
            seen.add("heal")
            if rnd.get("convergence_s") is not None:
                ax.axvline(rnd["heal_at"] + rnd["convergence_s"], color="tab:green",
                           linestyle=":", linewidth=1.5,
                           label="converged" if "conv" not in seen else None)
                seen.add("conv")
        marks = {"ok": ("o", "tab:green", "acknowledged"), "fail": ("x", "tab:red", "failed"),
                 "info": ("^", "tab:orange", "indeterminate")}
        for outcome, (marker, color, label) in marks.items():
            points = [(e["end"], row[e["node"]]) for e in entries
                      if e["kind"] == "append" and e.get("outcome") == outcome
                      and e.get("node") in row]
            if points:
                ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker,
                           s=14, color=color, label=f"{label} ({len(points)})", zorder=3)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_xlabel("seconds since the run began")
        verdict = "PASS" if summary["ok"] else "FAIL"
        ax.set_title(f"chaos seed {summary['seed']}: {summary['topology']}, mix "
                     f"{summary['mix']}, {summary['mode']} mode — {verdict}")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize="x-small", ncol=4, loc="upper center",
                  bbox_to_anchor=(0.5, -0.18))
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as exc:
        summary.setdefault("notes", []).append(f"plot not written: {exc}")
        return None
    finally:
        plt.close(fig)
    return path
