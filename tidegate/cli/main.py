"""The `tidegate` command: one subcommand per process or tool.

Each subcommand lives in the module that owns it and exposes
`configure_parser(parser)` and `run(args) -> int` (the process's composition root).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "controlplane": ("tidegate.controlplane.main",
                     "Run a control-plane instance (telemetry ingest, weights, etcd publisher, admin API)."),
    "agent": ("tidegate.agent.main",
              "Run the sidecar agent of one engine replica (NVML + engine metrics -> control plane)."),
    "router": ("tidegate.router.main",
               "Run an OpenAI-compatible router (front door) that routes by the tables in etcd."),
    "sim": ("tidegate.simulator.main", "Run the engine simulator: one simulated vLLM replica (HTTP API + /metrics)."),
    "up": ("tidegate.fleet.up",
           "Start a complete local fleet: etcd, control plane, simulated replicas with agents, router."),
    "demo": ("tidegate.fleet.demo", "Start a local fleet, replay a real trace through the router, print a report."),
    "simulate": ("tidegate.fleetsim.main",
                 "Simulate a whole fleet on a virtual clock (real weight and router policy code); compare policies."),
    "get": ("tidegate.ops.commands.get", "List replicas or pools (tables, or -o json)."),
    "describe": ("tidegate.ops.commands.describe", "Show everything known about one replica."),
    "cordon": ("tidegate.ops.commands.cordon", "Stop sending new requests to replicas (in-flight ones finish)."),
    "uncordon": ("tidegate.ops.commands.uncordon", "Let cordoned or drained replicas take requests again."),
    "drain": ("tidegate.ops.commands.drain", "Cordon replicas and wait until their in-flight work is done."),
    "events": ("tidegate.ops.commands.events", "The audit trail: SRE actions and automatic decisions."),
    "top": ("tidegate.ops.commands.top", "Live view of pools and replicas."),
    "budget": ("tidegate.ops.commands.budget", "Set, list or delete disruption budgets (per pool or region)."),
    "pool": ("tidegate.ops.commands.pool", "Set, show or clear a pool's SLO targets (TTFT, TPOT)."),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with `only` set, one whose other subcommands are listed but not
    configured: each subcommand imports its process's code, and a CLI call should not pay
    for every process (the SRE commands start in a fraction of the time)."""
    parser = argparse.ArgumentParser(
        prog="tidegate",
        description="Tidegate: SLO-aware traffic control for fleets of LLM inference engines.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, helptext) in COMMANDS.items():
        p = sub.add_parser(name, help=helptext, description=helptext)
        if only is None or name == only:
            importlib.import_module(module).configure_parser(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args = parser.parse_args(argv)
    mod = importlib.import_module(args._module)
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
