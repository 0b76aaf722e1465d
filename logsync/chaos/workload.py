"""The workload: appends through the CLIs on random replicas while the nemesis works, and
the history of what each returned.

Each op is one CLI process against a replica's palace (the daemon or hub shares it), run
with that replica's environment -- its clock too, when it is skewed:

- on a logsync replica: ``logsync append`` or, one in eight, ``logsync patch submit``
  (an artifact and the event naming it, in one transaction);
- on the hub: ``mempalace logstream append`` or, one in four, ``mempalace artifact put``
  followed by an append naming it.

An op is *acknowledged* (``ok``) when the CLI exits 0 and prints the event with its id and
``(origin_replica, origin_seq)``; *failed* when it exits non-zero (a full disk, a lock held
by a paused daemon): it definitely did not happen, so the checker fails a run that stores
it; *indeterminate* (``info``, as Jepsen says) when it timed out and was killed, was
killed by a signal (a negative return code: the OOM killer, say), or exited 0 without a
usable answer: it may or may not have committed, so the checker neither requires nor
forbids it. Every event carries ``metadata.chaos_op``, a unique tag, so a duplicated op
shows.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

from logsync.chaos.checker import OP_TAG, Acked
from logsync.chaos.cluster import Cluster, Node
from logsync.chaos.interop import hub as H
from logsync.chaos.timeline import Timeline

CLI_TIMEOUT_S = 20.0
TYPES = ("task.request", "task.reply", "status.update", "note.chaos")
PATCH = ("diff --git a/chaos.txt b/chaos.txt\n--- a/chaos.txt\n+++ b/chaos.txt\n"
         "@@ -1 +1 @@\n-old\n+new {tag} — ü ✓\n")


@dataclass
class Op:
    tag: str
    node: str
    kind: str
    start: float
    end: float = 0.0
    outcome: str = ""  # ok | fail | info
    id: str = ""
    origin: str = ""
    origin_seq: int = 0
    artifact: str = ""
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Workload:
    def __init__(self, cluster: Cluster, timeline: Timeline, *, seed: int, rate: float = 4.0,
                 workers: int = 2, hub_share: float = 0.2) -> None:
        self.cluster = cluster
        self.timeline = timeline
        self.seed = seed
        self.rate = rate
        self.workers = workers
        self.hub_share = hub_share
        self.history: list[Op] = []
        self._lock = threading.Lock()
        self._count = 0

    def acknowledged(self) -> list[Acked]:
        with self._lock:
            return [Acked(id=o.id, origin=o.origin, origin_seq=o.origin_seq, node=o.node,
                          tag=o.tag, artifact=o.artifact)
                    for o in self.history if o.outcome == "ok"]

    def failed(self) -> list[str]:
        """The tags of the ops the CLI reported failed (none may be stored)."""
        with self._lock:
            return [o.tag for o in self.history if o.outcome == "fail"]

    def run(self, stop: threading.Event, round_no: int = 0) -> None:
        """Append until ``stop`` is set; returns when every worker has (bounded)."""
        threads = [threading.Thread(target=self._worker, args=(w, stop, round_no),
                                    name=f"chaos-workload-{w}", daemon=True)
                   for w in range(self.workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CLI_TIMEOUT_S * 2 + 10)

    def _worker(self, worker: int, stop: threading.Event, round_no: int) -> None:
        rng = random.Random(f"{self.seed}:{round_no}:{worker}")
        members = [n for n in self.cluster.nodes if n != "hub"]
        for n in range(1_000_000):  # bounded by the stop event in practice
            if stop.wait(rng.uniform(0.5, 1.5) * self.workers / self.rate):
                return
            name = "hub" if rng.random() < self.hub_share else rng.choice(members)
            tag = f"s{self.seed}r{round_no}w{worker}n{n}"
            op = Op(tag=tag, node=name, kind="", start=self.timeline.now())
            try:
                self._one(self.cluster.nodes[name], op, rng)
            except Exception as exc:  # the harness's own failure: indeterminate
                op.outcome, op.error = "info", f"harness: {exc!r}"[:300]
            op.end = self.timeline.now()
            with self._lock:
                self.history.append(op)
            fields = {("op" if k == "kind" else k): v for k, v in op.as_dict().items()
                      if v not in ("", 0)}
            self.timeline.log("append", round=round_no, **fields)

    def _cli(self, node: Node) -> H.Cli:
        prefix = ([str(self.cluster.mempalace_exe)] if node.kind == "hub"
                  else [sys.executable, "-m", "logsync"])
        return H.Cli(label=f"{node.kind}@{node.name}", prefix=prefix, home=node.home / "cli",
                     env=self.cluster.cli_env(node))

    def _one(self, node: Node, op: Op, rng: random.Random) -> None:
        cli = self._cli(node)
        fields = ["--type", rng.choice(TYPES), "--stream", f"chaos/{self.seed}",
                  "--room", rng.choice(("general", "delegation")),
                  "--from-agent", f"agent-{node.name}",
                  "--metadata", json.dumps({OP_TAG: op.tag, "n": rng.randint(0, 10**6)})]
        body = f"{op.tag} on {node.name}: naïve ✓ {rng.random():.6f}".encode()
        if node.kind == "logsync" and rng.random() < 0.125:
            op.kind = "patch"
            args = ["patch", "submit", "--from-agent", f"agent-{node.name}", "--stream",
                    f"chaos/{self.seed}", "--metadata", json.dumps({OP_TAG: op.tag}),
                    "--file", "-", "--json"]
            answer = self._run(cli, node, op, args, PATCH.format(tag=op.tag).encode())
            if answer is not None:
                self._acknowledge(op, answer.get("event"), answer.get("artifact"))
            return
        if node.kind == "hub" and rng.random() < 0.25:
            op.kind = "artifact+append"
            put = ["artifact", "put", "--kind", "note", "--created-by", f"agent-{node.name}",
                   "--file", "-", "--json"]
            artifact = self._run(cli, node, op, put, f"note {op.tag} ✓\n".encode())
            if artifact is None:
                return
            op.artifact = str(artifact.get("id", ""))
            fields += ["--artifact-id", op.artifact]
        else:
            op.kind = "append"
        command = (["logstream"] if node.kind == "hub" else []) + ["append", *fields]
        answer = self._run(cli, node, op, [*command, "--body-file", "-", "--json"], body)
        if answer is not None:
            self._acknowledge(op, answer, None)

    def _run(self, cli: H.Cli, node: Node, op: Op, args: list[str],
             stdin: bytes) -> dict[str, Any] | None:
        try:
            done = cli.run(node.palace, *args, stdin=stdin, check=False, timeout=CLI_TIMEOUT_S)
        except H.HarnessError as exc:
            op.outcome, op.error = "info", str(exc)[:300]
            return None
        if done.returncode < 0:  # killed by a signal at an unknown point: maybe committed
            op.outcome, op.error = "info", f"killed by signal {-done.returncode}"
            return None
        if done.returncode != 0:
            op.outcome = "fail"
            said = (done.stderr or done.stdout).decode(errors="replace").strip()
            op.error = (said.splitlines() or [f"exit {done.returncode}"])[-1][:300]
            return None
        try:
            answer = json.loads(done.stdout.decode("utf-8"))
        except ValueError:
            op.outcome, op.error = "info", f"exit 0 but not JSON: {done.stdout[:200]!r}"
            return None
        if not isinstance(answer, dict):
            op.outcome, op.error = "info", f"exit 0 but not a JSON object: {done.stdout[:200]!r}"
            return None
        return answer

    @staticmethod
    def _acknowledge(op: Op, event: Any, artifact: Any) -> None:
        if not isinstance(event, dict) or not event.get("id") or not event.get("origin_seq"):
            op.outcome, op.error = "info", f"exit 0 without an event: {str(event)[:200]}"
            return
        op.outcome = "ok"
        op.id = str(event["id"])
        op.origin = str(event.get("origin_replica") or "")
        op.origin_seq = int(event["origin_seq"])
        if isinstance(artifact, dict):
            op.artifact = str(artifact.get("id", ""))
