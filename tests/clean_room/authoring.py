"""The clean-room peer's store: ops authored from a seed, from RFC 004 alone.

Identities (§3), valid ops in stored form (§4.1, §4.2), artifacts (§4.3), canonical bytes
and the chain (§4.4), HLC stamps (§5), gap-free and gappy counters (§6.2), and the answers
of §7.1, §7.2 (with the §8 extensions and the §8.1 byte budget) and §7.4. No `logsync`.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import time

try:  # §12.2: signatures are offered only when the package is there
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
except ImportError:  # pragma: no cover
    Ed25519PrivateKey = None

UPSTREAM_PAGE = 500
MAX_PAGE = 5000
EVENT_KEYS = ("id", "seq", "origin_replica", "origin_seq", "hlc", "type", "stream", "room",
              "topic", "from_agent", "to_agent", "correlation_id", "branch", "base_commit",
              "status", "artifact_ids", "body", "created_at", "metadata")
NULLABLE = ("topic", "to_agent", "correlation_id", "branch", "base_commit", "status")
CANONICAL_TEXT = ("base_commit", "body", "branch", "correlation_id", "created_at",
                  "from_agent", "hlc", "id", "origin_replica", "room", "status", "stream",
                  "to_agent", "topic", "type")


# ---------------------------------------------------------------- §4.4 canonical bytes

def canonical(op: dict, artifact_sha: dict) -> bytes:
    """The 18-key canonical object of an op in stored form (§4.4)."""
    obj = {k: op[k] for k in CANONICAL_TEXT}
    obj.update({k: op[k] or None for k in NULLABLE})
    obj["body"] = op["body"] or ""
    obj["origin_seq"] = op["origin_seq"]
    meta = json.loads(op["metadata_text"]) if op["metadata_text"] else {}
    obj["metadata"] = meta if isinstance(meta, dict) else {}
    obj["artifacts"] = [[a, artifact_sha.get(a)] for a in sorted(set(op["artifact_ids"]))]
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def chain_root(origin: str) -> bytes:
    return hashlib.sha256(b"logsync-chain-v1\x00" + origin.encode("utf-8")).digest()


def replica_id_of_key(public: bytes) -> str:
    """§3.1: a new palace's id certifies its key."""
    return "rep_" + hashlib.sha256(b"logsync-replica-v1\x00" + public).hexdigest()[:32]


# ---------------------------------------------------------------- §5 HLC

class Hlc:
    """§5 tick() over an injected wall clock (the author's simulated time)."""

    def __init__(self, replica: str):
        self.replica, self.ms, self.counter = replica, 0, 0

    def tick(self, wall_ms: int) -> str:
        if wall_ms > self.ms:
            self.ms, self.counter = wall_ms, 0
        elif self.counter < 0xFFFFFF:
            self.counter += 1
        else:
            self.ms, self.counter = self.ms + 1, 0
        return f"{self.ms:013d}-{self.counter:06x}-{self.replica}"


# ---------------------------------------------------------------- the authored store

class Origin:
    def __init__(self, replica: str, key=None):
        self.id, self.key, self.hlc = replica, key, Hlc(replica)
        self.public = (key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
                       if key else None)
        self.seqs: list[int] = []
        self.ops: list[dict] = []       # wire dicts, upstream key order
        self.wire: list[str] = []       # each op as served JSON (for the byte budget)
        self.digests: list[bytes] = []
        self.sigs: list[str | None] = []

    def digest_at(self, s: int) -> str | None:
        """D(s) (§4.4): the highest held op at or below s; undefined above the tip."""
        if s > (self.seqs[-1] if self.seqs else 0):
            return None
        i = bisect.bisect_right(self.seqs, s)
        return (self.digests[i - 1] if i else chain_root(self.id)).hex()


class Store:
    """Authors `n_ops` valid ops over three origins from `seed` (§4.1, §4.2, §5, §6.2)."""

    def __init__(self, n_ops: int, seed: int, signed: bool = True, bigint: bool = True):
        self.bigint = bigint
        rng = random.Random(seed)
        keys = [Ed25519PrivateKey.from_private_bytes(
                    hashlib.sha256(f"clean-room-{seed}-{i}".encode()).digest())
                if signed and Ed25519PrivateKey else None for i in range(2)]
        ids = [replica_id_of_key(k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
               if k else "rep_" + hashlib.sha256(f"o{seed}{i}".encode()).hexdigest()[:32]
               for i, k in enumerate(keys)]
        # the third origin is an older upstream one: 12-hex id, unsigned, gaps in its seqs
        ids.append("rep_" + hashlib.sha256(f"old{seed}".encode()).hexdigest()[:12])
        self.origins = {i: Origin(i, k) for i, k in zip(ids, keys + [None], strict=True)}
        self.replica_id = ids[0]
        self.artifacts: dict[str, dict] = {}
        self.timeline: list[dict] = []  # every op in local seq order (§5, the stream)
        self.by_id: dict[str, int] = {}
        self.artifact_sha: dict[str, str] = {}
        self.plant: str | None = None
        wall = 1796000000000 + rng.randrange(10**6)
        for n in range(1, n_ops + 1):
            wall += rng.choice((0, 0, 1, 3, 1000))
            origin = self.origins[ids[rng.choice((0, 0, 1, 2))]]
            self._author(rng, n, origin, wall)

    def _artifact(self, rng, origin: Origin, when: str, tag: str) -> str:
        kind = rng.choice(("patch", "file", "log", "json", "note"))
        content = (f"--- a/{tag}\n+++ b/{tag}\n@@ -1 +1 @@\n-1\n+2 ü\n" if kind == "patch"
                   else f"{kind} {tag} «données»\n" * rng.randrange(1, 400))
        data = content.encode("utf-8")
        art_id = f"art_{when[:4]}{when[5:7]}{when[8:10]}T{when[11:13]}{when[14:16]}{when[17:19]}_" \
                 + hashlib.sha256(tag.encode()).hexdigest()[:12]
        sha = hashlib.sha256(data).hexdigest()
        self.artifacts[art_id] = {
            "id": art_id, "kind": kind, "sha256": sha, "size_bytes": len(data),
            "content": content, "created_by": "pi@laptop", "created_at": when,
            "origin_replica": rng.choice((origin.id, origin.id, None)), "metadata": {}}
        self.artifact_sha[art_id] = sha
        return art_id

    def _author(self, rng, n: int, origin: Origin, wall: int) -> None:
        hlc = origin.hlc.tick(wall)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall // 1000))
        step = rng.randrange(1, 4) if len(origin.id) == 16 else 1  # upstream gaps (§6.2)
        seq = (origin.seqs[-1] if origin.seqs else 0) + step
        arts = []
        if rng.random() < 0.15:
            arts.append(self._artifact(rng, origin, when, f"a{n}"))
        if self.artifacts and rng.random() < 0.1:
            arts.append(rng.choice(sorted(self.artifacts)))
        meta = rng.choice(({}, {"priority": n % 5}, {"ratio": 2.5e-05, "big": 1e16, "neg": -0.0,
                           "nested": {"z": [1, 2.0, None, True], "a": "ü\n"}},
                           {"ack_of": f"evt_x{n}", "é": "naïve"}))
        body = rng.choice(("", f"Please fix {n}.", "quote \" back\\slash \t tab \x01 ctl 🙂",
                           "line\n" * 40, "large body ü " * rng.randrange(1, 4000)))
        deep: dict = {}
        for _ in range(63):  # 64 levels counting the outer object (§4.1; how to count is a guess)
            deep = {"d": deep}
        edge = {  # boundary values of §4.1/§4.2, each once
            3: {"metadata": {"huge": 2**70 if self.bigint else 2**63 - 1, "tiny": 1e-05}},
            4: {"from_agent": "\U0001d11e" * 256},
            5: {"body": "\x7f\u2028 \\u0000-lookalike", "topic": " padded label "},
            6: {"metadata": deep},
            7: {"metadata": {"pad": "x" * (65536 - 11)}},
            8: {"body": "\u00e9" * 131072},
        }.get(n, {})
        meta = edge.get("metadata", meta)
        body = edge.get("body", body)
        op = {
            "id": f"evt_{when[:4]}{when[5:7]}{when[8:10]}T{when[11:13]}{when[14:16]}{when[17:19]}_"
                  + hashlib.sha256(f"{origin.id}{seq}".encode()).hexdigest()[:12],
            "seq": n, "origin_replica": origin.id, "origin_seq": seq, "hlc": hlc,
            "type": rng.choice(("task.request", "task.result", "note", "event.ack")),
            "stream": rng.choice(("build", "project/x", "café/ü")), "room": "ci",
            "topic": edge.get("topic") or rng.choice((None, "release 1.2")),
            "from_agent": edge.get("from_agent")
            or rng.choice(("pi@laptop", "codex@build-box", "名前@デバイス")),
            "to_agent": rng.choice((None, "pi@laptop", "*")),
            "correlation_id": rng.choice((None, f"fix-{n % 17}")),
            "branch": rng.choice((None, "main")), "base_commit": rng.choice((None, "abc123")),
            "status": rng.choice((None, "open", "claimed", "ready", "applied", "blocked",
                                  "failed", "superseded")),
            "artifact_ids": sorted(set(arts)), "body": body, "created_at": when,
            "metadata_text": json.dumps(meta, ensure_ascii=False, sort_keys=True,
                                        allow_nan=False)}
        prev = origin.digests[-1] if origin.digests else chain_root(origin.id)
        digest = hashlib.sha256(prev + canonical(op, self.artifact_sha)).digest()
        wire = {k: op[k] for k in EVENT_KEYS if k != "metadata"}
        wire["metadata"] = json.loads(op["metadata_text"])
        origin.seqs.append(seq)
        origin.ops.append(wire)
        self.by_id[wire["id"]] = len(self.timeline)
        self.timeline.append(wire)
        origin.wire.append(json.dumps(wire, ensure_ascii=False))
        origin.digests.append(digest)
        origin.sigs.append(origin.key.sign(b"logsync-op-sig-v1\x00" + digest).hex()
                           if origin.key else None)

    # ------------------------------------------------------------ answers (§7)

    def vector(self, max_page_bytes: int, extensions: list[str]) -> dict:
        held = {o.id: o for o in self.origins.values() if o.seqs}
        return {"replica_id": self.replica_id,
                "version_vector": {i: o.seqs[-1] for i, o in held.items()},
                "logsync": {
                    "version": "clean-room-0.1",
                    "extensions": extensions,
                    "max_page": MAX_PAGE, "max_page_bytes": max_page_bytes,
                    "tips": {i: [o.seqs[-1], self._planted("tips", o.digests[-1].hex())]
                             for i, o in held.items()},
                    "tip_sigs": {i: self._planted("sigs", o.sigs[-1])
                                 for i, o in held.items() if o.sigs[-1]},
                    "keys": {i: o.public for i, o in held.items() if o.public}}}

    def page(self, origin_id: str, after: int, limit: int, ext: set, budget: int) -> dict:
        """§7.2 with §8 items 4–6 and the §8.1 byte budget (measured as served JSON)."""
        origin = self.origins.get(origin_id)
        large = "large_pages" in ext
        limit = min(limit, MAX_PAGE if large else UPSTREAM_PAGE)
        answer = {"origin": origin_id, "events": [], "count": 0}
        if origin is None:
            start = end = 0
        else:
            start = bisect.bisect_right(origin.seqs, after)
            end = min(len(origin.seqs), start + limit)
        if large and end > start and self.plant != "budget":
            size = len(json.dumps(answer, ensure_ascii=False)) + 400  # chain + artifacts keys
            stop = start
            while stop < end:
                grow = len(origin.wire[stop].encode("utf-8")) + 2
                grow += 150 if origin.seqs[stop] % 64 == 0 else 0
                if stop > start and size + grow > budget:
                    break
                size, stop = size + grow, stop + 1
            end = stop
        ops = origin.ops[start:end] if origin else []
        answer["events"], answer["count"] = ops, len(ops)
        if "inline_artifacts" in ext:
            answer["artifacts"] = []
        if "chain" in ext:
            sigs = [[origin.seqs[i], self._planted("sigs", origin.sigs[i])]
                    for i in range(start, end)
                    if origin.sigs[i] and (origin.seqs[i] % 64 == 0 or i == end - 1)]
            prev = self._planted("prev", origin.digest_at(after)) if ops else None
            answer["chain"] = {"prev": prev, "sigs": sigs}
        if "inline_artifacts" in ext:
            names = sorted({a for op in ops for a in op["artifact_ids"]})
            size = len(json.dumps(answer, ensure_ascii=False).encode("utf-8"))
            for name in names:
                art = self.artifacts[name]
                grow = len(json.dumps(art, ensure_ascii=False).encode("utf-8")) + 2
                if size + grow <= budget:
                    answer["artifacts"].append(art)
                    size += grow
        return answer

    def _planted(self, what: str, hex_value: str) -> str:
        """A planted defect (tests of the tests): the first hex digit changed."""
        if self.plant != what:
            return hex_value
        return ("1" if hex_value[0] == "0" else "0") + hex_value[1:]

    def digests(self, origin_id: str, ats: list[int]) -> dict:
        origin = self.origins.get(origin_id) or Origin(origin_id)
        return {"origin": origin_id, "digests": [[s, origin.digest_at(s)] for s in ats]}
