"""The version vector read by index seeks (`chaining.VECTOR_SQL`) is the GROUP BY's answer:
each origin's greatest origin_seq, whatever the gaps, the id shapes or the ops of no
origin (DESIGN invariant 1's vector)."""

from __future__ import annotations

from pathlib import Path

from conftest import RemoteKit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync.store import Store

GROUP_BY = ("SELECT origin_replica, max(origin_seq) FROM events "
            "WHERE origin_replica IS NOT NULL GROUP BY origin_replica")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chains=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=8), max_size=5),
       local=st.integers(0, 3))
def test_the_vector_by_seeks_is_the_vector_by_group_by(tmp_path_factory, chains: list[list[int]],
                                                       local: int) -> None:
    kit = RemoteKit()
    with Store.open(Path(tmp_path_factory.mktemp("v")) / "p") as store:
        for _ in range(local):
            store.append_event("task.note", "proj", "general", "lead")
        for n, steps in enumerate(chains, start=1):
            seq, ops = 0, []
            for step in steps:  # gaps, as upstream's rowid counters have
                seq += step
                ops.append(kit.op(kit.origin(n), seq))
            store.apply_remote(ops)
        expected = {o: int(top) for o, top in store._read(GROUP_BY, ())}
        assert store.version_vector() == expected
