"""The deterministic network simulator: the real engine and store over a virtual network.

`load_scenario(path)` reads a TOML scenario, `run_scenario(scenario)` runs one seed of
it and returns a `SimReport`. Modules: `spec` (the scenario types), `scenario` (reading
a file, with `table`), `render` (writing one back), `clock` (virtual time and
skewed node clocks), `network` (links and faults), `serve` (the `/sync/*` answers),
`node` (a replica and its store), `driver` (engine rounds as messages), `workload`
(agents appending), `topology` (edges, drawn faults), `faults` (what each fault kind
does), `checks` (invariants), `forks` (invariant 5 where histories part), `runner`
(the event loop), `report`, `plot`, `trace`.
"""

from logsync.sim.report import SimReport, summarise
from logsync.sim.runner import run_scenario
from logsync.sim.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = [
    "Scenario", "ScenarioError", "SimReport", "load_scenario", "parse_scenario",
    "run_scenario", "summarise",
]
