"""logsync: multi-master replication for MemPalace logstream coordination logs."""

import sys
import types

__version__ = "0.1.0"


def _httpx_cli_stub() -> None:
    """httpx's package imports its own command-line client (click, rich, pygments: ~80 ms)
    whenever those are installed, as rich and click are here. logsync never runs httpx's
    CLI, so a stand-in takes its place before httpx is first imported (a module, not a
    marked absence, so an httpx that imports it unconditionally still loads)."""
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        return
    stub = types.ModuleType("httpx._main", "logsync's stand-in for httpx's CLI module")

    def main() -> None:
        sys.exit("httpx's command-line client is not loaded in a logsync process")

    stub.main = main  # type: ignore[attr-defined]
    sys.modules["httpx._main"] = stub


_httpx_cli_stub()
