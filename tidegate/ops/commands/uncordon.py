"""`tidegate uncordon ID...|--selector k=v`: let the replicas take new requests again (ends a drain)."""

from __future__ import annotations

import argparse

from tidegate.ops.commands.base import Context, add_common_flags, execute, usage_error
from tidegate.ops.commands.cordon import add_selector_flags, print_results
from tidegate.ops.selectors import build_selector


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_selector_flags(parser)
    add_common_flags(parser)


async def _uncordon(ctx: Context) -> int:
    a = ctx.args
    resp = await ctx.client.uncordon(a.selector_msg, a.reason, a.dry_run)
    return print_results(ctx, "uncordon", resp)


def run(args: argparse.Namespace) -> int:
    try:
        args.selector_msg = build_selector(args.replica_ids, args.selector)
    except ValueError as e:
        return usage_error(args, str(e))
    return execute(args, _uncordon)
