"""logsync: multi-master replication for MemPalace logstream coordination logs."""

import sys

__version__ = "0.1.0"

# httpx's package __init__ imports its own command-line client (click, rich, pygments:
# ~80 ms) whenever those happen to be installed, as rich and click are here. logsync
# never runs httpx's CLI, so that module is marked absent before httpx is first imported:
# httpx then falls back to its stub `main`, as it does without the `cli` extra.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]
