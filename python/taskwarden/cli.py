"""taskwarden: the task-state ledger for AI-agent fleets, from the shell.

Every command prints one line of JSON with sorted keys (or a readable table
with --format text; an error's text also says why). Exit codes: 0 ok, 1
unhealthy doctor, 2 ledger error (bad input, conflict, busy, missing task), 3
internal error (or an answer that could not be written), 130 interrupted
(Ctrl-C). Rejected arguments are never echoed back, and bad input writes
nothing: not even a new file.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from . import __version__, _core
from ._fleet_cli import (
    FLEET_COMMANDS,
    add_fence,
    add_fleet_commands,
    add_task_id,
    codes_help,
    fleet_command,
    given,
    task_answer,
)
from ._output import render, write_all
from .compat import DELIVERY_REASON_CODES, TASK_REASON_CODES
from .errors import InvalidInput, LedgerError, StateConflict
from .ledger import Ledger
from .models import DeliveryStatus, TaskStatus

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_UNHEALTHY, EXIT_LEDGER_ERROR, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by SIGINT

# The terminal statuses, and the aliases of any of them ("completed").
_TERMINAL = [s.value for s in TaskStatus if s.is_terminal] + [
    alias for alias, to in _core.STATUS_ALIASES.items() if TaskStatus(to).is_terminal
]
# The read-only copy's default cap, as the core has it, in MiB.
_DEFAULT_SNAPSHOT_MIB = _core.DEFAULT_SNAPSHOT_MAX_BYTES >> 20
# The largest --snapshot-max-mib whose byte count the core can hold.
_MAX_SNAPSHOT_MIB = (2**63 - 1) >> 20
_DELIVERY = [s.value for s in DeliveryStatus if s is not DeliveryStatus.PENDING]


class SafeArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors never echo what was typed."""

    def error(self, message: str) -> NoReturn:
        raise InvalidInput(_without_values(message))


# argparse complaints that name only this parser's own arguments.
_VALUE_FREE = ("expected one argument", "not allowed with argument ")


def _without_values(message: str) -> str:
    """argparse's complaint, cut before anything the user typed: what comes
    before "argument X:" and the list of missing arguments are the parser's
    own names; invalid values and unknown arguments are the user's."""
    if message.startswith("the following arguments are required: "):
        return message
    if message.startswith("argument ") and ": " in message:
        name, detail = message[len("argument ") :].split(": ", 1)
        if detail.startswith(_VALUE_FREE):
            return message
        kind = "choice" if detail.startswith("invalid choice") else "value"
        return f"argument {name}: invalid {kind}"
    if message.startswith("unrecognized arguments"):
        return "unrecognized arguments"
    return "invalid command-line arguments"


def _common() -> argparse.ArgumentParser:
    """--format and --db, taken after the command as well as before it
    (unset ones keep what was given before: argparse would otherwise let
    a command's default replace it)."""
    common = SafeArgumentParser(add_help=False)
    _add_format(common)
    common.add_argument(
        "--db", metavar="PATH", default=argparse.SUPPRESS, help="path of the ledger file"
    )
    return common


def _add_snapshot_cap(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--snapshot-max-mib",
        type=int,
        default=_DEFAULT_SNAPSHOT_MIB,
        help=f"{what} (default {_DEFAULT_SNAPSHOT_MIB})",
    )


def _snapshot_bytes(args: argparse.Namespace) -> int:
    return int(args.snapshot_max_mib) * 1024 * 1024


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=["json", "text"],
        default=argparse.SUPPRESS,
        help="output format (default json)",
    )


def _add_lifecycle(
    sub: Any, common: argparse.ArgumentParser, reading: argparse.ArgumentParser
) -> None:
    sub.add_parser("init", parents=[common], help="create (or migrate) the ledger file")

    create = sub.add_parser("create", parents=[common], help="create a task (idempotent by id)")
    create.add_argument("--task-id", help="caller-chosen UUID (default a new time-ordered one)")
    create.add_argument("--parent-id", help="UUID of an existing parent task")
    create.add_argument(
        "--payload-sha256", help="lowercase SHA-256 of the payload (never the payload)"
    )
    create.add_argument(
        "--timeout-seconds", type=float, help="deadline after each start (default none)"
    )
    create.add_argument("--internal", action="store_true", help="no direct delivery expected")
    create.add_argument("--tenant", help="tenant id: 1-128 of [A-Za-z0-9._:@-]")
    calls = create.add_mutually_exclusive_group()
    calls.add_argument("--llm-calls-budget", type=int, help="LLM-call limit (default 25)")
    calls.add_argument("--unlimited-calls", action="store_true", help="no LLM-call limit")
    create.add_argument("--token-budget", type=int, help="token limit (default unlimited)")
    create.add_argument(
        "--cost-budget-micros", type=int, help="cost limit in micro-units (default unlimited)"
    )
    create.add_argument(
        "--max-attempts",
        type=int,
        help="starts (claims, start, queued -> running) before a release escalates (default 3)",
    )

    start = sub.add_parser("start", parents=[common], help="queued -> running")
    add_task_id(start)
    get = sub.add_parser("get", parents=[common, reading], help="show one task")
    add_task_id(get)
    events = sub.add_parser(
        "events", parents=[common, reading], help="show a task's history, oldest first"
    )
    add_task_id(events)

    heartbeat = sub.add_parser("heartbeat", parents=[common], help="mark a running task alive")
    add_task_id(heartbeat)
    add_fence(heartbeat)

    close = sub.add_parser("close", parents=[common], help="move a task to a terminal status")
    add_task_id(close)
    close.add_argument("--status", required=True, choices=_TERMINAL, help="the terminal status")
    terminal_codes = {to: c for to, c in TASK_REASON_CODES.items() if to.is_terminal}
    close.add_argument("--code", help=codes_help(terminal_codes))
    add_fence(close)

    delivery = sub.add_parser("delivery", parents=[common], help="record a delivery outcome")
    add_task_id(delivery)
    delivery.add_argument("--status", required=True, choices=_DELIVERY, help="the outcome")
    delivery.add_argument("--code", help=codes_help(DELIVERY_REASON_CODES, "outcome"))


def _add_recovery(
    sub: Any, common: argparse.ArgumentParser, reading: argparse.ArgumentParser
) -> None:
    rec = sub.add_parser(
        "reconcile",
        parents=[common],
        help="time out lost running tasks and expired deliveries (--dry-run: preview)",
    )
    rec.add_argument(
        "--active-grace-seconds",
        type=float,
        default=600.0,
        help="time out a running task silent this long (default 600, ten minutes)",
    )
    rec.add_argument(
        "--delivery-grace-seconds",
        type=float,
        default=600.0,
        help="close for good a pending delivery of a task that ended this long ago "
        "(default 600, ten minutes; it cannot be marked delivered afterwards)",
    )
    rec.add_argument(
        "--dry-run", action="store_true", help="read-only preview: counts, nothing written"
    )
    rec.add_argument(
        "--worker-lost",
        help="also time out this worker's running tasks now (the graces still apply to "
        "all tasks: give large ones to act on this worker's alone)",
    )
    rec.add_argument("--tenant", help="only this tenant's tasks")
    _add_snapshot_cap(rec, "largest file a dry run copies into memory")
    sub.add_parser(
        "doctor",
        parents=[common, reading],
        help="integrity and consistency check (exit 1 if unhealthy)",
    )
    purge = sub.add_parser(
        "purge", parents=[common], help="remove fully closed task trees older than a cutoff"
    )
    purge.add_argument(
        "--older-than-seconds",
        type=float,
        required=True,
        help="last change at least this long ago",
    )
    purge.add_argument(
        "--dry-run", action="store_true", help="read-only preview: counts, nothing written"
    )
    purge.add_argument("--tenant", help="only this tenant's trees")
    _add_snapshot_cap(purge, "largest file a dry run copies into memory")
    stats = sub.add_parser(
        "stats", parents=[common, reading], help="counts by status, delivery, tenant"
    )
    stats.add_argument("--tenant", help="only this tenant's tasks")
    demo = sub.add_parser(
        "demo", parents=[common], help="a synthetic restart: preview, apply, recheck"
    )
    demo.add_argument(
        "--keep-db",
        metavar="PATH",
        help="build the demo ledger here, a path that does not exist yet, and keep it "
        "(the global --db does the same)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (commands are added per capability)."""
    about, outputs = __doc__.split("\n\n")[:2]
    parser = SafeArgumentParser(prog="taskwarden", description=about, epilog=outputs)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--db", metavar="PATH", help="path of the ledger file")
    _add_format(parser)
    parser.add_argument(
        "--allow-external-acl",
        action="store_true",
        help="confirm an externally secured directory on platforms without POSIX modes",
    )
    parser.add_argument(
        "--busy-timeout-ms", type=int, default=5000, help="lock wait (default 5000)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common()
    reading = _reading()
    _add_lifecycle(sub, common, reading)
    add_fleet_commands(sub, common, reading)
    _add_recovery(sub, common, reading)
    return parser


def _reading() -> argparse.ArgumentParser:
    """The options of every command that only reads."""
    reading = SafeArgumentParser(add_help=False)
    reading.add_argument(
        "--read-only",
        action="store_true",
        help="never create, migrate or touch the file (a closed file is read from a "
        "private copy, one another process has open in place)",
    )
    _add_snapshot_cap(
        reading,
        "largest file read through a private copy: with --read-only, "
        "and a task-state-guard file always",
    )
    return reading


def _open(args: argparse.Namespace, *, read_only: bool = False, **options: Any) -> Ledger:
    if args.db is None:
        raise InvalidInput("--db is required for this command")
    # Checked whether or not it is used: a bad number is bad input either way.
    if not 0 <= getattr(args, "snapshot_max_mib", 0) <= _MAX_SNAPSHOT_MIB:
        raise InvalidInput("snapshot size is out of range")
    if getattr(args, "scratch", False):
        return Ledger.in_memory(busy_timeout_ms=args.busy_timeout_ms)
    if getattr(args, "read_only", False):
        read_only = True
        options["snapshot_max_bytes"] = _snapshot_bytes(args)
    elif hasattr(args, "read_only") and not read_only:
        return _open_for_reading(args, **options)
    return Ledger(
        args.db,
        allow_external_acl=args.allow_external_acl,
        busy_timeout_ms=args.busy_timeout_ms,
        read_only=read_only,
        **options,
    )


def _open_for_reading(args: argparse.Namespace, **options: Any) -> Ledger:
    """A reading command without --read-only opens the file writable, as the
    peer's doctor does, but never migrates a task-state-guard file (one way:
    the peer could not open it again). Such a file, or any other a writable
    open refuses, is read through a read-only private copy instead. Only
    doctor (as the peer's) makes a missing file; the others refuse it, so a
    mistyped path is not answered as an empty ledger."""
    opened = functools.partial(
        Ledger,
        args.db,
        allow_external_acl=args.allow_external_acl,
        busy_timeout_ms=args.busy_timeout_ms,
    )
    try:
        return opened(migrate=False, create=args.command == "doctor", **options)
    except StateConflict as refused:
        # The copy's refusal is the one to report: it is why the file
        # cannot be read (a task-state-guard file over the copy's cap, say).
        try:
            return opened(read_only=True, snapshot_max_bytes=_snapshot_bytes(args))
        except LedgerError as unreadable:
            raise unreadable from refused


def _cmd_init(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return {"ok": True, "storage": ledger.storage_info()}


def _cmd_create(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return task_answer(
            ledger.create_task(
                task_id=args.task_id,
                parent_id=args.parent_id,
                payload_hash=args.payload_sha256,
                timeout_seconds=args.timeout_seconds,
                delivery_required=not args.internal,
                tenant=args.tenant,
                **_calls_budget(args),
                token_budget=args.token_budget,
                cost_budget_micros=args.cost_budget_micros,
                **given(max_attempts=args.max_attempts),
            )
        )


def _calls_budget(args: argparse.Namespace) -> dict[str, Any]:
    """The LLM-call limit as given; none given, the API's default applies."""
    if args.unlimited_calls:
        return {"llm_calls_budget": None}
    return given(llm_calls_budget=args.llm_calls_budget)


def _cmd_start(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return task_answer(ledger.start_task(args.task_id))


def _cmd_get(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return task_answer(ledger.get_task(args.task_id))


def _cmd_events(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return {"ok": True, "events": [e.to_dict() for e in ledger.events(args.task_id)]}


def _cmd_heartbeat(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return task_answer(ledger.heartbeat(args.task_id, worker=args.worker, attempt=args.attempt))


def _cmd_close(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return task_answer(
            ledger.close_task(
                args.task_id, args.status, code=args.code, worker=args.worker, attempt=args.attempt
            )
        )


def _cmd_delivery(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return task_answer(ledger.set_delivery(args.task_id, args.status, code=args.code))


def _cmd_reconcile(args: argparse.Namespace) -> dict[str, Any]:
    options = {"snapshot_max_bytes": _snapshot_bytes(args)}
    with _open(args, read_only=args.dry_run, **options) as ledger:
        report = ledger.reconcile(
            active_grace_seconds=args.active_grace_seconds,
            delivery_grace_seconds=args.delivery_grace_seconds,
            dry_run=args.dry_run,
            worker_lost=args.worker_lost,
            tenant=args.tenant,
        )
    return {"ok": True, "reconcile": report}


def _cmd_doctor(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        report = ledger.doctor()
    return {**report, "_healthy": report["healthy"] is True, "_explain": _doctor_text(report)}


def _doctor_text(report: dict[str, Any]) -> list[str]:
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
    counts = ", ".join(f"{k} {v}" for k, v in report["task_status_counts"].items() if v)
    lines.append(f"tasks by status: {counts or 'none'}")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _cmd_purge(args: argparse.Namespace) -> dict[str, Any]:
    options = {"snapshot_max_bytes": _snapshot_bytes(args)} if args.dry_run else {}
    with _open(args, read_only=args.dry_run, **options) as ledger:
        report = ledger.purge(
            older_than_seconds=args.older_than_seconds, dry_run=args.dry_run, tenant=args.tenant
        )
    return {"ok": True, "purge": report}


def _cmd_stats(args: argparse.Namespace) -> dict[str, Any]:
    with _open(args) as ledger:
        return {"ok": True, "stats": ledger.stats(tenant=args.tenant)}


def _cmd_demo(args: argparse.Namespace) -> dict[str, Any]:
    from .demo import explain, run_demo

    # The global --db names the demo's new ledger too (kept, like --keep-db).
    named = {os.path.abspath(p) for p in (args.keep_db, args.db) if p is not None}
    if len(named) > 1:
        raise InvalidInput("--db and --keep-db name different paths")
    reports = run_demo(
        args.keep_db if args.keep_db is not None else args.db,
        busy_timeout_ms=args.busy_timeout_ms,
        allow_external_acl=args.allow_external_acl,
    )
    return {"ok": True, "demo": reports, "_explain": explain(reports)}


Command = Callable[[argparse.Namespace], dict[str, Any]]

COMMANDS: dict[str, Command] = {
    "init": _cmd_init,
    "create": _cmd_create,
    "start": _cmd_start,
    "get": _cmd_get,
    "events": _cmd_events,
    "heartbeat": _cmd_heartbeat,
    "close": _cmd_close,
    "delivery": _cmd_delivery,
    "reconcile": _cmd_reconcile,
    "demo": _cmd_demo,
    "doctor": _cmd_doctor,
    "purge": _cmd_purge,
    "stats": _cmd_stats,
    **dict.fromkeys(FLEET_COMMANDS, fleet_command(_open)),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        # Ctrl-C while an answer was being written: the command's effect
        # (if any) is committed, the answer cut short; no traceback.
        return EXIT_INTERRUPTED


def _run(argv: Sequence[str] | None) -> int:
    fmt = _format_asked(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        fmt = getattr(args, "format", "json")
        _refuse_bad_input(args)
        payload = COMMANDS[args.command](args)
        healthy = payload.pop("_healthy", True)
        explanation = payload.pop("_explain", None)
    except KeyboardInterrupt:
        _say({"ok": False, "error": "Interrupted"}, fmt)
        return EXIT_INTERRUPTED
    except LedgerError as exc:
        said = _say(_refusal(exc, fmt), fmt)
        return EXIT_LEDGER_ERROR if said else EXIT_INTERNAL
    except Exception:
        _say({"ok": False, "error": "InternalError"}, fmt)
        return EXIT_INTERNAL
    if not _say(payload, fmt, explanation):
        return EXIT_INTERNAL
    return EXIT_OK if healthy else EXIT_UNHEALTHY


def _format_asked(argv: Sequence[str]) -> str:
    """--format as typed, for refusals that come before parsing ends: the
    last one given, as argparse takes it. Like argparse, it takes a
    shortened flag (``--form text``)."""
    asked = "json"
    for flag, following in itertools.pairwise([*argv, ""]):
        if not isinstance(flag, str):  # main(argv) from Python: argparse refuses it
            continue
        name, joined, value = flag.partition("=")
        if len(name) > 2 and "--format".startswith(name):
            asked = value if joined else following
    return "text" if asked == "text" else "json"


def _refusal(exc: LedgerError, fmt: str) -> dict[str, Any]:
    """The peer's JSON line names the error class only. A person reading
    --format text also gets the reason: every ledger message is fixed text
    that holds no id, path or value (SPEC 2.4), argparse's is cut to one."""
    payload: dict[str, Any] = {"ok": False, "error": type(exc).__name__}
    if fmt == "text" and str(exc):
        payload["reason"] = str(exc)
    return payload


def _refuse_bad_input(args: argparse.Namespace) -> None:
    """Runs the command once on a throwaway in-memory ledger first: what the
    core refuses there as bad input is refused before the file is opened,
    so a mistyped argument never creates a file or a folder, nor migrates a
    task-state-guard file. Any other refusal there (a task the empty ledger
    lacks) says nothing about the real file, which is then opened as usual."""
    if args.command == "demo":  # it builds a ledger of its own
        return
    try:
        COMMANDS[args.command](argparse.Namespace(**vars(args), scratch=True))
    except InvalidInput:
        raise
    except LedgerError:
        pass


def _say(payload: dict[str, Any], fmt: str, explanation: list[str] | None = None) -> bool:
    """Writes the answer; False when standard output did not take all of
    it (a closed pipe, a full disk): the caller never got its answer, which
    is an exit 3, never a traceback."""
    text = "\n".join(explanation) + "\n" if fmt == "text" and explanation else render(payload, fmt)
    try:
        write_all(text)
        return True
    except (OSError, ValueError, AttributeError):
        # Python flushes standard output once more at exit; aim it at
        # /dev/null so that flush cannot fail loudly either.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
