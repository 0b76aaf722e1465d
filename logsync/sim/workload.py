"""Agents at work: the ops a workload appends, through the real store's local API.

Agents are named `<agent>@<node>` (RFC 003 §3.2). Each action is what an agent
on a coordination log does: ask another agent (a directed `open` request),
reply to or ack an ask it received (terminal statuses clear it from the owed
set), hand over a patch (artifact + `patch.ready`), claim a shared partition
(`status="claimed"` on one of a few correlation ids, R3), or post a broadcast
note. Replies and acks only answer asks that have reached the agent's node.
"""

from __future__ import annotations

import random
from typing import Any

from logsync.model import MAX_ARTIFACT_BYTES, TERMINAL_STATUSES
from logsync.sim.node import Ask, SimNode
from logsync.sim.spec import Workload

STREAM = "sim"
CLAIM_POOL = 6
_TERMINAL = tuple(sorted(TERMINAL_STATUSES))
_REPLY_STATUSES = (*_TERMINAL, "ready", "claimed")


def agent_names(node: str, count: int) -> list[str]:
    return [f"a{i}@{node}" for i in range(count)]


def pick_action(workload: Workload, rng: random.Random) -> str:
    total = sum(weight for _, weight in workload.mix)
    point = rng.uniform(0.0, total)
    for action, weight in workload.mix:
        point -= weight
        if point <= 0 and weight > 0:
            return action
    return next(action for action, weight in reversed(workload.mix) if weight > 0)


def perform(node: SimNode, action: str, workload: Workload, rng: random.Random,
            everyone: list[str], serial: int) -> list[dict[str, Any]]:
    """Run one action on the node's store; return the events it appended."""
    store = node.store_or_fail()
    agent = rng.choice(node.agents)
    if action in ("reply", "ack"):
        ask = _take_ask(node, rng)
        if ask is not None:
            return [_answer(node, action, ask, rng, serial)]
        action = "ask"
    if action == "ask":
        target = rng.choice([a for a in everyone if a != agent] or everyone)
        return [store.append_event(
            "task.request", STREAM, "tasks", agent, to_agent=target,
            correlation_id=f"c{serial}", status="open",
            body=f"ask #{serial} from {agent} to {target}")]
    if action == "patch":
        target = rng.choice(everyone)
        content = _patch_text(serial, workload.patch_bytes, rng)
        result = store.submit_patch(content, agent, STREAM, to_agent=target,
                                    correlation_id=f"c{serial}", body=f"patch #{serial}")
        return [result["event"]]
    if action == "claim":
        partition = f"part-{rng.randrange(CLAIM_POOL)}"
        return [store.append_event("task.claim", STREAM, "claims", agent,
                                   correlation_id=partition, status="claimed",
                                   body=f"{agent} claims {partition}")]
    return [store.append_event("note", STREAM, "notes", agent, to_agent="*", status="ready",
                               body=f"note #{serial} from {agent}")]


def _take_ask(node: SimNode, rng: random.Random) -> Ask | None:
    waiting = [agent for agent in node.agents if node.inbox.get(agent)]
    if not waiting:
        return None
    asks = node.inbox[rng.choice(waiting)]
    return asks.pop(rng.randrange(len(asks)))


def _answer(node: SimNode, action: str, ask: Ask, rng: random.Random,
            serial: int) -> dict[str, Any]:
    store = node.store_or_fail()
    if action == "ack":
        return store.ack_event(ask.event_id, ask.to_agent, status=rng.choice(_TERMINAL),
                               body=f"ack #{serial}")
    status = rng.choice(_REPLY_STATUSES)
    if status not in TERMINAL_STATUSES:
        node.inbox.setdefault(ask.to_agent, []).append(ask)
    return store.append_event(
        "task.reply", ask.stream, ask.room, ask.to_agent, to_agent=ask.from_agent,
        correlation_id=ask.correlation_id, status=status, body=f"reply #{serial}",
        metadata={"ack_of": ask.event_id})


def _patch_text(serial: int, size: int, rng: random.Random) -> str:
    lines = [f"--- a/file{serial}.txt", f"+++ b/file{serial}.txt", "@@ -1 +1 @@"]
    length = sum(len(line) + 1 for line in lines)  # kept, not summed again per line
    while length < size:
        lines.append(f"+{rng.getrandbits(64):016x} line {len(lines)}")
        length += len(lines[-1]) + 1
    if length > MAX_ARTIFACT_BYTES:  # the line that reached `size` passed what a store holds
        lines.pop()
    return "\n".join(lines) + "\n"
