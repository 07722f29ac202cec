"""`tidegate budget set|list|delete`: disruption budgets per pool or region."""

from __future__ import annotations

import argparse

from tidegate.ops import exitcodes, render
from tidegate.ops.commands.base import Context, add_common_flags, execute, usage_error
from tidegate.ops.selectors import parse_budget_value, parse_scope
from tidegate.v1 import records_pb2


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sp = sub.add_parser("set", help="Create or replace the budget of a pool or region.")
    sp.add_argument("scope", metavar="SCOPE", help="pool:NAME or region:NAME")
    group = sp.add_mutually_exclusive_group(required=True)
    group.add_argument("--min-available", metavar="N|N%", help="Keep at least this many replicas serving.")
    group.add_argument("--max-unavailable", metavar="N|N%", help="Take at most this many out of service.")
    add_common_flags(sp)
    lp = sub.add_parser("list", aliases=["ls"], help="List the budgets.")
    add_common_flags(lp)
    dp = sub.add_parser("delete", aliases=["rm"], help="Delete the budget of a scope.")
    dp.add_argument("scope", metavar="SCOPE", help="pool:NAME or region:NAME")
    add_common_flags(dp)


async def _set(ctx: Context) -> int:
    a = ctx.args
    budget = records_pb2.DisruptionBudget(scope=a.scope, min_available=a.min_available or "",
                                          max_unavailable=a.max_unavailable or "")
    resp = await ctx.client.set_budget(budget)
    if a.output == "json":
        out = render.budget_json(resp.budget if resp.HasField("budget") else budget)
        ctx.out(render.dumps({"api_version": render.API_VERSION, "kind": "Budget", "message": resp.message,
                              "budget": out}))
    else:
        ctx.out(resp.message or f"budget {render.budget_text(budget)} set")
    return exitcodes.OK


async def _list(ctx: Context) -> int:
    resp = await ctx.client.list_budgets()
    ctx.out(render.dumps(render.budgets_json(resp)) if ctx.args.output == "json" else render.budgets_table(resp))
    return exitcodes.OK


async def _delete(ctx: Context) -> int:
    a = ctx.args
    resp = await ctx.client.set_budget(records_pb2.DisruptionBudget(scope=a.scope), delete=True)
    if a.output == "json":
        ctx.out(render.dumps({"api_version": render.API_VERSION, "kind": "Budget", "message": resp.message,
                              "budget": None}))
    else:
        ctx.out(resp.message or f"budget {a.scope} deleted")
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    try:
        if args.action in ("set", "delete", "rm"):
            parse_scope(args.scope)
        if args.action == "set":
            args.min_available = parse_budget_value(args.min_available) if args.min_available else None
            args.max_unavailable = parse_budget_value(args.max_unavailable) if args.max_unavailable else None
    except ValueError as e:
        return usage_error(args, str(e))
    body = {"set": _set, "delete": _delete, "rm": _delete}.get(args.action, _list)
    return execute(args, body)
