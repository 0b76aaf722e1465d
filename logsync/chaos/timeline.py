"""The run's timeline: every fault, append, heal and check, with its time, as it happens.

Times are seconds since the run began (monotonic) plus the wall clock (UTC) of the
harness; entries are kept in memory and appended to a JSON-lines file at once, so a run
that dies still leaves what it did.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class Timeline:
    def __init__(self, path: Path | None = None, *, echo: bool = False) -> None:
        self.t0 = time.monotonic()
        self.path = path
        self.echo = echo
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, kind: str, **fields: Any) -> dict[str, Any]:
        entry = {"t": round(self.now(), 3),
                 "wall": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z",
                 "kind": kind, **fields}
        line = json.dumps(entry, ensure_ascii=False, default=str)
        with self._lock:
            self.entries.append(entry)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as out:
                    out.write(line + "\n")
        if self.echo and kind != "append":
            print(f"[{entry['t']:8.2f}s] {kind} "
                  + " ".join(f"{k}={v}" for k, v in fields.items()), file=sys.stderr)
        return entry

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.entries if e["kind"] in kinds]
