"""`tidegate get replicas|pools`: tables of replicas and pools, or JSON."""

from __future__ import annotations

import argparse

from tidegate.ops import exitcodes, render
from tidegate.ops.commands.base import Context, add_common_flags, execute, usage_error
from tidegate.ops.selectors import parse_state


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="resource", metavar="RESOURCE", required=True)
    rp = sub.add_parser("replicas", aliases=["replica"], help="Replicas: state, weight, load, latency.")
    rp.add_argument("--pool", default="", help="Only this pool (model).")
    rp.add_argument("--region", default="", help="Only this region.")
    rp.add_argument("--state", default="", help="Only this state (ready, degraded, cordoned, draining, ...).")
    add_common_flags(rp, output=("wide", "json"))
    pp = sub.add_parser("pools", aliases=["pool"], help="Pools: replicas by state, demand, budgets.")
    add_common_flags(pp)


async def _replicas(ctx: Context) -> int:
    a = ctx.args
    resp = await ctx.client.list_replicas(a.pool, a.region, a.state_value)
    if a.output == "json":
        ctx.out(render.dumps(render.replicas_json(resp)))
    else:
        ctx.out(render.replicas_table(resp, wide=a.output == "wide"))
    return exitcodes.OK


async def _pools(ctx: Context) -> int:
    resp = await ctx.client.list_pools()
    ctx.out(render.dumps(render.pools_json(resp)) if ctx.args.output == "json" else render.pools_table(resp))
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    if args.resource in ("replicas", "replica"):
        try:
            args.state_value = parse_state(args.state) if args.state else 0
        except ValueError as e:
            return usage_error(args, str(e))
        return execute(args, _replicas)
    return execute(args, _pools)
