"""A Jepsen-style nemesis and checker for a cluster of real logsync processes (issue 13).

Why a package under ``logsync/`` and not ``scripts/``: an operator soaks a build with
``python -m logsync.chaos --seed S --duration 30m`` from a checkout, the same way the
simulator is run with ``logsync simulate``; the pytest suite in ``tests/chaos/`` drives the
very same code with fixed seeds. It needs a checkout all the same: it reuses the interop
harness in ``tests/interop/hub.py`` (real MemPalace hubs, ``ServerProcess``, the CLIs) by
importing it (``chaos.interop``), and the MemPalace venv that ``scripts/install-mempalace.sh``
makes. Nothing in the rest of ``logsync`` imports this package.

A run, in order (one module per concern):

- ``netns`` — names, the bridge, one network namespace and veth pair per process, link
  down/up, pairwise cuts, the tmpfs of the node whose disk fills, and the sweep of
  leftovers by name prefix (an earlier harness that died);
- ``proxy`` — a fault-injecting TCP proxy (asyncio, one thread): frozen, lossy, slow;
  every link in loopback mode, the chosen lossy links in namespace mode;
- ``cluster`` — N ``logsync serve`` daemons and one MemPalace 3.11 hub as processes,
  peers.json per topology (mesh, ring, star: hub-and-spoke with the hub at the centre),
  kill -9, SIGSTOP/SIGCONT, restarts under libfaketime, full disks; cleanup guaranteed
  (try/finally, atexit, and the sweep at the next start);
- ``schedule`` — the nemesis schedule, a pure function of (seed, settings);
- ``nemesis`` — carries a schedule out on a cluster, logging every action with its time;
- ``workload`` — appends through both CLIs on random nodes, the acknowledged history;
- ``checker`` — the verdict after the heal: acknowledged appends (and their artifacts)
  everywhere, failed appends nowhere, no link without its artifact, per-origin prefixes,
  no duplicates, identical canonical rows, ledgers, integrity, convergence time;
- ``report`` — the verdict and timeline as JSON and a PNG;
- ``run`` — one run (rounds of faults, heal, check) and its replay command;
- ``timeline`` — every action with its time, kept and written as it happens;
- ``interop`` — the import of ``tests/interop/hub.py``;
- ``__main__`` — the command line.

The checker's own tests (``tests/chaos/``) include a planted defect: a daemon that loses
every tenth op it applies must fail the run with its losses named.
"""
