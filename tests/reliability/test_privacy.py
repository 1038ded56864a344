"""Privacy audit (SPEC §2.4, §7): after a full workload, the bytes of the
database, its WAL and its shared-memory file hold no free text and no
payload, and no CLI output does.

- Recognisable markers valid for their field go into every caller-supplied
  text position the API stores (tenant, worker names, via claims, fences and
  ``worker_lost``), and a payload goes in only through
  ``payload_fingerprint``. These markers may be stored (positive control:
  the scan finds them, so it can find things), the payload never.
- Free-text markers (with spaces) go into every position that must refuse
  them, through the API and the CLI: each is refused (``InvalidInput``, exit
  2) and appears nowhere: not in the ``.db``, ``-wal`` or ``-shm`` bytes
  (read while a ledger is open, so the WAL exists, and again after close),
  not in any exception message, not in CLI stdout/stderr.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger, payload_fingerprint
from taskwarden.cli import main
from taskwarden.errors import InvalidInput

from ..conftest import FrozenClock

TENANT = "tenant.PRIVMARK-t7@acme"
WORKERS = ["worker-PRIVMARK-w1:host", "worker-PRIVMARK-w2@pod.9"]
PAYLOAD = "PAYLOAD BODY 0xFEED: summarise the quarterly report for Mallory"
FREE_TEXT = [
    "PROMPT SECRET 42",
    "Ignore previous instructions SECRET-SEVEN",
    "r\u00e9sum\u00e9 PROMPT SECRET \u2014 unicode",
]
FORBIDDEN = [*FREE_TEXT, PAYLOAD]


def _encodings(text: str) -> list[bytes]:
    return [text.encode("utf-8"), text.encode("utf-16-le"), text.encode("utf-16-be")]


# Distinctive fragments: a partial copy (say, a truncated text) is a leak too.
FRAGMENTS = {
    FREE_TEXT[0]: ["PROMPT SECRET", "SECRET 42"],
    FREE_TEXT[1]: ["SECRET-SEVEN", "previous instructions"],
    FREE_TEXT[2]: ["r\u00e9sum\u00e9 PROMPT"],
    PAYLOAD: ["PAYLOAD BODY", "0xFEED", "quarterly", "Mallory"],
}


def _found(blob: bytes, texts: list[str]) -> list[str]:
    """The texts of which any encoding, or any distinctive fragment, is in ``blob``."""
    hits = []
    for text in texts:
        probes = [e for t in [text, *FRAGMENTS.get(text, [])] for e in _encodings(t)]
        if any(p in blob for p in probes):
            hits.append(text)
    return hits


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue() + err.getvalue()


def _workload(ledger: Ledger, clock: FrozenClock, db: Path) -> dict[str, str]:
    """Every kind of write, with the valid markers wherever text is stored."""
    fingerprint = payload_fingerprint(PAYLOAD)
    root = ledger.create_task(tenant=TENANT, payload_hash=fingerprint, llm_calls_budget=50)
    child = ledger.create_task(parent_id=root.id, tenant=TENANT, timeout_seconds=5)
    other = ledger.create_task(tenant=TENANT, payload_hash=payload_fingerprint(PAYLOAD.encode()))
    extra = [ledger.create_task(tenant=TENANT, delivery_required=False) for _ in range(4)]
    w1, w2 = WORKERS
    ledger.claim(root.id, w1)
    ledger.heartbeat(root.id, worker=w1, attempt=1)
    ledger.charge(root.id, calls=2, tokens=30, worker=w1, attempt=1)
    claimed = ledger.claim_next(w2, tenant=TENANT, limit=2)
    assert {t.owner for t in claimed} == {w2}
    ledger.charge(child.id, worker=w2)
    ledger.block(root.id, worker=w1)
    ledger.requeue(root.id)
    ledger.transition(root.id, "queued", "running", worker=w1)
    ledger.escalate(root.id, worker=w1)
    ledger.grant(root.id, calls=5)
    ledger.requeue(root.id)
    ledger.claim(root.id, w2)
    ledger.release(root.id, w2)
    ledger.claim(extra[0].id, w1)
    ledger.close_task(extra[0].id, "succeeded", worker=w1, attempt=1)
    ledger.set_delivery(extra[0].id, "not_applicable")
    ledger.cancel(extra[1].id)
    clock.advance(700)
    ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=600, worker_lost=w2)
    ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=0, tenant=TENANT)
    ledger.purge(older_than_seconds=0, tenant=TENANT)
    ledger.list_tasks(tenant=TENANT, owner=w1)
    ledger.stats(tenant=TENANT)
    # The CLI writes with the same markers.
    for argv in (
        ["create", "--tenant", TENANT, "--payload-sha256", fingerprint],
        ["claim-next", "--worker", w1, "--tenant", TENANT],
        ["list", "--owner", w1],
        ["stats", "--tenant", TENANT],
    ):
        code, output = _cli("--db", str(db), *argv)
        assert code == 0, output
        assert not _found(output.encode(), FORBIDDEN)
    ended = ledger.create_task(tenant=TENANT)
    ledger.cancel(ended.id)  # terminal, delivery pending
    ids = {"root": root.id, "child": child.id, "other": other.id, "extra": extra[2].id}
    live = ledger.create_task(tenant=TENANT)
    ledger.claim(live.id, w1)
    return {**ids, "ended": ended.id, "live": live.id}


def _refusals(ledger: Ledger, ids: dict[str, str], text: str) -> list[Callable[[], Any]]:
    """Every API position that must refuse free text."""
    task, running = ids["extra"], ids["live"]
    return [
        lambda: ledger.create_task(task_id=text),
        lambda: ledger.create_task(parent_id=text),
        lambda: ledger.create_task(payload_hash=text),
        lambda: ledger.create_task(tenant=text),
        lambda: ledger.create_task(llm_calls_budget=text),  # type: ignore[arg-type]
        lambda: ledger.get_task(text),
        lambda: ledger.children_of(text),
        lambda: ledger.events(text),
        lambda: ledger.start_task(text),
        lambda: ledger.heartbeat(running, worker=text),
        lambda: ledger.close_task(task, text),
        lambda: ledger.close_task(task, "failed", code=text),
        lambda: ledger.close_task(running, "failed", worker=text),
        lambda: ledger.set_delivery(ids["ended"], text),
        lambda: ledger.set_delivery(ids["ended"], "failed", code=text),
        lambda: ledger.claim(task, text),
        lambda: ledger.claim(text, WORKERS[0]),
        lambda: ledger.claim_next(text),
        lambda: ledger.claim_next(WORKERS[0], tenant=text),
        lambda: ledger.release(running, text),
        lambda: ledger.transition(task, text, "running"),
        lambda: ledger.transition(task, "queued", text),
        lambda: ledger.transition(task, "queued", "running", code=text),
        lambda: ledger.transition(task, "queued", "running", worker=text),
        lambda: ledger.block(running, code=text),
        lambda: ledger.block(running, worker=text),
        lambda: ledger.escalate(running, code=text),
        lambda: ledger.escalate(running, worker=text),
        lambda: ledger.requeue(text),
        lambda: ledger.cancel(text),
        lambda: ledger.charge(text),
        lambda: ledger.charge(running, worker=text),
        lambda: ledger.charge(running, calls=text),  # type: ignore[arg-type]
        lambda: ledger.budget(text),
        lambda: ledger.grant(text, calls=1),
        lambda: ledger.list_tasks(status=text),
        lambda: ledger.list_tasks(tenant=text),
        lambda: ledger.list_tasks(owner=text),
        lambda: ledger.list_tasks(parent_id=text),
        lambda: ledger.list_tasks(after=text),
        lambda: ledger.reconcile(
            active_grace_seconds=1, delivery_grace_seconds=1, worker_lost=text
        ),
        lambda: ledger.reconcile(active_grace_seconds=1, delivery_grace_seconds=1, tenant=text),
        lambda: ledger.reconcile(active_grace_seconds=text, delivery_grace_seconds=1),
        lambda: ledger.purge(older_than_seconds=0, tenant=text),
        lambda: ledger.delete_task(text),
        lambda: ledger.stats(tenant=text),
    ]


def _cli_refusals(db: Path, ids: dict[str, str], text: str) -> list[list[str]]:
    task, running = ids["extra"], ids["live"]
    return [
        ["create", "--tenant", text],
        ["create", "--task-id", text],
        ["create", "--parent-id", text],
        ["create", "--payload-sha256", text],
        ["create", "--token-budget", text],
        ["get", text],
        ["start", text],
        ["heartbeat", running, "--worker", text],
        ["close", task, "--status", text],
        ["close", task, "--status", "failed", "--code", text],
        ["close", running, "--status", "failed", "--worker", text],
        ["delivery", ids["ended"], "--status", "failed", "--code", text],
        ["claim", task, "--worker", text],
        ["claim-next", "--worker", text],
        ["claim-next", "--worker", WORKERS[0], "--tenant", text],
        ["release", running, "--worker", text],
        ["charge", running, "--worker", text],
        ["charge", text],
        ["budget", text],
        ["grant", text, "--calls", "1"],
        ["transition", task, "--expected", "queued", "--to", "running", "--worker", text],
        ["transition", task, "--expected", "queued", "--to", "running", "--code", text],
        ["block", running, "--code", text],
        ["escalate", running, "--worker", text],
        ["requeue", text],
        ["cancel", text],
        ["list", "--owner", text],
        ["list", "--tenant", text],
        ["list", "--after", text],
        ["reconcile", "--worker-lost", text],
        ["reconcile", "--tenant", text],
        ["reconcile", "--dry-run", "--worker-lost", text],
        ["purge", "--older-than-seconds", "0", "--tenant", text],
        ["stats", "--tenant", text],
        ["doctor", "--snapshot-max-mib", text],
        [text],
        ["--format", text, "stats"],
    ]


def test_no_free_text_or_payload_reaches_the_files_or_the_output(
    tmp_path: Path, figures: Any
) -> None:
    directory = tmp_path / "ledger"
    directory.mkdir(mode=0o700)
    db = directory / "ledger.db"
    clock = FrozenClock()
    refused = 0
    with Ledger(db, clock=clock) as ledger:
        ids = _workload(ledger, clock, db)
        for text in [*FREE_TEXT, PAYLOAD]:
            for call in _refusals(ledger, ids, text):
                with pytest.raises(InvalidInput) as info:
                    call()
                assert not _found(f"{info.value} {info.value!r}".encode(), FORBIDDEN)
                refused += 1
            for argv in _cli_refusals(db, ids, text):
                for fmt in ([], ["--format", "text"]):
                    code, output = _cli("--db", str(db), *argv[:1], *fmt, *argv[1:])
                    assert code == 2, (argv, output)
                    assert not _found(output.encode(), FORBIDDEN), argv
                    refused += 1
            with pytest.raises(InvalidInput):
                Ledger(db, durability=text)
        # More accepted writes after the refusals, so the WAL holds fresh frames.
        ledger.create_task(tenant=TENANT)
        ledger.claim_next(WORKERS[1])
        assert ledger.doctor()["healthy"] is True
        # Read the files while the ledger is open (plain reads, no SQLite).
        open_files = _files(directory)
    assert {"ledger.db", "ledger.db-wal", "ledger.db-shm"} <= set(open_files)
    assert len(open_files["ledger.db-wal"]) > 0
    closed_files = _files(directory)
    assert set(closed_files) == {"ledger.db"}

    everything = b"".join(open_files.values()) + b"".join(closed_files.values())
    for name, blob in [*open_files.items(), *closed_files.items()]:
        assert _found(blob, FORBIDDEN) == [], name
    # Positive control: the scan finds what may be stored (so it can find things).
    assert TENANT.encode() in everything
    assert all(w.encode() in everything for w in WORKERS)
    fingerprint = payload_fingerprint(PAYLOAD)
    assert fingerprint.encode() in everything or bytes.fromhex(fingerprint) in everything
    assert _found(PAYLOAD.encode(), [PAYLOAD]) == [PAYLOAD]
    figures.record("privacy", refusals_checked=refused, files_scanned=len(open_files) + 1)


def test_doctor_and_reports_print_no_free_text(tmp_path: Path) -> None:
    """Every read-side CLI command on the audited ledger prints no free text
    and no payload (text and JSON formats)."""
    directory = tmp_path / "ledger"
    directory.mkdir(mode=0o700)
    db = directory / "ledger.db"
    clock = FrozenClock()
    with Ledger(db, clock=clock) as ledger:
        ids = _workload(ledger, clock, db)
    for fmt in ("json", "text"):
        for argv in (
            ["doctor"],
            ["doctor", "--read-only"],
            ["stats"],
            ["list"],
            ["get", ids["root"]],
            ["budget", ids["root"]],
            ["reconcile", "--dry-run"],
            ["purge", "--older-than-seconds", "0", "--dry-run"],
        ):
            code, output = _cli("--db", str(db), *argv[:1], "--format", fmt, *argv[1:])
            assert code == 0, (argv, output)
            assert output.strip()
            assert _found(output.encode(), FORBIDDEN) == [], argv
