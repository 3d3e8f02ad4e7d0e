"""Process logging: text lines for people, JSON lines for machines.

:func:`setup_logging` installs one handler on the root logger (replacing the one it
installed before, so calling it again is safe). Fields passed with ``extra=`` travel with
the record: JSON output carries them as top-level keys, text output appends them as
``key=value`` pairs.

>>> import io, json, logging
>>> buf = io.StringIO()
>>> setup_logging("info", "json", stream=buf)
>>> logging.getLogger("magnetar.demo").info("listening", extra={"port": 6650})
>>> rec = json.loads(buf.getvalue())
>>> rec["level"], rec["logger"], rec["msg"], rec["port"]
('info', 'magnetar.demo', 'listening', 6650)
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "setup_logging", "LEVELS"]

#: Accepted level names (case-insensitive) and the :mod:`logging` level each maps to.
LEVELS = {
    "trace": 5,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

logging.addLevelName(5, "TRACE")

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def _timestamp(created: float) -> str:
    secs = int(created)
    millis = int((created - secs) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{millis:03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, then extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``2026-01-01T00:00:00.000Z INFO  logger: message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record.created)} {record.levelname:<5} {record.name}: {record.getMessage()}"
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                                   for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class _MagnetarHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler :func:`setup_logging` owns, so a second call replaces it."""


def setup_logging(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Configure the root logger: ``level`` (trace, debug, info, warning, error, critical)
    and ``fmt`` ("text" or "json"); output goes to ``stream`` (default stderr).

    Raises :class:`ValueError` for an unknown level or format.
    """
    try:
        numeric = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r} (expected one of {', '.join(LEVELS)})") from None
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
    elif fmt == "text":
        formatter = TextFormatter()
    else:
        raise ValueError(f"unknown log format {fmt!r} (expected text or json)")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _MagnetarHandler)]:
        root.removeHandler(old)
        old.close()
    handler = _MagnetarHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(numeric)
