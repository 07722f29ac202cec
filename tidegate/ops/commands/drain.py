"""`tidegate drain ID...`: cordon, then wait until no running or waiting requests remain.

Calls Drain (the server stores the intent with its deadline), then polls DrainStatus every
0.5 s and prints a progress line whenever a replica's counts change. At the deadline it prints
what is left and exits 4; with --force the server marks the replicas drained at the deadline,
so the command waits a little longer for that and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tidegate.ops import exitcodes, render
from tidegate.ops.commands.base import Context, add_common_flags, execute, sleep_or_stop, usage_error
from tidegate.ops.commands.cordon import add_selector_flags
from tidegate.ops.durations import format_duration, parse_duration
from tidegate.ops.selectors import build_selector
from tidegate.v1 import admin_pb2

POLL_S = 0.5
REPEAT_S = 5.0          # reprint an unchanged progress line this often
FORCE_SLACK_S = 5.0     # with --force, how long past the deadline to wait for the server to mark drained


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_selector_flags(parser)
    parser.add_argument("--timeout", default="10m", help="How long to wait for in-flight work (default 10m).")
    parser.add_argument("--grace-period", default="30s",
                        help="Grace period the server gives in-flight requests (default 30s).")
    parser.add_argument("--force", action="store_true",
                        help="Drain even if a disruption budget forbids it, and mark the replicas drained at "
                             "the deadline even if work is left.")
    add_common_flags(parser)


def _key(p: admin_pb2.DrainProgress) -> tuple[int, int, int, int, bool]:
    return (p.state, p.running, p.waiting, p.router_inflight, p.done)


async def _drain(ctx: Context) -> int:
    a = ctx.args
    json_out = a.output == "json"
    loop = asyncio.get_running_loop()
    started = loop.time()
    resp = await ctx.client.drain(a.selector_msg, a.reason, a.dry_run, a.force, a.timeout_s, a.grace_s)
    code = exitcodes.for_intent_results(resp.results)
    if not json_out:
        ctx.out(render.intent_results_text("drain", resp))
    ids = [r.replica_id for r in resp.results
           if exitcodes.for_intent_results([r]) == exitcodes.OK]
    if a.dry_run or not ids:
        if json_out:
            ctx.out(render.dumps(render.drain_json(resp, [], dry_run=a.dry_run, timed_out=False)))
        return code

    deadline = started + a.timeout_s
    give_up = deadline + (FORCE_SLACK_S if a.force else 0.0)
    last: dict[str, tuple[tuple[int, int, int, int, bool], float]] = {}
    progress: list[admin_pb2.DrainProgress] = []
    outcome = "timeout"
    while True:
        status = await ctx.client.drain_status(ids)
        now = loop.time()
        progress = sorted(status.replicas, key=lambda p: p.replica_id)
        for p in progress:
            key = _key(p)
            seen = last.get(p.replica_id)
            if not json_out and (seen is None or seen[0] != key or now - seen[1] >= REPEAT_S):
                ctx.out(render.progress_line(p, deadline - now))
                last[p.replica_id] = (key, now)
        got = {p.replica_id for p in progress if p.done}
        if set(ids) <= got:
            outcome = "done"
            break
        if now >= give_up:
            break
        if await sleep_or_stop(ctx.stop, POLL_S):
            outcome = "interrupted"
            break

    left = [p for p in progress if not p.done]
    missing = sorted(set(ids) - {p.replica_id for p in progress})
    if json_out:
        ctx.out(render.dumps(render.drain_json(resp, progress, dry_run=False, timed_out=outcome != "done")))
    if outcome == "done":
        if not json_out:
            ctx.out(f"drained: {', '.join(ids)} (safe to stop) in {format_duration(loop.time() - started)}")
        return code
    what = "interrupted" if outcome == "interrupted" else f"timed out after {format_duration(a.timeout_s)}"
    print(f"tidegate drain: {what}; not drained:", file=sys.stderr, flush=True)
    for p in left:
        print(f"  replica/{p.replica_id} {render.progress_line(p, 0).split(' ', 1)[1]}", file=sys.stderr,
              flush=True)
    for rid in missing:
        print(f"  replica/{rid}: no drain status", file=sys.stderr, flush=True)
    if outcome == "interrupted":
        print("the drain continues on the control plane; `tidegate uncordon` cancels it", file=sys.stderr,
              flush=True)
    return exitcodes.worst([code, exitcodes.TIMEOUT])


def run(args: argparse.Namespace) -> int:
    try:
        args.selector_msg = build_selector(args.replica_ids, args.selector)
        args.timeout_s = parse_duration(args.timeout)
        args.grace_s = parse_duration(args.grace_period)
    except ValueError as e:
        return usage_error(args, str(e))
    if args.timeout_s <= 0:
        return usage_error(args, "--timeout must be positive")
    return execute(args, _drain)
