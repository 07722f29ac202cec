"""What every operations command shares: connection flags, config, target resolution, running the
async body with signal handling, and mapping errors to exit codes (tidegate.ops.exitcodes)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from tidegate import config, logs
from tidegate.fleet import endpoints as endpoints_file
from tidegate.ops import exitcodes
from tidegate.ops.client import AdminClient, AdminError
from tidegate.ops.target import TargetError, resolve

SECTION = "ops"


class OpsConfig(config.ConfigBase):
    log_level: str = Field("warning", description="Log level: debug, info, warning, error.")
    controlplane: tuple[str, ...] = Field(
        (), description="Control-plane admin addresses, comma-separated host:port, tried in order until one "
                        "answers (default: the endpoints file's control planes).")
    endpoints_file: Path | None = Field(
        None, description="Endpoints file written by `tidegate up` (default: $TIDEGATE_HOME/endpoints.json "
                          "or ~/.local/state/tidegate/endpoints.json).")
    token_file: Path | None = Field(
        None, description="File holding the admin API token (default: $TIDEGATE_TOKEN, else the endpoints "
                          "file's operator token, else its viewer token).")
    rpc_timeout_s: float = Field(5.0, gt=0, description="Timeout of each admin call, seconds.")

    @field_validator("controlplane", mode="before")
    @classmethod
    def _endpoints(cls, v: Any) -> tuple[str, ...]:
        return config.parse_endpoints(v)


def add_common_flags(parser: argparse.ArgumentParser, *, output: tuple[str, ...] = ("json",)) -> None:
    config.add_flags(parser, OpsConfig)
    if output:
        parser.add_argument("-o", "--output", choices=output, default=None,
                            help="Output format (default: a table for people).")


@dataclass
class Context:
    cfg: OpsConfig
    client: AdminClient
    stop: asyncio.Event
    args: argparse.Namespace

    def out(self, text: str) -> None:
        print(text, flush=True)

    def err(self, text: str) -> None:
        print(f"tidegate {self.args.command}: {text}", file=sys.stderr, flush=True)


Body = Callable[[Context], Awaitable[int]]


def usage_error(args: argparse.Namespace, message: str) -> int:
    print(f"tidegate {args.command}: {message}", file=sys.stderr, flush=True)
    return exitcodes.USAGE


def execute(args: argparse.Namespace, body: Body) -> int:
    """The composition root of every operations command."""
    try:
        cfg = config.load(OpsConfig, SECTION, args, getattr(args, "config", None))
    except config.ConfigError as e:
        return usage_error(args, str(e))
    logs.configure(cfg.log_level, cfg.log_json, process="cli")
    try:
        target = resolve(controlplane=cfg.controlplane, endpoints_file=cfg.endpoints_file,
                         token_file=cfg.token_file, environ=os.environ,
                         default_endpoints_file=endpoints_file.default_path(),
                         read_endpoints=endpoints_file.read, read_text=lambda p: p.read_text())
    except TargetError as e:
        print(f"tidegate {args.command}: {e}", file=sys.stderr, flush=True)
        return exitcodes.AUTH if e.auth else exitcodes.USAGE

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with AdminClient(target.addresses, target.token, timeout_s=cfg.rpc_timeout_s) as client:
            try:
                return await body(Context(cfg, client, stop, args))
            except AdminError as e:
                msg = str(e)
                if e.exit_code == exitcodes.AUTH:
                    msg += f" [token from {target.token_source}]"
                print(f"tidegate {args.command}: {msg}", file=sys.stderr, flush=True)
                return e.exit_code

    return asyncio.run(main())


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep; True when stop was set meanwhile (SIGINT/SIGTERM)."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
