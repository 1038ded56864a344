"""The fleet commands of the CLI (SPEC §8): claims, the state machine, the
budget guard and listing, with JSON and text output and the error exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger

from .conftest import FrozenClock, logical_dump, run_cli

MISSING = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
#: Tasks are made in the past so that the CLI (real clock) always writes later.
PAST = 1_700_000_000.0
TENANTS = ["acme", "acme", "beta", "beta", None, "acme"]


def cli(db: Path, *argv: str) -> tuple[int, Any, str]:
    return run_cli("--db", str(db), *argv)


def ok(db: Path, *argv: str) -> Any:
    code, out, raw = cli(db, *argv)
    assert code == 0, raw
    assert out["ok"] is True
    assert raw.count("\n") == 1
    assert raw.strip() == json.dumps(out, sort_keys=True, separators=(",", ":"))
    return out


def fails(db: Path, error: str, *argv: str) -> None:
    """The command exits 2 with exactly ``{"error": error, "ok": false}`` and writes nothing."""
    before = logical_dump(db)
    code, out, raw = cli(db, *argv)
    assert (code, out) == (2, {"error": error, "ok": False}), raw
    assert logical_dump(db) == before


def get(db: Path, task_id: str) -> dict[str, Any]:
    return ok(db, "get", task_id)["task"]


@pytest.fixture
def tasks(db_path: Path) -> list[str]:
    """Six queued tasks, oldest first, with tenants ``TENANTS`` and budget 2 calls."""
    clock = FrozenClock(PAST)
    with Ledger(db_path, clock=clock) as ledger:
        ids = []
        for tenant in TENANTS:
            clock.advance(1)
            ids.append(ledger.create_task(tenant=tenant, llm_calls_budget=2, token_budget=100).id)
    return ids


# -- claims ----------------------------------------------------------------------


def test_claim(db_path: Path, tasks: list[str]) -> None:
    out = ok(db_path, "claim", tasks[0], "--worker", "w1")
    task = out["task"]
    assert (task["id"], task["status"], task["owner"], task["attempt_count"]) == (
        tasks[0],
        "running",
        "w1",
        1,
    )
    assert task["started_at"] is not None and task["version"] == 1
    assert get(db_path, tasks[0]) == task
    # not queued any more: exit 0 with no task, nothing written
    before = logical_dump(db_path)
    assert ok(db_path, "claim", tasks[0], "--worker", "w2") == {"ok": True, "task": None}
    assert logical_dump(db_path) == before
    assert get(db_path, tasks[0])["owner"] == "w1"


def test_claim_errors(db_path: Path, tasks: list[str]) -> None:
    fails(db_path, "TaskNotFound", "claim", MISSING, "--worker", "w1")
    fails(db_path, "InvalidInput", "claim", "not-a-uuid", "--worker", "w1")
    code, out, raw = cli(db_path, "claim", tasks[0], "--worker", "bad worker!")
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert "bad worker" not in raw
    fails(db_path, "InvalidInput", "claim", tasks[0])  # --worker is required
    assert get(db_path, tasks[0])["status"] == "queued"


def test_claim_next_takes_the_oldest(db_path: Path, tasks: list[str]) -> None:
    out = ok(db_path, "claim-next", "--worker", "w1")
    assert [t["id"] for t in out["tasks"]] == tasks[:1]
    out = ok(db_path, "claim-next", "--worker", "w2", "--limit", "2")
    assert [t["id"] for t in out["tasks"]] == tasks[1:3]
    assert {(t["status"], t["owner"], t["attempt_count"]) for t in out["tasks"]} == {
        ("running", "w2", 1)
    }
    for tid in tasks[1:3]:
        assert get(db_path, tid)["owner"] == "w2"


def test_claim_next_by_tenant(db_path: Path, tasks: list[str]) -> None:
    out = ok(db_path, "claim-next", "--worker", "w1", "--tenant", "beta", "--limit", "10")
    assert [t["id"] for t in out["tasks"]] == tasks[2:4]
    assert all(t["tenant"] == "beta" for t in out["tasks"])
    assert ok(db_path, "claim-next", "--worker", "w1", "--tenant", "beta")["tasks"] == []
    out = ok(db_path, "claim-next", "--worker", "w3", "--tenant", "acme", "--limit", "2")
    assert [t["id"] for t in out["tasks"]] == [tasks[0], tasks[1]]
    assert get(db_path, tasks[5])["status"] == "queued"
    assert get(db_path, tasks[4])["status"] == "queued"


def test_claim_next_when_nothing_is_queued_and_bad_limits(db_path: Path, tasks: list[str]) -> None:
    out = ok(db_path, "claim-next", "--worker", "w1", "--limit", "100")
    assert sorted(t["id"] for t in out["tasks"]) == sorted(tasks)
    before = logical_dump(db_path)
    assert ok(db_path, "claim-next", "--worker", "w1")["tasks"] == []
    assert logical_dump(db_path) == before
    fails(db_path, "InvalidInput", "claim-next", "--worker", "w1", "--limit", "0")
    fails(db_path, "InvalidInput", "claim-next", "--worker", "w1", "--limit", "-1")
    fails(db_path, "InvalidInput", "claim-next", "--worker", "w1", "--limit", "x")
    fails(db_path, "InvalidInput", "claim-next", "--worker", "w1", "--tenant", "no tenant")


def _as_text(db: Path, *argv: str) -> tuple[int, str]:
    code, _, raw = cli(db, *argv, "--format", "text")
    return code, raw


def test_an_empty_claim_says_so_in_text(db_path: Path, tasks: list[str]) -> None:
    """A claim that took nothing read ``task: -`` (or ``tasks: 0``) in text;
    it says so plainly now, and its JSON is unchanged."""
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    assert _as_text(db_path, "claim", tasks[0], "--worker", "w2") == (
        0,
        "claimed: none (the task is not queued)\n",
    )
    code, raw = _as_text(db_path, "claim-next", "--worker", "w2", "--tenant", "beta")
    assert code == 0 and raw.startswith("tasks: 1\nID ")  # a claim that took one
    ok(db_path, "claim-next", "--worker", "w2", "--limit", "10")
    assert _as_text(db_path, "claim-next", "--worker", "w2") == (
        0,
        "claimed: none (no queued task to claim now)\n",
    )
    assert _as_text(db_path, "claim-next", "--worker", "w2", "--tenant", "acme") == (
        0,
        "claimed: none (no queued task of this tenant to claim now)\n",
    )
    assert ok(db_path, "claim-next", "--worker", "w2") == {"ok": True, "tasks": []}


def test_release(db_path: Path, tasks: list[str]) -> None:
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    fails(db_path, "ClaimLost", "release", tasks[0], "--worker", "w2")
    fails(db_path, "ClaimLost", "release", tasks[0], "--worker", "w1", "--attempt", "2")
    task = ok(db_path, "release", tasks[0], "--worker", "w1", "--attempt", "1")["task"]
    assert (task["status"], task["owner"], task["started_at"], task["attempt_count"]) == (
        "queued",
        None,
        None,
        1,
    )
    fails(db_path, "ClaimLost", "release", tasks[0], "--worker", "w1")
    fails(db_path, "TaskNotFound", "release", MISSING, "--worker", "w1")


# -- the budget guard ----------------------------------------------------------------


def test_charge_fields(db_path: Path, tasks: list[str]) -> None:
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    out = ok(db_path, "charge", tasks[0], "--tokens", "30", "--cost-micros", "7", "--worker", "w1")
    assert out["charge"] == {
        "allowed": True,
        "escalated": False,
        "exhausted": None,
        "calls_used": 1,
        "calls_budget": 2,
        "calls_remaining": 1,
        "tokens_used": 30,
        "token_budget": 100,
        "tokens_remaining": 70,
        "cost_used_micros": 7,
        "cost_budget_micros": None,
        "cost_remaining_micros": None,
        "exhausted_task_id": None,
        "refused": None,
    }
    task = get(db_path, tasks[0])
    assert (task["llm_calls_used"], task["tokens_used"], task["cost_used_micros"]) == (1, 30, 7)


def refused(db: Path, *argv: str) -> Any:
    """A charge the guard refused: the answer (``ok``, ``allowed: false``)
    on one line, and exit 1, so ``charge ... && call_llm`` stops."""
    code, out, raw = cli(db, *argv)
    assert (code, out["ok"], out["charge"]["allowed"]) == (1, True, False), raw
    assert raw.strip() == json.dumps(out, sort_keys=True, separators=(",", ":"))
    return out


def test_refused_charges_exit_one(db_path: Path, tasks: list[str]) -> None:
    # not running
    out = refused(db_path, "charge", tasks[0])
    assert (out["charge"]["allowed"], out["charge"]["escalated"]) == (False, False)
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    # another worker, a stale attempt: refused, nothing written
    before = logical_dump(db_path)
    out = refused(db_path, "charge", tasks[0], "--worker", "w2")
    assert (out["charge"]["allowed"], out["charge"]["calls_used"]) == (False, 0)
    refused(db_path, "charge", tasks[0], "--attempt", "2")
    assert logical_dump(db_path) == before
    # the budget runs out: the third call escalates
    assert ok(db_path, "charge", tasks[0], "--calls", "2")["charge"]["allowed"] is True
    out = refused(db_path, "charge", tasks[0], "--worker", "w1", "--attempt", "1")
    assert (out["charge"]["allowed"], out["charge"]["escalated"], out["charge"]["exhausted"]) == (
        False,
        True,
        "calls",
    )
    assert out["charge"]["calls_used"] == 2
    task = get(db_path, tasks[0])
    assert (task["status"], task["park_code"], task["owner"]) == (
        "escalated",
        "budget_exhausted",
        "w1",
    )


def test_charge_bad_amounts(db_path: Path, tasks: list[str]) -> None:
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    fails(db_path, "InvalidInput", "charge", tasks[0], "--calls", "-1")
    fails(db_path, "InvalidInput", "charge", tasks[0], "--tokens", "1.5")
    fails(db_path, "InvalidInput", "charge", tasks[0], "--cost-micros", str(2**63))
    fails(db_path, "TaskNotFound", "charge", MISSING)


def test_budget_reads_without_charging(db_path: Path, tasks: list[str]) -> None:
    out = ok(db_path, "budget", tasks[0])
    assert out["charge"]["allowed"] is False  # queued
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    ok(db_path, "charge", tasks[0], "--calls", "2")
    before = logical_dump(db_path)
    for _ in range(2):
        figures = ok(db_path, "budget", tasks[0])["charge"]
        assert (figures["allowed"], figures["exhausted"]) == (False, "calls")
        assert (figures["calls_used"], figures["calls_remaining"]) == (2, 0)
    assert logical_dump(db_path) == before
    fails(db_path, "TaskNotFound", "budget", MISSING)


def test_grant(db_path: Path, tasks: list[str]) -> None:
    task = ok(db_path, "grant", tasks[0], "--calls", "3", "--tokens", "50", "--cost-micros", "9")
    task = task["task"]
    assert (task["llm_calls_budget"], task["token_budget"], task["cost_budget_micros"]) == (
        5,
        150,
        None,
    )
    assert task["version"] == 1
    assert get(db_path, tasks[0]) == task
    fails(db_path, "InvalidInput", "grant", tasks[0], "--calls", "-3")
    fails(db_path, "TaskNotFound", "grant", MISSING, "--calls", "1")


def test_grant_and_requeue_give_an_escalated_task_another_chance(
    db_path: Path, tasks: list[str]
) -> None:
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    refused(db_path, "charge", tasks[0], "--calls", "3")  # over budget: escalated
    assert get(db_path, tasks[0])["status"] == "escalated"
    ok(db_path, "grant", tasks[0], "--calls", "5")
    assert ok(db_path, "requeue", tasks[0])["task"]["status"] == "queued"
    ok(db_path, "claim", tasks[0], "--worker", "w2")
    assert ok(db_path, "charge", tasks[0], "--calls", "3")["charge"]["calls_remaining"] == 4


# -- the state machine ------------------------------------------------------------


def test_transition(db_path: Path, tasks: list[str]) -> None:
    out = ok(
        db_path, "transition", tasks[0], "--expected", "queued", "--to", "running",
        "--worker", "w7",
    )  # fmt: skip
    assert (out["task"]["status"], out["task"]["owner"]) == ("running", "w7")
    for expected, to in (("queued", "running"), ("blocked", "running"), ("running", "running")):
        fails(db_path, "StateConflict", "transition", tasks[0], "--expected", expected, "--to", to)
    fails(
        db_path, "ClaimLost", "transition", tasks[0], "--expected", "running", "--to",
        "succeeded", "--worker", "w1",
    )  # fmt: skip
    fails(
        db_path, "InvalidInput", "transition", tasks[0], "--expected", "running", "--to",
        "succeeded", "--code", "worker_failed",
    )  # fmt: skip
    out = ok(
        db_path, "transition", tasks[0], "--expected", "in_progress", "--to", "completed",
        "--code", "worker_completed", "--worker", "w7", "--attempt", "1",
    )  # fmt: skip
    task = out["task"]
    assert (task["status"], task["terminal_code"], task["owner"]) == (
        "succeeded",
        "worker_completed",
        "w7",
    )
    # the same terminal status again is a no-op
    again = ok(db_path, "transition", tasks[0], "--expected", "succeeded", "--to", "succeeded")
    assert again["task"] == task


def test_transition_aliases_print_canonical_names(db_path: Path, tasks: list[str]) -> None:
    out = ok(db_path, "transition", tasks[1], "--expected", "pending", "--to", "in_progress")
    assert out["task"]["status"] == "running" and out["task"]["owner"] is None
    out = ok(db_path, "transition", tasks[1], "--expected", "running", "--to", "pending")
    assert out["task"]["status"] == "queued"


def test_transition_argument_errors_are_not_echoed(db_path: Path, tasks: list[str]) -> None:
    code, out, raw = cli(
        db_path, "transition", tasks[0], "--expected", "queued", "--to", "bogus_status"
    )
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert "bogus_status" not in raw
    fails(db_path, "InvalidInput", "transition", tasks[0], "--to", "running")
    fails(db_path, "TaskNotFound", "transition", MISSING, "--expected", "queued", "--to", "running")


@pytest.mark.parametrize(
    ("command", "status", "default"),
    [("block", "blocked", "needs_input"), ("escalate", "escalated", "escalated_manually")],
)
def test_block_and_escalate(
    db_path: Path, tasks: list[str], command: str, status: str, default: str
) -> None:
    fails(db_path, "StateConflict", command, tasks[0])  # queued
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    ok(db_path, "claim", tasks[1], "--worker", "w1")
    fails(db_path, "ClaimLost", command, tasks[0], "--worker", "w2")
    fails(db_path, "ClaimLost", command, tasks[0], "--worker", "w1", "--attempt", "2")
    fails(db_path, "InvalidInput", command, tasks[0], "--code", "budget_exhausted")
    task = ok(db_path, command, tasks[0], "--worker", "w1", "--attempt", "1")["task"]
    assert (task["status"], task["park_code"], task["owner"]) == (status, default, "w1")
    task = ok(db_path, command, tasks[1], "--code", default)["task"]
    assert (task["status"], task["park_code"]) == (status, default)
    fails(db_path, "StateConflict", command, tasks[0])  # already parked


@pytest.mark.parametrize(
    "argv",
    [
        ("block", MISSING, "--code", "bogus_code"),
        ("escalate", MISSING, "--code", "needs_input"),
        ("transition", MISSING, "--expected", "running", "--to", "blocked", "--code", "bogus"),
        ("transition", MISSING, "--expected", "queued", "--to", "running", "--code", "claimed"),
    ],
)
def test_a_bad_code_for_a_status_that_cannot_repeat_is_bad_input_first(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """Only the same terminal status again ignores its code, so a code for any
    other status is judged before the task is looked for: bad input, and not
    even a new file."""
    db = tmp_path / "new" / "ledger.db"
    code, out, _ = cli(db, *argv)
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert not db.parent.exists()


def test_a_code_for_a_terminal_status_is_judged_when_written(db_path: Path) -> None:
    """The same terminal status again is a no-op that ignores its code, so such a
    code is judged only once the task is found (as ``close`` does)."""
    Ledger(db_path).close()
    argv = ("--expected", "queued", "--to", "cancelled", "--code", "bogus")
    fails(db_path, "TaskNotFound", "transition", MISSING, *argv)


def test_requeue(db_path: Path, tasks: list[str]) -> None:
    fails(db_path, "StateConflict", "requeue", tasks[0])  # queued
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    ok(db_path, "block", tasks[0])
    task = ok(db_path, "requeue", tasks[0])["task"]
    assert (task["status"], task["owner"], task["park_code"], task["attempt_count"]) == (
        "queued",
        None,
        None,
        1,
    )
    fails(db_path, "TaskNotFound", "requeue", MISSING)


def test_cancel(db_path: Path, tasks: list[str]) -> None:
    ok(db_path, "claim", tasks[1], "--worker", "w1")
    for tid in tasks[:2]:
        task = ok(db_path, "cancel", tid)["task"]
        assert (task["status"], task["terminal_code"]) == ("cancelled", "caller_cancelled")
        before = logical_dump(db_path)
        assert ok(db_path, "cancel", tid)["task"] == task
        assert logical_dump(db_path) == before
    assert get(db_path, tasks[1])["owner"] == "w1"
    ok(db_path, "close", tasks[2], "--status", "succeeded")
    fails(db_path, "StateConflict", "cancel", tasks[2])
    fails(db_path, "TaskNotFound", "cancel", MISSING)


# -- listing -------------------------------------------------------------------------


def test_list_filters(db_path: Path, tasks: list[str]) -> None:
    assert [t["id"] for t in ok(db_path, "list")["tasks"]] == tasks
    ok(db_path, "claim", tasks[1], "--worker", "w1")
    ok(db_path, "claim", tasks[3], "--worker", "w2")
    ok(db_path, "claim", tasks[4], "--worker", "w1")
    running = ok(db_path, "list", "--status", "running")["tasks"]
    assert [t["id"] for t in running] == [tasks[1], tasks[3], tasks[4]]
    assert [t["id"] for t in ok(db_path, "list", "--status", "in_progress")["tasks"]] == [
        t["id"] for t in running
    ]
    queued = [tasks[0], tasks[2], tasks[5]]
    assert [t["id"] for t in ok(db_path, "list", "--status", "pending")["tasks"]] == queued
    assert all(t["status"] == "queued" for t in ok(db_path, "list", "--status", "queued")["tasks"])
    assert [t["id"] for t in ok(db_path, "list", "--owner", "w1")["tasks"]] == [tasks[1], tasks[4]]
    out = ok(db_path, "list", "--owner", "w1", "--status", "running", "--limit", "1")
    assert [t["id"] for t in out["tasks"]] == [tasks[1]]
    assert [t["id"] for t in ok(db_path, "list", "--tenant", "beta")["tasks"]] == tasks[2:4]
    assert ok(db_path, "list", "--status", "succeeded")["tasks"] == []
    assert [t["id"] for t in ok(db_path, "list", "--limit", "2")["tasks"]] == tasks[:2]
    fails(db_path, "InvalidInput", "list", "--limit", "0")
    fails(db_path, "InvalidInput", "list", "--status", "done")
    fails(db_path, "TaskNotFound", "list", "--after", MISSING)


@pytest.mark.parametrize("page", [1, 2, 4, 6, 7])
def test_list_paging_covers_every_task_exactly_once(
    db_path: Path, tasks: list[str], page: int
) -> None:
    seen: list[str] = []
    after: list[str] = []
    for _ in range(len(tasks) + 2):
        batch = ok(db_path, "list", "--limit", str(page), *after)["tasks"]
        assert len(batch) <= page
        if not batch:
            break
        seen += [t["id"] for t in batch]
        after = ["--after", batch[-1]["id"]]
    assert seen == tasks


# -- text output -------------------------------------------------------------------------


def test_list_as_text(db_path: Path, tasks: list[str]) -> None:
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    code, parsed, raw = cli(db_path, "list", "--format", "text")
    assert code == 0 and parsed is None
    lines = raw.splitlines()
    assert lines[0] == f"tasks: {len(tasks)}"
    assert lines[1].split()[:3] == ["ID", "STATUS", "DELIVERY_STATUS"]
    assert "OWNER" in lines[1]
    assert len(lines) == 2 + len(tasks)
    assert lines[2].split()[:4] == [tasks[0], "running", "pending", "w1"]
    for tid, line in zip(tasks, lines[2:], strict=True):
        assert line.startswith(tid)
    assert not raw.lstrip().startswith("{")


def test_list_as_text_says_why_a_task_waits_and_when_it_changed(
    db_path: Path, tasks: list[str]
) -> None:
    """An operator tells a budget escalation from an attempts one, reads
    used/limit figures and calendar times (UTC), not epoch seconds."""
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    for _ in range(2):  # a budget of 2 calls: the third escalates
        ok(db_path, "charge", tasks[0], "--worker", "w1")
    refused(db_path, "charge", tasks[0], "--worker", "w1")
    _, _, raw = cli(db_path, "list", "--status", "escalated", "--format", "text")
    header, row = raw.splitlines()[1:]
    assert header.split()[5:] == ["CODE", "ATTEMPTS", "LLM_CALLS", "UPDATED_AT"]
    cells = row.split()
    assert cells[5:8] == ["budget_exhausted", "1/3", "2/2"]
    updated = datetime.fromtimestamp(get(db_path, tasks[0])["updated_at"], UTC)
    assert cells[8] == updated.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_charge_as_text(db_path: Path, tasks: list[str]) -> None:
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    code, parsed, raw = cli(db_path, "charge", tasks[0], "--tokens", "5", "--format", "text")
    assert code == 0 and parsed is None
    rows = {
        line.split()[0]: line.split()[1] for line in raw.splitlines()[1:] if line.startswith("  ")
    }
    assert raw.splitlines()[0] == "charge:"
    assert rows["allowed"] == "yes" and rows["escalated"] == "no"
    assert rows["calls_used"] == "1" and rows["tokens_used"] == "5"
    assert rows["calls_remaining"] == "1" and rows["cost_budget_micros"] == "-"
    assert get(db_path, tasks[0])["tokens_used"] == 5
    ok(db_path, "charge", tasks[0])
    code, _, raw = cli(db_path, "charge", tasks[0], "--format", "text")
    assert code == 1, raw  # the last call of 2 is spent: refused, and the shell hears it
    assert "  allowed                no" in raw.splitlines()


def test_budget_as_text_is_headed_budget(db_path: Path, tasks: list[str]) -> None:
    """``budget`` charges nothing, so its text is not headed ``charge:``;
    its JSON key stays ``charge``, which scripts read."""
    ok(db_path, "claim", tasks[0], "--worker", "w1")
    ok(db_path, "charge", tasks[0], "--tokens", "5", "--worker", "w1")
    code, parsed, raw = cli(db_path, "budget", tasks[0], "--format", "text")
    assert code == 0 and parsed is None
    assert raw.splitlines()[0] == "budget:"
    assert "  tokens_used" in raw and "charge" not in raw
    # What a one-call charge would do now, not what a charge did.
    assert "  next_call_allowed" in raw and "escalated" not in raw
    figures = ok(db_path, "budget", tasks[0])
    assert set(figures) == {"ok", "charge"} and figures["charge"]["tokens_used"] == 5


def test_errors_as_text_are_not_json(db_path: Path, tasks: list[str]) -> None:
    code, parsed, raw = cli(db_path, "requeue", tasks[0], "--format", "text")
    assert code == 2 and parsed is None
    assert "StateConflict" in raw and tasks[0] not in raw


# -- a real process --------------------------------------------------------------------------


def test_python_m_taskwarden_claim_next(db_path: Path, tasks: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "taskwarden", "--db", str(db_path), "claim-next", "--worker",
         "proc-1", "--limit", "2", "--tenant", "acme"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True
    assert [t["id"] for t in out["tasks"]] == tasks[:2]
    assert all(t["owner"] == "proc-1" and t["status"] == "running" for t in out["tasks"])
    assert proc.stdout.count("\n") == 1
    with Ledger(db_path) as ledger:
        assert [t.id for t in ledger.list_tasks(owner="proc-1")] == tasks[:2]


def test_cancel_subtree(db_path: Path, tasks: list[str]) -> None:
    with Ledger(db_path) as ledger:
        child = ledger.create_task(parent_id=tasks[0]).id
        ledger.claim(child, "w1")
    assert ok(db_path, "cancel", tasks[0])["task"]["status"] == "cancelled"
    assert get(db_path, child)["status"] == "running"  # a plain cancel stops the task alone
    ok(db_path, "cancel", tasks[0], "--subtree")
    assert get(db_path, child)["status"] == "cancelled"


@pytest.mark.parametrize("limit", [1, 2, 5, 6, 7])
def test_a_list_page_says_where_the_next_one_starts(
    db_path: Path, tasks: list[str], limit: int
) -> None:
    """A full page gives its last id as ``next_after``; following it walks
    every task once, and the walk ends on a page that says there is no
    next one. A page's count alone ("tasks: 100") read as all there were."""
    seen: list[str] = []
    after: list[str] = []
    while True:
        page = ok(db_path, "list", "--limit", str(limit), *after)
        seen += [t["id"] for t in page["tasks"]]
        if page["next_after"] is None:
            assert len(page["tasks"]) < limit
            break
        assert page["next_after"] == page["tasks"][-1]["id"]
        after = ["--after", page["next_after"]]
    assert seen == tasks
    code, _, text = cli(db_path, "list", "--limit", "1", "--format", "text")
    assert code == 0 and text.splitlines()[-1] == f"next page: --after {tasks[0]}"
    _, _, last = cli(db_path, "list", "--format", "text")
    assert "next page" not in last
