"""What starting a logsync process imports: never httpx's own command-line client.

Why: httpx's package imports `httpx._main` (click, rich, pygments: ~80 ms) whenever those
are installed, and rich is a logsync dependency; every `logsync` command, daemon and
joiner paid for a CLI it never runs. `logsync/__init__.py` puts a stand-in in its place.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = (
    "import sys, json, {module}, httpx\n"
    "print(json.dumps({{'loaded': [m for m in ('pygments', 'rich.console', 'rich.progress')"
    " if m in sys.modules], 'stub': 'logsync' in (sys.modules['httpx._main'].__doc__ or ''),"
    " 'client': hasattr(httpx, 'Client')}}))\n"
)


def _probe(module: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)


def test_the_sync_path_never_imports_httpx_command_line_client() -> None:
    for module in ("logsync.cli", "logsync.client", "logsync.snapshot.joining",
                   "logsync.daemon"):
        got = _probe(module)
        assert got == {"loaded": [], "stub": True, "client": True}, module


def test_httpx_imported_first_is_left_as_it_is() -> None:
    """A program that imported httpx before logsync keeps httpx exactly as it loaded."""
    code = ("import httpx, sys; had = sys.modules.get('httpx._main'); "
            "import logsync.client; print(had is sys.modules.get('httpx._main'))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    assert out.strip() == "True"
