"""The taskwarden CLI (its help text is ``ABOUT`` and ``OUTPUTS`` below)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from ._fleet_cli import FLEET_COMMANDS, add_fleet_commands, fleet_command, given, task_answer
from ._output import doctor_text, render, write_all
from ._parser import (
    MAX_SNAPSHOT_MIB,
    SafeArgumentParser,
    add_global_options,
    add_lifecycle_commands,
    add_recovery_commands,
    common_options,
    in_flags,
    reading_options,
    snapshot_bytes,
)
from .errors import InvalidInput, LedgerError, StateConflict
from .ledger import Ledger

__all__ = ["build_parser", "main"]

# 1 is a "no" the command was asked to find out: an unhealthy file, a refused charge.
EXIT_OK, EXIT_NO, EXIT_LEDGER_ERROR, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by SIGINT

# Help text lives here, not in the docstring: `python -OO` drops docstrings.
ABOUT = "taskwarden: the task-state ledger for AI-agent fleets, from the shell."
OUTPUTS = """Every command prints one line of JSON with sorted keys (or a readable table
with --format text; an error's text also says why). Exit codes: 0 ok, 1 the
answer is no (an unhealthy doctor, a refused charge), 2 ledger error (bad
input, conflict, busy, missing task), 3 internal error (or an answer that
could not be written), 130 interrupted (Ctrl-C). Rejected arguments are never
echoed back. Only init and create make a missing ledger: every other command
refuses a missing or empty file. Input the arguments alone show to be bad
writes nothing, not even a new file. close, delivery and a transition to an
ending status judge a reason code after the open, against the stored task, as
the peer does; block, escalate and other transitions refuse one outside the
registry before opening anything."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (commands are added per capability)."""
    parser = SafeArgumentParser(prog="taskwarden", description=ABOUT, epilog=OUTPUTS)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common, reading = common_options(), reading_options()
    add_lifecycle_commands(sub, common, reading)
    add_fleet_commands(sub, common, reading)
    add_recovery_commands(sub, common, reading)
    return parser


# The commands that make a missing ledger. Every other one refuses a path
# with no file, or an empty file, rather than answer for a new ledger: a
# mistyped --db in a nightly reconcile, purge or doctor was a green run on a
# stray empty file for ever, and doctor wrote a schema over a file emptied
# to 0 bytes, the evidence an operator was about to look at.
_MAKES_A_LEDGER = frozenset({"init", "create"})


def _open(args: argparse.Namespace, *, read_only: bool = False, **options: Any) -> Ledger:
    if args.db is None:
        raise InvalidInput("--db is required for this command")
    # Checked whether or not it is used: a bad number is bad input either way.
    if not 0 <= getattr(args, "snapshot_max_mib", 0) <= MAX_SNAPSHOT_MIB:
        raise InvalidInput("snapshot size is out of range")
    if getattr(args, "scratch", False):
        return Ledger.in_memory(busy_timeout_ms=args.busy_timeout_ms)
    if getattr(args, "read_only", False):
        read_only = True
        options["snapshot_max_bytes"] = snapshot_bytes(args)
    elif hasattr(args, "read_only") and not read_only:
        return _open_for_reading(args, **options)
    if not read_only:
        options["create"] = args.command in _MAKES_A_LEDGER
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
    open refuses, is read through a read-only private copy instead. A
    missing or empty file is refused (see `_MAKES_A_LEDGER`), doctor's too,
    where the peer's made one and called it healthy."""
    opened = functools.partial(
        Ledger,
        args.db,
        allow_external_acl=args.allow_external_acl,
        busy_timeout_ms=args.busy_timeout_ms,
    )
    try:
        return opened(migrate=False, create=False, **options)
    except StateConflict as refused:
        # The copy's refusal is the one to report: it is why the file
        # cannot be read (a task-state-guard file over the copy's cap, say).
        try:
            return opened(read_only=True, snapshot_max_bytes=snapshot_bytes(args))
        except InvalidInput:
            # The copy refused how the file is kept (a mode a writable open
            # tightens on a ledger it accepts): the first refusal says why.
            raise refused from None
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
        return task_answer(
            ledger.set_delivery(
                args.task_id, args.status, code=args.code, worker=args.worker, attempt=args.attempt
            )
        )


def _cmd_reconcile(args: argparse.Namespace) -> dict[str, Any]:
    options = {"snapshot_max_bytes": snapshot_bytes(args)}
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
    return {**report, "_no": report["healthy"] is not True, "_explain": doctor_text(report)}


def _cmd_purge(args: argparse.Namespace) -> dict[str, Any]:
    options = {"snapshot_max_bytes": snapshot_bytes(args)} if args.dry_run else {}
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
        answered_no = payload.pop("_no", False)
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
    return EXIT_NO if answered_no else EXIT_OK


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
    that holds no id, path or value (SPEC 2.4), argparse's is cut to one,
    and it names the flag the person typed, not the API's parameter."""
    payload: dict[str, Any] = {"ok": False, "error": type(exc).__name__}
    if fmt == "text" and str(exc):
        payload["reason"] = in_flags(str(exc))
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
