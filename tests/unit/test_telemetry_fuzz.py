"""Property tests of telemetry validation: any report an agent (or an attacker speaking the
protocol) can send is clamped by `controlplane.fleet.sanitize` into sane numbers, never a crash.

Reports are generated from the proto descriptor, so fields added later are fuzzed too."""

from __future__ import annotations

import math

from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidegate.controlplane.fleet import CleanStats, sanitize
from tidegate.v1 import telemetry_pb2

FD = pb_descriptor.FieldDescriptor
_INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1), FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1), FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1), FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_FIXED64: (0, 2**64 - 1),
}
# Values around the edges matter more than the middle of a 64-bit range.
_EDGY_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, 1.0000001, -1e-300, 1e308])


def _scalar(field: pb_descriptor.FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        return st.integers(lo, hi) | st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1])
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if t == FD.TYPE_DOUBLE else 32) | _EDGY_FLOATS
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t == FD.TYPE_STRING:
        return st.text(max_size=30) | st.sampled_from(["CUDA out of memory", "OOM", "Xid 79"])
    if t == FD.TYPE_BYTES:
        return st.binary(max_size=30)
    if t == FD.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    raise AssertionError(f"unhandled field type {t}")


def messages(desc: pb_descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy:
    """Messages of `desc` with any subset of fields set to any value of their type."""

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        out = message_factory.GetMessageClass(desc)()
        for field in desc.fields:
            if not draw(st.booleans()):
                continue
            if field.type == FD.TYPE_MESSAGE:
                if depth > 3 or field.message_type.full_name.startswith("google.protobuf."):
                    continue
                sub = messages(field.message_type, depth + 1)
                if field.is_repeated:
                    for m in draw(st.lists(sub, max_size=3)):
                        getattr(out, field.name).add().CopyFrom(m)
                else:
                    getattr(out, field.name).CopyFrom(draw(sub))
            elif field.is_repeated:
                getattr(out, field.name).extend(draw(st.lists(_scalar(field), max_size=4)))
            else:
                setattr(out, field.name, draw(_scalar(field)))
        return out

    return build()


def _check(stats: CleanStats) -> None:
    for name in ("kv_usage", "ttft_p95_ms", "itl_p95_ms", "preemptions_total"):
        v = getattr(stats, name)
        assert math.isfinite(v) and v >= 0, (name, v)
    assert 0.0 <= stats.kv_usage <= 1.0
    assert stats.running >= 0 and stats.waiting >= 0
    assert 0 <= stats.kv_free_tokens <= stats.kv_capacity_tokens
    assert stats.ecc_uncorrected >= 0
    assert all(isinstance(f, str) and f for f in stats.flags)


REPORTS = messages(telemetry_pb2.Report.DESCRIPTOR)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REPORTS)
def test_any_report_is_clamped(report: telemetry_pb2.Report):
    stats = sanitize(report)
    _check(stats)
    if not report.HasField("engine"):
        assert not stats.healthy
    # a clamp always says which field it touched
    eng = report.engine
    if report.HasField("engine") and (not math.isfinite(eng.kv_cache_usage) or not 0 <= eng.kv_cache_usage <= 1):
        assert any("kv_cache_usage" in f for f in stats.flags)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_on_the_wire(raw: bytes):
    try:
        report = telemetry_pb2.Report.FromString(raw)
    except DecodeError:
        return  # gRPC answers INVALID_ARGUMENT before the servicer sees it
    _check(sanitize(report))
