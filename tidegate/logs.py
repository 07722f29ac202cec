"""structlog setup: JSON lines when stderr is not a terminal, pretty console otherwise.

Log event names and key/values only. Never log prompts, bodies or auth headers.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", json: bool | None = None, process: str = "tidegate") -> None:
    if json is None:
        json = not sys.stderr.isatty()
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks if json else structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(process=process)
