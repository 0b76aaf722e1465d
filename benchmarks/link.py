"""A pull over a slow link: a fresh replica pulls N events with P patch artifacts through a
proxy limited to `--mbit` Mbit/s (`logsync.chaos.proxy`: one medium for both directions),
one run, as an operator reconciling a device over a WAN would:

  (a) from a logsync daemon, in-process (`client.sync_once`): pages zstd-coded, the default
  (a) what-if: the same pull asking for plain pages (`Accept-Encoding: identity`)
  (c) upstream's own `mempalace logstream sync` from a MemPalace 3.11 hub, same link

Every replica must end with all N events and P artifacts, or the run fails. Each figure
is the best of `--repeat` interleaved rounds; "bytes" are what crossed the link.

Usage: python benchmarks/link.py [--events N] [--patches P] [--mbit M] [--repeat R] [--json]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from _harness import (
    Bench,
    copy_palace,
    machine,
    parse_pull_args,
    positive_float,
    pull_parser,
    run_main,
)
from bootstrap import Expect, in_process, upstream_cli, via_cli, warm_up
from workload import build_origin

import logsync.client as client_mod
from logsync.chaos.proxy import ProxyHub


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = pull_parser(__doc__.splitlines()[0], repeat=2)
    parser.add_argument("--mbit", type=positive_float, default=100.0,
                        help="the link's bandwidth, Mbit/s")
    return parse_pull_args(parser, argv)


@dataclass
class Proxied:
    """A server as a puller sees it through the link (what `in_process` and the CLIs use)."""

    name: str
    url: str
    token: str


def plain_pages() -> Any:
    """The client asking for plain pages while the block runs (the what-if)."""
    class _Plain:
        def __enter__(self) -> None:
            self.asked, client_mod.ASK_ZSTD = client_mod.ASK_ZSTD, "identity"  # type: ignore[attr-defined]

        def __exit__(self, *exc: object) -> None:
            client_mod.ASK_ZSTD = self.asked  # type: ignore[attr-defined]
    return _Plain()


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    origin_dir = bench.root / "origin"
    origin = build_origin(origin_dir, args.events, args.patches)
    expect = Expect(**{k: origin.counts()[k] for k in ("events", "artifacts")})
    origin.close()
    copy_palace(origin_dir, bench.root / "hub-palace")
    daemon = bench.daemon("daemon", origin_dir)
    hub = bench.hub("hub", bench.root / "hub-palace")
    for server in (daemon, hub):
        warm_up(server)  # the daemon keeps its pages: every round is served alike
    proxies = ProxyHub()
    proxies.start()
    try:
        ends = {}
        for server in (daemon, hub):
            port = proxies.add(server.name, "127.0.0.1", "127.0.0.1", server.port,
                               rewrite_host=True)
            proxies.set(server.name, rate=args.mbit * 1e6 / 8)
            ends[server.name] = Proxied(server.name, f"http://127.0.0.1:{port}", server.token)
        rounds = []
        for i in range(args.repeat):
            runs: dict[str, Any] = {}
            before = proxies.stats()[daemon.name]["bytes"]
            runs["a_zstd"] = in_process(bench, f"a-zstd{i}", ends[daemon.name], expect)
            middle = proxies.stats()[daemon.name]["bytes"]
            runs["a_zstd"]["link_bytes"] = middle - before
            with plain_pages():
                runs["a_plain"] = in_process(bench, f"a-plain{i}", ends[daemon.name], expect)
            runs["a_plain"]["link_bytes"] = proxies.stats()[daemon.name]["bytes"] - middle
            before = proxies.stats()[hub.name]["bytes"]
            argv, env = upstream_cli(bench, ends[hub.name], i)  # type: ignore[arg-type]
            runs["c_upstream"] = via_cli(bench, f"c-upstream{i}", argv, env, expect,
                                         args.cli_timeout)
            runs["c_upstream"]["link_bytes"] = proxies.stats()[hub.name]["bytes"] - before
            rounds.append(runs)
    finally:
        proxies.stop()
    runs = {key: min((r[key] for r in rounds), key=lambda run: run["seconds"])
            for key in rounds[0]}
    for key in runs:
        runs[key]["all_seconds"] = [r[key]["seconds"] for r in rounds]
    a, plain, up = runs["a_zstd"], runs["a_plain"], runs["c_upstream"]
    return {"benchmark": "link", "events": expect.events, "artifacts": expect.artifacts,
            "mbit": args.mbit, "repeat": args.repeat, "runs": runs,
            "ratios": {"plain_over_zstd": plain["seconds"] / a["seconds"],
                       "upstream_over_zstd": up["seconds"] / a["seconds"],
                       "bytes_plain_over_zstd": plain["link_bytes"] / max(a["link_bytes"], 1)},
            "machine": machine(bench.root)}


def render(result: dict[str, Any]) -> list[str]:
    runs, r, m = result["runs"], result["ratios"], result["machine"]
    labels = {"a_zstd": "(a) daemon, in-process, zstd pages",
              "a_plain": "(a) what-if: plain pages",
              "c_upstream": "(c) hub, `mempalace logstream sync`"}
    lines = [f"link: {result['events']} events, {result['artifacts']} patch artifacts over a "
             f"{result['mbit']:g} Mbit/s link (every replica verified complete), best of "
             f"{result['repeat']}; {m['cpus']} cpus, load {m['loadavg_1m']}"]
    for key, label in labels.items():
        run = runs[key]
        lines.append(f"  {label:40s} {run['seconds']:8.2f} s  {run['link_bytes'] / 1e6:8.1f} MB"
                     " over the link")
    lines += [f"  plain/zstd:    {r['plain_over_zstd']:6.1f}x time, "
              f"{r['bytes_plain_over_zstd']:.1f}x bytes",
              f"  upstream/zstd: {r['upstream_over_zstd']:6.1f}x time"]
    return lines


def main(argv: list[str] | None = None) -> int:
    return run_main("link", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())
