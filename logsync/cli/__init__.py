"""The `logsync` command line: thin click commands over the library.

Exit codes: 0 ok, 1 error, usage errors included (one line: `Error: …` on
stderr, or `{"error": …}` with --json), 2 timeout (`wait`), 3 the store does not
verify (`verify`) or a peer is behind either way (`status`, where 1 is a peer that
failed). `main()` is the entry point that enforces the one-line form for click's own
usage errors. The command modules register their commands on `cli` when imported,
which `cli` does for a command only when it is named (`group.COMMAND_MODULES`).
"""

from __future__ import annotations

from logsync.cli.group import cli, main

__all__ = ["cli", "main"]
