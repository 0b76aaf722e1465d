"""The run's trace: one line per decision, hashed as it is written.

Two runs of one scenario and seed must write byte-identical traces; the
sha256 of the trace is printed with every report, so "same seed, same run"
is one string comparison. Lines carry virtual time, never wall time, paths
or anything else that differs between machines.
"""

from __future__ import annotations

import hashlib
from typing import TextIO

from logsync.sim.clock import VirtualClock, stamp

_FLUSH = 2000


class Trace:
    """Lines are `<virtual microseconds> <category> <text>`, hashed in batches."""

    def __init__(self, clock: VirtualClock, sink: TextIO | None = None) -> None:
        self._clock = clock
        self._hash = hashlib.sha256()
        self._sink = sink
        self._pending: list[str] = []
        self.lines = 0
        self.faults: list[str] = []

    def log(self, category: str, text: str) -> None:
        self._pending.append(f"{self._clock.now_us} {category} {text}\n")
        if len(self._pending) >= _FLUSH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        chunk = "".join(self._pending)
        self._hash.update(chunk.encode("utf-8", "surrogatepass"))
        if self._sink is not None:
            self._sink.write(chunk)
        self.lines += len(self._pending)
        self._pending.clear()

    def fault(self, text: str) -> None:
        """A fault decision: traced and kept for the report."""
        self.faults.append(f"{stamp(self._clock.now_us).strip()} {text}")
        self.log("fault", text)

    def digest(self) -> str:
        self._flush()
        return self._hash.hexdigest()
