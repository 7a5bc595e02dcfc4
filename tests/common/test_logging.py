"""Structured logging: key=value text or one JSON object per line, with fields."""

from __future__ import annotations

import json
import logging

from services.common.logging import get_logger, setup_logging


def _capture(as_json: bool, capsys) -> str:
    setup_logging("INFO", as_json=as_json)
    log = get_logger("test")
    log.info("history opened", extra={"fields": {"request_id": "r1", "rows": 42}})
    log.debug("hidden")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    return capsys.readouterr().err


def test_text_lines_carry_fields(capsys) -> None:
    err = _capture(False, capsys)
    first = err.splitlines()[0]
    assert "INFO" in first and "dhisparse.test: history opened" in first
    assert "request_id=r1" in first and "rows=42" in first
    assert "hidden" not in err and "ValueError: boom" in err


def test_json_lines_parse(capsys) -> None:
    err = _capture(True, capsys)
    records = [json.loads(line) for line in err.splitlines()]
    assert records[0]["msg"] == "history opened" and records[0]["rows"] == 42
    assert records[0]["level"] == "INFO" and records[0]["logger"] == "dhisparse.test"
    assert "ValueError: boom" in records[1]["exc"]
    logging.getLogger("dhisparse").handlers.clear()
