"""Rendering of CLI results (one line of sorted JSON, or a text table) and
writing them out."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

__all__ = ["render", "write_all"]

# The list table: what an operator scans for. `code` says why a task waits
# or how it ended; `attempts` and `llm_calls` are used/limit.
_TASK_COLUMNS = (
    "id",
    "status",
    "delivery_status",
    "owner",
    "tenant",
    "code",
    "attempts",
    "llm_calls",
    "updated_at",
)

# The history table: when, what moved, why and for whom; grants last.
_EVENT_COLUMNS = (
    "at",
    "kind",
    "from_state",
    "to_state",
    "code",
    "worker",
    "granted_calls",
    "granted_tokens",
    "granted_cost_micros",
)


def _json_line(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def _cell(value: Any, key: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and (key == "at" or key.endswith("_at")):
        return _utc(value)
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _number(value: float) -> str:
    """A float as the JSON line has it in substance: never rounded to zero
    (a timeout of 0.0004 s read 0.000), never hundreds of digits."""
    return f"{value:.12g}"


def _utc(seconds: float) -> str:
    """A timestamp as people read it (UTC, milliseconds); the raw number when
    it lies outside what a calendar date can show."""
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return _number(seconds)


def _task_row(task: dict[str, Any]) -> dict[str, Any]:
    def used_of(used: Any, limit: Any) -> str:
        return f"{used}/{'-' if limit is None else limit}"

    return {
        **task,
        "code": task.get("park_code") or task.get("terminal_code"),
        "attempts": used_of(task.get("attempt_count"), task.get("max_attempts")),
        "llm_calls": used_of(task.get("llm_calls_used"), task.get("llm_calls_budget")),
    }


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> list[str]:
    cells = [[_cell(row.get(c), c) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return lines


def _flatten(mapping: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    flat: list[tuple[str, Any]] = []
    for key in sorted(mapping):
        value = mapping[key]
        if isinstance(value, dict):
            flat += _flatten(value, f"{prefix}{key}.")
        else:
            flat.append((f"{prefix}{key}", value))
    return flat


def _pairs(mapping: dict[str, Any]) -> list[str]:
    flat = _flatten(mapping)
    width = max((len(k) for k, _ in flat), default=0)
    return [f"{key.ljust(width)}  {_cell(value, key)}" for key, value in flat]


def _text(payload: dict[str, Any]) -> list[str]:
    body = {k: v for k, v in payload.items() if k != "ok"}
    lines: list[str] = []
    for key, value in body.items():
        if key == "next_after":
            # A person is told how to ask for the next page, only if full.
            if value is not None:
                lines.append(f"next page: --after {value}")
            continue
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            lines.append(f"{key}: {len(value)}")
            if value:
                if key == "tasks":
                    lines += _table([_task_row(t) for t in value], _TASK_COLUMNS)
                elif key == "events":
                    lines += _table(value, _EVENT_COLUMNS)
                else:
                    lines += _table(value, tuple(value[0]))
        elif isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {line}" for line in _pairs(value)]
        else:
            lines.append(f"{key}: {_cell(value)}")
    return lines


def render(payload: dict[str, Any], fmt: str = "json") -> str:
    """``payload`` as one JSON line (sorted keys) or as readable text,
    newline included."""
    if fmt == "text":
        return "\n".join(_text(payload)) + "\n"
    return _json_line(payload) + "\n"


def write_all(text: str) -> None:
    """Writes ``text`` to standard output, every byte or an error. Python's
    buffered writer reports a reader that left halfway (``| head``) by
    returning a short count, not by raising, so a cut-off answer looked
    written; here the bytes go to the descriptor, each count checked, and
    the write after a short one raises (a broken pipe)."""
    out = sys.stdout
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):  # not a file (a test's buffer)
        out.write(text)
        out.flush()
        return
    out.flush()
    data = memoryview(text.encode(out.encoding or "utf-8", out.errors or "strict"))
    while data:
        data = data[os.write(fd, data) :]


def doctor_text(report: dict[str, Any]) -> list[str]:
    """What ``doctor --format text`` says: the verdict, then each problem."""
    verdict = "healthy" if report["healthy"] else "UNHEALTHY"
    lines = [
        f"ledger: {verdict} (schema v{report['schema_version']}, "
        f"{_count(report['task_count'], 'task')}, {_count(report['event_count'], 'event')})"
    ]
    if report["quick_check"] != "ok":
        lines.append("  SQLite quick_check failed: the file is damaged")
    if not report["schema_ok"]:
        lines.append("  the schema is not exactly taskwarden's")
    problems = {
        k: v
        for k, v in report.items()
        if k.endswith("_count") and v and k not in ("task_count", "event_count")
    }
    lines += [
        f"  {key.removesuffix('_count').replace('_', ' ')}: {n}" for key, n in problems.items()
    ]
    for label, key in (
        ("tasks by status", "task_status_counts"),
        ("deliveries", "delivery_status_counts"),
    ):
        counts = ", ".join(f"{k} {v}" for k, v in report.get(key, {}).items() if v)
        lines.append(f"{label}: {counts or 'none'}")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
