"""Tidegate: SLO-aware traffic control for fleets of LLM inference engines.

Shared code lives here: the generated contract (`tidegate.v1`), the etcd key
layout (`keys`), the etcd client wrapper (`store`), the pure policies
(`policy`), typed config (`config`), logging and the `tidegate` CLI.
Each process has its own top-level package: `agent`, `controlplane`,
`router`, `simulator`.
"""

__version__ = "0.1.0"
