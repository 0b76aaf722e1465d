"""The interop harness of the checkout (``tests/interop/hub.py``), imported, never copied.

It starts real MemPalace 3.11 hubs and logsync daemons (``ServerProcess``, ``hub_argv``,
``logsync_argv``, ``logsync_env``, ``write_peers_json``, ``free_port``) and runs both CLIs;
the chaos harness reuses all of it. Being in ``tests/``, it exists only in a checkout: from an
installed wheel the chaos harness says so in one sentence.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import logsync
from logsync.chaos.netns import ChaosError

REPO_ROOT = Path(next(iter(logsync.__path__))).resolve().parent


def _load() -> ModuleType:
    if not (REPO_ROOT / "tests" / "interop" / "hub.py").is_file():
        raise ChaosError(f"the chaos harness runs from a checkout: {REPO_ROOT}/tests/interop/"
                         "hub.py (the interop harness it reuses) is missing")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return importlib.import_module("tests.interop.hub")


hub = _load()
