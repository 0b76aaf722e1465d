"""Per-origin signing keys (issue 10, item 3 groundwork): the palace's key file, the
self-certifying replica id, signatures over chain digests on every local append, the
keyring's pin-on-first-sight, and the key never leaving the palace."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from logsync import responder
from logsync.errors import KeyFileError, ReplicaIdentityError, ValidationError
from logsync.keyfile import load_or_mint_signing_key, read_signing_key
from logsync.keys import (
    KEY_FILENAME,
    SIGNATURE_DOMAIN,
    certifies,
    public_key_of,
    self_certifying_id,
    sign_digest,
    verify_digest,
)
from logsync.replica import REPLICA_FILENAME, get_replica_id, read_replica_id
from logsync.store import DB_FILENAME, Store
from logsync.store.faults import StoreNeedsWrite
from logsync.store.keyring import all_keys, known_key, pin_key
from tests.conftest import CountingIds, FakeClock, RemoteKit

ROOT = Path(__file__).resolve().parent.parent
OLD_ID = "rep_0123456789ab"
NOW = "2026-07-02T03:24:43Z"


def seed_of(palace: Path) -> bytes:
    return bytes.fromhex((palace / KEY_FILENAME).read_text(encoding="ascii").strip())


def own_entries(store: Store) -> list[tuple[int, bytes, bytes | None]]:
    """`(seq, digest, signature)` of every chain entry of our own origin."""
    conn = sqlite3.connect(store.db_path)
    try:
        rows = conn.execute(
            "SELECT origin_seq, digest, signature FROM logsync_chain WHERE origin = ? "
            "ORDER BY origin_seq", (store.replica_id,)
        ).fetchall()
    finally:
        conn.close()
    return [(int(s), bytes(d), None if g is None else bytes(g)) for s, d, g in rows]


def raw(palace: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(palace / DB_FILENAME)
    with conn:
        for sql, params in statements:
            conn.execute(sql, params)
    conn.close()


# ── the key file ──────────────────────────────────────────────────────


def test_the_key_file_is_0600_hex_and_never_rewritten(tmp_path: Path) -> None:
    old = os.umask(0)  # the mode must not depend on the umask
    try:
        key = load_or_mint_signing_key(tmp_path)
    finally:
        os.umask(old)
    path = tmp_path / KEY_FILENAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text(encoding="ascii")
    assert text == bytes(key).hex() + "\n" and len(text) == 65
    before = path.stat().st_ino
    again = load_or_mint_signing_key(tmp_path)
    assert bytes(again) == bytes(key) and path.stat().st_ino == before
    assert read_signing_key(tmp_path) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY_FILENAME]  # no temp file left


def test_racing_first_mints_agree_on_one_key(tmp_path: Path) -> None:
    for trial in range(10):
        palace = tmp_path / f"t{trial}"
        palace.mkdir()
        barrier = threading.Barrier(6)
        keys: list[bytes] = []

        def mint(palace: Path = palace, barrier: threading.Barrier = barrier,
                 keys: list[bytes] = keys) -> None:
            barrier.wait()
            keys.append(bytes(load_or_mint_signing_key(palace)))

        threads = [threading.Thread(target=mint) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert len(keys) == 6 and set(keys) == {seed_of(palace)}


def test_no_key_file_reads_as_none(tmp_path: Path) -> None:
    assert read_signing_key(tmp_path) is None


@pytest.mark.parametrize("text", ["", "\n", "zz" * 32, "AB" * 32, "ab" * 31, "ab" * 33,
                                  "ab" * 32 + " extra", "\x00" * 64])
def test_a_corrupt_key_file_is_one_sentence_and_never_replaced(tmp_path: Path,
                                                               text: str) -> None:
    path = tmp_path / KEY_FILENAME
    path.write_text(text)
    path.chmod(0o600)
    for read in (read_signing_key, load_or_mint_signing_key):
        with pytest.raises(KeyFileError, match="is corrupt") as info:
            read(tmp_path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert path.read_text() == text
    with pytest.raises(ReplicaIdentityError):  # KeyFileError is one
        Store.open(tmp_path)
    assert path.read_text() == text


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_a_key_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    load_or_mint_signing_key(tmp_path)
    (tmp_path / KEY_FILENAME).chmod(mode)
    with pytest.raises(KeyFileError, match="group/others") as info:
        read_signing_key(tmp_path)
    assert "chmod 600" in str(info.value)
    with pytest.raises(KeyFileError):
        Store.open(tmp_path)


def test_a_directory_where_the_key_belongs_is_refused(tmp_path: Path) -> None:
    (tmp_path / KEY_FILENAME).mkdir(mode=0o700)
    with pytest.raises(KeyFileError, match="not a regular file"):
        read_signing_key(tmp_path)


# ── identity ──────────────────────────────────────────────────────────


def test_a_new_palace_id_certifies_its_key(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store:
        assert store.signing_key is not None and store.public_key is not None
        assert store.public_key == public_key_of(store.signing_key)
        assert certifies(store.replica_id, store.public_key)
        assert store.replica_id == self_certifying_id(store.public_key)
        assert store.public_keys() == {store.replica_id: store.public_key}
        assert bytes(store.signing_key) == seed_of(tmp_path / "p")
    assert get_replica_id(tmp_path / "p") == read_replica_id(tmp_path / "p")


def test_the_self_certifying_id_rule() -> None:
    key = bytes(range(32))
    rid = self_certifying_id(key)
    assert rid == "rep_" + hashlib.sha256(b"logsync-replica-v1\x00" + key).hexdigest()[:32]
    assert certifies(rid, key)
    assert not certifies(rid, bytes(32))
    assert not certifies(rid[:-1] + "0" if rid[-1] != "0" else rid[:-1] + "1", key)
    for bad in (None, 5, "x", key[:31], key + b"\x00"):
        assert not certifies(rid, bad)
    assert not certifies(None, key)


def test_an_existing_palace_keeps_its_id_and_gets_a_key(tmp_path: Path) -> None:
    (tmp_path / REPLICA_FILENAME).write_text(json.dumps({"replica_id": OLD_ID}))
    assert not (tmp_path / KEY_FILENAME).exists()
    with Store.open(tmp_path) as store:
        assert store.replica_id == OLD_ID
        assert store.public_key is not None and not certifies(OLD_ID, store.public_key)
        key = store.public_key
        assert store.public_keys() == {OLD_ID: key}
    assert json.loads((tmp_path / REPLICA_FILENAME).read_text()) == {"replica_id": OLD_ID}
    assert stat.S_IMODE((tmp_path / KEY_FILENAME).stat().st_mode) == 0o600
    with Store.open(tmp_path) as store:
        assert store.replica_id == OLD_ID and store.public_key == key
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    assert conn.execute("SELECT source FROM logsync_keys").fetchall() == [("self",)]
    conn.close()


def test_a_replaced_key_file_is_refused_not_a_silent_rotation(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.append_event("note", "main", "lobby", "alice")
    original = (tmp_path / KEY_FILENAME).read_bytes()
    (tmp_path / KEY_FILENAME).unlink()
    with pytest.raises(KeyFileError, match="is missing, but the store records a key"):
        Store.open(tmp_path)
    assert not (tmp_path / KEY_FILENAME).exists()  # a lost key is not replaced by a new one
    (tmp_path / KEY_FILENAME).write_text(bytes(32).hex() + "\n")  # another key
    (tmp_path / KEY_FILENAME).chmod(0o600)
    with pytest.raises(KeyFileError, match="replaced or lost"):
        Store.open(tmp_path)
    (tmp_path / KEY_FILENAME).unlink()
    (tmp_path / KEY_FILENAME).write_bytes(original)
    (tmp_path / KEY_FILENAME).chmod(0o600)
    Store.open(tmp_path).close()


def test_a_keyless_open_checks_the_identity_as_a_read_does(tmp_path: Path) -> None:
    """`reidentify`'s open goes on without a damaged key, never past an edited
    replica.json (it would have replaced the identity of the id written there)."""
    import json

    with Store.open(tmp_path / "peer") as peer:
        peer_id = peer.replica_id
    with Store.open(tmp_path / "p") as store:
        own = store.replica_id
    (tmp_path / "p" / "replica.json").write_text(json.dumps({"replica_id": peer_id}))
    (tmp_path / "p" / KEY_FILENAME).write_text("not a seed\n")
    with pytest.raises(ReplicaIdentityError, match=f"records {own} as this palace.s own origin"):
        Store.open(tmp_path / "p", keyless=True)


def test_a_read_only_open_reads_the_key_and_writes_nothing(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        key = store.public_key
    with Store.open(tmp_path, read_only=True) as store:
        assert store.public_key == key and store.signing_key is not None
    (tmp_path / KEY_FILENAME).unlink()  # another user's key would look like this to reads
    with Store.open(tmp_path, read_only=True) as store:
        assert store.signing_key is None
        assert store.public_key == key  # what the keyring recorded
    assert not (tmp_path / KEY_FILENAME).exists()
    (tmp_path / KEY_FILENAME).write_text("not a seed\n")
    (tmp_path / KEY_FILENAME).chmod(0o600)
    with Store.open(tmp_path, read_only=True) as store:  # reads need no key: said, not refused
        assert store.signing_key is None and store.public_key == key
        assert store.key_problem is not None and "is corrupt" in store.key_problem
    with pytest.raises(KeyFileError, match="is corrupt.*logsync reidentify --yes"):
        Store.open(tmp_path)  # a write would sign on with no key of ours


# ── signatures ────────────────────────────────────────────────────────


def test_sign_verify_round_trip_and_every_flipped_bit_fails() -> None:
    key = SigningKey(bytes(range(32)))
    public = public_key_of(key)
    digest = bytes(range(100, 132))
    signature = sign_digest(key, digest)
    assert len(signature) == 64
    assert verify_digest(public, digest, signature)
    assert verify_digest(bytearray(public), memoryview(digest), bytearray(signature))
    assert key.verify_key.verify(SIGNATURE_DOMAIN + digest, signature)  # the domain is signed
    for i in range(len(digest) * 8):
        flipped = bytearray(digest)
        flipped[i // 8] ^= 1 << (i % 8)
        assert not verify_digest(public, bytes(flipped), signature)
    for i in range(len(signature) * 8):
        flipped = bytearray(signature)
        flipped[i // 8] ^= 1 << (i % 8)
        assert not verify_digest(public, digest, bytes(flipped))
    other = public_key_of(SigningKey(bytes(32)))
    assert not verify_digest(other, digest, signature)
    # Without the domain, a signature over the bare digest is not one of ours.
    assert not verify_digest(public, digest, key.sign(digest).signature)


@pytest.mark.parametrize("which", ["key", "digest", "signature"])
@pytest.mark.parametrize("bad", [b"", b"\x00", "text", None, 0, 32, 64, [], "a" * 64])
def test_malformed_inputs_verify_false_and_never_raise(which: str, bad: object) -> None:
    key = SigningKey(bytes(range(32)))
    args: dict[str, object] = {"key": public_key_of(key), "digest": bytes(32)}
    args["signature"] = sign_digest(key, bytes(32))
    args[which] = bad
    assert verify_digest(args["key"], args["digest"], args["signature"]) is False


@pytest.mark.parametrize("which", ["key", "digest", "signature"])
@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_lengths_verify_false(which: str, delta: int) -> None:
    key = SigningKey(bytes(range(32)))
    args = {"key": public_key_of(key), "digest": bytes(32), "signature": b""}
    args["signature"] = sign_digest(key, bytes(32))
    value = args[which]
    args[which] = value[:-1] if delta < 0 else value + b"\x00"
    assert not verify_digest(args["key"], args["digest"], args["signature"])


def test_small_order_keys_are_rejected() -> None:
    """libsodium's strict verify: the identity point (small order) with a signature that
    a lax verifier accepts for any message (R = identity, S = 0)."""
    identity = b"\x01" + bytes(31)
    assert not verify_digest(identity, bytes(32), identity + bytes(32))
    assert not verify_digest(bytes(32), bytes(32), bytes(64))


def test_sign_digest_refuses_a_digest_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        sign_digest(SigningKey(bytes(32)), bytes(31))


# ── local appends are signed ──────────────────────────────────────────

event_fields = st.fixed_dictionaries({
    "body": st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=40),
    "topic": st.one_of(st.none(), st.sampled_from(["a", "b"])),
    "metadata": st.one_of(st.none(), st.dictionaries(st.sampled_from(["k", "n"]),
                                                     st.integers(-5, 5), max_size=2)),
    "with_artifact": st.booleans(),
})


@settings(max_examples=20, deadline=None)
@given(st.lists(event_fields, min_size=1, max_size=6))
def test_every_local_append_is_signed_over_its_stored_digest(specs: list[dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp, Store.open(
        Path(tmp), wall_ms=FakeClock(), new_id=CountingIds()
    ) as store:
        assert store.public_key is not None
        for spec in specs:
            spec = dict(spec)
            arts = []
            if spec.pop("with_artifact"):
                arts = [store.put_artifact("note", spec["body"] or "x", "alice")["id"]]
            store.append_event("note", "main", "lobby", "alice", artifact_ids=arts, **spec)
        entries = own_entries(store)
        assert [s for s, _, _ in entries] == list(range(1, len(specs) + 1))
        for seq, digest, signature in entries:
            assert signature is not None
            assert store.chain_digest(store.replica_id, seq) == digest
            assert store.chain_signature(store.replica_id, seq) == signature
            assert verify_digest(store.public_key, digest, signature)


def test_remote_ops_are_stored_unsigned_unless_given(store: Store, remote: RemoteKit) -> None:
    origin = remote.origin(7)
    store.apply_remote(remote.chain(origin, 3))
    assert [store.chain_signature(origin, s) for s in (1, 2, 3)] == [None, None, None]
    assert store.chain_digest(origin, 3) is not None
    assert store.chain_signature(origin, 99) is None


def test_an_append_onto_a_chain_needing_repair_is_still_signed(store: Store) -> None:
    for _ in range(3):
        store.append_event("note", "main", "lobby", "alice")
    raw(store.palace, ("DELETE FROM logsync_chain WHERE origin = ? AND origin_seq = 3",
                       (store.replica_id,)))
    store.append_event("note", "main", "lobby", "alice")  # its predecessor is missing
    entries = own_entries(store)
    assert [s for s, _, _ in entries] == [1, 2, 3, 4]
    assert entries[2][2] is None  # the entry the repair recomputed had lost its signature
    for seq, digest, signature in (entries[0], entries[1], entries[3]):
        assert signature is not None and verify_digest(store.public_key, digest, signature), seq


def test_a_repair_keeps_signatures_only_where_the_digest_is_unchanged(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        for _ in range(4):
            store.append_event("note", "main", "lobby", "alice", body="b")
        rid, key = store.replica_id, store.public_key
        before = own_entries(store)
    # An entry lost in the middle: recomputed from there, same digests, signatures kept.
    raw(tmp_path, ("DELETE FROM logsync_chain WHERE origin = ? AND origin_seq = 2", (rid,)))
    with Store.open(tmp_path) as store:
        after = own_entries(store)
    assert [e[:2] for e in after] == [e[:2] for e in before]
    assert [e[2] is not None for e in after] == [True, False, True, True]
    # An op changed under its entry by another program: later digests change, their
    # signatures go; the ones below stay and still verify.
    raw(tmp_path,
        ("UPDATE events SET body = 'changed' WHERE origin_replica = ? AND origin_seq = 3",
         (rid,)),
        ("DELETE FROM logsync_chain WHERE origin = ? AND origin_seq = 3", (rid,)))
    with Store.open(tmp_path) as store:
        final = own_entries(store)
    assert [e[1] == b[1] for e, b in zip(final, before, strict=True)] == [True, True, False,
                                                                            False]
    # the tip (4) lost its signature with its digest, and the open signs it again
    # (`sign_own_chain`: a page must be able to end at the tip)
    assert [e[2] is not None for e in final] == [True, False, False, True]
    assert verify_digest(key, final[0][1], final[0][2])
    assert verify_digest(key, final[3][1], final[3][2])


# ── the keyring ───────────────────────────────────────────────────────


def test_pin_on_first_sight_and_a_changed_key_is_never_written(store: Store) -> None:
    conn = store._writer
    peer = SigningKey(bytes(range(1, 33)))
    certified = self_certifying_id(public_key_of(peer))
    other = public_key_of(SigningKey(bytes(range(2, 34))))
    assert pin_key(conn, certified, public_key_of(peer), NOW) == "new"
    assert pin_key(conn, OLD_ID, other, NOW) == "new"
    assert pin_key(conn, certified, public_key_of(peer), NOW) == "same"
    assert pin_key(conn, certified, other, NOW) == "changed"
    assert known_key(conn, certified) == public_key_of(peer)
    assert pin_key(conn, store.replica_id, other, NOW) == "changed"
    assert known_key(conn, store.replica_id) == store.public_key
    assert known_key(conn, "rep_" + "f" * 32) is None
    sources = dict(conn.execute("SELECT origin, source FROM logsync_keys").fetchall())
    assert sources == {store.replica_id: "self", certified: "certified", OLD_ID: "pinned"}
    assert all_keys(conn) == store.public_keys() == {
        store.replica_id: store.public_key, certified: public_key_of(peer), OLD_ID: other}
    for bad in (b"", bytes(31), bytes(33), "ab" * 16, None):
        with pytest.raises(ValidationError, match="32 raw bytes"):
            pin_key(conn, OLD_ID, bad, NOW)  # type: ignore[arg-type]


# ── stores from before ────────────────────────────────────────────────


def test_a_store_from_before_signatures_opens_and_signs_new_appends(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.append_event("note", "main", "lobby", "alice")
        rid = store.replica_id
    raw(tmp_path, ("ALTER TABLE logsync_chain DROP COLUMN signature", ()),
        ("DROP TABLE logsync_keys", ()))
    with pytest.raises(StoreNeedsWrite, match="schema migration"):
        Store.open(tmp_path, read_only=True)
    with Store.open(tmp_path) as store:
        assert store.replica_id == rid
        # written before the key: the open signs it, as the tip (`sign_own_chain`)
        assert verify_digest(store.public_key, store.chain_digest(rid, 1),
                             store.chain_signature(rid, 1))
        store.append_event("note", "main", "lobby", "alice")
        digest = store.chain_digest(rid, 2)
        assert verify_digest(store.public_key, digest, store.chain_signature(rid, 2))
        assert store.public_keys() == {rid: store.public_key}
        assert store.audit().ok  # the chain `logsync verify` recomputes is intact
    with Store.open(tmp_path, read_only=True) as store:
        assert store.chain_signature(rid, 2) is not None


def test_a_chain_table_built_by_hand_in_the_old_shape_is_migrated(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        store.append_event("note", "main", "lobby", "alice")
        rid = store.replica_id
    raw(tmp_path,
        ("DROP TABLE logsync_chain", ()),
        ("CREATE TABLE logsync_chain (origin TEXT NOT NULL, origin_seq INTEGER NOT NULL, "
         "digest BLOB NOT NULL, PRIMARY KEY (origin, origin_seq)) WITHOUT ROWID", ()))
    with Store.open(tmp_path) as store:
        assert store.chain_digest(rid, 1) is not None  # backfilled
        assert store.chain_signature(rid, 1) is not None  # and the own tip signed again


# ── never served ──────────────────────────────────────────────────────


def test_the_responder_and_server_never_touch_the_key() -> None:
    server = sorted((ROOT / "logsync" / "server").glob("*.py"))
    sources = [ROOT / "logsync" / "responder.py", *server]
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for needle in ("signing_key", "KEY_FILENAME", "logsync-signing-key", "keyfile"):
            assert needle not in text, f"{path.name} mentions {needle}"


def test_keys_is_pure_so_deciding_modules_can_verify() -> None:
    """The key file lives in keyfile.py: keys.py (signatures, ids) reaches no I/O."""
    from tests.test_layout import IO_STDLIB, imports_of, modules

    known = modules()
    ours, others = imports_of("logsync.keys", known["logsync.keys"], known)
    assert not others & IO_STDLIB and ours == set()


def test_the_seed_never_appears_in_any_sync_answer(store: Store) -> None:
    art = store.put_artifact("patch", "diff --git a b\n", "alice")
    store.append_event("note", "main", "lobby", "alice", artifact_ids=[art["id"]])
    store.append_event("note", "main", "lobby", "bob", body="hi")
    seed = bytes(store.signing_key)
    assert seed == seed_of(store.palace)
    params = {"origin": store.replica_id, "after": "0", "limit": "10", "id": art["id"],
              "at": "1,2", "ext": ",".join(responder.EXTENSIONS)}
    answered = 0
    for profile in (responder.LOGSYNC_SERVER, responder.UPSTREAM_HUB):
        for path in responder.SYNC_ROUTES:
            status, body = responder.answer(store, path, params, profile=profile)
            text = json.dumps(body, default=repr)
            for needle in (seed.hex(), seed.hex().upper(), repr(seed)[2:-1]):
                assert needle not in text, (path, profile)
            assert seed not in text.encode("utf-8", "surrogatepass")
            answered += status == 200
    assert answered >= 4


def test_verification_is_remembered_only_for_the_exact_bytes() -> None:
    """The same (key, digest, signature) is checked once; any other byte is checked
    afresh, and the memory is bounded."""
    from nacl.signing import SigningKey

    from logsync import keys

    signer = SigningKey.generate()
    public = bytes(signer.verify_key)
    digest = bytes(range(32))
    good = keys.sign_digest(signer, digest)
    keys._verified.cache_clear()
    assert keys.verify_digest(public, digest, good)
    assert keys.verify_digest(public, digest, good)
    assert keys._verified.cache_info().hits == 1
    bad = bytes([good[0] ^ 1]) + good[1:]
    assert not keys.verify_digest(public, digest, bad)
    assert not keys.verify_digest(public, bytes(31) + b"\x01", good)
    assert keys._verified.cache_info().maxsize == keys.VERIFIED_KEPT


def test_a_relayed_key_that_would_be_ignored_opens_no_write_transaction(tmp_path):
    """pin_keys decides 'same' and 'ignored' from a read: a relay's page, which publishes
    an origin key the relay cannot vouch for, costs no write transaction."""
    from logsync.store import Store

    store = Store.open(tmp_path / "palace")
    other = SigningKey.generate().verify_key.encode()
    begun: list[str] = []
    store._writer.set_trace_callback(lambda sql: begun.append(sql) if sql.startswith("BEGIN")
                                     else None)
    origin, relay = "rep_" + "a" * 32, "rep_" + "b" * 32
    assert store.pin_keys({origin: other}, relay) == {origin: "ignored"}
    assert begun == []
    assert store.pin_keys({origin: other}, origin) == {origin: "new"}
    assert len(begun) == 1
    assert store.pin_keys({origin: other}, relay) == {origin: "same"}
    assert len(begun) == 1
    store.close()
