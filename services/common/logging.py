"""Structured logging for every service: key=value text or one JSON object per line.

    log = get_logger("kvstore")
    log.info("history opened", extra={"fields": {"request_id": rid, "rows": n}})
"""

from __future__ import annotations

import json
import logging
import sys
import time

_RESERVED = set(vars(logging.makeLogRecord({})))


class _Formatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, "fields", {}) or {})
        fields.update({k: v for k, v in vars(record).items()
                       if k not in _RESERVED and k != "fields"})
        base = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.as_json:
            base.update(fields)
            if record.exc_info:
                base["exc"] = self.formatException(record.exc_info)
            return json.dumps(base, default=str)
        text = f"{base['ts']} {base['level']:<7} {base['logger']}: {base['msg']}"
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(level: str = "INFO", as_json: bool = False) -> None:
    """Configure the root ``dhisparse`` logger once per process (idempotent)."""
    root = logging.getLogger("dhisparse")
    root.setLevel(level.upper())
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(as_json))
    root.addHandler(handler)
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    """A child of the ``dhisparse`` logger."""
    return logging.getLogger(f"dhisparse.{name}")
