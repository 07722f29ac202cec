"""Tidegate: SLO-aware traffic control for fleets of LLM inference engines.

Shared code lives here: the generated contract (`tidegate.v1`), the etcd key
layout (`keys`), the etcd client wrapper (`store`), the pure policies
(`policy`), typed config (`config`), logging, the rules processes share
(`tokens`, `engine_metrics`) and the `tidegate` CLI. Each process has its own
package, kept in a top-level folder and installed under this namespace:
`tidegate.agent`, `tidegate.controlplane`, `tidegate.router`,
`tidegate.simulator`. The layers are import-linter contracts in pyproject.toml.
"""

__version__ = "0.1.0"
