"""The operator's view of chains and signatures (issue 10, items 4-5), through click's
CliRunner: `conflicts` shows a chain divergence (first divergent seq, peer, both digests,
both ops) and a key change (both keys, peer), its JSON stays the ledger rows, and a
malformed ledger row another program wrote prints without a traceback; `info` and
`status` show each origin's signing state (signed, pinned, unsigned), signed_to and
unproven, in text and JSON."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from logsync.cli import cli
from logsync.store import DB_FILENAME, Store
from tests.conftest import RemoteKit, origin_id
from tests.test_divergence import ChainPeer, backup_then_remint
from tests.test_divergence import pull as pull_diverging
from tests.test_engine import FakePeer
from tests.test_signatures import Relay, append, pull


def run(palace: Path, *args: str) -> Result:
    result = CliRunner().invoke(cli, ["--palace", str(palace), *args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


def detail(stdout: str, head: str) -> list[str]:
    """The indented lines under the first output line containing `head`."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if head in line)
    out = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        out.append(line.strip())
    return out


# ── conflicts ─────────────────────────────────────────────────────────


def test_a_divergence_shows_its_seq_peer_both_digests_and_both_ops(tmp_path: Path) -> None:
    a, _, x2 = backup_then_remint(tmp_path, total=5, kept=2, reminted=4)
    pull_diverging(a, ChainPeer(x2))
    ledger = a.list_conflicts(1000)
    (found,) = [c for c in ledger if c["kind"] == "divergence"]
    local, remote = found["local"], found["remote"]
    a.close()
    x2.close()

    result = run(tmp_path / "a", "conflicts")
    assert result.exit_code == 0
    head = f"  divergence  {x2.replica_id}#3  {local['op']['id']}  x1: "
    assert detail(result.stdout, head) == [
        f"first divergent seq 3, peer {remote['peer']}",
        f"here:  digest {local['digest'][:12]}...  op {local['op']['id']} body 'x-late 0'",
        f"peer:  digest {remote['digest'][:12]}...  op {remote['op']['id']} "
        "body 're-minted 0'",
    ]
    assert local["digest"][:12] != remote["digest"][:12]
    fork = next(line for line in result.stdout.splitlines() if "  fork  " in line)
    assert detail(result.stdout, fork) == []           # other kinds: one line, as before

    as_json = run(tmp_path / "a", "conflicts", "--json")
    assert json.loads(as_json.stdout) == {"conflicts": ledger, "count": len(ledger)}


def test_a_key_change_shows_both_keys_and_the_peer(tmp_path: Path) -> None:
    a, r, c = (Store.open(tmp_path / n) for n in ("a", "r", "c"))
    append(a, 2)
    pull(r, Relay(a))
    pull(c, Relay(r))
    other = Store.open(tmp_path / "other")

    def rekey(request: Any, body: Any) -> Any:
        if request.path == "/sync/version_vector":
            body["logsync"]["keys"][a.replica_id] = other.public_key.hex()
        return body
    pull(c, Relay(r, rekey))
    (change,) = [x for x in c.list_conflicts() if x["kind"] == "key_change"]
    for store in (a, r, c, other):
        store.close()

    result = run(tmp_path / "c", "conflicts")
    line = next(x for x in result.stdout.splitlines() if "  key_change  " in x)
    assert f"  key_change  {a.replica_id}  None  x1: " in line   # no '#None' for no seq
    assert detail(result.stdout, line) == [
        f"peer {change['remote']['peer']}: pinned key {a.public_key.hex()[:12]}..., "
        f"the peer's {other.public_key.hex()[:12]}..."]


def test_a_long_body_is_shortened_and_a_malformed_row_prints_without_a_traceback(
    tmp_path: Path,
) -> None:
    palace = tmp_path / "p"
    kit, origin = RemoteKit(), origin_id(3)
    with Store.open(palace) as store:
        store.apply_remote([kit.op(origin, 1)])
        store.record_divergence(
            origin=origin, seq=1, peer="hub\t", local_digest=b"\xab" * 32,
            remote_digest=None, remote_ops=[kit.op(origin, 1, body="x" * 500 + "\x1b[2J")])
    conn = sqlite3.connect(palace / DB_FILENAME)
    with conn:
        conn.execute("INSERT INTO logsync_conflicts (detected_at, kind, origin_replica, "
                     "origin_seq, item_id, reason, local_json, remote_json, digest) VALUES "
                     "('t', 'divergence', ?, 9, NULL, 'odd', 'not json', '[1]', 'd1'), "
                     "('t', 'key_change', ?, NULL, NULL, 'odd', '{\"public_key\": 5}', "
                     "'{\"public_key\": \"zz\", \"peer\": 7}', 'd2')", (origin, origin))
    conn.close()
    result = run(palace, "conflicts")
    assert result.exit_code == 0
    first = detail(result.stdout, f"  divergence  {origin}#1  ")
    assert first[0] == "first divergent seq 1, peer ?"      # not printable: not echoed
    assert first[1].startswith(f"here:  digest {'ab' * 6}...  op ")
    assert first[2].startswith("peer:  digest none  op ") and "\x1b" not in first[2]
    assert len(first[2]) < 140 and first[2].endswith("...")
    assert detail(result.stdout, f"  divergence  {origin}#9  ") == [
        "first divergent seq 9, peer ?", "here:  digest none  no op held here",
        "peer:  digest none  no op sent"]
    assert detail(result.stdout, f"  key_change  {origin}  ") == [
        "peer ?: pinned key ?, the peer's ?"]


# ── info and status: the signing state per origin ─────────────────────


def test_info_and_status_show_signed_pinned_unsigned_and_unproven(tmp_path: Path) -> None:
    """c holds its own ops (signed), an upstream-id origin's (pinned on first sight), a
    self-certified origin's taken 5 signed then 3 through a hub (signed to 5, 3
    unproven), and ops of an origin that never published a key (unsigned)."""
    c = Store.open(tmp_path / "c")
    append(c, 2)
    upstream = Store.open(tmp_path / "u", replica_id="rep_0123456789ab")
    append(upstream, 3)
    pull(c, Relay(upstream))
    a = Store.open(tmp_path / "a")
    append(a, 5)
    pull(c, Relay(a))
    append(a, 3, "late")
    pull(c, FakePeer(a))                                   # a hub: no signatures
    bare = origin_id(4)
    c.apply_remote(RemoteKit().chain(bare, 2))
    me = c.replica_id
    for store in (c, upstream, a):
        store.close()

    expected = {
        me: {"state": "signed", "signed_to": 2, "unproven": 0},
        upstream.replica_id: {"state": "pinned", "signed_to": 3, "unproven": 0},
        a.replica_id: {"state": "signed", "signed_to": 5, "unproven": 3},
        bare: {"state": "unsigned", "signed_to": 0, "unproven": 2},
    }
    info = json.loads(run(tmp_path / "c", "info", "--json").stdout)
    assert info["signing"] == expected
    assert set(info["signing"]) == set(info["version_vector"])
    status = json.loads(run(tmp_path / "c", "status", "--json").stdout)
    assert status["signing"] == expected

    info_text = run(tmp_path / "c", "info").stdout.splitlines()
    status_text = run(tmp_path / "c", "status").stdout.splitlines()
    words = {me: "signed, signed to 2, 0 unproven",
             upstream.replica_id: "pinned, signed to 3, 0 unproven",
             a.replica_id: "signed, signed to 5, 3 unproven",
             bare: "unsigned, 2 unproven"}
    tops = {me: 2, upstream.replica_id: 3, a.replica_id: 8, bare: 2}
    for origin, phrase in words.items():
        assert f"  {origin}  {tops[origin]}  {phrase}" in info_text
        assert f"  holds {origin} up to {tops[origin]} ({phrase})" in status_text


def test_a_fresh_palace_shows_no_origins(tmp_path: Path) -> None:
    Store.open(tmp_path / "p").close()
    assert json.loads(run(tmp_path / "p", "info", "--json").stdout)["signing"] == {}
    assert json.loads(run(tmp_path / "p", "status", "--json").stdout)["signing"] == {}
