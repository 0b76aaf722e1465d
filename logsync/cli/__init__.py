"""The `logsync` command line: thin click commands over the library.

Exit codes: 0 ok, 1 error, usage errors included (one line: `Error: …` on
stderr, or `{"error": …}` with --json), 2 timeout (`wait`), 3 the store does not
verify (`verify`) or a peer is behind either way (`status`, where 1 is a peer that
failed). `main()` is the entry point that enforces the one-line form for click's own
usage errors.
"""

from __future__ import annotations

# Importing the command modules registers their commands on `cli`.
from logsync.cli import (  # noqa: E402
    conformance,  # noqa: F401
    ledgers,  # noqa: F401
    local,  # noqa: F401
    operator,  # noqa: F401
    replication,  # noqa: F401
    sim,  # noqa: F401
    status,  # noqa: F401
    verify,  # noqa: F401
)
from logsync.cli.group import cli, main

__all__ = ["cli", "main"]
