"""`tidegate`: Tidegate's own pick, registered beside the baselines it is measured against.

The policy lives in tidegate.policy.slo_pick (predicted SLO fit over load counted in tokens, with
prefix affinity); see tidegate/policy/README.md for its formulas.
"""

from __future__ import annotations

from tidegate.policy.slo_pick import TidegatePolicy

TidegatePick = TidegatePolicy

__all__ = ["TidegatePick"]
