"""One table of a scenario file with its path: typed getters whose errors are one
`ScenarioError` sentence naming the exact key, the value and what is allowed."""

from __future__ import annotations

import math
import re
from typing import Any

from logsync.sim.spec import ScenarioError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# Every duration of a scenario (a run's length, a latency, a clock's skew or jump) is at
# most this far from zero: a virtual clock further out leaves the calendar's years.
MAX_DURATION_S = 3650 * 86400.0
_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


class Table:
    """One TOML table with its path, for messages that name the exact key."""

    def __init__(self, data: Any, source: str, path: str, allowed: tuple[str, ...]) -> None:
        where = path or "the top level"
        if not isinstance(data, dict):
            raise ScenarioError(f"{source}: {where} must be a table")
        for key in data:
            if key not in allowed:
                raise ScenarioError(
                    f"{source}: {self._name(path, key)} is not a known key; "
                    f"allowed in {where}: {', '.join(allowed)}"
                )
        self.data, self.source, self.path = data, source, path

    @staticmethod
    def _name(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def fail(self, key: str, value: Any, rule: str) -> ScenarioError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ScenarioError(f"{self.source}: {self._name(self.path, key)}={shown} {rule}")

    def has(self, key: str) -> bool:
        return key in self.data

    def table(self, key: str, allowed: tuple[str, ...]) -> Table:
        return Table(self.data.get(key, {}), self.source, self._name(self.path, key), allowed)

    def tables(self, key: str, allowed: tuple[str, ...]) -> list[Table]:
        raw = self.data.get(key, [])
        if not isinstance(raw, list):
            raise self.fail(key, raw, f"must be an array of tables ([[{key}]])")
        return [
            Table(item, self.source, f"{self._name(self.path, key)}[{i}]", allowed)
            for i, item in enumerate(raw)
        ]

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, value, "must be a string")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.data.get(key, default)
        if value not in allowed:
            raise self.fail(key, value, f"is not allowed; allowed: {', '.join(allowed)}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, value, "must be true or false")
        return value

    def integer(self, key: str, default: Any, low: int | None = None,
                high: int | None = None) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, value, "must be an integer")
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(key, value, f"must be an integer in [{low}, {high}]"
                            if high is not None else f"must be an integer >= {low}")
        return value

    def number(self, key: str, default: Any, low: float = 0.0,
               high: float | None = None) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise self.fail(key, value, "must be a number")
        if value < low or (high is not None and value > high):
            bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
            raise self.fail(key, value, f"must be a number {bound}")
        return float(value)

    def fraction(self, key: str, default: float) -> float:
        return self.number(key, default, 0.0, 1.0)

    def duration(self, key: str, default: Any, low: float = 0.0,
                 negative: bool = False) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        seconds = parse_duration(value)
        if seconds is None:
            raise self.fail(key, value, "must be seconds as a number or a string like "
                            "'250ms', '30s', '5m', '2h', '3d', '2w'")
        if not negative and seconds < low:
            raise self.fail(key, value, f"must be at least {low:g} s")
        if abs(seconds) > MAX_DURATION_S:
            raise self.fail(key, value, "must be at most 3650 days "
                            f"({MAX_DURATION_S:.0f} s){' either way' if negative else ''}")
        return seconds

    def node(self, key: str, known: set[str], default: Any = None) -> Any:
        value = self.data.get(key, default)
        if value is None:
            return None
        if not is_node(value, known):
            raise self.fail(key, value, f"is not a node; nodes: {', '.join(sorted(known))}")
        return value

    def node_list(self, key: str, known: set[str], *, allow_all: bool = False) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if allow_all and value == "all":
            return tuple(sorted(known, key=natural))
        if not isinstance(value, list) or not value:
            rule = "must be a non-empty list of node names" + (" or \"all\"" if allow_all else "")
            raise self.fail(key, value, rule)
        for item in value:
            if not is_node(item, known):
                raise self.fail(key, value, f"names {item!r}, which is not a node; "
                                f"nodes: {', '.join(sorted(known, key=natural))}")
        return tuple(value)


def is_node(value: Any, known: set[str]) -> bool:
    """A node name (TOML also gives lists and tables, which no set can hold)."""
    return isinstance(value, str) and value in known


def parse_duration(value: Any) -> float | None:
    """Seconds from a number or a '<n><unit>' string; None if neither (or not finite)."""
    if isinstance(value, bool):
        return None
    seconds = None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
    return seconds if seconds is not None and math.isfinite(seconds) else None


def natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
