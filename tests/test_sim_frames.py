"""Change frames in the simulator: counted as Maelstrom counts messages, none to a peer
known to hold the op, batched per subscriber within `sync.coalesce`."""

from __future__ import annotations

from logsync.sim import parse_scenario, run_scenario

MESH = """
name = "frames"
duration = "6s"
[nodes]
count = 5
[topology]
kind = "full-mesh"
[network]
latency = "20ms"
[sync]
interval = "2s"
coalesce = "{coalesce}"
[[workload]]
rate = 40
[expect]
converge_within = "10s"
"""


def run(coalesce: str):  # noqa: ANN201 - a SimReport
    return run_scenario(parse_scenario(MESH.format(coalesce=coalesce),
                                       source="frames.toml").with_seed(2))


def test_messages_are_requests_answers_and_frames() -> None:
    report = run("0ms")
    assert report.ok, report.text()
    assert report.messages_total == report.requests_total + report.answers + report.notifications
    assert 0 < report.answers <= report.requests_total
    assert report.as_dict()["messages"]["per_event"] == round(report.messages_per_event, 4)
    assert "messages" in report.text()


def test_coalesced_frames_are_fewer_and_lose_nothing() -> None:
    eager, batched = run("0ms"), run("200ms")
    assert eager.ok and batched.ok, batched.text()
    assert eager.lost == batched.lost == 0
    assert batched.notifications < eager.notifications * 0.7


def test_no_frame_names_an_op_its_subscriber_holds() -> None:
    """A frame never goes to the origin of every op it names, nor back to the peer the
    ops were pulled from: in a two-node pair every frame is about the sender's own op."""
    pair = MESH.replace("count = 5", "count = 2").format(coalesce="0ms")
    report = run_scenario(parse_scenario(pair, source="pair.toml").with_seed(2))
    assert report.ok, report.text()
    assert report.notifications == report.events  # one frame per op, to the other node


def test_messages_per_event_is_a_graded_target() -> None:
    """`[expect] messages_per_event` grades the run as requests per event does."""
    for bar, met in (("1000", True), ("0.5", False)):
        text = MESH.format(coalesce="20ms") + f"messages_per_event = {bar}\n"
        report = run_scenario(parse_scenario(text, source="frames.toml").with_seed(2))
        graded = report.targets()["messages_per_event"]
        assert graded["got"] == report.messages_per_event and graded["met"] is met
        assert report.targets_met() is met


def test_page_frames_spare_the_pulls_a_named_frame_costs() -> None:
    """With pages (the daemon's default) a frame carries its ops: far fewer requests
    and messages than frames that only name what to pull, and nothing lost."""
    paged = run("20ms")
    named = run_scenario(parse_scenario(MESH.format(coalesce="20ms").replace(
        "[sync]\n", "[sync]\npages = false\n"), source="frames.toml").with_seed(2))
    assert paged.ok and named.ok and paged.lost == named.lost == 0
    assert paged.requests_total < named.requests_total / 3
    assert paged.messages_per_event < named.messages_per_event


def test_a_subscriber_names_a_direct_peer_only_once_a_round_taught_its_id(tmp_path,
                                                                       monkeypatch) -> None:
    """As the daemon: what a subscriber names as streamed directly comes from the peer
    ids its rounds learnt (`outbox.direct_header`); when it grows, the stream is
    replaced (the watcher reconnects) and the subscriber runs a full round."""
    from logsync.sim.runner import Simulation
    from logsync.sim.streams import Streams

    named: list[tuple[str, str, frozenset[str], frozenset[str]]] = []
    real = Streams._direct

    def spy(self, sub, publisher):  # type: ignore[no-untyped-def]
        got = real(self, sub, publisher)
        learnt = frozenset(link.replica for link in self.sim.driver.links[sub.name].values()
                           if link.replica and link.replica != publisher.replica_id)
        named.append((sub.name, publisher.name, got, learnt))
        return got

    monkeypatch.setattr(Streams, "_direct", spy)
    reconnects: list[str] = []
    scenario = parse_scenario(MESH.format(coalesce="20ms"), source="frames.toml").with_seed(2)
    sim = Simulation(scenario, tmp_path)
    real_reconnected = sim.driver.reconnected
    monkeypatch.setattr(sim.driver, "reconnected",
                        lambda node, peer: (reconnects.append(node.name),
                                            real_reconnected(node, peer)))
    report = sim.run(0.0)
    assert report.ok and report.lost == 0, report.text()
    assert all(got == learnt for _, _, got, learnt in named)  # never more than rounds taught
    assert any(not got for _, _, got, _ in named)  # before the first rounds: nothing named
    assert any(len(got) == 3 for _, _, got, _ in named)  # later: every other peer of a 5-mesh
    assert reconnects  # the stream was replaced when the set grew
