"""Named GPU/model profiles of the engine simulator, loaded from profiles/profiles.yaml.

A profile fixes what one simulated vLLM replica looks like: the model it serves by default, its
paged KV cache (num_gpu_blocks blocks of block_size tokens), the scheduler limits (max_num_seqs,
max_num_batched_tokens, max_model_len) and the step-time cost model (see simulator.cost).
The YAML file documents where each number comes from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tidegate.simulator.cost import CostModel

_COST_FIELDS = {f.name for f in dataclasses.fields(CostModel)}
_PROFILE_FIELDS = {"description", "model", "block_size", "num_gpu_blocks", "max_num_seqs",
                   "max_num_batched_tokens", "max_model_len", "cost"}


class ProfileError(ValueError):
    """A profile is unknown or its definition is invalid; the message says which and why."""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: str
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    cost: CostModel

    def __post_init__(self) -> None:
        for f in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ProfileError(f"profile {self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.max_model_len > self.kv_capacity_tokens:
            raise ProfileError(
                f"profile {self.name!r}: max_model_len {self.max_model_len} does not fit in the KV cache "
                f"({self.num_gpu_blocks} blocks x {self.block_size} = {self.kv_capacity_tokens} tokens); "
                "lower max_model_len or raise num_gpu_blocks"
            )

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def with_overrides(self, **changes: Any) -> Profile:
        """A copy with the given fields replaced; None values are ignored. When a smaller KV cache no
        longer holds max_model_len, max_model_len shrinks to the cache (unless it was given too)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if "num_gpu_blocks" in changes and "max_model_len" not in changes:
            cap = changes["num_gpu_blocks"] * changes.get("block_size", self.block_size)
            if cap < self.max_model_len:
                changes["max_model_len"] = cap
        return dataclasses.replace(self, **changes)


def _parse_cost(name: str, raw: Any) -> CostModel:
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {name!r}: cost must be a mapping")
    unknown = set(raw) - _COST_FIELDS
    missing = _COST_FIELDS - set(raw)
    if unknown or missing:
        raise ProfileError(
            f"profile {name!r}: cost has unknown keys {sorted(unknown)} / lacks keys {sorted(missing)}"
        )
    try:
        points = tuple((int(p[0]), float(p[1])) for p in raw["linear_points"])
        values = {k: float(v) for k, v in raw.items() if k != "linear_points"}
        return CostModel(linear_points=points, **values)
    except (TypeError, ValueError, IndexError) as exc:
        raise ProfileError(f"profile {name!r}: invalid cost model: {exc}") from None


def parse_profiles(doc: Any) -> dict[str, Profile]:
    """Profiles from a parsed YAML document ``{profiles: {name: {...}}}``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("profiles"), dict):
        raise ProfileError("profiles file must be a mapping with a 'profiles' mapping")
    out: dict[str, Profile] = {}
    for name, raw in doc["profiles"].items():
        if not isinstance(raw, dict):
            raise ProfileError(f"profile {name!r} must be a mapping")
        unknown = set(raw) - _PROFILE_FIELDS
        missing = _PROFILE_FIELDS - {"description"} - set(raw)
        if unknown or missing:
            raise ProfileError(f"profile {name!r}: unknown keys {sorted(unknown)} / lacks keys {sorted(missing)}")
        fields = {k: v for k, v in raw.items() if k != "cost"}
        fields.setdefault("description", "")
        out[str(name)] = Profile(name=str(name), cost=_parse_cost(name, raw["cost"]), **fields)
    return out


def load_profiles(path: Path | None = None) -> dict[str, Profile]:
    """All profiles from `path`, or from the packaged profiles/profiles.yaml."""
    try:
        if path is None:
            text = resources.files("tidegate.simulator").joinpath("profiles/profiles.yaml").read_text()
        else:
            text = Path(path).read_text()
    except OSError as exc:
        raise ProfileError(f"cannot read profiles file {path}: {exc.strerror}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"profiles file {path or 'profiles.yaml'} is not valid YAML: {exc}") from exc
    return parse_profiles(doc)


def get_profile(name: str, path: Path | None = None) -> Profile:
    profiles = load_profiles(path)
    try:
        return profiles[name]
    except KeyError:
        raise ProfileError(f"unknown profile {name!r}; valid profiles: {', '.join(sorted(profiles))}") from None


def profile_names(path: Path | None = None) -> list[str]:
    return sorted(load_profiles(path))
