"""`tidegate describe replica ID`: everything the control plane knows about one replica."""

from __future__ import annotations

import argparse

from tidegate.ops import exitcodes, render
from tidegate.ops.commands.base import Context, add_common_flags, execute


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=("replica", "replicas"), help="What to describe (replica).")
    parser.add_argument("replica_id", metavar="ID", help="Replica id.")
    add_common_flags(parser)


async def _describe(ctx: Context) -> int:
    detail = await ctx.client.describe_replica(ctx.args.replica_id)
    if ctx.args.output == "json":
        ctx.out(render.dumps(render.detail_json(detail)))
    else:
        ctx.out(render.describe_text(detail))
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    return execute(args, _describe)
