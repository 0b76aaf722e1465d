"""A cluster of real processes: N ``logsync serve`` daemons and one MemPalace 3.11 hub.

Two modes, and the run says which it used (``Cluster.mode``, ``mode_reason``):

- ``netns``: each process in its own network namespace with its own address on a bridge
  (``netns.Fabric``); peers reach each other directly, except the links named in
  ``ClusterConfig.proxied``, which go through a proxy on the bridge (lossy, slow);
- ``loopback`` (no root, no ``ip``): every process on 127.0.0.1 and every link through
  its own proxy (``proxy.ProxyHub``), which is then also how partitions are made.

Members are ``n1`` .. ``nN`` and ``hub``; topologies are over all of them: ``mesh`` (every
pair), ``ring`` (n1 .. nN, hub, n1) and ``star`` (hub-and-spoke, the hub at the centre).
Each edge is pulled in both directions; ``links`` lists them as (puller, peer).

Cleanup is guaranteed three ways: ``close()`` in the context manager's exit, the same call
at interpreter exit (atexit), and ``netns.sweep()`` at every start, which removes what a
harness killed outright left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logsync.chaos import netns
from logsync.chaos.interop import hub as H
from logsync.chaos.netns import TAG_ENV, ChaosError
from logsync.chaos.proxy import ProxyHub
from logsync.chaos.timeline import Timeline

TOPOLOGIES = ("mesh", "ring", "star")
MODES = ("auto", "netns", "loopback")
DAEMON_PORT = 8742
HUB_PORT = 8080
FILL_CHUNK = 1 << 20
FAKETIME_GLOBS = ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1",
                  "/usr/local/lib/faketime/libfaketimeMT.so.1")


# What libfaketime creates in each process it is loaded into (its children share them)
# and removes as that process exits. A process that is killed, or that execs (`ip netns
# exec` loads it, then becomes the daemon), leaves them: the cluster removes them.
FAKETIME_LEFTOVERS = ("/dev/shm/faketime_shm_{pid}", "/dev/shm/sem.faketime_sem_{pid}")


def faketime_lib() -> str | None:
    """libfaketime (multi-threaded flavour), or None when it is not installed."""
    for pattern in FAKETIME_GLOBS:
        for path in sorted(glob.glob(pattern)):
            return path
    return None


def remove_faketime_leftovers(pid: int) -> None:
    """Remove what libfaketime left of process `pid` (which has exited and was reaped)."""
    for pattern in FAKETIME_LEFTOVERS:
        with contextlib.suppress(OSError):
            os.unlink(pattern.format(pid=pid))


def edges(topology: str, members: list[str]) -> list[tuple[str, str]]:
    """Undirected edges of a topology over ``members`` (the hub last)."""
    if topology == "mesh":
        return [(a, b) for i, a in enumerate(members) for b in members[i + 1:]]
    if topology == "ring":
        return [(members[i], members[(i + 1) % len(members)]) for i in range(len(members))]
    if topology == "star":
        return [("hub", m) for m in members if m != "hub"]
    raise ChaosError(f"topology {topology!r} is not one of {', '.join(TOPOLOGIES)}")


@dataclass(eq=False)
class NodeProcess(H.ServerProcess):
    """A ServerProcess whose address may be a namespace's, not loopback's.

    In namespace mode an isolated node cannot be asked for ``/healthz``; it is up when
    its process listens on its port (``/proc/PID/net/tcp`` lists its namespace's sockets).
    """

    host: str = H.LOOPBACK
    reachable: Callable[[], bool] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _healthy(self) -> bool:
        if self.reachable is not None and not self.reachable():
            return self.proc is not None and _listening(self.proc.pid, self.port)
        return bool(super()._healthy())


def _listening(pid: int, port: int) -> bool:
    try:
        table = Path(f"/proc/{pid}/net/tcp").read_text()
    except OSError:
        return False
    wanted = f":{port:04X}"
    return any(len(parts) > 3 and parts[1].endswith(wanted) and parts[3] == "0A"
               for parts in (line.split() for line in table.splitlines()[1:]))


@dataclass
class ClusterConfig:
    root: Path
    nodes: int = 5
    topology: str = "mesh"
    mode: str = "auto"
    interval: float = 2.0  # the daemons' anti-entropy interval (s)
    hub_interval: float = 1.0  # MEMPALACE_SYNC_INTERVAL
    hub_timeout: float = 5.0  # MEMPALACE_SYNC_HTTP_TIMEOUT
    disk_nodes: tuple[str, ...] = ()  # palaces on a small tmpfs (the full-disk fault)
    disk_size: str = "48m"
    proxied: tuple[tuple[str, str], ...] = ()  # netns mode: (puller, peer) links via a proxy
    daemon_module: str = "logsync"  # `python -m <this>`: a planted defect wraps logsync
    seed: int = 0


@dataclass
class Node:
    name: str
    kind: str  # "logsync" or "hub"
    palace: Path
    home: Path
    token: str
    host: str
    port: int
    server: NodeProcess | None = None
    clock_file: Path | None = None
    skewed: bool = False
    paused: bool = False
    disk: Path | None = None
    filler: Path | None = None

    @property
    def db(self) -> Path:
        return self.palace / "logstream.sqlite3"


@dataclass
class Cluster:
    config: ClusterConfig
    timeline: Timeline
    mempalace_exe: Path
    nodes: dict[str, Node] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)
    mode: str = ""
    mode_reason: str = ""
    tag: str = ""
    swept: list[str] = field(default_factory=list)
    fabric: netns.Fabric | None = None
    proxies: ProxyHub | None = None
    proxy_of: dict[tuple[str, str], str] = field(default_factory=dict)
    closed: bool = False
    problems: list[str] = field(default_factory=list)
    faked_pids: set[int] = field(default_factory=set)  # daemons started under libfaketime

    # ── lifecycle ──

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        cfg = self.config
        if cfg.topology not in TOPOLOGIES or cfg.mode not in MODES or cfg.nodes < 2:
            raise ChaosError(f"topology {cfg.topology!r}, mode {cfg.mode!r}, nodes {cfg.nodes}: "
                             f"want one of {TOPOLOGIES}, one of {MODES}, at least 2 nodes")
        self.swept = netns.sweep()
        if self.swept:
            self.timeline.log("sweep", removed=self.swept)
        self.tag = netns.new_tag()
        netns.claim(self.tag)
        atexit.register(self.close)
        self._choose_mode()
        names = [f"n{i}" for i in range(1, cfg.nodes + 1)] + ["hub"]
        for index, name in enumerate(names, start=1):
            self.nodes[name] = self._make_node(name, index)
        for a, b in edges(cfg.topology, names):
            self.links += [(a, b), (b, a)]
        self._wire()
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.server.start(), self.nodes.values()))  # type: ignore[union-attr]
        self.timeline.log("cluster_up", mode=self.mode, reason=self.mode_reason, tag=self.tag,
                          topology=cfg.topology, nodes=names,
                          links=[f"{a}>{b}" for a, b in self.links],
                          addresses={n: f"{x.host}:{x.port}" for n, x in self.nodes.items()})

    def _choose_mode(self) -> None:
        reason = None if self.config.mode == "loopback" else netns.namespaces_unavailable()
        if self.config.mode == "netns" and reason:
            raise ChaosError(f"network namespaces were asked for but cannot be made: {reason}")
        if reason is None and self.config.mode != "loopback":
            self.mode, self.mode_reason = "netns", "root and ip(8): one namespace per process"
            self.fabric = netns.Fabric(self.tag)
            self.fabric.create()
        else:
            self.mode = "loopback"
            self.mode_reason = ("asked for" if self.config.mode == "loopback" else
                                f"network namespaces unavailable ({reason})")
        self.proxies = ProxyHub(seed=self.config.seed)
        self.proxies.start()

    def _make_node(self, name: str, index: int) -> Node:
        root = self.config.root
        kind = "hub" if name == "hub" else "logsync"
        palace = root / "palaces" / name
        disk = None
        if name in self.config.disk_nodes:
            disk = root / f"{netns.PREFIX}{self.tag}-{name}-disk"
            netns.mount_tmpfs(disk, self.config.disk_size)
            palace = disk / "palace"
        palace.mkdir(parents=True, exist_ok=True)
        home = root / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        if self.fabric is not None:
            host = self.fabric.add_node(name, index)
            port = HUB_PORT if kind == "hub" else DAEMON_PORT
        else:
            host, port = H.LOOPBACK, H.free_port()
        node = Node(name=name, kind=kind, palace=palace, home=home, host=host, port=port,
                    token=f"tok-{name}-{secrets.token_hex(6)}", disk=disk,
                    clock_file=home / "faketime")
        node.server = NodeProcess(
            name=name, kind="hub" if kind == "hub" else "logsync daemon", palace=palace,
            home=home, port=port, token=node.token, argv=self._argv(node), env=self._env(node),
            log_path=root / "logs" / f"{name}.log", host=host,
            reachable=(lambda n=name: self._reachable(n)) if self.fabric else None)
        node.server.log_path.parent.mkdir(parents=True, exist_ok=True)
        return node

    def _argv(self, node: Node) -> list[str]:
        if node.kind == "hub":
            argv = H.hub_argv(self.mempalace_exe, node.palace, node.port, node.token)
        else:
            argv = H.logsync_argv(node.palace, node.port, node.token,
                                  ["--interval", str(self.config.interval)])
            argv[1:3] = ["-m", self.config.daemon_module]
        argv[argv.index("--host") + 1] = node.host
        return (self.fabric.exec_prefix(node.name) if self.fabric else []) + argv

    def _env(self, node: Node, *, skewed: bool = False) -> dict[str, str]:
        extra = {TAG_ENV: self.tag, **(self.clock_env(node) if skewed else {})}
        if node.kind == "hub":
            extra |= {"MEMPALACE_SYNC_INTERVAL": str(self.config.hub_interval),
                      "MEMPALACE_SYNC_HTTP_TIMEOUT": str(self.config.hub_timeout)}
            return dict(H.child_env(node.home, extra))
        return dict(H.logsync_env(node.home, extra))

    def clock_env(self, node: Node) -> dict[str, str]:
        lib = faketime_lib()
        if lib is None:
            raise ChaosError("clock faults need libfaketime (apt-get install faketime)")
        assert node.clock_file is not None
        return {"LD_PRELOAD": lib, "FAKETIME_TIMESTAMP_FILE": str(node.clock_file),
                "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def cli_env(self, node: Node) -> dict[str, str]:
        """The environment a CLI on this node's machine gets (its clock included)."""
        extra = {TAG_ENV: self.tag, **(self.clock_env(node) if node.skewed else {})}
        home = node.home / "cli"
        home.mkdir(exist_ok=True)
        if node.kind == "hub":
            return dict(H.child_env(home, extra))
        return dict(H.logsync_env(home, extra))

    def _wire(self) -> None:
        """A proxy per link that needs one, then every palace's peers.json."""
        assert self.proxies is not None
        for puller, peer in self.links:
            target = self.nodes[peer]
            if self.fabric is None:
                listen, rewrite = H.LOOPBACK, True
            elif (puller, peer) in self.config.proxied:
                listen, rewrite = self.fabric.gateway, False
            else:
                continue
            name = f"{puller}>{peer}"
            self.proxies.add(name, listen, target.host, target.port, rewrite_host=rewrite)
            self.proxy_of[(puller, peer)] = name
        for name, node in self.nodes.items():
            entries = [{"name": peer, "url": self._url(name, peer),
                        "token": self.nodes[peer].token}
                       for puller, peer in self.links if puller == name]
            H.write_peers_json(node.palace, entries)

    def _url(self, puller: str, peer: str) -> str:
        proxy = self.proxy_of.get((puller, peer))
        if proxy is not None:
            assert self.proxies is not None
            link = self.proxies.links[proxy]
            host = self.fabric.gateway if self.fabric else H.LOOPBACK
            return f"http://{host}:{link.port}"
        target = self.nodes[peer]
        return f"http://{target.host}:{target.port}"

    def _reachable(self, name: str) -> bool:
        return self.fabric is None or name not in self.fabric.down

    def close(self) -> list[str]:
        """Stop everything and remove every resource; return what went wrong (idempotent)."""
        if self.closed:
            return self.problems
        self.closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        for node in self.nodes.values():
            self._stop_node(node)
        for step in (self._stop_proxies, self._free_disks, self._close_fabric):
            try:
                step()
            except Exception as exc:  # keep cleaning up
                self.problems.append(f"cleanup step {step.__name__}: {exc!r}")
        if self.tag:
            left = netns.remove(netns.find([self.tag]))
            if left:
                self.problems.append(f"left behind after cleanup: {left}")
            netns.release(self.tag)
        return self.problems

    def _stop_node(self, node: Node) -> None:
        server = node.server
        if server is None or server.proc is None:
            return
        try:
            if server.proc.poll() is None:
                os.kill(server.proc.pid, signal.SIGCONT)
            if not server.stop() and node.kind == "logsync":
                self.problems.append(f"daemon {node.name} ignored SIGTERM for "
                                     f"{H.STOP_TIMEOUT_S:.0f} s and was killed")
        except Exception as exc:
            self.problems.append(f"stopping {node.name}: {exc!r}")
            with contextlib.suppress(Exception):
                server.proc.kill()
                server.proc.wait(5)
        self._reaped(server.proc)

    def _reaped(self, proc: subprocess.Popen[bytes]) -> None:
        """After a node's process was reaped: what libfaketime left of it goes (its pid
        is not re-used before the reap)."""
        if proc.returncode is not None and proc.pid in self.faked_pids:
            self.faked_pids.discard(proc.pid)
            remove_faketime_leftovers(proc.pid)

    def _stop_proxies(self) -> None:
        if self.proxies is not None:
            self.proxies.stop()

    def _free_disks(self) -> None:
        for node in self.nodes.values():
            if node.disk is not None:
                netns.umount(node.disk)

    def _close_fabric(self) -> None:
        if self.fabric is not None:
            self.fabric.close()

    # ── processes ──

    def server(self, name: str) -> NodeProcess:
        server = self.nodes[name].server
        assert server is not None
        return server

    def running(self, name: str) -> bool:
        return self.server(name).running

    def kill(self, name: str) -> None:
        """kill -9 (a paused process dies too)."""
        node, proc = self.nodes[name], self.server(name).proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(H.STOP_TIMEOUT_S)
        if proc is not None:
            self._reaped(proc)
        node.paused = False

    def start_node(self, name: str, *, skewed: bool | None = None) -> None:
        """Start a stopped node (with or without its clock file); waits for it to serve."""
        node = self.nodes[name]
        if skewed is not None:
            node.skewed = skewed
        server = self.server(name)
        if server.proc is not None and server.proc.poll() is not None:
            self._reaped(server.proc)  # it ended by itself (a full disk, a crash)
        server.env = self._env(node, skewed=node.skewed)
        try:
            server.start()
        finally:
            if node.skewed and server.proc is not None:
                self.faked_pids.add(server.proc.pid)

    def restart(self, name: str, *, skewed: bool | None = None) -> None:
        """A graceful restart (SIGTERM), e.g. to change its clock."""
        node = self.nodes[name]
        if node.paused:
            self.resume(name)
        self._stop_node(node)
        self.start_node(name, skewed=skewed)

    def pause(self, name: str) -> None:
        os.kill(self._pid(name), signal.SIGSTOP)
        self.nodes[name].paused = True

    def resume(self, name: str) -> None:
        with contextlib.suppress(ChaosError, ProcessLookupError):
            os.kill(self._pid(name), signal.SIGCONT)
        self.nodes[name].paused = False

    def _pid(self, name: str) -> int:
        proc = self.server(name).proc
        if proc is None or proc.poll() is not None:
            raise ChaosError(f"{name} is not running")
        return int(proc.pid)

    def set_clock(self, name: str, offset_s: float) -> None:
        """The node's clock file: libfaketime's offset, read within a second."""
        clock = self.nodes[name].clock_file
        assert clock is not None
        clock.write_text(f"{offset_s:+.0f}s\n", encoding="ascii")

    # ── network ──

    def isolate(self, name: str) -> None:
        if self.fabric is not None:
            self.fabric.link(name, False)
        for pair in self.proxy_of:
            if name in pair:
                self._proxy(pair, frozen=True)

    def cut(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Lose everything between each pair (both directions)."""
        for a, b in pairs:
            if self.fabric is not None:
                self.fabric.cut(a, b)
            for pair in ((a, b), (b, a)):
                if pair in self.proxy_of:
                    self._proxy(pair, frozen=True)

    def heal_network(self) -> None:
        """Every link up, every cut gone, every proxy flowing (loss and delay stay)."""
        if self.fabric is not None:
            self.fabric.heal()
        for pair in self.proxy_of:
            self._proxy(pair, frozen=False)

    def degrade(self, pair: tuple[str, str], **state: Any) -> None:
        """Loss, resets or delay on a proxied link (``state`` as ``ProxyHub.set``)."""
        self._proxy(pair, **state)

    def _proxy(self, pair: tuple[str, str], **state: Any) -> None:
        assert self.proxies is not None
        self.proxies.set(self.proxy_of[pair], **state)

    # ── disks ──

    def fill_disk(self, name: str) -> int:
        """Write a filler file until the node's tmpfs is full; return its size."""
        node = self.nodes[name]
        if node.disk is None:
            raise ChaosError(f"{name}'s palace is not on a tmpfs (ClusterConfig.disk_nodes)")
        node.filler = node.disk / "filler"
        written = 0
        chunk = b"\0" * FILL_CHUNK
        with node.filler.open("ab") as out:
            for _ in range(1 << 16):  # bounded: 64 GiB
                try:
                    out.write(chunk)
                    out.flush()
                except OSError:
                    break
                written += len(chunk)
        with contextlib.suppress(OSError), node.filler.open("ab") as out:
            for _ in range(FILL_CHUNK // 512):  # the last partial chunk
                out.write(b"\0" * 512)
                out.flush()
        return written

    def free_disk(self, name: str) -> None:
        node = self.nodes[name]
        if node.filler is not None:
            with contextlib.suppress(FileNotFoundError):
                node.filler.unlink()
            node.filler = None
