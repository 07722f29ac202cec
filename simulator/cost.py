"""Step-time cost model of a simulated engine: how long one forward pass takes.

One engine step runs the whole scheduled batch (decode tokens and prefill chunks) at once::

    step_ms = overhead_ms
            + linear(n)                          n = tokens scheduled in the step
            + lm_head_ms
            + attn_base_ms + attn_ms_per_1k_ctx * ctx / 1000

``linear(n)`` is piecewise-linear through ``linear_points`` ((tokens, ms) pairs): nearly flat while
the weights' memory traffic dominates (up to ~128 tokens per step on an H100 for Llama-3-8B), then
growing by ``linear_ms_per_token_beyond`` per token once the matmuls are compute-bound (large
prefill chunks). Below the first point it is the first point's value. ``ctx`` is the sum over
scheduled sequences of the context each attends to (tokens already in its KV cache plus the tokens
it computes in this step): decode attention is memory-bound and reads every cached token once.
A step with no tokens costs 0 (the engine idles).

The form and the coefficients come from ../shared/data/README.md and
calibration/derived_decode_step_llama3_8b_bf16.csv (derived from microsoft/vidur profiles,
anchored to vLLM measurements); the profiles in profiles/profiles.yaml hold the numbers.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    overhead_ms: float
    lm_head_ms: float
    linear_points: tuple[tuple[int, float], ...]
    linear_ms_per_token_beyond: float
    attn_base_ms: float
    attn_ms_per_1k_ctx: float

    def __post_init__(self) -> None:
        if not self.linear_points:
            raise ValueError("linear_points must hold at least one (tokens, ms) pair")
        xs = [p[0] for p in self.linear_points]
        if xs != sorted(xs) or len(set(xs)) != len(xs):
            raise ValueError("linear_points must be sorted by strictly increasing token count")
        numbers = [self.overhead_ms, self.lm_head_ms, self.linear_ms_per_token_beyond,
                   self.attn_base_ms, self.attn_ms_per_1k_ctx, *(p[1] for p in self.linear_points)]
        if any(v < 0 for v in numbers) or any(x < 0 for x in xs):
            raise ValueError("cost coefficients must be non-negative")

    def linear_ms(self, n_tokens: int) -> float:
        pts = self.linear_points
        if n_tokens <= pts[0][0]:
            return pts[0][1]
        if n_tokens >= pts[-1][0]:
            return pts[-1][1] + (n_tokens - pts[-1][0]) * self.linear_ms_per_token_beyond
        i = bisect_right([p[0] for p in pts], n_tokens)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (n_tokens - x0) / (x1 - x0)

    def step_ms(self, n_tokens: int, ctx_tokens: int) -> float:
        """Duration of one step that computes `n_tokens` tokens and reads `ctx_tokens` of context."""
        if n_tokens <= 0:
            return 0.0
        return (
            self.overhead_ms
            + self.linear_ms(n_tokens)
            + self.lm_head_ms
            + self.attn_base_ms
            + self.attn_ms_per_1k_ctx * ctx_tokens / 1000.0
        )

    def decode_step_ms(self, batch: int, context_per_seq: int) -> float:
        """A pure-decode step: `batch` sequences, each with `context_per_seq` tokens of context."""
        return self.step_ms(batch, batch * context_per_seq)

    def scaled(self, factor: float) -> CostModel:
        """Every time multiplied by `factor` (e.g. 1/speedup)."""
        return CostModel(
            overhead_ms=self.overhead_ms * factor,
            lm_head_ms=self.lm_head_ms * factor,
            linear_points=tuple((x, y * factor) for x, y in self.linear_points),
            linear_ms_per_token_beyond=self.linear_ms_per_token_beyond * factor,
            attn_base_ms=self.attn_base_ms * factor,
            attn_ms_per_1k_ctx=self.attn_ms_per_1k_ctx * factor,
        )
