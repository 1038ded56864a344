"""The CLI's argument parser: global options, the options shared by
commands, and the peer's commands with the retention ones (the fleet's
commands are in ``_fleet_cli``). Refusals never echo what was typed."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from . import _core
from ._fleet_cli import add_fence, add_task_id, codes_help
from .compat import DELIVERY_REASON_CODES, TASK_REASON_CODES
from .errors import InvalidInput
from .models import DeliveryStatus, TaskStatus

# The terminal statuses, and the aliases of any of them ("completed").
_TERMINAL = [s.value for s in TaskStatus if s.is_terminal] + [
    alias for alias, to in _core.STATUS_ALIASES.items() if TaskStatus(to).is_terminal
]
# The read-only copy's default cap, as the core has it, in MiB.
_DEFAULT_SNAPSHOT_MIB = _core.DEFAULT_SNAPSHOT_MAX_BYTES >> 20
# The largest --snapshot-max-mib whose byte count the core can hold.
MAX_SNAPSHOT_MIB = (2**63 - 1) >> 20
_DELIVERY = [s.value for s in DeliveryStatus if s is not DeliveryStatus.PENDING]


class SafeArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors never echo what was typed."""

    def error(self, message: str) -> NoReturn:
        raise InvalidInput(_without_values(message))


# argparse complaints that name only this parser's own arguments.
_VALUE_FREE = ("expected one argument", "not allowed with argument ", "may be given once")


class _GivenOnce(argparse.Action):
    """An option that argparse would let a second use overwrite in silence:
    `--worker-lost a --worker-lost b` acted on b alone."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if getattr(namespace, self.dest) is not None:
            raise argparse.ArgumentError(self, "may be given once (run it once per value)")
        setattr(namespace, self.dest, values)


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
        if not detail.startswith("invalid choice"):
            return f"argument {name}: invalid value"
        # The choices are this parser's own names: the last "(choose from"
        # is argparse's, whatever the typed value held.
        _, found, choices = detail.rpartition(" (choose from ")
        return f"argument {name}: invalid choice" + (f" (choose from {choices}" if found else "")
    if message.startswith("unrecognized arguments"):
        return "unrecognized arguments"
    return "invalid command-line arguments"


# The API parameters a ledger refusal begins with ("limit must be between
# 1 and 10000"), each with the flag a CLI user types for it: the library's
# words name its parameters, the CLI's must name its flags.
_FLAG_OF_PARAMETER = {
    "payload_hash": "--payload-sha256",
    **{
        name: "--" + name.replace("_", "-")
        for name in (
            "llm_calls_budget",
            "token_budget",
            "cost_budget_micros",
            "max_attempts",
            "timeout_seconds",
            "attempt",
            "calls",
            "tokens",
            "cost_micros",
            "code",
            "limit",
            "tenant",
            "owner",
            "worker",
            "parent_id",
            "after",
            "active_grace_seconds",
            "delivery_grace_seconds",
            "worker_lost",
            "older_than_seconds",
            "busy_timeout_ms",
        )
    },
}
# The one refusal that names the API parameter beside the flag.
_CAP_NAMED_TWICE = ("(snapshot_max_bytes, CLI --snapshot-max-mib)", "(--snapshot-max-mib)")


def in_flags(reason: str) -> str:
    """A ledger refusal's reason as the CLI user reads it: the parameter it
    begins with becomes the flag typed for it. Only a name followed by its
    rule ("must ...", "is ...") is one parameter: "task id must be a valid
    UUID" stays as it is."""
    reason = reason.replace(*_CAP_NAMED_TWICE)
    name, _, rule = reason.partition(" ")
    if name in _FLAG_OF_PARAMETER and rule.startswith(("must ", "is ")):
        return f"{_FLAG_OF_PARAMETER[name]} {rule}"
    return reason


def common_options() -> argparse.ArgumentParser:
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


def snapshot_bytes(args: argparse.Namespace) -> int:
    return int(args.snapshot_max_mib) * 1024 * 1024


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=["json", "text"],
        default=argparse.SUPPRESS,
        help="output format (default json)",
    )


def add_lifecycle_commands(
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
    add_fence(close, ended=True)

    delivery = sub.add_parser("delivery", parents=[common], help="record a delivery outcome")
    add_task_id(delivery)
    delivery.add_argument("--status", required=True, choices=_DELIVERY, help="the outcome")
    delivery.add_argument("--code", help=codes_help(DELIVERY_REASON_CODES, "outcome"))
    add_fence(delivery, ended=True)


def add_recovery_commands(
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
        action=_GivenOnce,
        help="also time out this worker's running tasks now; the pass still times out "
        "every task past its deadline or silent past the grace, whoever runs it "
        "(one worker per pass)",
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


def reading_options() -> argparse.ArgumentParser:
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


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The options taken before the command."""
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
