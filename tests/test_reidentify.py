"""`logsync reidentify` (issue 11, item 6): a cloned palace gets a new replica id and key.

Refused without --yes (one sentence, nothing touched); with it the palace's id is the one
its new key certifies, the ops held so far stay under the old origin byte for byte (chain
and signatures too, so `logsync verify` passes), the next append is seq 1 of the new
origin, and a third replica that meets both clones finds no fork. A crash at any step
(raised in-process, or SIGKILL) leaves the old identity or the new, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from logsync.cli import cli
from logsync.keyfile import read_signing_key
from logsync.keys import certifies, public_key_of, verify_digest
from logsync.replica import PENDING_KEY_FILENAME, mint_replica_id, read_replica_id
from logsync.store import Store
from tests.test_divergence import ChainPeer, append, origin_ops
from tests.test_divergence import pull as pull_chained

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("pending_key", "replica_json", "key")


class Crash(BaseException):
    """A crash played in-process: nothing after it runs (no except Exception catches it)."""


def crash_at(step: str):  # type: ignore[no-untyped-def]
    def after(name: str) -> None:
        if name == step:
            raise Crash(step)
    return after


def run(palace: Path, *args: str) -> Result:
    result = CliRunner().invoke(cli, ["--palace", str(palace), *args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


def files(palace: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(palace.iterdir())
            if p.is_file() and not p.name.endswith(("-wal", "-shm"))}


def identity(palace: Path) -> tuple[str, bytes]:
    """(replica id, public key) as a fresh open sees them; they must belong together."""
    with Store.open(palace) as store:
        key = read_signing_key(palace)
        assert key is not None and store.public_keys()[store.replica_id] == public_key_of(key)
        return store.replica_id, public_key_of(key)


@pytest.fixture
def palace(tmp_path: Path) -> Path:
    path = tmp_path / "p"
    with Store.open(path) as store:
        append(store, 3, "before")
    return path


def test_without_yes_it_refuses_in_one_sentence_and_touches_nothing(palace: Path) -> None:
    before = files(palace)
    result = run(palace, "reidentify")
    assert result.exit_code == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "new replica id and signing key" in result.stderr and "--yes" in result.stderr
    assert files(palace) == before
    as_json = run(palace, "reidentify", "--json")
    assert as_json.exit_code == 1 and "--yes" in json.loads(as_json.stdout)["error"]


def test_a_missing_palace_is_one_sentence(tmp_path: Path) -> None:
    result = run(tmp_path / "none", "reidentify", "--yes")
    assert result.exit_code == 1 and result.stderr.startswith("Error: no palace at ")
    assert not (tmp_path / "none").exists()


def test_a_new_id_and_key_the_old_ops_untouched_and_new_ones_under_the_new_id(
        palace: Path) -> None:
    with Store.open(palace) as store:
        old_id, old_ops = store.replica_id, origin_ops(store)
        old_chain = [store.chain_digest(old_id, s) for s in (1, 2, 3)]
        old_sig = store.chain_signature(old_id, 3)
    result = run(palace, "reidentify", "--yes", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    new_id = out["replica_id"]
    assert out["previous_replica_id"] == old_id and new_id != old_id
    assert read_replica_id(palace) == new_id
    key = read_signing_key(palace)
    assert key is not None and certifies(new_id, public_key_of(key))
    assert stat.S_IMODE(os.stat(palace / "logsync-signing-key").st_mode) == 0o600
    assert not (palace / PENDING_KEY_FILENAME).exists()
    with Store.open(palace) as store:
        assert store.list_ops(old_id, 0, 100) == old_ops
        assert [store.chain_digest(old_id, s) for s in (1, 2, 3)] == old_chain
        assert store.chain_signature(old_id, 3) == old_sig
        event = store.append_event("task.ask", "s", "r", "alice", body="after")
        assert (event["origin_replica"], event["origin_seq"]) == (new_id, 1)
        assert event["hlc"] > old_ops[-1]["hlc"]
        digest = store.chain_digest(new_id, 1)
        assert verify_digest(public_key_of(key), digest, store.chain_signature(new_id, 1))
        sources = dict(store._read("SELECT origin, source FROM logsync_keys"))
        assert sources == {old_id: "certified", new_id: "self"}
        assert store.version_vector() == {old_id: 3, new_id: 1}
    verified = run(palace, "verify")
    assert verified.exit_code == 0, verified.output


def test_a_reidentified_clone_is_a_new_origin_to_its_peers(palace: Path, tmp_path: Path
                                                           ) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(palace, clone)
    assert run(clone, "reidentify", "--yes").exit_code == 0
    with Store.open(palace) as a, Store.open(clone) as b, Store.open(tmp_path / "t") as third:
        assert a.replica_id != b.replica_id
        append(a, 2, "original")
        append(b, 2, "clone")
        pull_chained(third, ChainPeer(a))
        pull_chained(third, ChainPeer(b))
        pull_chained(a, ChainPeer(b))
        for store in (third, a):
            assert [c["kind"] for c in store.list_conflicts()] == []
            assert store.version_vector() == {a.replica_id: 5, b.replica_id: 2}
        assert [op["body"] for op in third.list_ops(b.replica_id, 0, 10)] == [
            "clone 0", "clone 1"]


def test_text_output_names_both_ids(palace: Path) -> None:
    old = read_replica_id(palace)
    result = run(palace, "reidentify", "--yes")
    assert result.exit_code == 0
    assert f"replica id {old} -> {read_replica_id(palace)}" in result.stdout


def test_an_old_random_id_keeps_its_key_as_pinned(tmp_path: Path) -> None:
    palace = tmp_path / "old"
    palace.mkdir()
    (palace / "replica.json").write_text(json.dumps({"replica_id": mint_replica_id()}))
    with Store.open(palace) as store:
        append(store, 1, "old")
        old_id = store.replica_id
    assert run(palace, "reidentify", "--yes").exit_code == 0
    with Store.open(palace) as store:
        assert dict(store._read("SELECT origin, source FROM logsync_keys"))[old_id] == "pinned"
    assert run(palace, "verify").exit_code == 0


# ── crashes ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_leaves_the_old_identity_or_the_new(palace: Path,
                                                               step: str) -> None:
    before = identity(palace)
    store = Store.open(palace)
    held = origin_ops(store)
    with pytest.raises(Crash):
        store.reidentify(after=crash_at(step))
    store.close()
    after = identity(palace)  # a writable open: finishes a committed change
    if step == "pending_key":
        assert after == before
    else:
        assert after[0] != before[0] and certifies(after[0], after[1])
    assert not (palace / PENDING_KEY_FILENAME).exists() or step == "pending_key"
    with Store.open(palace) as reopened:
        assert reopened.append_event("task.ask", "s", "r", "a")["origin_replica"] == after[0]
        assert reopened.list_ops(before[0], 0, 3) == held
    assert run(palace, "verify").exit_code == 0


def test_a_read_only_open_finishes_a_committed_change(palace: Path) -> None:
    store = Store.open(palace)
    with pytest.raises(Crash):
        store.reidentify(after=crash_at("replica_json"))
    store.close()
    new_id = read_replica_id(palace, finish=False)
    assert (palace / PENDING_KEY_FILENAME).exists()
    with Store.open(palace, read_only=True) as reader:
        assert reader.replica_id == new_id
    key = read_signing_key(palace)
    assert key is not None and certifies(new_id, public_key_of(key))
    assert not (palace / PENDING_KEY_FILENAME).exists()


def test_a_stale_pending_key_is_left_alone_and_a_later_reidentify_works(palace: Path) -> None:
    store = Store.open(palace)
    with pytest.raises(Crash):
        store.reidentify(after=crash_at("pending_key"))
    store.close()
    old = identity(palace)
    assert (palace / PENDING_KEY_FILENAME).exists()      # never committed: ignored
    assert run(palace, "reidentify", "--yes").exit_code == 0
    new = identity(palace)
    assert new[0] != old[0] and certifies(new[0], new[1])


@pytest.mark.parametrize("step", STEPS)
def test_sigkill_at_any_step_leaves_the_old_identity_or_the_new(palace: Path,
                                                               step: str) -> None:
    before = identity(palace)
    script = textwrap.dedent(f"""
        import os, signal
        from logsync.store import Store
        def after(name):
            if name == {step!r}:
                os.kill(os.getpid(), signal.SIGKILL)
        Store.open({str(palace)!r}).reidentify(after=after)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60,
                          capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    after = identity(palace)
    assert after == before if step == "pending_key" else (
        after[0] != before[0] and certifies(after[0], after[1]))
    assert run(palace, "verify").exit_code == 0
