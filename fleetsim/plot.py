"""PNG plots of `tidegate simulate` runs (matplotlib, an optional dependency: tidegate[plot]).

attainment_vs_load.png  SLO attainment against offered load, one line per policy
ttft_cdf_load<X>.png    TTFT CDF per policy at each load
replica_load_<policy>_load<X>.png  running + waiting per replica over time (agent samples)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidegate.fleetsim.sim import SimResult


class PlotUnavailableError(ValueError):
    """matplotlib is not installed."""


class Plotter:
    def __init__(self, out_dir: Path) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise PlotUnavailableError(
                "--plot needs matplotlib, which is not installed: pip install 'tidegate[plot]' "
                "(or pip install matplotlib)") from None
        self._plt = plt
        self.out_dir = Path(out_dir)
        self._runs: list[dict[str, Any]] = []
        self._ttfts: dict[tuple[Any, str], list[float]] = {}
        self._written: list[Path] = []

    def add(self, summary: dict[str, Any], result: SimResult) -> None:
        self._runs.append(summary)
        key = (summary["load"], summary["policy"])
        self._ttfts[key] = sorted(r.ttft_s * 1000 for r in result.records if r.ttft_s is not None)
        self._replica_plot(summary, result)

    def _save(self, fig: Any, name: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / name
        fig.savefig(path, dpi=100, bbox_inches="tight")
        self._plt.close(fig)
        self._written.append(path)

    def _replica_plot(self, summary: dict[str, Any], result: SimResult) -> None:
        fig, ax = self._plt.subplots(figsize=(9, 4))
        for rid, samples in sorted(result.samples.items()):
            if samples:
                ax.plot([s[0] for s in samples], [s[1] + s[2] for s in samples], linewidth=0.7, label=rid)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("running + waiting")
        ax.set_title(f"per-replica load: {summary['policy']} at load {summary['load']}")
        if len(result.samples) <= 16:
            ax.legend(fontsize=6, ncol=4)
        self._save(fig, f"replica_load_{summary['policy']}_load{summary['load']}.png")

    def finish(self) -> list[Path]:
        plt = self._plt
        policies = sorted({r["policy"] for r in self._runs})
        loads = sorted({r["load"] for r in self._runs if r["load"] is not None})
        fig, ax = plt.subplots(figsize=(7, 4))
        for p in policies:
            pts = sorted((r["load"], r["slo_attainment"]) for r in self._runs
                         if r["policy"] == p and r["load"] is not None)
            ax.plot([x for x, _ in pts], [y * 100 for _, y in pts], marker="o", label=p)
        ax.set_xlabel("offered load (fraction of estimated capacity)")
        ax.set_ylabel("SLO attainment (%)")
        ax.legend(fontsize=7)
        self._save(fig, "attainment_vs_load.png")
        for load in loads:
            fig, ax = plt.subplots(figsize=(7, 4))
            for p in policies:
                xs = self._ttfts.get((load, p), [])
                if xs:
                    ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=p)
            ax.set_xscale("log")
            ax.set_xlabel("TTFT (ms)")
            ax.set_ylabel("CDF")
            ax.set_title(f"TTFT at load {load}")
            ax.legend(fontsize=7)
            self._save(fig, f"ttft_cdf_load{load}.png")
        return list(self._written)
