"""Logging set-up: structlog, JSON when stderr is not a terminal, key=value on one.

Every line carries the node name; key=value lines are written without terminal control sequences
(reporter.terminal). A processor blanks any field whose name says it holds a secret
(token, authorization, password, kubeconfig content), so a careless `log.info(..., token=t)` cannot
leak one; messages are written never to include them in the first place.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO, cast

import structlog
from structlog.typing import EventDict, WrappedLogger

from reporter.terminal import TerminalStream

_SECRET_FIELDS = ("token", "authorization", "password", "secret", "kubeconfig_content", "cert")


def redact_secrets(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Replace the value of any field whose name says it is a secret."""
    for name in event_dict:
        if any(s in name.lower() for s in _SECRET_FIELDS):
            event_dict[name] = "[redacted]"
    return event_dict


def configure(
    *, log_format: str, level: str, node: str | None, stream: TextIO | None = None
) -> None:
    """Configure structlog for the process: format auto/json/console, a level, the node name."""
    out = stream or sys.stderr
    as_json = log_format == "json" or (log_format == "auto" and not out.isatty())

    def add_node(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        event_dict.setdefault("node", node)
        return event_dict

    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=False, sort_keys=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_node,
            redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # On a terminal a line can quote the cluster (an API server's message): written through
        # TerminalStream, it cannot carry escape sequences. JSON escapes them itself. PrintLogger
        # only writes and flushes, which is all TerminalStream has.
        logger_factory=structlog.PrintLoggerFactory(
            out if as_json else cast(TextIO, TerminalStream(out))
        ),
        cache_logger_on_first_use=False,
    )
