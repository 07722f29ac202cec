"""`tidegate pool set-slo|get-slo|clear-slo`: a pool's SLO targets (time to first token, time per
output token). Stored in etcd through the control plane's admin API; routers get them inside the
pool's routing table (docs/OPERATIONS.md, "SLO targets")."""

from __future__ import annotations

import argparse

from tidegate.ops import exitcodes, render
from tidegate.ops.commands.base import Context, add_common_flags, execute, usage_error
from tidegate.ops.durations import parse_duration
from tidegate.v1 import records_pb2

MAX_TARGET_S = 3600.0


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sp = sub.add_parser("set-slo", help="Set (or replace) a pool's SLO targets.")
    sp.add_argument("pool", metavar="POOL", help="The pool: the model name clients ask for.")
    sp.add_argument("--ttft", required=True, metavar="DURATION",
                    help="Time-to-first-token target, e.g. 2s or 800ms (a bare number is seconds).")
    sp.add_argument("--tpot", required=True, metavar="DURATION",
                    help="Time-per-output-token target after the first token, e.g. 100ms.")
    add_common_flags(sp)
    gp = sub.add_parser("get-slo", help="Show the SLO targets of one pool, or of every pool with targets.")
    gp.add_argument("pool", metavar="POOL", nargs="?", default="", help="The pool (default: every pool).")
    add_common_flags(gp)
    cp = sub.add_parser("clear-slo", help="Remove a pool's SLO targets (routers fall back to the policy default).")
    cp.add_argument("pool", metavar="POOL", help="The pool.")
    add_common_flags(cp)


def parse_target(flag: str, text: str) -> float:
    """Seconds of one target flag; raises ValueError naming the flag."""
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
    if not 0 < seconds <= MAX_TARGET_S:
        raise ValueError(f"{flag}: must be > 0 and at most 1h, got {text!r}")
    return seconds


def _message_json(message: str, slo: records_pb2.PoolSlo | None) -> str:
    return render.dumps({"api_version": render.API_VERSION, "kind": "PoolSlo", "message": message,
                         "slo": render.slo_json(slo) if slo is not None else None})


async def _set(ctx: Context) -> int:
    a = ctx.args
    resp = await ctx.client.set_pool_slo(records_pb2.PoolSlo(pool=a.pool, ttft_s=a.ttft_s, tpot_s=a.tpot_s))
    slo = resp.slo if resp.HasField("slo") else None
    if a.output == "json":
        ctx.out(_message_json(resp.message, slo))
    else:
        shown = render.slo_text(slo) if slo is not None else "-"
        ctx.out(f"pool {a.pool}: SLO {resp.message} (ttft/tpot {shown})")
    return exitcodes.OK


async def _get(ctx: Context) -> int:
    a = ctx.args
    resp = await ctx.client.get_pool_slo(a.pool)
    if a.output == "json":
        ctx.out(render.dumps(render.slos_json(resp.slos)))
    elif a.pool and not resp.slos:
        ctx.out(f"No SLO set for pool {a.pool}.")
    else:
        ctx.out(render.slos_table(resp.slos))
    return exitcodes.NOT_FOUND if a.pool and not resp.slos else exitcodes.OK


async def _clear(ctx: Context) -> int:
    a = ctx.args
    resp = await ctx.client.set_pool_slo(records_pb2.PoolSlo(pool=a.pool), clear=True)
    ctx.out(_message_json(resp.message, None) if a.output == "json" else f"pool {a.pool}: {resp.message}")
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "set-slo":
            args.ttft_s = parse_target("--ttft", args.ttft)
            args.tpot_s = parse_target("--tpot", args.tpot)
        if args.action != "get-slo" and not args.pool.strip():
            raise ValueError("POOL must not be empty")
    except ValueError as e:
        return usage_error(args, str(e))
    return execute(args, {"set-slo": _set, "get-slo": _get, "clear-slo": _clear}[args.action])
