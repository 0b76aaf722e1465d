"""Kernel resources of a chaos run: names, namespaces, veths, a bridge, tmpfs mounts, and
the sweep that removes what a dead harness left behind.

Names. Every resource carries the run's *tag*: ``PREFIX`` + six characters (the harness
pid in base 36, zero-padded, and one counter character, so a process can make several
clusters one after the other). Interface names stay within the kernel's 15 characters:
``lsc<tag>br`` (the bridge), ``lsc<tag><node>h`` (a veth's end on the bridge) and
``lsc<tag><node>p`` (its end in the node's namespace ``lsc<tag>-<node>``). A disk that
fills is a tmpfs mounted on a directory named ``lsc<tag>-<node>-disk``. Every process the
harness starts has ``LOGSYNC_CHAOS_TAG=<tag>`` in its environment.

Ownership. A tag is claimed by an owner file (pid and kernel start time of the harness
process) under ``/run/logsync-chaos`` (when not root: ``/tmp/logsync-chaos``, made
world-writable and sticky, else the temp dir). A tag is alive when an owner file in *any*
of these places names a live process (``owner_dirs``), so root's sweep sees a non-root
harness's tag and the other way round. ``sweep()`` removes every resource whose tag has
no live owner -- processes (SIGCONT, then SIGKILL, by pid),
mounts, links, namespaces -- so a harness killed with SIGKILL is cleaned up by the next
one, and a concurrent run (another live owner) is never touched.

Partitions in namespace mode. Isolating one node takes its veth down (its end on the
bridge): every packet to or from it is lost. A partition between groups cuts each pair
across the cut with a permanent neighbour entry pointing at a MAC nobody has, in both
namespaces: frames are sent and silently lost, connects hang until their timeout, as in
a real partition, and the harness (on the bridge) still reaches every node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "lsc"
TAG_ENV = "LOGSYNC_CHAOS_TAG"
TAG_LEN = 6
CMD_TIMEOUT_S = 15.0
NOBODY_MAC = "02:00:5e:00:00:01"  # a locally administered address no interface has
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_counter = 0


class ChaosError(RuntimeError):
    """The harness could not do its job (a command failed, a wait ran out)."""


def run_cmd(argv: list[str], *, timeout: float = CMD_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one system command, bounded; a failure (if checked) is a ChaosError sentence."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ChaosError(f"`{' '.join(argv)}` did not finish in {timeout:.0f} s") from None
    except OSError as exc:
        raise ChaosError(f"`{' '.join(argv)}` could not run: {exc}") from None
    if check and done.returncode != 0:
        raise ChaosError(f"`{' '.join(argv)}` exited {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()[:300]}")
    return done


def _base36(number: int, width: int) -> str:
    out = ""
    while number:
        number, digit = divmod(number, 36)
        out = _DIGITS[digit] + out
    return out.rjust(width, "0")[-width:]


def new_tag() -> str:
    """A fresh tag for this process: its pid in base 36 and a counter character."""
    global _counter
    _counter += 1
    return _base36(os.getpid(), TAG_LEN - 1) + _DIGITS[_counter % 36]


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no ip(8)"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        done = run_cmd(["ip", "netns", "add", probe], check=False)
    except ChaosError as exc:
        return str(exc)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()[:200]}"
    run_cmd(["ip", "netns", "del", probe], check=False)
    return None


# ── ownership ────────────────────────────────────────────────────────────


SHARED_OWNER_DIR = Path("/tmp/logsync-chaos")  # not $TMPDIR: every user's harness looks here


def owner_dirs() -> list[Path]:
    """Every place an owner file may be, whoever wrote it (all are searched)."""
    places = [Path("/run/logsync-chaos"), SHARED_OWNER_DIR,
              Path(tempfile.gettempdir()) / "logsync-chaos"]
    return list(dict.fromkeys(places))


def owner_dir() -> Path:
    """Where this process writes its owner files."""
    if os.geteuid() == 0 and Path("/run").is_dir():
        return Path("/run/logsync-chaos")
    with contextlib.suppress(OSError):
        if not SHARED_OWNER_DIR.exists():
            SHARED_OWNER_DIR.mkdir()
            SHARED_OWNER_DIR.chmod(0o1777)
        if os.access(SHARED_OWNER_DIR, os.W_OK | os.X_OK):
            return SHARED_OWNER_DIR
    return Path(tempfile.gettempdir()) / "logsync-chaos"


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def claim(tag: str) -> None:
    """Record this process as the owner of ``tag``."""
    directory = owner_dir()
    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    (directory / f"{tag}.owner").write_text(
        json.dumps({"pid": pid, "start": _start_time(pid)}), encoding="utf-8")


def release(tag: str) -> None:
    for directory in dict.fromkeys([owner_dir(), *owner_dirs()]):
        with contextlib.suppress(OSError):
            (directory / f"{tag}.owner").unlink()


def owner_alive(tag: str) -> bool:
    """Whether an owner file for ``tag``, wherever it is, names a live process."""
    for directory in dict.fromkeys([owner_dir(), *owner_dirs()]):
        try:
            owner = json.loads((directory / f"{tag}.owner").read_text(encoding="utf-8"))
            pid, start = int(owner["pid"]), owner.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if start is not None and _start_time(pid) == start:
            return True
    return False


# ── what exists ──────────────────────────────────────────────────────────


@dataclass
class Found:
    """The harness's resources that exist now, by kind."""

    processes: dict[int, str] = field(default_factory=dict)  # pid -> tag
    mounts: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        return ([f"process {pid} (tag {tag})" for pid, tag in sorted(self.processes.items())]
                + [f"mount {m}" for m in self.mounts] + [f"link {n}" for n in self.links]
                + [f"namespace {n}" for n in self.namespaces])


def _tag_of(name: str) -> str | None:
    if not name.startswith(PREFIX) or len(name) < len(PREFIX) + TAG_LEN:
        return None
    tag = name[len(PREFIX):len(PREFIX) + TAG_LEN]
    return tag if all(c in _DIGITS for c in tag) else None


def _processes() -> dict[int, str]:
    marker = f"{TAG_ENV}=".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(marker):
                found[int(entry.name)] = item[len(marker):].decode(errors="replace")
    return found


def _unescape(field: str) -> str:
    """A /proc/self/mounts field: space, tab, newline and backslash are octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> list[str]:
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 1:
                point = _unescape(parts[1])
                if _tag_of(Path(point).name) is not None:
                    points.append(point)
    return points


def _links() -> list[str]:
    if shutil.which("ip") is None:
        return []
    done = run_cmd(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in done.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if _tag_of(name) is not None:
                names.append(name)
    return names


def _namespaces() -> list[str]:
    if shutil.which("ip") is None:
        return []
    done = run_cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines()
            if line.split() and _tag_of(line.split()[0]) is not None]


def find(tags: Iterable[str] | None = None) -> Found:
    """The harness's resources that exist now (of ``tags``, or of every tag)."""
    wanted = set(tags) if tags is not None else None

    def keep(tag: str | None) -> bool:
        return tag is not None and (wanted is None or tag in wanted)

    return Found(
        processes={pid: tag for pid, tag in _processes().items() if keep(tag)},
        mounts=[m for m in _mounts() if keep(_tag_of(Path(m).name))],
        links=[n for n in _links() if keep(_tag_of(n))],
        namespaces=[n for n in _namespaces() if keep(_tag_of(n))],
    )


def remove(found: Found) -> list[str]:
    """Remove what ``found`` names, processes first; return what could not be removed."""
    for pid in found.processes:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists()
                                              and not _zombie(p) for p in found.processes):
        time.sleep(0.05)
    for point in found.mounts:
        run_cmd(["umount", "-l", point], check=False)
    for name in found.namespaces:
        run_cmd(["ip", "netns", "del", name], check=False)
    for name in found.links:
        run_cmd(["ip", "link", "del", name], check=False)
    tags = set(found.processes.values()) | {
        t for t in map(_tag_of, [*found.links, *found.namespaces,
                                 *(Path(m).name for m in found.mounts)]) if t}
    left = find(tags)
    left.processes = {p: t for p, t in left.processes.items() if not _zombie(p)}
    return left.describe()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


SWEEP_PASSES = 5


def sweep() -> list[str]:
    """Remove the leftovers of every harness that is no longer running; say what went."""
    found = find()
    dead = {tag for tag in {*found.processes.values(),
                            *map(_tag_of, [*found.links, *found.namespaces,
                                           *(Path(m).name for m in found.mounts)])}
            if tag and not owner_alive(tag)}
    if not dead:
        return []
    stale = find(dead)
    removed = stale.describe()
    for _ in range(SWEEP_PASSES):  # a child of a dead harness may start a process meanwhile
        if not remove(stale):
            break
        stale = find(dead)
        removed += [item for item in stale.describe() if item not in removed]
    for tag in dead:
        release(tag)
    return removed


# ── tmpfs ────────────────────────────────────────────────────────────────


def mount_tmpfs(point: Path, size: str) -> None:
    point.mkdir(parents=True, exist_ok=True)
    run_cmd(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)])


def umount(point: Path) -> None:
    run_cmd(["umount", "-l", str(point)], check=False)


# ── the bridge and the namespaces ────────────────────────────────────────


def _subnet_in_use(octet: int) -> bool:
    done = run_cmd(["ip", "-o", "addr", "show"], check=False)
    return f" 10.213.{octet}." in done.stdout


class Fabric:
    """One bridge in the root namespace and, per node, a namespace joined to it by a veth."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.bridge = f"{PREFIX}{tag}br"
        self.octet = self._free_octet()
        self.gateway = f"10.213.{self.octet}.1"
        self.addresses: dict[str, str] = {}
        self.namespaces: dict[str, str] = {}
        self.down: set[str] = set()
        self.cuts: set[frozenset[str]] = set()

    def _free_octet(self) -> int:
        start = os.getpid() % 200
        for step in range(200):
            octet = 20 + (start + step) % 200
            if not _subnet_in_use(octet):
                return octet
        raise ChaosError("no free 10.213.x.0/24 subnet for the bridge")

    def create(self) -> None:
        run_cmd(["ip", "link", "add", self.bridge, "type", "bridge"])
        run_cmd(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        run_cmd(["ip", "link", "set", self.bridge, "up"])

    def host_end(self, node: str) -> str:
        return f"{PREFIX}{self.tag}{node}h"

    def inner_end(self, node: str) -> str:
        return f"{PREFIX}{self.tag}{node}p"

    def add_node(self, node: str, index: int) -> str:
        """A namespace for ``node`` with address 10.213.x.(10+index) on the bridge."""
        namespace = f"{PREFIX}{self.tag}-{node}"
        address = f"10.213.{self.octet}.{10 + index}"
        host, inner = self.host_end(node), self.inner_end(node)
        run_cmd(["ip", "netns", "add", namespace])
        self.namespaces[node] = namespace
        run_cmd(["ip", "link", "add", host, "type", "veth", "peer", "name", inner])
        run_cmd(["ip", "link", "set", inner, "netns", namespace])
        run_cmd(["ip", "link", "set", host, "master", self.bridge, "up"])
        run_cmd(["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", inner])
        run_cmd(["ip", "-n", namespace, "link", "set", inner, "up"])
        run_cmd(["ip", "-n", namespace, "link", "set", "lo", "up"])
        self.addresses[node] = address
        return address

    def exec_prefix(self, node: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[node]]

    def link(self, node: str, up: bool) -> None:
        """Take ``node``'s veth down (every packet lost) or bring it back."""
        run_cmd(["ip", "link", "set", self.host_end(node), "up" if up else "down"])
        (self.down.discard if up else self.down.add)(node)

    def cut(self, a: str, b: str) -> None:
        """Lose every frame between ``a`` and ``b`` (both directions)."""
        for here, there in ((a, b), (b, a)):
            run_cmd(["ip", "-n", self.namespaces[here], "neigh", "replace",
                     self.addresses[there], "lladdr", NOBODY_MAC, "nud", "permanent",
                     "dev", self.inner_end(here)])
        self.cuts.add(frozenset((a, b)))

    def uncut(self, a: str, b: str) -> None:
        for here, there in ((a, b), (b, a)):
            run_cmd(["ip", "-n", self.namespaces[here], "neigh", "del", self.addresses[there],
                     "dev", self.inner_end(here)], check=False)
        self.cuts.discard(frozenset((a, b)))

    def heal(self) -> None:
        for pair in list(self.cuts):
            self.uncut(*sorted(pair))
        for node in list(self.down):
            self.link(node, True)

    def close(self) -> None:
        for namespace in self.namespaces.values():
            run_cmd(["ip", "netns", "del", namespace], check=False)
        for node in self.namespaces:
            run_cmd(["ip", "link", "del", self.host_end(node)], check=False)
        run_cmd(["ip", "link", "del", self.bridge], check=False)
        self.namespaces.clear()
