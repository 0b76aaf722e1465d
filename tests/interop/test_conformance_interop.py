"""`logsync conformance` against a real MemPalace 3.11 hub (issue 14, item 4): the upstream
sections pass and every extension section is not applicable, with the hub's own data
(written by its own CLI and library: every field, artifacts, an ack, an origin relayed from
a second hub, rowid gaps in its own origin, and more than one 500-op page)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from .hub import bulk_specs
from .test_replication_interop import write_hub_palace

if TYPE_CHECKING:
    from .conftest import Lab

pytestmark = pytest.mark.interop

UPSTREAM = ("§3", "§4", "§5", "§6", "§7.1", "§7.2", "§7.3", "§7.7", "§11", "§12")
EXTENSIONS_ONLY = ("§7.4", "§7.5", "§7.6", "§8.1", "§13")


def test_a_mempalace_hub_passes_the_upstream_sections(lab: Lab) -> None:
    source_palace = lab.palace("source")
    write_hub_palace(lab, source_palace, "src")
    source = lab.hub("source", palace=source_palace)
    hub_palace = lab.palace("hub")
    write_hub_palace(lab, hub_palace, "hub")
    lab.mp.sync(hub_palace, source.url, source.token)  # a relayed origin; gaps in our own
    lab.mp.bulk_append(hub_palace, bulk_specs("hub", 620))
    hub = lab.hub("hub", palace=hub_palace)
    done = subprocess.run([sys.executable, "-m", "logsync", "conformance", hub.url, "--token",
                           hub.token, "--writable", "--json"],
                          capture_output=True, text=True, timeout=120)
    payload = json.loads(done.stdout)
    assert (done.returncode, payload["failures"]) == (0, []), done.stdout + done.stderr
    verdicts = {s["section"]: s["verdict"] for s in payload["sections"]}
    checks = {(c["section"], c["check"]): c for s in payload["sections"] for c in s["checks"]}
    for section in UPSTREAM:
        assert verdicts[section] == "pass", (section, payload)
    for section in EXTENSIONS_ONLY:  # a hub advertises no extension: nothing to hold it to
        assert verdicts[section] == "n/a", (section, payload)
    for name in ("max-page", "msgpack-same-events"):
        assert checks[("§8", name)]["verdict"] == "n/a"
    assert checks[("§8", "unknown-extension-ignored")]["verdict"] == "pass"
    assert checks[("§7.2", "upstream-page-cap")]["verdict"] == "pass"  # 620 > 500 ops
    for must in (("§7.2", "unknown-origin-empty"), ("§7.2", "defaults"),
                 ("§6", "vector-top-held"), ("§12", "token-required"),
                 ("§12", "wrong-token-refused")):  # the hub's answers to the later checks
        assert checks[must]["verdict"] == "pass", (must, checks[must])
    assert checks[("§11", "negative-after")]["sentence"] == "upstream shape"
    assert checks[("§7.5", "push-applied")]["sentence"].startswith("push not advertised")
    assert len(hub.version_vector()) == 2  # --writable wrote nothing to a hub: no push


def test_a_daemon_serving_a_hubs_ops_passes_every_section(lab: Lab) -> None:
    """A logsync daemon that pulled a hub (upstream origins, rowid gaps, the hub's
    artifacts) serves them conformantly, extensions included (chains over upstream ops)."""
    hub_palace = lab.palace("hub")
    write_hub_palace(lab, hub_palace, "hub")
    lab.mp.bulk_append(hub_palace, bulk_specs("hub", 30))
    hub = lab.hub("hub", palace=hub_palace)
    palace = lab.palace("daemon")
    lab.ls.sync(palace, hub.url, hub.token)
    daemon = lab.daemon("daemon", palace=palace)
    done = subprocess.run([sys.executable, "-m", "logsync", "conformance", daemon.url,
                           "--token", daemon.token, "--writable", "--json"],
                          capture_output=True, text=True, timeout=120)
    payload = json.loads(done.stdout)
    assert (done.returncode, payload["failures"]) == (0, []), done.stdout + done.stderr
    verdicts = {s["section"]: s["verdict"] for s in payload["sections"]}
    assert {section for section, verdict in verdicts.items() if verdict != "pass"} == set()
    assert hub.replica_id() in daemon.version_vector()
