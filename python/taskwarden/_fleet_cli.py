"""CLI commands of the fleet guard: claims, the state machine, the budget
guard and listing. Registered by ``cli.build_parser``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from . import _core
from ._output import render
from .compat import TASK_REASON_CODES
from .ledger import Ledger
from .models import TaskStatus

__all__ = [
    "FLEET_COMMANDS",
    "add_fence",
    "add_fleet_commands",
    "add_task_id",
    "codes_help",
    "fleet_command",
    "given",
    "task_answer",
]

Opener = Callable[[argparse.Namespace], Ledger]
_STATUSES = [s.value for s in TaskStatus] + list(_core.STATUS_ALIASES)


def add_task_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", help="the task's UUID")


def codes_help(codes: Any, given_for: str = "status", default: str = "none") -> str:
    """The --code help: the codes each target allows, from the core's table."""
    allowed = "; ".join(f"{to}: {', '.join(sorted(c))}" for to, c in codes.items())
    return f"reason code for the {given_for} ({allowed}; default {default})"


def add_fleet_commands(
    sub: Any, common: argparse.ArgumentParser, reading: argparse.ArgumentParser
) -> None:
    """Add claim, claim-next, release, charge, budget, grant, transition,
    block, escalate, requeue, cancel and list (``budget`` and ``list`` only
    read, so they take ``reading``'s --read-only options)."""
    claim = sub.add_parser("claim", parents=[common], help="claim one queued task for a worker")
    add_task_id(claim)
    claim.add_argument("--worker", required=True, help="the claiming worker's name")

    nxt = sub.add_parser("claim-next", parents=[common], help="claim the oldest queued tasks")
    nxt.add_argument("--worker", required=True, help="the claiming worker's name")
    nxt.add_argument("--tenant", help="only this tenant's tasks")
    nxt.add_argument("--limit", type=int, default=1, help="how many, 1-10000 (default 1)")

    release = sub.add_parser("release", parents=[common], help="the owner gives a task back")
    add_task_id(release)
    release.add_argument("--worker", required=True, help="the owner")
    release.add_argument("--attempt", type=int, help="refuse unless this is the current attempt")

    charge = sub.add_parser("charge", parents=[common], help="meter LLM use before a call")
    add_task_id(charge)
    charge.add_argument("--calls", type=int, default=1, help="LLM calls (default 1)")
    charge.add_argument("--tokens", type=int, default=0, help="tokens (default 0)")
    charge.add_argument(
        "--cost-micros", type=int, default=0, help="cost in micro-units (default 0)"
    )
    add_fence(charge, refusal="answer allowed=false (exit 1)")

    budget = sub.add_parser("budget", parents=[common, reading], help="show budget figures")
    add_task_id(budget)

    grant = sub.add_parser(
        "grant", parents=[common], help="raise a task's limits (at least one amount above 0)"
    )
    add_task_id(grant)
    grant.add_argument("--calls", type=int, default=0, help="more LLM calls (default 0)")
    grant.add_argument("--tokens", type=int, default=0, help="more tokens (default 0)")
    grant.add_argument(
        "--cost-micros", type=int, default=0, help="more cost in micro-units (default 0)"
    )

    trans = sub.add_parser("transition", parents=[common], help="compare-and-set a status")
    add_task_id(trans)
    trans.add_argument(
        "--expected", required=True, choices=_STATUSES, help="the status it must have now"
    )
    trans.add_argument("--to", required=True, choices=_STATUSES, help="the status to move to")
    trans.add_argument(
        "--code",
        help=codes_help(
            TASK_REASON_CODES,
            "target",
            "the ledger's own code for the move, none for a terminal target",
        ),
    )
    add_fence(trans)

    for name, to in (("block", TaskStatus.BLOCKED), ("escalate", TaskStatus.ESCALATED)):
        command = sub.add_parser(name, parents=[common], help=f"running -> {to}")
        add_task_id(command)
        (code,) = TASK_REASON_CODES[to]
        command.add_argument("--code", help=f"reason code (default and only one: {code})")
        add_fence(command)
    add_task_id(sub.add_parser("requeue", parents=[common], help="blocked|escalated -> queued"))
    cancel = sub.add_parser("cancel", parents=[common], help="-> cancelled")
    add_task_id(cancel)
    cancel.add_argument(
        "--subtree",
        action="store_true",
        help="also cancel every task below it that is not finished (stops a runaway tree); "
        "a root that already ended is left as it is, and the answer is the root",
    )

    lst = sub.add_parser("list", parents=[common, reading], help="list tasks, oldest first")
    lst.add_argument("--status", choices=_STATUSES, help="only tasks in this status")
    lst.add_argument("--tenant", help="only this tenant's tasks")
    lst.add_argument(
        "--owner",
        help="only tasks this worker holds, or held when they were parked or ended "
        "(a task back in the queue has no owner)",
    )
    lst.add_argument("--parent-id", help="only this task's children")
    lst.add_argument("--limit", type=int, default=100, help="page size, 1-10000 (default 100)")
    lst.add_argument("--after", help="the last id of the previous page (a task that still exists)")


def task_answer(task: Any) -> dict[str, Any]:
    """A command's answer about one task (``None`` where no task moved: a
    claim of a task that is not queued)."""
    return {"ok": True, "task": None if task is None else task.to_dict()}


def _tasks(tasks: list[Any]) -> dict[str, Any]:
    return {"ok": True, "tasks": [t.to_dict() for t in tasks]}


def _claimed(task: Any) -> dict[str, Any]:
    """``claim``'s answer; in text, a claim that took nothing says so
    plainly (its JSON keeps ``"task": null``)."""
    answer = task_answer(task)
    if task is None:
        answer["_explain"] = ["claimed: none (the task is not queued)"]
    return answer


def _page(tasks: list[Any], limit: int) -> dict[str, Any]:
    """A page of ``list``, with where the next one starts: the last id of a
    full page (``--after`` for the next; it may be empty), ``None`` once a
    page comes back short. "tasks: 100" alone read as all there were."""
    answer = _tasks(tasks)
    answer["next_after"] = tasks[-1].id if tasks and len(tasks) == limit else None
    return answer


def _claimed_next(tasks: list[Any], tenant: str | None) -> dict[str, Any]:
    """``claim-next``'s answer; in text, an empty claim says why."""
    answer = _tasks(tasks)
    if not tasks:
        whose = " of this tenant" if tenant is not None else ""
        answer["_explain"] = [f"claimed: none (no queued task{whose} to claim now)"]
    return answer


def given(**options: Any) -> dict[str, Any]:
    """The options a user typed: the API's defaults apply to the others."""
    return {name: value for name, value in options.items() if value is not None}


Run = Callable[[argparse.Namespace, Ledger], dict[str, Any]]


def _charge(result: Any) -> dict[str, Any]:
    """A refused charge exits 1, so ``taskwarden charge ... && call_the_llm``
    in a shell loop stops spending when the guard says no."""
    return {"ok": True, "charge": result.to_dict(), "_no": not result.allowed}


def _budget(figures: Any) -> dict[str, Any]:
    """The figures under JSON's ``charge`` key, which scripts already read.
    Text heads them ``budget:``, as nothing was charged: ``allowed`` says
    whether a one-call charge would pass now, and ``escalated`` (what a
    charge did) is left out, as "escalated: no" beside an escalated task
    read as a contradiction."""
    shown = figures.to_dict()
    read = {k: v for k, v in shown.items() if k not in ("allowed", "escalated")}
    read["next_call_allowed"] = shown["allowed"]
    return {"ok": True, "charge": shown, "_explain": render({"budget": read}, "text").splitlines()}


def _park(args: argparse.Namespace, ledger: Ledger) -> dict[str, Any]:
    park = ledger.block if args.command == "block" else ledger.escalate
    typed = given(code=args.code)
    return task_answer(park(args.task_id, worker=args.worker, attempt=args.attempt, **typed))


# Each fleet command's call on an open ledger, by command name.
_RUNS: dict[str, Run] = {
    "claim": lambda a, lg: _claimed(lg.claim(a.task_id, a.worker)),
    "claim-next": lambda a, lg: _claimed_next(
        lg.claim_next(a.worker, tenant=a.tenant, limit=a.limit), a.tenant
    ),
    "release": lambda a, lg: task_answer(lg.release(a.task_id, a.worker, attempt=a.attempt)),
    "charge": lambda a, lg: _charge(
        lg.charge(
            a.task_id,
            calls=a.calls,
            tokens=a.tokens,
            cost_micros=a.cost_micros,
            worker=a.worker,
            attempt=a.attempt,
        )
    ),
    "budget": lambda a, lg: _budget(lg.budget(a.task_id)),
    "grant": lambda a, lg: task_answer(
        lg.grant(a.task_id, calls=a.calls, tokens=a.tokens, cost_micros=a.cost_micros)
    ),
    "transition": lambda a, lg: task_answer(
        lg.transition(a.task_id, a.expected, a.to, code=a.code, worker=a.worker, attempt=a.attempt)
    ),
    "block": _park,
    "escalate": _park,
    "requeue": lambda a, lg: task_answer(lg.requeue(a.task_id)),
    "cancel": lambda a, lg: task_answer(lg.cancel(a.task_id, subtree=a.subtree)),
    "list": lambda a, lg: _page(
        lg.list_tasks(
            status=a.status,
            tenant=a.tenant,
            owner=a.owner,
            parent_id=a.parent_id,
            limit=a.limit,
            after=a.after,
        ),
        a.limit,
    ),
}

FLEET_COMMANDS = tuple(_RUNS)


def _command(args: argparse.Namespace, opener: Opener) -> dict[str, Any]:
    with opener(args) as ledger:
        return _RUNS[args.command](args, ledger)


def fleet_command(opener: Opener) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """The handler for every fleet command, opening the ledger with ``opener``."""
    return lambda args: _command(args, opener)


def add_fence(
    command: argparse.ArgumentParser, *, refusal: str = "refuse (ClaimLost)", ended: bool = False
) -> None:
    """--worker and --attempt: the zombie fence of a write. ``refusal`` says
    what a fenced-out call answers; ``ended`` marks the writes (close,
    delivery) that an ended task's last holder may still make."""
    last_holder = " (for an ended task: held it last)" if ended else ""
    command.add_argument(
        "--worker", help=f"{refusal} unless this worker's claim holds the task{last_holder}"
    )
    command.add_argument(
        "--attempt", type=int, help=f"{refusal} unless this is the task's current attempt"
    )
