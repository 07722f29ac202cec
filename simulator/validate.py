"""The sampling fields of an OpenAI request, validated as vLLM validates them.

vLLM parses a request into a pydantic model (lax mode: ``"0.5"`` is a number, ``3.0`` an
integer, ``"hot"`` is an error), then checks ranges in ``SamplingParams._verify_args``. Both
failures answer 400 with vLLM's error body::

    {"error": {"message": "...", "type": "BadRequestError", "param": "<field>", "code": 400}}

Here the same lax types and the same ranges, for the fields the simulator itself does not
read (it checks model, messages, prompt, max_tokens, n, stream and stream_options on its
own). Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

# vLLM's limit on chat `top_logprobs`.
MAX_TOP_LOGPROBS = 20


class SamplingError(ValueError):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class _Sampling(BaseModel):
    """Types of vLLM's ChatCompletionRequest/CompletionRequest sampling fields (extra fields
    are allowed, as in vLLM's OpenAIBaseModel)."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    user: str | None = None
    echo: bool | None = None


class _Chat(_Sampling):
    logprobs: bool | None = False
    top_logprobs: int | None = 0


class _Completion(_Sampling):
    logprobs: int | None = None


def _range_error(sp: _Sampling, max_tokens: int | None) -> SamplingError | None:
    """SamplingParams._verify_args, in its order and words."""
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        v = getattr(sp, name)
        if v is not None and not math.isfinite(v):
            return SamplingError(f"{name} must be a finite number, got {v}.", name)
    if sp.presence_penalty is not None and not -2.0 <= sp.presence_penalty <= 2.0:
        return SamplingError(f"presence_penalty must be in [-2, 2], got {sp.presence_penalty}.", "presence_penalty")
    if sp.frequency_penalty is not None and not -2.0 <= sp.frequency_penalty <= 2.0:
        return SamplingError(f"frequency_penalty must be in [-2, 2], got {sp.frequency_penalty}.",
                             "frequency_penalty")
    if sp.repetition_penalty is not None and sp.repetition_penalty <= 0.0:
        return SamplingError(f"repetition_penalty must be greater than zero, got {sp.repetition_penalty}.",
                             "repetition_penalty")
    if sp.temperature is not None and sp.temperature < 0.0:
        return SamplingError(f"temperature must be non-negative, got {sp.temperature}.", "temperature")
    if sp.top_p is not None and not 0.0 < sp.top_p <= 1.0:
        return SamplingError(f"top_p must be in (0, 1], got {sp.top_p}.", "top_p")
    if sp.top_k is not None and sp.top_k < -1:
        return SamplingError(f"top_k must be 0 or -1 (disable), or at least 1, got {sp.top_k}.", "top_k")
    if sp.min_p is not None and not 0.0 <= sp.min_p <= 1.0:
        return SamplingError(f"min_p must be in [0, 1], got {sp.min_p}.", "min_p")
    if sp.min_tokens < 0:
        return SamplingError(f"min_tokens must be greater than or equal to 0, got {sp.min_tokens}.", "min_tokens")
    if max_tokens is not None and sp.min_tokens > max_tokens:
        return SamplingError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                             f"got {sp.min_tokens}.", "min_tokens")
    if isinstance(sp, _Chat) and sp.top_logprobs is not None and not 0 <= sp.top_logprobs <= MAX_TOP_LOGPROBS:
        return SamplingError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {sp.top_logprobs}.",
                             "top_logprobs")
    if isinstance(sp, _Completion) and sp.logprobs is not None and sp.logprobs < 0:
        return SamplingError(f"logprobs must be non-negative, got {sp.logprobs}.", "logprobs")
    return None


def check_sampling(body: dict[str, Any], chat: bool, max_tokens: int | None) -> None:
    """Raises SamplingError (-> 400, vLLM's body) when a sampling field has the wrong type or range."""
    try:
        sp: _Sampling = (_Chat if chat else _Completion).model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        field = str(err["loc"][0]) if err["loc"] else None
        where = ".".join(str(p) for p in err["loc"])
        raise SamplingError(f"1 validation error: {where}: {err['msg']}", field) from None
    problem = _range_error(sp, max_tokens)
    if problem is not None:
        raise problem


def vllm_error_body(message: str, param: str | None, status: int = 400) -> dict[str, Any]:
    """vLLM's ErrorResponse for a 4xx from request validation."""
    return {"error": {"message": message, "type": "BadRequestError", "param": param, "code": status}}
