"""How much load a simulated fleet takes: the demo's rate is a fraction of this.

Little's-law estimate, from the simulator profile and the trace's means:

    per request KV   = mean_prompt + mean_output / 2      (tokens held on average over its life)
    concurrency      = min(max_num_seqs, kv_capacity_tokens / per request KV)
    decode step      = cost.decode_step_ms(concurrency, per request KV)
    prefill          = cost.step_ms(mean_prompt, mean_prompt)
    per replica rps  = 1000 / (mean_output * decode_step / concurrency + prefill)

i.e. the rate at which one replica's KV cache is full and every step is spent
on the average request. Offered load 1.0 is that rate times the replicas; the
demo's default 0.8 keeps the fleet short of saturation on average while the
trace's bursts push single replicas into queueing and KV pressure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tidegate.fleet.traces import TraceRequest
from tidegate.simulator.profiles import Profile


@dataclass(frozen=True)
class CapacityEstimate:
    fleet_rps: float
    per_replica_rps: float
    concurrency: float
    decode_step_ms: float


def estimate(profile: Profile, trace: Sequence[TraceRequest], replicas: int) -> CapacityEstimate:
    if not trace:
        raise ValueError("empty trace")
    mean_p = sum(r.prompt_tokens for r in trace) / len(trace)
    mean_o = sum(r.output_tokens for r in trace) / len(trace)
    held = mean_p + mean_o / 2
    conc = max(1.0, min(float(profile.max_num_seqs), profile.kv_capacity_tokens / held))
    step = profile.cost.decode_step_ms(max(1, round(conc)), round(held))
    prefill = profile.cost.step_ms(round(mean_p), round(mean_p))
    per_req_ms = mean_o * step / conc + prefill
    per_replica = 1000.0 / per_req_ms if per_req_ms > 0 else float("inf")
    return CapacityEstimate(per_replica * replicas, per_replica, conc, step)
