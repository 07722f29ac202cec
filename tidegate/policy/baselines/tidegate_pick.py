"""`tidegate`: Tidegate's own pick, registered beside the baselines it is measured against.

The policy lives in tidegate.policy.slo_pick (predicted SLO fit over load counted in tokens, with
prefix affinity); see tidegate/policy/README.md for its formulas.
"""

from __future__ import annotations


def TidegatePick():  # noqa: N802 (a factory in the registry's BUILTIN table, named like the classes beside it)
    # Imported on use: slo_pick builds on baselines.prefix_blocks, so importing it while this
    # package initialises would be circular.
    from tidegate.policy.slo_pick import TidegatePolicy

    return TidegatePolicy()


__all__ = ["TidegatePick"]
