"""Crash campaign (SPEC §2.3, §3, §4, §7): workers doing mixed operations are
SIGKILLed at random moments, again and again, on one ledger file.

Each worker (``_crash_worker.py``) journals every call that RETURNED, with an
fsync before its next call. After every kill the parent opens the ledger as a
restarting process would and checks, against all journals so far:

- the ledger opens and ``doctor()`` is healthy;
- every write whose call had returned is there: a created task exists (the
  ``keep`` tenant is never purged), a returned close left that terminal
  status, a returned delivery that delivery status, a returned charge left
  counters at least that high (they are cumulative), a returned escalation
  left the task escalated, and no task's ``version`` went backwards;
- ownership: every running task has an owner; no two claims (by any
  workers, in any round) returned the same task with the same attempt
  number; where the stored attempt is a journalled claim's, the stored owner
  is that claim's worker (unless the task went back to the queue);
- no budget counter exceeds its limit.

Short: ~30 kills. Long (``--run-slow`` / ``TASKWARDEN_LONG=1``): >= 500 kills
and >= 1,000,000 returned operations (workers live longer between kills).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskwarden import Ledger, Task, TaskNotFound

WORKER = Path(__file__).with_name("_crash_worker.py")
DURABLE, SCRATCH = "keep", "scratch"
WORKERS_PER_ROUND = 2
SHORT_KILLS, LONG_KILLS = 30, 520
LONG_OPERATIONS = 1_000_000
# Seconds a worker may live before its kill: short rounds give many kills, the
# long campaign lets workers run longer so the operations add up too.
SHORT_LIFE, LONG_LIFE = 0.9, 3.6
EPOCH_KILLS = 40
READY_TIMEOUT = 60.0
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled"}


@dataclass
class Expected:
    """What the journals prove about one task."""

    tenant: str | None = None
    created: bool = False
    min_version: int = 0
    status: str | None = None  # a permanent status a returned call produced
    delivery: str | None = None
    min_calls: int = 0
    min_tokens: int = 0
    min_cost: int = 0
    min_attempt: int = 0
    claims: dict[int, str] = field(default_factory=dict)  # attempt -> worker


@dataclass
class Campaign:
    db: Path
    expected: dict[str, Expected] = field(default_factory=dict)
    offsets: dict[Path, int] = field(default_factory=dict)
    kills: int = 0
    operations: int = 0
    conflicts: int = 0
    busy: int = 0
    gone: int = 0
    checks: int = 0
    lost: list[str] = field(default_factory=list)  # returned writes not found
    violations: list[str] = field(default_factory=list)  # any other broken promise

    def task(self, task_id: str) -> Expected:
        return self.expected.setdefault(task_id, Expected())

    def read_journal(self, path: Path) -> None:
        """Apply the complete lines appended since the last read."""
        with open(path, "rb") as handle:
            handle.seek(self.offsets.get(path, 0))
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a line cut by the kill is ignored
        self.offsets[path] = self.offsets.get(path, 0) + end
        for raw in data[:end].splitlines():
            self.apply(json.loads(raw), path.stem)

    def apply(self, rec: dict[str, Any], source: str) -> None:
        op = rec["op"]
        if op == "unexpected":
            self.violations.append(f"{source}: unexpected {rec['type']}: {rec['trace']}")
            return
        if op in ("open", "busy", "conflict", "gone"):
            self.conflicts += op == "conflict"
            self.busy += op == "busy"
            self.gone += op == "gone"
            return
        self.operations += 1
        if op == "claim":
            for task_id, attempt, version, owner, status, tenant in rec["tasks"]:
                exp = self.task(task_id)
                exp.tenant = tenant
                if owner != rec["worker"] or status != "running":
                    self.violations.append(f"claim returned owner/status {owner}/{status}")
                previous = exp.claims.get(attempt)
                if previous is not None:
                    self.violations.append(
                        f"attempt {attempt} of one task claimed by {previous} and {rec['worker']}"
                    )
                exp.claims[attempt] = rec["worker"]
                exp.min_attempt = max(exp.min_attempt, attempt)
                exp.min_version = max(exp.min_version, version)
            return
        if op in ("reconcile", "purge"):
            return
        exp = self.task(rec["id"])
        if op == "create":
            exp.created, exp.tenant = True, rec["tenant"]
        if op == "charge":
            if rec["allowed"]:
                exp.min_calls = max(exp.min_calls, rec["calls"])
                exp.min_tokens = max(exp.min_tokens, rec["tokens"])
                exp.min_cost = max(exp.min_cost, rec["cost"])
            if rec["escalated"]:
                exp.status = "escalated"  # nothing in the campaign requeues or cancels
            return
        exp.min_version = max(exp.min_version, rec["v"])
        if op == "close" or (op == "release" and rec["status"] == "escalated"):
            exp.status = rec["status"]
        if op == "delivery":
            exp.delivery = rec["delivery"]

    # -- verification after a kill --------------------------------------------

    def verify(self) -> None:
        with Ledger(self.db, busy_timeout_ms=30_000) as ledger:
            report = ledger.doctor()
            tasks = _all_tasks(ledger)
        self.checks += 1
        if report["healthy"] is not True:
            bad = {k: v for k, v in report.items() if k.endswith("_count") and v}
            self.violations.append(f"doctor unhealthy after kill {self.kills}: {bad}")
        for task in tasks.values():
            if task.status == "running" and not task.owner:
                self.violations.append("a running task has no owner")
            for used, limit, name in (
                (task.llm_calls_used, task.llm_calls_budget, "calls"),
                (task.tokens_used, task.token_budget, "tokens"),
                (task.cost_used_micros, task.cost_budget_micros, "cost"),
            ):
                if limit is not None and used > limit:
                    self.violations.append(f"{name} counter {used} above its limit {limit}")
        for task_id, exp in self.expected.items():
            task = tasks.get(task_id)
            if task is None:
                # Only scratch tasks are purged (and an escalated task never is).
                if exp.tenant != SCRATCH or exp.status == "escalated":
                    self.lost.append(f"kill {self.kills}: task {task_id} missing ({exp})")
                continue
            self._check_task(task, exp)

    def _check_task(self, task: Task, exp: Expected) -> None:
        lost = []
        if task.version < exp.min_version:
            lost.append(f"version {task.version} < {exp.min_version}")
        if exp.status is not None and task.status != exp.status:
            lost.append(f"status {task.status} != {exp.status}")
        if exp.delivery is not None and task.delivery_status != exp.delivery:
            lost.append(f"delivery {task.delivery_status} != {exp.delivery}")
        if task.llm_calls_used < exp.min_calls:
            lost.append(f"calls {task.llm_calls_used} < {exp.min_calls}")
        if task.tokens_used < exp.min_tokens:
            lost.append(f"tokens {task.tokens_used} < {exp.min_tokens}")
        if task.cost_used_micros < exp.min_cost:
            lost.append(f"cost {task.cost_used_micros} < {exp.min_cost}")
        if task.attempt_count < exp.min_attempt:
            lost.append(f"attempt {task.attempt_count} < {exp.min_attempt}")
        if lost:
            self.lost.append(f"kill {self.kills}: task {task.id}: {'; '.join(lost)}")
        claimer = exp.claims.get(task.attempt_count)
        if claimer is not None and task.status != "queued" and task.owner != claimer:
            self.violations.append(
                f"task {task.id} attempt {task.attempt_count} claimed by {claimer} "
                f"but owned by {task.owner}"
            )


def _all_tasks(ledger: Ledger) -> dict[str, Task]:
    """Every task, paged. The round's other workers go on writing, and a
    purge may remove the task a page ended at: its cursor is then
    `TaskNotFound` (documented), and the walk starts again."""
    while True:
        tasks: dict[str, Task] = {}
        after = None
        try:
            while True:
                page = ledger.list_tasks(limit=10_000, after=after)
                tasks.update((t.id, t) for t in page)
                if len(page) < 10_000:
                    return tasks
                after = page[-1].id
        except TaskNotFound:
            continue


def _wait_ready(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT)
    assert ready, "a crash worker did not start"
    assert proc.stdout.readline() == b"ready\n"


def _round(
    campaign: Campaign,
    tmp: Path,
    number: int,
    rng: random.Random,
    lost_names: list[str],
    creation: bool = False,
    life: float = SHORT_LIFE,
) -> list[str]:
    """Start workers, SIGKILL each at a random moment, verify after each kill.

    A ``creation`` round starts one worker on a file that does not exist yet
    and kills it within 120 ms, while it creates the ledger. (Two processes
    creating one new file at once is a separate test, in test_contention.py.)
    """
    names = [f"w{number}-{k}" for k in range(1 if creation else WORKERS_PER_ROUND)]
    procs = []
    for name in names:
        stderr = open(tmp / f"{name}.stderr", "wb")  # noqa: SIM115 - closed below
        durability = rng.choice(["normal", "normal", "full"])
        argv = [str(campaign.db), str(tmp / f"{name}.jsonl"), name, str(rng.getrandbits(32))]
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), *argv, durability, *lost_names[-4:]],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        procs.append((name, proc, stderr))
    try:
        for _, proc, _ in procs:
            _wait_ready(proc)
        started = time.monotonic()
        # Most kills land in the middle of the work; some during open/recovery.
        delays = sorted(
            rng.uniform(0.0, 0.12) if creation or rng.random() < 0.1 else rng.uniform(0.05, life)
            for _ in procs
        )
        for delay, (name, proc, _) in zip(delays, procs, strict=True):
            time.sleep(max(0.0, started + delay - time.monotonic()))
            alive = proc.poll() is None
            if alive:
                os.kill(proc.pid, signal.SIGKILL)
            code = proc.wait(timeout=30)
            if alive and code == -signal.SIGKILL:
                campaign.kills += 1
            else:
                campaign.violations.append(f"{name} ended by itself with code {code}")
            campaign.read_journal(tmp / f"{name}.jsonl")
            campaign.verify()
    finally:
        for _, proc, stderr in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
            stderr.close()
    for name, _, _ in procs:
        text = (tmp / f"{name}.stderr").read_bytes()
        if text.strip():
            campaign.violations.append(f"{name} stderr: {text[-2000:]!r}")
    return names


def test_sigkill_campaign_loses_no_returned_write(
    tmp_path: Path, long_campaign: bool, figures: Any
) -> None:
    target = LONG_KILLS if long_campaign else SHORT_KILLS
    operations = LONG_OPERATIONS if long_campaign else 0
    life = LONG_LIFE if long_campaign else SHORT_LIFE
    rng = random.Random(20251130)
    epochs: list[Campaign] = []
    started = time.monotonic()
    number = 0

    def kills() -> int:
        return sum(c.kills for c in epochs)

    def done() -> bool:
        return kills() >= target and sum(c.operations for c in epochs) >= operations

    while not done() and number < target * 2:
        # A fresh ledger every EPOCH_KILLS kills keeps each check of "every
        # returned write so far" affordable in the long campaign.
        if not epochs or epochs[-1].kills >= EPOCH_KILLS:
            epochs.append(Campaign(db=tmp_path / f"ledger-{len(epochs)}.db"))
            lost_names: list[str] = []
        campaign = epochs[-1]
        creation = not campaign.db.exists()
        lost_names += _round(campaign, tmp_path, number, rng, lost_names, creation, life)
        number += 1
        if campaign.violations or campaign.lost:
            break
    lost = [x for c in epochs for x in c.lost]
    violations = [x for c in epochs for x in c.violations]
    expected = [e for c in epochs for e in c.expected.values()]
    figures.record(
        "crash",
        kills_survived=kills(),
        rounds=number,
        ledgers=len(epochs),
        operations_journalled=sum(c.operations for c in epochs),
        tasks_tracked=len(expected),
        verifications=sum(c.checks for c in epochs),
        legitimate_conflicts=sum(c.conflicts for c in epochs),
        busy=sum(c.busy for c in epochs),
        lost=len(lost),
        violations=len(violations),
        seconds=round(time.monotonic() - started, 1),
    )
    assert lost == [], lost[:10]
    assert violations == [], violations[:10]
    assert kills() >= target
    # The campaign did real work: creates, claims, charges and closes were journalled.
    assert sum(c.operations for c in epochs) >= max(10 * target, operations)
    assert any(e.claims for e in expected)
    assert any(e.status in TERMINAL for e in expected)
    assert any(e.min_calls for e in expected)
