"""The CLI: the peer's commands and flags, one-line sorted JSON, exit codes."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import task_state_guard as tsg

import taskwarden
from taskwarden import Ledger

from .conftest import FrozenClock, run_cli


def test_lifecycle_through_the_cli(db_path: Path) -> None:
    db = str(db_path)
    code, out, raw = run_cli("--db", db, "init")
    assert code == 0 and out["ok"] is True
    assert out["storage"]["journal_mode"] == "wal"
    assert raw.count("\n") == 1
    assert raw.strip() == json.dumps(out, sort_keys=True, separators=(",", ":"))

    code, out, _ = run_cli(
        "--db", db, "create", "--timeout-seconds", "30", "--payload-sha256", "b" * 64
    )
    assert code == 0
    task = out["task"]
    assert task["status"] == "queued" and task["has_payload_hash"] is True
    assert "b" * 64 not in json.dumps(out)
    tid = task["id"]

    assert run_cli("--db", db, "start", tid)[1]["task"]["status"] == "running"
    assert run_cli("--db", db, "heartbeat", tid)[1]["task"]["version"] == 2
    code, out, _ = run_cli(
        "--db", db, "close", tid, "--status", "succeeded", "--code", "worker_completed"
    )
    assert (code, out["task"]["terminal_code"]) == (0, "worker_completed")
    code, out, _ = run_cli("--db", db, "delivery", tid, "--status", "delivered")
    assert out["task"]["delivery_status"] == "delivered"
    assert run_cli("--db", db, "get", tid)[1]["task"] == out["task"]


def test_create_internal_child_with_budgets(db_path: Path) -> None:
    db = str(db_path)
    parent = run_cli("--db", db, "create", "--tenant", "acme")[1]["task"]
    code, out, _ = run_cli(
        "--db", db, "create", "--parent-id", parent["id"], "--internal",
        "--llm-calls-budget", "5", "--token-budget", "1000", "--max-attempts", "2",
    )  # fmt: skip
    child = out["task"]
    assert code == 0
    assert child["parent_id"] == parent["id"] and child["delivery_required"] is False
    assert (child["llm_calls_budget"], child["token_budget"], child["max_attempts"]) == (5, 1000, 2)
    assert run_cli("--db", db, "create", "--unlimited-calls")[1]["task"]["llm_calls_budget"] is None


def test_errors_map_to_exit_codes(db_path: Path) -> None:
    db = str(db_path)
    missing = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
    assert run_cli("--db", db, "init")[0] == 0
    assert run_cli("--db", db, "start", missing)[:2] == (2, {"error": "TaskNotFound", "ok": False})
    tid = run_cli("--db", db, "create")[1]["task"]["id"]
    run_cli("--db", db, "close", tid, "--status", "failed")
    code, out, _ = run_cli("--db", db, "close", tid, "--status", "succeeded")
    assert (code, out) == (2, {"error": "StateConflict", "ok": False})
    code, out, _ = run_cli("--db", db, "close", tid, "--status", "running")
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert run_cli("create")[:2] == (2, {"error": "InvalidInput", "ok": False})


# Every command but these two needs a ledger that exists.
MAKES_A_LEDGER = {"init", "create"}
SOME_TASK = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
NEEDS_A_LEDGER: list[list[str]] = [
    ["start", SOME_TASK],
    ["heartbeat", SOME_TASK],
    ["close", SOME_TASK, "--status", "failed"],
    ["delivery", SOME_TASK, "--status", "failed"],
    ["claim", SOME_TASK, "--worker", "w"],
    ["claim-next", "--worker", "w"],
    ["release", SOME_TASK, "--worker", "w"],
    ["charge", SOME_TASK],
    ["grant", SOME_TASK, "--calls", "1"],
    ["transition", SOME_TASK, "--expected", "queued", "--to", "running"],
    ["block", SOME_TASK],
    ["escalate", SOME_TASK],
    ["requeue", SOME_TASK],
    ["cancel", SOME_TASK],
    ["reconcile"],
    ["purge", "--older-than-seconds", "0"],
    ["doctor"],
    ["stats"],
    ["list"],
    ["get", SOME_TASK],
    ["events", SOME_TASK],
    ["budget", SOME_TASK],
]


@pytest.mark.parametrize("argv", NEEDS_A_LEDGER, ids=lambda argv: argv[0])
@pytest.mark.parametrize("found", ["missing", "empty"])
def test_a_command_on_a_missing_or_empty_file_refuses_and_makes_nothing(
    tmp_path: Path, argv: list[str], found: str
) -> None:
    """A mistyped --db, or a file emptied to 0 bytes, is not a new ledger:
    a nightly reconcile, purge or doctor on it answered for a stray empty
    file with exit 0, and a write left that file behind."""
    os.chmod(tmp_path, 0o700)
    db = tmp_path / "sub" / "fleet.db" if found == "missing" else tmp_path / "fleet.db"
    if found == "empty":
        db.touch(mode=0o600)
    code, _, raw = run_cli("--db", str(db), *argv, "--format", "text")
    assert code == 2, raw
    # A missing file is a bad path; an empty one a file with no ledger (the
    # class a read-only open gives it too).
    refusal = {"missing": "InvalidInput", "empty": "StateConflict"}[found]
    assert raw.startswith(f"error: {refusal}\nreason: database "), raw
    assert sorted(p.name for p in tmp_path.rglob("*")) == (
        [] if found == "missing" else ["fleet.db"]
    )
    if found == "empty":
        assert db.stat().st_size == 0


def test_every_command_is_judged_on_a_missing_file() -> None:
    """The table above names every command that does not make a ledger."""
    from taskwarden.cli import COMMANDS

    assert set(COMMANDS) - MAKES_A_LEDGER - {"demo"} == {argv[0] for argv in NEEDS_A_LEDGER}


SECRET = "SECRET-7f3a"
SOME_ID = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
NOT_AN_AMOUNT = "must be a non-negative 64-bit integer"
NOT_SECONDS = "must be a finite nonnegative number"
NOT_A_NAME = "must be 1-128 characters of [A-Za-z0-9._:@-]"
# (argv after --db, the reason a person reading --format text is given)
REFUSAL_REASONS: list[tuple[list[str], str]] = [
    (["get"], "the following arguments are required: task_id"),
    (["get", SECRET], "task id must be a valid UUID"),
    ([SECRET], "argument COMMAND: invalid choice (choose from "),
    # The choices are argparse's own text (quoted or not, by Python version).
    (["list", "--status", f"{SECRET} (choose from x)"], "argument --status: invalid choice ("),
    (["create", "--llm-calls-budget", SECRET], "argument --llm-calls-budget: invalid value"),
    (
        ["create", "--llm-calls-budget", "5", "--unlimited-calls"],
        "argument --unlimited-calls: not allowed with argument --llm-calls-budget",
    ),
    (["create", "--bogus", SECRET], "unrecognized arguments"),
    (["create", "--tenant", f"a/{SECRET}"], "--tenant must be 1-128 characters"),
    (["stats", "--tenant", f"a/{SECRET}"], "--tenant must be 1-128 characters"),
    (["claim-next", "--worker", f"a/{SECRET}"], "--worker must be 1-128 characters"),
    (["list", "--limit", "0"], "--limit must be between 1 and 10000"),
    # The core's own refusals name the flag that was typed, not the API's parameter.
    (
        ["create", "--payload-sha256", SECRET],
        "--payload-sha256 must be a lowercase SHA-256 hex digest",
    ),
    (["create", "--llm-calls-budget", "-1"], f"--llm-calls-budget {NOT_AN_AMOUNT}"),
    (["create", "--token-budget", "-1"], f"--token-budget {NOT_AN_AMOUNT}"),
    (["create", "--cost-budget-micros", "-1"], f"--cost-budget-micros {NOT_AN_AMOUNT}"),
    (["create", "--max-attempts", "-1"], f"--max-attempts {NOT_AN_AMOUNT}"),
    (["create", "--timeout-seconds", "-1"], f"--timeout-seconds {NOT_SECONDS}"),
    (["heartbeat", SOME_ID, "--attempt", "-1"], f"--attempt {NOT_AN_AMOUNT}"),
    (["charge", SOME_ID, "--calls", "-1"], f"--calls {NOT_AN_AMOUNT}"),
    (["charge", SOME_ID, "--tokens", "-1"], f"--tokens {NOT_AN_AMOUNT}"),
    (["grant", SOME_ID, "--cost-micros", "-1"], f"--cost-micros {NOT_AN_AMOUNT}"),
    (["block", SOME_ID, "--code", SECRET], "--code must be 1-64 lowercase"),
    (["claim-next", "--worker", "w", "--limit", "0"], "--limit must be between 1 and 10000"),
    (["list", "--tenant", f"a/{SECRET}"], f"--tenant {NOT_A_NAME}"),
    (["list", "--owner", f"a/{SECRET}"], f"--owner {NOT_A_NAME}"),
    (["list", "--parent-id", SECRET], "--parent-id must be a task id (a UUID)"),
    (["list", "--after", SECRET], "--after must be a task id (a UUID)"),
    (["reconcile", "--active-grace-seconds", "-1"], f"--active-grace-seconds {NOT_SECONDS}"),
    (["reconcile", "--delivery-grace-seconds", "-1"], f"--delivery-grace-seconds {NOT_SECONDS}"),
    (["reconcile", "--worker-lost", f"a/{SECRET}"], f"--worker-lost {NOT_A_NAME}"),
    (  # a second one used to replace the first in silence
        ["reconcile", "--worker-lost", "w1", "--worker-lost", SECRET],
        "argument --worker-lost: may be given once (run it once per value)",
    ),
    (["purge", "--older-than-seconds", "-1"], f"--older-than-seconds {NOT_SECONDS}"),
    (["--busy-timeout-ms", "-1", "get", SOME_ID], "--busy-timeout-ms must be nonnegative"),
]


@pytest.mark.parametrize(
    ("argv", "reason"), REFUSAL_REASONS, ids=[" ".join(a)[:40] for a, _ in REFUSAL_REASONS]
)
@pytest.mark.parametrize(
    "spelling", [["--format", "text"], ["--format=text"], ["--form", "text"], ["--forma=text"]]
)
def test_a_text_refusal_says_why_without_echoing_what_was_typed(
    tmp_path: Path, argv: list[str], reason: str, spelling: list[str]
) -> None:
    """The JSON line stays the peer's (class only); a person asking for text
    is told why, in fixed words that never repeat the refused value."""
    db = str(tmp_path / "missing" / "t.db")
    code, parsed, raw = run_cli("--db", db, *argv)
    assert (code, parsed) == (2, {"error": "InvalidInput", "ok": False})
    code, _, raw = run_cli("--db", db, *argv, *spelling)
    assert code == 2
    assert raw.startswith(f"error: InvalidInput\nreason: {reason}"), raw
    assert SECRET not in raw
    assert not (tmp_path / "missing").exists()


def test_a_refused_choice_lists_every_choice() -> None:
    """Which statuses are there? The refusal says, in the parser's words."""
    from taskwarden import TaskStatus

    code, _, raw = run_cli("--db", "x.db", "list", "--status", SECRET, "--format", "text")
    assert code == 2 and SECRET not in raw
    reason = raw.split("reason: ", 1)[1]
    assert all(status.value in reason for status in TaskStatus), reason


def test_a_text_refusal_without_db_says_it_is_needed() -> None:
    code, _, raw = run_cli("doctor", "--format", "text")
    assert (code, raw) == (2, "error: InvalidInput\nreason: --db is required for this command\n")


def test_text_format_is_readable(db_path: Path) -> None:
    code, _, raw = run_cli("--db", str(db_path), "create", "--tenant", "acme", "--format", "text")
    assert code == 0
    assert "status" in raw and "queued" in raw and "acme" in raw
    assert not raw.lstrip().startswith("{")


def test_text_numbers_say_what_the_json_says(db_path: Path) -> None:
    """Text rounded a timeout of 0.0004 s to 0.000, and wrote 1e300 out in
    hundreds of digits."""
    for given, shown in (("0.0004", "0.0004"), ("1e300", "1e+300"), ("900", "900")):
        code, _, raw = run_cli(
            "--db", str(db_path), "create", "--timeout-seconds", given, "--format", "text"
        )
        assert code == 0, raw
        (line,) = [line for line in raw.splitlines() if "timeout_seconds" in line]
        assert line.split()[-1] == shown, line


def test_doctor_text_counts_deliveries_too(db_path: Path) -> None:
    with Ledger(db_path, clock=FrozenClock(1_700_000_000.0)) as ledger:
        task = ledger.create_task()
        ledger.close_task(task.id, "cancelled")
    code, _, raw = run_cli("--db", str(db_path), "doctor", "--format", "text")
    assert code == 0, raw
    assert "tasks by status: cancelled 1" in raw
    assert "deliveries: pending 1" in raw


def test_version_and_module_entry_point(db_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "taskwarden", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, f"taskwarden {taskwarden.__version__}")
    proc = subprocess.run(
        [sys.executable, "-m", "taskwarden", "--db", str(db_path), "create", "--bogus", "SECRET-9"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert json.loads(proc.stdout) == {"error": "InvalidInput", "ok": False}
    assert "SECRET-9" not in proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "taskwarden", "--db", str(db_path), "create"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True


def test_help_lists_the_commands() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "taskwarden", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0
    for command in ("init", "create", "start", "heartbeat", "close", "delivery"):
        assert command in proc.stdout
    assert "Exit codes: 0 ok" in " ".join(proc.stdout.split())


def _help(command: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "taskwarden", command, "--help"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert proc.returncode == 0
    return " ".join(proc.stdout.split())


def test_each_fence_help_says_what_a_fenced_out_call_answers(db_path: Path) -> None:
    """A charge never raises for state: its help promises allowed=false and
    exit 1, as a fenced-out charge answers; a fenced-out heartbeat is
    refused. Only close and delivery accept an ended task's last holder."""
    with Ledger(db_path) as ledger:
        task = ledger.create_task()
        ledger.claim(task.id, "w1")
    db = ("--db", str(db_path))
    assert "allowed=false (exit 1) unless" in _help("charge")
    assert "ClaimLost" not in _help("charge")
    code, out, _ = run_cli(*db, "charge", task.id, "--worker", "w2")
    assert (code, out["charge"]["allowed"]) == (1, False)
    assert "refuse (ClaimLost) unless" in _help("heartbeat")
    code, out, _ = run_cli(*db, "heartbeat", task.id, "--worker", "w2")
    assert (code, out["error"]) == (2, "ClaimLost")
    for command in ("heartbeat", "charge", "transition", "block", "escalate"):
        assert "held it last" not in _help(command), command
    for command in ("close", "delivery"):
        assert "for an ended task: held it last" in _help(command), command


READS = [["stats"], ["list"], ["get", "{id}"], ["events", "{id}"], ["budget", "{id}"], ["doctor"]]


def _read(db: Path, argv: list[str], task_id: str, *extra: str) -> tuple[int, object, str]:
    return run_cli("--db", str(db), *[a.format(id=task_id) for a in argv], *extra)


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_read_commands_answer_the_same_read_only(db_path: Path, argv: list[str]) -> None:
    """With --read-only a read command gives the writable answer, and the
    file keeps every byte and its modification time."""
    with Ledger(db_path) as ledger:
        task = ledger.create_task(tenant="acme")
        ledger.claim(task.id, "w1")
    writable = _read(db_path, argv, task.id)
    before = (db_path.read_bytes(), db_path.stat().st_mtime_ns)
    assert _read(db_path, argv, task.id, "--read-only") == writable
    assert (db_path.read_bytes(), db_path.stat().st_mtime_ns) == before
    assert sorted(p.name for p in db_path.parent.iterdir()) == [db_path.name]


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_read_only_reads_never_create_a_file(tmp_path: Path, argv: list[str]) -> None:
    missing = tmp_path / "typo" / "ledger.db"
    code, out, _ = _read(missing, argv, str(uuid.uuid4()), "--read-only")
    assert code == 2 and out["ok"] is False
    assert not missing.parent.exists()


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_read_only_reads_never_migrate_a_peer_file(tmp_path: Path, argv: list[str]) -> None:
    """A task-state-guard 0.1.0 file is read as a migrated one would be, and
    stays the peer's: its bytes are unchanged and the peer still opens it."""
    peer_file = tmp_path / "peer.db"
    peer = tsg.Ledger(peer_file)
    task = peer.create_task()
    before = peer_file.read_bytes()
    code, out, _ = _read(peer_file, argv, task.id, "--read-only")
    assert code == 0 and out.get("ok", True) is True, out
    assert peer_file.read_bytes() == before
    assert tsg.Ledger(peer_file).get_task(task.id).id == task.id


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_reads_never_migrate_a_peer_file_even_without_read_only(
    tmp_path: Path, argv: list[str]
) -> None:
    """A health check or a look at a task must not turn a task-state-guard
    file into one its own package cannot open: a reading command answers
    from a read-only copy (doctor names the file's own schema version), and
    only a writing command (or init) migrates."""
    peer_file = tmp_path / "peer.db"
    task = tsg.Ledger(peer_file).create_task()
    before = peer_file.read_bytes()
    code, out, _ = _read(peer_file, argv, task.id)
    assert code == 0 and out.get("ok", True) is True, out
    if argv == ["doctor"]:
        assert out["schema_version"] == 2
    assert peer_file.read_bytes() == before
    assert tsg.Ledger(peer_file).get_task(task.id).id == task.id
    code, out, _ = run_cli("--db", str(peer_file), "init")
    assert code == 0 and out["ok"] is True
    with pytest.raises(tsg.StateConflict):
        tsg.Ledger(peer_file)


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_a_peer_file_over_the_copys_cap_is_refused_for_that_reason(
    tmp_path: Path, argv: list[str]
) -> None:
    """A reading command reads a task-state-guard file through a private
    copy: a file over the copy's cap is refused with that reason (which
    names --snapshot-max-mib, not the API's snapshot_max_bytes), not as a
    file that may not be migrated, and a larger cap reads it."""
    peer_file = tmp_path / "peer.db"
    task = tsg.Ledger(peer_file).create_task()
    with contextlib.closing(sqlite3.connect(peer_file)) as conn:  # 2 MiB of free pages
        conn.execute("CREATE TABLE scratch (x)")
        conn.executemany("INSERT INTO scratch VALUES (randomblob(4000))", [()] * 500)
        conn.commit()
        conn.execute("DROP TABLE scratch")
        conn.commit()
    refused = _read(peer_file, argv, task.id, "--snapshot-max-mib", "1", "--format", "text")
    assert refused[0] == 2
    assert "--snapshot-max-mib" in refused[2] and "migrate" not in refused[2]
    assert "snapshot_max_bytes" not in refused[2]
    code, out, _ = _read(peer_file, argv, task.id, "--snapshot-max-mib", "8")
    assert code == 0 and out.get("ok", True) is True, out


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_reads_refuse_a_missing_file_instead_of_making_one(tmp_path: Path, argv: list[str]) -> None:
    """A mistyped --db must not be answered as an empty ledger (doctor's
    too, where the peer's makes the file and calls it healthy)."""
    missing = tmp_path / "typo" / "ledger.db"
    code, out, _ = _read(missing, argv, str(uuid.uuid4()))
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert not missing.parent.exists()


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
@pytest.mark.parametrize("found", ["empty-file", "empty-database"])
def test_reads_leave_a_file_that_holds_no_ledger_as_it_is(
    tmp_path: Path, argv: list[str], found: str
) -> None:
    """An existing file that holds no ledger (0 bytes; another program's
    empty database) is no more a ledger to a reading command than a missing
    one: refused, never given a schema or a WAL. (The empty file keeps its
    mode too; a SQLite file is made private, as by any open, before SQLite
    reads it.)"""
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "ledger.db"
    path.touch(mode=0o644)
    if found == "empty-database":
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA user_version = 5")
    before = path.read_bytes()
    code, out, _ = _read(path, argv, str(uuid.uuid4()))
    assert (code, out) == (2, {"error": "StateConflict", "ok": False})
    assert path.read_bytes() == before
    assert path.stat().st_mode & 0o777 == (0o644 if found == "empty-file" else 0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db"]


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_a_shared_file_that_is_no_ledger_is_called_that_not_a_mode_problem(
    tmp_path: Path, argv: list[str]
) -> None:
    """Another program's file, readable by all, is refused as no ledger. The
    read-only copy that a reading command falls back on would refuse its
    mode instead, and send the user to chmod a file that is no ledger."""
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "notes.db"
    path.write_bytes(b"plain text, not a ledger\n" * 100)
    path.chmod(0o644)
    before = path.read_bytes()
    code, _, text = _read(path, argv, str(uuid.uuid4()), "--format", "text")
    assert code == 2
    assert "StateConflict" in text and "not a ledger" in text and "mode" not in text
    assert path.read_bytes() == before and path.stat().st_mode & 0o777 == 0o644


def test_db_and_format_may_come_before_or_after_the_command(db_path: Path) -> None:
    with Ledger(db_path) as ledger:
        task = ledger.create_task()
    orders = [
        ["--db", str(db_path), "--format", "text", "get", task.id],
        ["get", task.id, "--db", str(db_path), "--format", "text"],
        ["--format", "text", "get", task.id, "--db", str(db_path)],
    ]
    answers = {run_cli(*argv)[2] for argv in orders}
    assert len(answers) == 1
    assert task.id in answers.pop()
    code, out, _ = run_cli("get", task.id, "--db", str(db_path))
    assert code == 0 and out["task"]["id"] == task.id


@pytest.mark.parametrize("argv", READS, ids=[a[0] for a in READS])
def test_read_only_refuses_a_negative_snapshot_cap(db_path: Path, argv: list[str]) -> None:
    Ledger(db_path).close()
    for mode in ([], ["--read-only"]):
        code, out, _ = _read(db_path, argv, str(uuid.uuid4()), *mode, "--snapshot-max-mib", "-1")
        assert (code, out) == (2, {"error": "InvalidInput", "ok": False}), mode


@pytest.mark.parametrize("sink", ["full", "closed"])
def test_an_answer_that_cannot_be_written_is_exit_3_without_a_traceback(
    db_path: Path, sink: str
) -> None:
    """stdout on a full disk, or closed: the caller never got its answer.
    That is exit 3 (internal), never a Python traceback on stderr."""
    Ledger(db_path).close()
    argv = [sys.executable, "-m", "taskwarden", "--db", str(db_path), "stats"]
    if sink == "full":
        with open("/dev/full", "w") as full:
            proc = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True)
    else:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            preexec_fn=lambda: os.close(1),
        )
    assert proc.returncode == 3
    assert proc.stderr == ""


def _listing_into_a_pipe(db_path: Path) -> subprocess.Popen[bytes]:
    """``taskwarden list`` of a ledger whose list is far larger than a pipe
    holds (64 KiB), writing into a pipe; its first byte already read."""
    with Ledger(db_path) as ledger:
        for _ in range(1_500):
            ledger.create_task()
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskwarden", "--db", str(db_path), "list", "--limit", "1500"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.read(1) == b"{"
    return proc


def test_an_answer_its_reader_stopped_taking_is_exit_3(db_path: Path) -> None:
    """A reader that leaves after the first bytes (``| head -c1``): Python's
    buffered writer reports that as a short write, not an error, and the
    cut-off answer once looked written (exit 0). The caller never got the
    list: exit 3, no traceback."""
    with _listing_into_a_pipe(db_path) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        assert proc.wait(timeout=60) == 3
        assert proc.stderr.read() == b""


def test_ctrl_c_while_the_answer_is_written_is_exit_130_without_a_traceback(
    db_path: Path,
) -> None:
    """A slow reader (a pager): the command is done, its answer fills the
    pipe, and Ctrl-C comes while it waits to write the rest."""
    import signal
    import time

    with _listing_into_a_pipe(db_path) as proc:
        time.sleep(0.5)  # it is writing; the pipe fills again
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err == b""
    assert len(out) < 1_500 * 200  # cut short, not the whole list


def test_the_last_format_given_is_the_one_every_answer_takes(db_path: Path) -> None:
    """A wrapper that appends --format json gets JSON from every outcome,
    an argument the parser refuses included."""
    Ledger(db_path).close()
    for limit, code in (("1", 0), ("0", 2), ("x", 2)):
        argv = ["--format", "text", "list", "--format", "json", "--limit", limit]
        answer = run_cli("--db", str(db_path), *argv)
        assert answer[0] == code and answer[1] is not None, answer
    code, out, text = run_cli(
        "--db", str(db_path), "--format", "json", "list", "--form", "text", "--limit", "x"
    )
    assert (code, out) == (2, None) and text.startswith("error: InvalidInput")


# Bad arguments the core refuses, each given to a command that would
# otherwise open (and so create or migrate) the file.
BAD_ARGUMENTS = [
    ["get", "not-a-uuid"],
    ["budget", "not-a-uuid"],
    ["close", "not-a-uuid", "--status", "succeeded"],
    ["claim-next", "--worker", "w", "--limit", "0"],
    ["charge", "{id}", "--tokens", "-1"],
    ["grant", "{id}"],
    ["create", "--tenant", "no spaces allowed"],
    ["list", "--limit", "0"],
    ["reconcile", "--active-grace-seconds", "-1"],
    ["purge", "--older-than-seconds", "nan"],
    ["--busy-timeout-ms", "-1", "stats"],
]


@pytest.mark.parametrize("argv", BAD_ARGUMENTS, ids=[" ".join(a[:2]) for a in BAD_ARGUMENTS])
def test_bad_arguments_never_create_a_file_or_a_folder(tmp_path: Path, argv: list[str]) -> None:
    missing = tmp_path / "typo" / "ledger.db"
    code, out, _ = run_cli("--db", str(missing), *[a.format(id=uuid.uuid4()) for a in argv])
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert not missing.parent.exists()


@pytest.mark.parametrize("argv", BAD_ARGUMENTS, ids=[" ".join(a[:2]) for a in BAD_ARGUMENTS])
def test_bad_arguments_never_migrate_a_peer_file(tmp_path: Path, argv: list[str]) -> None:
    peer_file = tmp_path / "peer.db"
    task = tsg.Ledger(peer_file).create_task()
    before = peer_file.read_bytes()
    code, out, _ = run_cli("--db", str(peer_file), *[a.format(id=task.id) for a in argv])
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert peer_file.read_bytes() == before


def test_purge_dry_run_reads_only(tmp_path: Path) -> None:
    """Like reconcile --dry-run: counts, and leaves a peer file the peer's
    and a missing file missing."""
    peer_file = tmp_path / "peer.db"
    peer = tsg.Ledger(peer_file)
    task = peer.create_task()
    peer.start_task(task.id)
    before = peer_file.read_bytes()
    code, out, _ = run_cli(
        "--db", str(peer_file), "purge", "--older-than-seconds", "0", "--dry-run"
    )
    assert code == 0 and out["purge"]["dry_run"] is True
    assert peer_file.read_bytes() == before
    assert tsg.Ledger(peer_file).get_task(task.id).status == "running"

    missing = tmp_path / "typo" / "ledger.db"
    code, _, _ = run_cli("--db", str(missing), "purge", "--older-than-seconds", "0", "--dry-run")
    assert code == 2 and not missing.parent.exists()


def test_close_takes_the_completed_alias(db_path: Path) -> None:
    with Ledger(db_path) as ledger:
        task = ledger.create_task()
        ledger.start_task(task.id)
    code, out, _ = run_cli("--db", str(db_path), "close", task.id, "--status", "completed")
    assert (code, out["task"]["status"]) == (0, "succeeded")


def test_an_explicit_calls_budget_and_unlimited_calls_are_refused_together(
    db_path: Path,
) -> None:
    Ledger(db_path).close()
    code, out, _ = run_cli(
        "--db", str(db_path), "create", "--llm-calls-budget", "5", "--unlimited-calls"
    )
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    with Ledger(db_path) as ledger:
        assert ledger.list_tasks() == []


@pytest.mark.parametrize("argv", [["stats"], ["reconcile", "--dry-run"]])
def test_a_snapshot_cap_too_large_to_count_in_bytes_is_refused(
    db_path: Path, argv: list[str]
) -> None:
    Ledger(db_path).close()
    for mode in ([], ["--read-only"]):
        code, out, _ = run_cli(
            "--db", str(db_path), *argv, *mode, "--snapshot-max-mib", str(2**63 - 1)
        )
        assert (code, out) == (2, {"error": "InvalidInput", "ok": False}), mode
    largest = str((2**63 - 1) >> 20)
    assert run_cli("--db", str(db_path), *argv, "--snapshot-max-mib", largest)[0] == 0


def test_ctrl_c_is_exit_130_without_a_traceback(db_path: Path) -> None:
    """SIGINT while the command waits for the write lock: it stops at once
    (not when the minute-long wait ends), the answer says so, and no Python
    traceback reaches the terminal."""
    import signal
    import sqlite3
    import time

    Ledger(db_path).close()
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskwarden", "--db", str(db_path),
             "--busy-timeout-ms", "60000", "create"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        holder.close()
    assert proc.returncode == 130
    assert json.loads(out) == {"error": "Interrupted", "ok": False}
    assert err == ""


def test_demo_takes_the_same_path_given_twice(tmp_path: Path) -> None:
    os.chdir(tmp_path)
    code, out, _ = run_cli("--db", "./demo.db", "demo", "--keep-db", "demo.db")
    assert code == 0 and out["ok"] is True
    assert (tmp_path / "demo.db").exists()


def test_an_interrupted_demo_leaves_nothing_at_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C halfway through the demo once left a half-built ledger at
    --keep-db (tasks still running, never reconciled), and every later demo
    refused the path. The ledger is built under another name and takes its
    own only when done: nothing is left behind, and the demo runs again."""
    from taskwarden import demo

    os.chmod(tmp_path, 0o700)
    kept = tmp_path / "demo.db"
    real = demo._reconcile

    def interrupted(ledger: Ledger, *, dry_run: bool = False) -> dict[str, Any]:
        if not dry_run:
            raise KeyboardInterrupt
        return real(ledger, dry_run=dry_run)

    monkeypatch.setattr(demo, "_reconcile", interrupted)
    code, out, _ = run_cli("demo", "--keep-db", str(kept))
    assert (code, out) == (130, {"error": "Interrupted", "ok": False})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(demo, "_reconcile", real)
    assert run_cli("demo", "--keep-db", str(kept))[0] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["demo.db"]


def test_of_two_demos_given_one_path_one_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another demo (or anything) took the path while this one ran: this
    one refuses, leaves the other's file as it is and cleans up after
    itself; it never shares the file."""
    from taskwarden import demo

    os.chmod(tmp_path, 0o700)
    kept = tmp_path / "demo.db"
    real = demo._run

    def overtaken(path: Path, options: dict[str, Any]) -> dict[str, Any]:
        reports = real(path, options)
        kept.write_bytes(b"the other demo's ledger")
        return reports

    monkeypatch.setattr(demo, "_run", overtaken)
    code, out, _ = run_cli("demo", "--keep-db", str(kept))
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert kept.read_bytes() == b"the other demo's ledger"
    assert [p.name for p in tmp_path.iterdir()] == ["demo.db"]


def test_the_demo_syncs_its_folder_after_naming_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link to the final name and the unlink of the temporary one reach
    the disk together: after a power cut the ledger is at its name with one
    link (a file left with both names is refused by every open)."""
    from taskwarden import demo

    os.chmod(tmp_path, 0o700)
    kept = tmp_path / "demo.db"
    synced: list[tuple[str, list[str]]] = []
    real_fsync = os.fsync

    def fsync(handle: int) -> None:
        target = os.readlink(f"/proc/self/fd/{handle}")
        synced.append((target, sorted(os.listdir(tmp_path)) if target == str(tmp_path) else []))
        real_fsync(handle)

    monkeypatch.setattr(demo.os, "fsync", fsync)
    code, out, _ = run_cli("demo", "--keep-db", str(kept))
    assert code == 0 and out["ok"] is True
    assert (str(tmp_path), ["demo.db"]) in synced


def test_the_demo_takes_any_name_a_ledger_takes(tmp_path: Path) -> None:
    """Its temporary name is short and fixed, so a long final name works as
    for any ledger (a longer temporary name once made it exit 3)."""
    os.chmod(tmp_path, 0o700)
    name = "d" * 240
    code, out, _ = run_cli("demo", "--keep-db", f"{tmp_path}/{name}")
    assert code == 0 and out["ok"] is True
    assert [p.name for p in tmp_path.iterdir()] == [name]


# A path an open refuses for itself alone: the demo refuses it too (exit 2,
# never 3), before it makes any file or folder.
REFUSED_DEMO_PATHS = {
    "slash": "{dir}/kept/",
    "slash-dot": "{dir}/kept/.",
    # `new/..` once made the folder `new`, then refused the path.
    "dot-dot": "{dir}/new/..",
    "empty": "",
    "name-too-long": "{dir}/" + "n" * 300,
    # An undecodable byte, as Python hands it over from the command line.
    "not-text": "{dir}/\udcff.db",
}


@pytest.mark.parametrize("path", REFUSED_DEMO_PATHS.values(), ids=REFUSED_DEMO_PATHS.keys())
def test_the_demo_refuses_a_path_any_open_refuses_and_makes_nothing(
    tmp_path: Path, path: str
) -> None:
    os.chmod(tmp_path, 0o700)
    code, out, _ = run_cli("demo", "--keep-db", path.format(dir=tmp_path))
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert list(tmp_path.iterdir()) == []


def test_the_demo_names_the_file_an_open_of_its_path_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`link/../z.db` is `z.db` beside the link for an open (as for the
    peer). The demo built there, then linked by the kernel's reading of the
    path (in the link target's parent), failed with exit 3 and left its
    half-named ledger behind."""
    os.chmod(tmp_path, 0o700)
    (tmp_path / "real" / "inner").mkdir(parents=True, mode=0o700)
    (tmp_path / "lnk").symlink_to(tmp_path / "real" / "inner")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli("demo", "--keep-db", "lnk/../z.db")
    assert code == 0 and out["ok"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lnk", "real", "z.db"]
    assert list((tmp_path / "real").iterdir()) == [tmp_path / "real" / "inner"]
    with Ledger(tmp_path / "z.db", read_only=True) as ledger:
        assert ledger.doctor()["healthy"]


def test_demo_refuses_a_bad_global_option_and_writes_nothing(tmp_path: Path) -> None:
    """The demo opens its ledgers with the global options, so it refuses
    the values every other command refuses, before any file is made."""
    demo = tmp_path / "demo.db"
    code, out, _ = run_cli("--db", str(demo), "--busy-timeout-ms", "-1", "demo")
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert list(tmp_path.iterdir()) == []
    code, out, _ = run_cli("--db", str(demo), "--busy-timeout-ms", "50", "demo")
    assert code == 0 and out["ok"] is True
