"""`tidegate cordon ID...|--selector k=v`: no new requests to the replicas; in-flight ones finish.

The replicas are cordoned one by one on the leader, with no all-or-nothing: if it fails midway the
command exits 1 and the error names those cordoned (they stay so), the one being written and those
not attempted (controlplane/admin.py); running it again finishes the job."""

from __future__ import annotations

import argparse

from tidegate.ops import exitcodes, render
from tidegate.ops.commands.base import Context, add_common_flags, execute, usage_error
from tidegate.ops.selectors import build_selector
from tidegate.v1 import admin_pb2


def add_selector_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("replica_ids", nargs="*", metavar="ID", help="Replica ids.")
    parser.add_argument("-l", "--selector", action="append", default=[], metavar="KEY=VALUE",
                        help="Select replicas by label (pool, region, zone); repeat or comma-separate.")
    parser.add_argument("--reason", default="", help="Why (recorded in the intent and the audit trail).")
    parser.add_argument("--dry-run", action="store_true", help="Say what would change; change nothing.")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_selector_flags(parser)
    parser.add_argument("--force", action="store_true", help="Cordon even if a disruption budget forbids it.")
    add_common_flags(parser)


def print_results(ctx: Context, verb: str, resp: admin_pb2.IntentResponse) -> int:
    if ctx.args.output == "json":
        ctx.out(render.dumps(render.intent_results_json(verb, ctx.args.dry_run, resp)))
    else:
        ctx.out(render.intent_results_text(verb, resp))
    return exitcodes.for_intent_results(resp.results)


async def _cordon(ctx: Context) -> int:
    a = ctx.args
    resp = await ctx.client.cordon(a.selector_msg, a.reason, a.dry_run, a.force)
    return print_results(ctx, "cordon", resp)


def run(args: argparse.Namespace) -> int:
    try:
        args.selector_msg = build_selector(args.replica_ids, args.selector)
    except ValueError as e:
        return usage_error(args, str(e))
    return execute(args, _cordon)
