"""Full disk (SPEC §2.4, §7): a ledger on a tiny tmpfs is filled until a write
fails. The failure is a clean ``taskwarden.errors.LedgerError`` (never a raw
``sqlite3.Error``, never a crash), nothing partial is committed, the ledger
stays healthy, and once space is freed (a filler file made beforehand in the
same tmpfs is deleted) it accepts writes again, in the same process and
after a reopen. Skipped when tmpfs cannot be mounted (not root, no
CAP_SYS_ADMIN). Long campaign: more filler sizes, so the failure lands at
different points of WAL growth and checkpointing.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger, payload_fingerprint
from taskwarden.errors import LedgerError, TaskNotFound

MIB = 1024 * 1024
# (tmpfs size, filler size): the filler is freed to make room again. It must be
# large enough for the checkpoint that moves the WAL into the database file.
SHORT_DISKS = [(2 * MIB, MIB // 2)]
LONG_DISKS = [(size, size // 2) for size in (MIB, 2 * MIB, 3 * MIB, 4 * MIB, 6 * MIB)]
MAX_CREATES = 200_000


@contextlib.contextmanager
def small_tmpfs(where: Path, size: int) -> Iterator[Path]:
    where.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield where
    finally:
        done = subprocess.run(["umount", str(where)], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _filler(directory: Path, size: int) -> Path:
    filler = directory / "filler.bin"
    with open(filler, "wb") as handle:
        handle.write(os.urandom(size))  # tmpfs does not store zeros sparsely, but be sure
    return filler


def _assert_clean(exc: BaseException, secrets: list[str]) -> None:
    assert isinstance(exc, LedgerError), f"{type(exc).__module__}.{type(exc).__name__}"
    assert not isinstance(exc, sqlite3.Error)
    text = f"{exc} {exc!r}"
    for secret in secrets:
        assert secret not in text


def _fill(ledger: Ledger, mount: Path) -> tuple[list[str], str, BaseException]:
    """Create tasks until one fails; the created ids, the failing id, the error."""
    created: list[str] = []
    for _ in range(MAX_CREATES):
        task_id = str(uuid.uuid4())
        try:
            ledger.create_task(
                task_id=task_id,
                tenant="tenant-a",
                payload_hash=payload_fingerprint(task_id),
                llm_calls_budget=1000,
            )
        except Exception as exc:
            _assert_clean(exc, [task_id, str(mount)])
            return created, task_id, exc
        created.append(task_id)
    raise AssertionError("the tmpfs never filled up")


def _updates_while_full(ledger: Ledger, created: list[str], mount: Path) -> dict[str, int]:
    """Claims, charges and closes on a full disk: each returns or fails cleanly,
    and a failed one leaves no trace."""
    outcome = {"ok": 0, "refused": 0}
    for round_ in range(12):
        running = len(ledger.list_tasks(status="running", limit=10_000))
        try:
            claimed = ledger.claim_next(f"w{round_}", limit=2)
        except Exception as exc:
            _assert_clean(exc, [str(mount)])
            assert len(ledger.list_tasks(status="running", limit=10_000)) == running
            outcome["refused"] += 1
            continue
        outcome["ok"] += 1
        for task in claimed:
            before = ledger.budget(task.id)
            try:
                ledger.charge(task.id, calls=1, tokens=5, worker=task.owner)
                outcome["ok"] += 1
            except Exception as exc:
                _assert_clean(exc, [task.id, str(mount)])
                assert ledger.budget(task.id) == before
                outcome["refused"] += 1
            state = ledger.get_task(task.id)
            try:
                ledger.close_task(task.id, "succeeded", worker=task.owner)
                outcome["ok"] += 1
            except Exception as exc:
                _assert_clean(exc, [task.id, str(mount)])
                after = ledger.get_task(task.id)
                assert (after.status, after.version) == (state.status, state.version)
                outcome["refused"] += 1
    return outcome


def _disks(long_campaign: bool) -> list[tuple[int, int]]:
    return LONG_DISKS if long_campaign else SHORT_DISKS


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_full_disk_fails_cleanly_and_recovers(
    tmp_path: Path, durability: str, long_campaign: bool, figures: Any
) -> None:
    for disk_size, filler_size in _disks(long_campaign):
        mount = tmp_path / f"mnt-{disk_size}"
        with small_tmpfs(mount, disk_size):
            filler = _filler(mount, filler_size)
            with Ledger(mount / "ledger.db", durability=durability) as ledger:
                created, failed_id, _ = _fill(ledger, mount)
                assert created, "not even one task fitted"
                # Nothing partial: the failing task is absent, the rest intact.
                with pytest.raises(TaskNotFound):
                    ledger.get_task(failed_id)
                assert ledger.stats()["task_count"] == len(created)
                assert ledger.doctor()["healthy"] is True
                updates = _updates_while_full(ledger, created, mount)
                assert ledger.doctor()["healthy"] is True
                # Free the space: the same open ledger writes again.
                filler.unlink()
                again = ledger.create_task(task_id=failed_id, tenant="tenant-a")
                assert again.id == failed_id
                ledger.get_task(created[0])
                assert ledger.stats()["task_count"] == len(created) + 1
            with Ledger(mount / "ledger.db", durability=durability) as reopened:
                assert reopened.doctor()["healthy"] is True
                assert reopened.stats()["task_count"] == len(created) + 1
                reopened.create_task(tenant="tenant-a")
            assert sorted(p.name for p in mount.iterdir()) == ["ledger.db"]
        figures.record(
            "full_disk",
            disks_filled=1,
            tasks_before_full=len(created),
            writes_while_full_ok=updates["ok"],
            writes_while_full_refused=updates["refused"] + 1,
            lost=0,
        )


def test_full_disk_close_and_reopen_while_full(
    tmp_path: Path, long_campaign: bool, figures: Any
) -> None:
    for disk_size, filler_size in _disks(long_campaign):
        mount = tmp_path / f"mnt-{disk_size}"
        with small_tmpfs(mount, disk_size):
            filler = _filler(mount, filler_size)
            ledger = Ledger(mount / "ledger.db")
            try:
                created, failed_id, _ = _fill(ledger, mount)
            finally:
                # Closing on a full disk (the checkpoint may not fit) is quiet or clean.
                try:
                    ledger.close()
                except Exception as exc:
                    _assert_clean(exc, [str(mount)])
            # Reopening while still full either works (and is healthy) or fails cleanly.
            try:
                with Ledger(mount / "ledger.db") as reopened:
                    assert reopened.doctor()["healthy"] is True
                    assert reopened.stats()["task_count"] == len(created)
            except Exception as exc:
                _assert_clean(exc, [str(mount)])
            filler.unlink()
            with Ledger(mount / "ledger.db") as recovered:
                assert recovered.doctor()["healthy"] is True
                assert recovered.stats()["task_count"] == len(created)
                with pytest.raises(TaskNotFound):
                    recovered.get_task(failed_id)
                for task_id in created[:: max(1, len(created) // 50)]:
                    assert recovered.get_task(task_id).payload_hash == payload_fingerprint(task_id)
                recovered.create_task(task_id=failed_id)
            assert sorted(p.name for p in mount.iterdir()) == ["ledger.db"]
        figures.record("full_disk", disks_filled=1, closed_while_full=1, lost=0)
