"""The frame `tidegate top` shows: pools, then replicas (rich renderables, no I/O)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tidegate.ops import render
from tidegate.ops.selectors import state_name
from tidegate.v1 import admin_pb2

# Colour only tells; the state name is always printed, so a monochrome terminal loses nothing.
STATE_STYLE = {"ready": "green", "degraded": "yellow", "joining": "cyan", "cordoned": "magenta",
               "draining": "magenta", "drained": "blue", "ejected": "bold red", "stale": "red"}

# Below this width the frame keeps only the columns an operator needs at a glance.
FULL_WIDTH = 170
COMPACT_REPLICA = ("ID", "STATE", "WEIGHT", "KV", "QUEUE(REQ/TOK)", "RUNNING", "TTFT-P95", "REPORT-AGE")
SHORT = {"QUEUE(REQ/TOK)": "QUEUE", "RUNNING": "RUN", "REPORT-AGE": "AGE", "TTFT-P95": "TTFT95"}
COMPACT_POOL = ("POOL", "REPLICAS", "AVAILABLE", "STATES", "DEMAND(RPS)", "SLO")


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", expand=False, box=None, pad_edge=False)


def frame(pools: admin_pb2.ListPoolsResponse, replicas: admin_pb2.ListReplicasResponse, *,
          header: str, error: str = "", width: int = FULL_WIDTH) -> Group:
    compact = width < FULL_WIDTH
    title = Text(header, style="bold")
    if error:
        title.append(f"  ({error})", style="bold red")

    pool_cols = [i for i, h in enumerate(render.POOL_HEADERS) if not compact or h in COMPACT_POOL]
    pt = _table("Pools")
    for i in pool_cols:
        pt.add_column(render.POOL_HEADERS[i], no_wrap=True)
    for p in sorted(pools.pools, key=lambda p: p.pool):
        row = render.pool_row(p)
        pt.add_row(*(row[i] for i in pool_cols))

    headers = render.REPLICA_HEADERS + ("REASON",)
    rep_cols = [i for i, h in enumerate(headers) if not compact or h in COMPACT_REPLICA]
    state_col = headers.index("STATE")
    rt = _table("Replicas")
    for i in rep_cols:
        h = headers[i]
        rt.add_column(SHORT.get(h, h) if compact else h, no_wrap=h != "REASON")
    for s in sorted(replicas.replicas, key=lambda s: (s.pool, s.replica_id)):
        row = render.replica_row(s) + [s.reason or "-"]
        style = STATE_STYLE.get(state_name(s.state), "")
        rt.add_row(*(Text(row[i], style=style if i == state_col else "") for i in rep_cols))
    return Group(title, Text(""), pt, Text(""), rt)
