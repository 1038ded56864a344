"""The budget guard (SPEC §4, §2.2, §2.2.1), in one process.

Exact-N budgets (no off-by-one), a refused charge consumes nothing, amounts are
validated before anything is written, use rolls up the whole ancestor chain
whatever the ancestors' states, and ``grant`` + ``requeue`` give an escalated
task a second chance with cumulative counters.
"""

from __future__ import annotations

import contextlib
import math
import random
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger
from taskwarden.errors import InvalidInput, StateConflict, TaskNotFound

from .conftest import EVENT_TASK_ID, FrozenClock, logical_dump

I64_MAX = 2**63 - 1
DIMENSIONS = {"calls": "llm_calls", "tokens": "tokens", "cost_micros": "cost"}


def counters(task: Any) -> tuple[int, int, int]:
    return (task.llm_calls_used, task.tokens_used, task.cost_used_micros)


@contextlib.contextmanager
def unchanged_file(db_path: Path, clock: FrozenClock) -> Iterator[Ledger]:
    """A fresh Ledger on ``db_path``; after it is closed, the file's logical
    content must equal what it was before it was opened."""
    before = logical_dump(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        yield ledger
    assert logical_dump(db_path) == before, "a refused call wrote to the ledger"


# --------------------------------------------------------------------------
# exact N


@pytest.mark.parametrize("budget", [0, 1, 25, None])
def test_exactly_n_one_call_charges_are_allowed(ledger: Ledger, budget: int | None) -> None:
    if budget is None:
        task = ledger.create_task()  # the default budget
        budget = 25
    else:
        task = ledger.create_task(llm_calls_budget=budget)
    assert task.llm_calls_budget == budget
    ledger.claim(task.id, "w")
    for i in range(budget):
        answer = ledger.charge(task.id, worker="w")
        assert (answer.allowed, answer.escalated, answer.exhausted) == (True, False, None)
        assert answer.calls_used == i + 1
        assert answer.calls_budget == budget
        assert answer.calls_remaining == budget - i - 1
    assert ledger.get_task(task.id).status == "running"

    refused = ledger.charge(task.id, worker="w")
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "calls")
    assert refused.calls_used == budget
    assert refused.calls_remaining == 0
    parked = ledger.get_task(task.id)
    assert parked.status == "escalated"
    assert parked.park_code == "budget_exhausted"
    assert parked.llm_calls_used == budget
    assert parked.owner == "w"

    # Once escalated the task is not running: refused, not escalated again, nothing changes.
    for amounts in ({}, {"calls": 0}, {"calls": 5, "tokens": 5, "cost_micros": 5}):
        again = ledger.charge(task.id, **amounts)
        assert again.allowed is False
        assert again.escalated is False
        assert again.calls_used == budget
    assert ledger.get_task(task.id) == parked


def test_refused_charge_consumes_nothing_when_it_would_overshoot(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=10)
    ledger.claim(task.id, "w")
    assert ledger.charge(task.id, calls=7).allowed
    refused = ledger.charge(task.id, calls=4)  # 7 + 4 > 10: not even a partial charge
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "calls")
    assert refused.calls_used == 7
    assert ledger.get_task(task.id).llm_calls_used == 7


def test_multi_call_charge_that_exactly_fills_is_allowed(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=10, token_budget=50, cost_budget_micros=90)
    ledger.claim(task.id, "w")
    answer = ledger.charge(task.id, calls=10, tokens=50, cost_micros=90)
    assert answer.allowed
    assert (answer.calls_remaining, answer.tokens_remaining, answer.cost_remaining_micros) == (
        0,
        0,
        0,
    )
    assert ledger.get_task(task.id).status == "running"


# --------------------------------------------------------------------------
# zero charges and bad amounts


@pytest.mark.parametrize(
    "limits",
    [
        {"llm_calls_budget": 0},
        {"llm_calls_budget": 0, "token_budget": 0, "cost_budget_micros": 0},
        {"llm_calls_budget": 3, "token_budget": 3, "cost_budget_micros": 3},
    ],
)
def test_zero_charge_is_allowed_at_the_limit(ledger: Ledger, limits: dict[str, int]) -> None:
    task = ledger.create_task(**limits)
    ledger.claim(task.id, "w")
    fill = {
        "calls": limits["llm_calls_budget"],
        "tokens": limits.get("token_budget", 0),
        "cost_micros": limits.get("cost_budget_micros", 0),
    }
    assert ledger.charge(task.id, **fill).allowed
    full = ledger.get_task(task.id)
    for _ in range(3):
        answer = ledger.charge(task.id, calls=0, tokens=0, cost_micros=0, worker="w")
        assert (answer.allowed, answer.escalated, answer.exhausted) == (True, False, None)
    after = ledger.get_task(task.id)
    assert after.status == "running"
    assert counters(after) == counters(full)
    # ...while one more call is refused.
    refused = ledger.charge(task.id, worker="w")
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "calls")


def test_zero_charge_on_a_queued_task_is_not_allowed(ledger: Ledger) -> None:
    task = ledger.create_task()
    answer = ledger.charge(task.id, calls=0)
    assert answer.allowed is False and answer.escalated is False
    assert ledger.get_task(task.id) == task


BAD_AMOUNTS = [
    pytest.param(-1, id="negative"),
    pytest.param(-(2**63), id="i64-min"),
    pytest.param(True, id="true"),
    pytest.param(False, id="false"),
    pytest.param(1.5, id="float-1.5"),
    pytest.param("1", id="str"),
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(2**63, id="2**63"),
    pytest.param(2**64, id="2**64"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("value", BAD_AMOUNTS)
@pytest.mark.parametrize("field", ["calls", "tokens", "cost_micros"])
def test_bad_charge_amounts_are_refused_and_write_nothing(
    db_path: Path, clock: FrozenClock, field: str, value: Any
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=5, token_budget=5, cost_budget_micros=5)
        ledger.claim(task.id, "w")
        assert ledger.charge(task.id, calls=1, tokens=1, cost_micros=1).allowed
    clock.advance(5)
    with unchanged_file(db_path, clock) as ledger:
        with pytest.raises(InvalidInput):
            ledger.charge(task.id, **{field: value})
        with pytest.raises(InvalidInput):
            ledger.charge(task.id, **{field: value}, worker="w", attempt=1)
        # An invalid amount that would also exceed the limit must not escalate either.
        assert ledger.get_task(task.id).status == "running"


@pytest.mark.parametrize("value", BAD_AMOUNTS)
def test_bad_grant_amounts_are_refused_and_write_nothing(
    db_path: Path, clock: FrozenClock, value: Any
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=5)
    for field in ("calls", "tokens", "cost_micros"):
        with unchanged_file(db_path, clock) as ledger, pytest.raises(InvalidInput):
            ledger.grant(task.id, **{field: value})


def test_i64_edges_of_a_calls_budget(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=I64_MAX)
    ledger.claim(task.id, "w")
    answer = ledger.charge(task.id, calls=I64_MAX)
    assert answer.allowed and answer.calls_used == I64_MAX and answer.calls_remaining == 0
    assert ledger.charge(task.id, calls=0).allowed
    refused = ledger.charge(task.id, calls=1)
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "calls")
    after = ledger.get_task(task.id)
    assert after.llm_calls_used == I64_MAX
    assert after.status == "escalated"


def test_i64_edge_of_a_token_limit_escalates_rather_than_wrapping(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=None, token_budget=I64_MAX)
    ledger.claim(task.id, "w")
    assert ledger.charge(task.id, tokens=I64_MAX - 1).allowed
    # used + amount overflows i64 and exceeds the limit: a budget refusal, never a wrap.
    refused = ledger.charge(task.id, tokens=I64_MAX)
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "tokens")
    after = ledger.get_task(task.id)
    assert after.tokens_used == I64_MAX - 1
    assert after.status == "escalated"


@pytest.mark.parametrize("amount", [1, I64_MAX])
@pytest.mark.parametrize(("field", "dim"), [("tokens", "tokens"), ("cost_micros", "cost")])
def test_a_full_unlimited_counter_stops_the_charge_like_a_limit(
    ledger: Ledger, field: str, dim: str, amount: int
) -> None:
    """A counter that cannot hold the sum (signed 64 bits) is full: the
    charge's amount is valid input, so it is refused and escalated like
    one past a limit, never raised as an error."""
    task = ledger.create_task(llm_calls_budget=None)
    ledger.claim(task.id, "w")
    assert ledger.charge(task.id, calls=0, **{field: I64_MAX - 2}).allowed
    assert ledger.charge(task.id, calls=0, **{field: 2}).allowed  # exactly i64 max
    assert ledger.budget(task.id).exhausted == dim
    refused = ledger.charge(task.id, calls=0, worker="w", **{field: amount})
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, dim)
    assert refused.exhausted_task_id == task.id
    after = ledger.get_task(task.id)
    assert (after.status, after.park_code) == ("escalated", "budget_exhausted")
    used = {"tokens": after.tokens_used, "cost_micros": after.cost_used_micros}
    assert used[field] == I64_MAX


def test_budget_names_the_limit_the_escalating_charge_named(ledger: Ledger) -> None:
    """A full unlimited counter on the task and a spent limit on its parent:
    the charge that escalates names the parent's limit (what a grant can
    raise), and so must ``budget()`` and every later refusal, or the
    operator grants where nothing can be raised."""
    parent = ledger.create_task(llm_calls_budget=1)
    task = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
    ledger.claim(task.id, "w")
    assert ledger.charge(task.id, calls=0, tokens=I64_MAX, worker="w").allowed
    assert ledger.charge(task.id, calls=1, worker="w").allowed
    named = ("calls", parent.id)
    assert (ledger.budget(task.id).exhausted, ledger.budget(task.id).exhausted_task_id) == named
    stop = ledger.charge(task.id, calls=1, worker="w")
    assert (stop.refused, stop.exhausted, stop.exhausted_task_id) == ("budget", *named)
    for later in (ledger.budget(task.id), ledger.charge(task.id, calls=1)):
        assert (later.exhausted, later.exhausted_task_id) == named


def test_a_full_ancestor_counter_stops_a_sibling_s_charge(ledger: Ledger) -> None:
    """What filled the parent's unlimited counter is a sibling's use: the
    next child's ordinary charge is a budget stop naming the parent, not
    an input error (a charge never raises for state)."""
    parent = ledger.create_task(llm_calls_budget=None)
    a = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
    b = ledger.create_task(parent_id=parent.id, llm_calls_budget=None, token_budget=1000)
    ledger.claim(a.id, "a")
    ledger.claim(b.id, "b")
    assert ledger.charge(a.id, calls=0, tokens=I64_MAX).allowed
    assert ledger.budget(b.id).exhausted == "tokens"
    refused = ledger.charge(b.id, calls=0, tokens=1, worker="b")
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "tokens")
    assert refused.exhausted_task_id == parent.id
    assert ledger.get_task(b.id).status == "escalated"
    assert ledger.get_task(b.id).tokens_used == 0
    assert ledger.get_task(parent.id).tokens_used == I64_MAX
    # A charge of another dimension still fits.
    assert ledger.charge(a.id, calls=1, worker="a").allowed


def test_a_passed_ancestor_limit_escalates_even_where_a_counter_would_overflow(
    db_path: Path, clock: FrozenClock
) -> None:
    """The child's tokens are unlimited and its counter could not hold the
    sum, but the parent's limit is passed first: the runaway is stopped
    (escalated), not answered with an input error."""
    with Ledger(db_path, clock=clock) as ledger:
        parent = ledger.create_task(llm_calls_budget=None, token_budget=I64_MAX)
        child = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
        ledger.claim(child.id, "w")
        assert ledger.charge(child.id, calls=0, tokens=I64_MAX - 5, worker="w").allowed
        answer = ledger.charge(child.id, calls=0, tokens=10, worker="w")
        assert (answer.allowed, answer.escalated, answer.exhausted) == (False, True, "tokens")
        assert ledger.get_task(child.id).status == "escalated"
        assert ledger.get_task(parent.id).tokens_used == I64_MAX - 5


# --------------------------------------------------------------------------
# roll-up through the ancestor chain


def test_three_level_chain_stops_at_the_smallest_ancestor_limit(ledger: Ledger) -> None:
    grand = ledger.create_task(llm_calls_budget=3)
    parent = ledger.create_task(parent_id=grand.id, llm_calls_budget=5)
    child = ledger.create_task(parent_id=parent.id, llm_calls_budget=10)
    ledger.claim(child.id, "c")
    for i in range(3):
        answer = ledger.charge(child.id, worker="c")
        assert answer.allowed
        assert answer.calls_remaining == 10 - (i + 1)  # own limit minus own use
        for t in (grand, parent, child):
            assert ledger.get_task(t.id).llm_calls_used == i + 1
    refused = ledger.charge(child.id, worker="c")
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "calls")
    assert refused.calls_used == 3 and refused.calls_remaining == 7
    assert [ledger.get_task(t.id).llm_calls_used for t in (grand, parent, child)] == [3, 3, 3]
    assert ledger.get_task(child.id).status == "escalated"
    # Only the charging task is escalated; the ancestors keep their state.
    assert ledger.get_task(grand.id).status == "queued"
    assert ledger.get_task(parent.id).status == "queued"


@pytest.mark.parametrize(
    ("limits", "charge", "dimension"),
    [
        ({"token_budget": 100}, {"calls": 0, "tokens": 60}, "tokens"),
        ({"cost_budget_micros": 100}, {"calls": 0, "cost_micros": 60}, "cost"),
        ({"llm_calls_budget": 1}, {"calls": 1}, "calls"),
    ],
)
def test_grandparent_limit_names_the_exhausted_dimension(
    ledger: Ledger, limits: dict[str, int], charge: dict[str, int], dimension: str
) -> None:
    grand = ledger.create_task(**{"llm_calls_budget": None, **limits})
    parent = ledger.create_task(parent_id=grand.id, llm_calls_budget=None)
    child = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
    ledger.claim(child.id, "c")
    assert ledger.charge(child.id, **charge).allowed
    refused = ledger.charge(child.id, **charge)
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, dimension)
    assert counters(ledger.get_task(grand.id)) == counters(ledger.get_task(child.id))


def _fits(ledger: Ledger, task_id: str, calls: int, tokens: int) -> bool:
    current: str | None = task_id
    while current is not None:
        t = ledger.get_task(current)
        if t.llm_calls_budget is not None and t.llm_calls_used + calls > t.llm_calls_budget:
            return False
        if t.token_budget is not None and t.tokens_used + tokens > t.token_budget:
            return False
        current = t.parent_id
    return True


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_tree_roll_up_invariants_at_every_step(ledger: Ledger, seed: int) -> None:
    rng = random.Random(seed)
    grand = ledger.create_task(llm_calls_budget=15, token_budget=900)  # never claimed: queued
    p1 = ledger.create_task(parent_id=grand.id, llm_calls_budget=30, token_budget=None)
    p2 = ledger.create_task(parent_id=grand.id, llm_calls_budget=None, token_budget=400)
    c1 = ledger.create_task(parent_id=p1.id, llm_calls_budget=100)
    c2 = ledger.create_task(parent_id=p1.id, llm_calls_budget=None, token_budget=300)
    c3 = ledger.create_task(parent_id=p2.id, llm_calls_budget=4)
    chargers = [p1.id, p2.id, c1.id, c2.id, c3.id]
    for i, task_id in enumerate(chargers):
        ledger.claim(task_id, f"w{i}")
    tree = {p1.id: [c1.id, c2.id], p2.id: [c3.id], grand.id: [p1.id, p2.id]}
    allowed_total = [0, 0]
    running = set(chargers)
    while running:
        task_id = rng.choice(sorted(running))
        calls, tokens = rng.choice([0, 1, 1, 2]), rng.choice([0, 10, 50, 120])
        expected = _fits(ledger, task_id, calls, tokens)
        answer = ledger.charge(task_id, calls=calls, tokens=tokens)
        assert answer.allowed is expected
        assert answer.escalated is (not expected)
        if expected:
            allowed_total[0] += calls
            allowed_total[1] += tokens
        else:
            assert answer.exhausted in ("calls", "tokens")
            assert ledger.get_task(task_id).status == "escalated"
            running.discard(task_id)
        tasks = {t: ledger.get_task(t) for t in [grand.id, *chargers]}
        for t in tasks.values():
            if t.llm_calls_budget is not None:
                assert t.llm_calls_used <= t.llm_calls_budget
            if t.token_budget is not None:
                assert t.tokens_used <= t.token_budget
        for parent_id, kids in tree.items():
            parent = tasks[parent_id]
            assert sum(tasks[k].llm_calls_used for k in kids) <= parent.llm_calls_used
            assert sum(tasks[k].tokens_used for k in kids) <= parent.tokens_used
        assert [tasks[grand.id].llm_calls_used, tasks[grand.id].tokens_used] == allowed_total
    assert ledger.get_task(grand.id).status == "queued"


def _put_parent_in(ledger: Ledger, task_id: str, state: str) -> None:
    if state == "queued":
        return
    if state in ("succeeded", "failed", "timed_out", "cancelled"):
        ledger.close_task(task_id, state)
        return
    ledger.claim(task_id, "lead")
    if state == "blocked":
        ledger.block(task_id)
    elif state == "escalated":
        ledger.escalate(task_id)


@pytest.mark.parametrize(
    "state",
    ["queued", "running", "blocked", "escalated", "succeeded", "failed", "timed_out", "cancelled"],
)
def test_ancestor_in_any_state_limits_and_accumulates(ledger: Ledger, state: str) -> None:
    grand = ledger.create_task(llm_calls_budget=3, token_budget=1000)
    parent = ledger.create_task(parent_id=grand.id, llm_calls_budget=None)
    child = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
    _put_parent_in(ledger, grand.id, state)
    _put_parent_in(ledger, parent.id, state)
    ledger.claim(child.id, "c")
    grand_before = ledger.get_task(grand.id)
    assert grand_before.status == state
    for _ in range(3):
        assert ledger.charge(child.id, tokens=7, worker="c").allowed
    refused = ledger.charge(child.id, worker="c")
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "calls")
    for t in (grand.id, parent.id):
        after = ledger.get_task(t)
        assert after.status == state
        assert (after.llm_calls_used, after.tokens_used) == (3, 21)


# --------------------------------------------------------------------------
# budget()


def test_budget_figures(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=10, token_budget=1000, cost_budget_micros=None)
    queued = ledger.budget(task.id)
    assert queued.allowed is False  # not running
    assert (queued.calls_used, queued.calls_budget, queued.calls_remaining) == (0, 10, 10)
    ledger.claim(task.id, "w")
    assert ledger.charge(task.id, calls=3, tokens=250, cost_micros=42).allowed
    version = ledger.get_task(task.id).version
    for _ in range(2):
        fig = ledger.budget(task.id)
        assert fig.allowed is True and fig.escalated is False and fig.exhausted is None
        assert (fig.calls_used, fig.calls_budget, fig.calls_remaining) == (3, 10, 7)
        assert (fig.tokens_used, fig.token_budget, fig.tokens_remaining) == (250, 1000, 750)
        assert (fig.cost_used_micros, fig.cost_budget_micros, fig.cost_remaining_micros) == (
            42,
            None,
            None,
        )
    after = ledger.get_task(task.id)
    assert after.version == version and counters(after) == (3, 250, 42)

    assert ledger.charge(task.id, calls=7).allowed
    spent = ledger.budget(task.id)
    assert spent.allowed is False
    assert spent.escalated is False
    assert spent.exhausted == "calls"
    assert spent.calls_remaining == 0
    # Reading the figures never escalates.
    assert ledger.get_task(task.id).status == "running"


def test_budget_reports_an_exhausted_ancestor(ledger: Ledger) -> None:
    parent = ledger.create_task(llm_calls_budget=2)
    child = ledger.create_task(parent_id=parent.id, llm_calls_budget=10)
    ledger.claim(child.id, "w")
    assert ledger.charge(child.id, calls=2).allowed
    fig = ledger.budget(child.id)
    assert fig.allowed is False
    assert fig.exhausted == "calls"
    assert (fig.calls_used, fig.calls_budget, fig.calls_remaining) == (2, 10, 8)
    assert ledger.get_task(child.id).status == "running"


def test_budget_allows_a_one_call_charge_while_another_dimension_is_spent(
    ledger: Ledger,
) -> None:
    """``allowed`` answers for a one-call charge: tokens at their limit
    refuse token charges only, which ``exhausted`` names."""
    parent = ledger.create_task(llm_calls_budget=None, cost_budget_micros=5)
    task = ledger.create_task(parent_id=parent.id, token_budget=10)
    ledger.claim(task.id, "w")
    assert ledger.charge(task.id, calls=0, tokens=10, cost_micros=5).allowed
    fig = ledger.budget(task.id)
    assert (fig.allowed, fig.exhausted) == (True, "tokens")
    assert ledger.charge(task.id).allowed  # what the figures promised
    assert ledger.charge(task.id, calls=0, tokens=1).escalated


def test_a_refused_charge_reports_what_budget_reports(ledger: Ledger) -> None:
    """Once the guard has escalated a task, a late charge is refused and
    names the same exhausted limit as ``budget``, changing nothing."""
    task = ledger.create_task(llm_calls_budget=1)
    ledger.claim(task.id, "w")
    assert ledger.charge(task.id, worker="w").allowed
    assert ledger.charge(task.id, worker="w").escalated
    before = ledger.get_task(task.id)
    late = ledger.charge(task.id, worker="w")
    assert (late.allowed, late.escalated, late.exhausted) == (False, False, "calls")
    assert late.refused == "not_running"  # parked under the worker's own claim
    assert late == ledger.budget(task.id)
    assert ledger.get_task(task.id) == before


def test_a_refused_charge_says_why(ledger: Ledger, clock: FrozenClock) -> None:
    """A worker that stops logs why: its budget, a task no longer running,
    or a claim that is no longer its own (what other fenced writes raise
    as ``ClaimLost``). ``budget()`` says the same of a one-call charge."""
    parent = ledger.create_task(llm_calls_budget=1)
    task = ledger.create_task(parent_id=parent.id)
    queued = ledger.create_task()
    assert (ledger.charge(queued.id).refused, ledger.budget(queued.id).refused) == (
        "not_running",
        "not_running",
    )
    ledger.claim(task.id, "w")
    ok = ledger.charge(task.id, worker="w")
    assert (ok.allowed, ok.refused, ledger.budget(task.id).refused) == (True, None, "budget")
    assert ledger.charge(task.id, worker="other").refused == "claim_lost"
    assert ledger.charge(task.id, worker="w", attempt=2).refused == "claim_lost"
    over = ledger.charge(task.id, worker="w")
    assert (over.refused, over.escalated, over.exhausted_task_id) == ("budget", True, parent.id)
    # Parked under w's claim: not running; back in the queue or claimed by
    # another: w's claim is lost.
    assert ledger.charge(task.id, worker="w").refused == "not_running"
    ledger.requeue(task.id)
    assert ledger.charge(task.id, worker="w").refused == "claim_lost"
    assert ledger.charge(task.id).refused == "not_running"
    ledger.claim(task.id, "v")
    assert ledger.charge(task.id, worker="w").refused == "claim_lost"
    ledger.cancel(task.id)
    assert ledger.charge(task.id, worker="v").refused == "not_running"  # an operator's cancel
    assert ledger.charge(task.id, worker="w").refused == "claim_lost"
    # A clock behind the task's times refuses a charge past a limit without
    # escalating it: still the budget's refusal.
    spent = ledger.create_task(parent_id=parent.id)
    ledger.claim(spent.id, "w")
    clock.now -= 10
    behind = ledger.charge(spent.id, worker="w")
    assert (behind.refused, behind.escalated) == ("budget", False)
    assert ledger.charge(spent.id, calls=0).refused is None


@pytest.mark.parametrize("method", ["charge", "budget", "grant"])
def test_unknown_task_is_not_found(db_path: Path, clock: FrozenClock, method: str) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        ledger.create_task()
    amount = {"calls": 1} if method == "grant" else {}  # a grant of nothing is bad input
    with unchanged_file(db_path, clock) as ledger, pytest.raises(TaskNotFound):
        getattr(ledger, method)(str(uuid.uuid4()), **amount)


@pytest.mark.parametrize("state", ["queued", "blocked", "succeeded", "cancelled"])
def test_charge_on_a_task_that_is_not_running_changes_nothing(
    db_path: Path, clock: FrozenClock, state: str
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task()
        _put_parent_in(ledger, task.id, state)
    with unchanged_file(db_path, clock) as ledger:
        answer = ledger.charge(task.id)
        assert (answer.allowed, answer.escalated) == (False, False)
        assert answer.calls_used == 0
        assert ledger.charge(task.id, calls=100).allowed is False


def test_a_charge_past_the_limit_with_a_lagging_clock_is_refused_not_raised(
    db_path: Path, clock: FrozenClock
) -> None:
    """The escalation must not be dated before the task's last write, and a
    charge never raises for state: refused, nothing written, and the first
    charge past the limit once the clock has caught up escalates."""
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=1)
        ledger.claim(task.id, "w")
        assert ledger.charge(task.id, worker="w").allowed
    clock.advance(-0.001)
    with unchanged_file(db_path, clock) as ledger:
        refused = ledger.charge(task.id, worker="w")
        assert (refused.allowed, refused.escalated, refused.exhausted) == (False, False, "calls")
        assert refused.calls_used == 1
        assert ledger.get_task(task.id).status == "running"
        # A charge that fits reads no clock and is unaffected.
        assert ledger.charge(task.id, calls=0).allowed
    clock.advance(0.002)
    with Ledger(db_path, clock=clock) as ledger:
        escalated = ledger.charge(task.id, worker="w")
        assert (escalated.allowed, escalated.escalated) == (False, True)
        parked = ledger.get_task(task.id)
        assert (parked.status, parked.park_code, parked.updated_at) == (
            "escalated",
            "budget_exhausted",
            clock.now,
        )


# --------------------------------------------------------------------------
# grant


def _grant_events(db_path: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
        return conn.execute(
            f"SELECT {EVENT_TASK_ID}, code, grant_calls, grant_tokens, grant_cost_micros "
            "FROM task_events WHERE event_kind = 'budget_granted' ORDER BY sequence"
        ).fetchall()


def test_grant_raises_limits_and_is_recorded(db_path: Path, clock: FrozenClock) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=2, token_budget=10, cost_budget_micros=None)
        g1 = ledger.grant(task.id, calls=3)
        assert (g1.llm_calls_budget, g1.token_budget, g1.cost_budget_micros) == (5, 10, None)
        g2 = ledger.grant(task.id, tokens=5, cost_micros=1000)
        # Unlimited stays unlimited.
        assert (g2.llm_calls_budget, g2.token_budget, g2.cost_budget_micros) == (5, 15, None)
        assert g2.status == "queued"
    events = _grant_events(db_path)
    assert len(events) == 2
    assert events[0][0] == task.id and events[0][2:] == (3, 0, 0)
    # The history says what the grant added: nothing to the unlimited cost.
    assert events[1][0] == task.id and events[1][2:] == (0, 5, 0)
    assert all(e[1] == "budget_granted" for e in events)


def test_a_grant_to_unlimited_limits_only_writes_nothing(db_path: Path, clock: FrozenClock) -> None:
    """An operator granting "a bit of everything" to a task whose limits
    are unlimited raises nothing: the task comes back as it was, and no
    event claims a grant that changed nothing."""
    with Ledger(db_path, clock=clock) as ledger:
        unlimited = ledger.create_task(llm_calls_budget=None)
    with unchanged_file(db_path, clock) as ledger:
        assert ledger.grant(unlimited.id, calls=7, tokens=5, cost_micros=9) == unlimited
    assert _grant_events(db_path) == []


def test_grant_never_lowers_a_limit(db_path: Path, clock: FrozenClock) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=5, token_budget=5, cost_budget_micros=5)
    for field in ("calls", "tokens", "cost_micros"):
        with unchanged_file(db_path, clock) as ledger, pytest.raises(InvalidInput):
            ledger.grant(task.id, **{field: -1})
    with Ledger(db_path, clock=clock) as ledger:
        t = ledger.get_task(task.id)
        assert (t.llm_calls_budget, t.token_budget, t.cost_budget_micros) == (5, 5, 5)


def test_a_grant_of_nothing_is_bad_input(db_path: Path, clock: FrozenClock) -> None:
    """A grant without amounts (a CLI `grant` with no flags) raises no limit:
    refused, with no event and no new version."""
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=5)
    with unchanged_file(db_path, clock) as ledger, pytest.raises(InvalidInput):
        ledger.grant(task.id)
    with unchanged_file(db_path, clock) as ledger, pytest.raises(InvalidInput):
        ledger.grant(task.id, calls=0, tokens=0, cost_micros=0)


def test_grant_and_requeue_give_an_escalated_task_a_second_chance(
    db_path: Path, clock: FrozenClock
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=2, token_budget=100)
        ledger.claim(task.id, "A")
        assert ledger.charge(task.id, tokens=40, worker="A").allowed
        assert ledger.charge(task.id, tokens=40, worker="A").allowed
        assert ledger.charge(task.id, worker="A").escalated
        # Granting alone does not resume the task.
        granted = ledger.grant(task.id, calls=3, tokens=50)
        assert granted.status == "escalated"
        assert (granted.llm_calls_budget, granted.token_budget) == (5, 150)
        assert counters(granted) == (2, 80, 0)
        assert ledger.charge(task.id, worker="A").allowed is False
        queued = ledger.requeue(task.id)
        assert queued.status == "queued" and queued.owner is None
        again = ledger.claim(task.id, "B")
        assert again is not None and again.attempt_count == 2
        # Counters are cumulative: 3 more calls up to the new limit of 5.
        for used in (3, 4, 5):
            answer = ledger.charge(task.id, tokens=10, worker="B", attempt=2)
            assert answer.allowed and answer.calls_used == used
            assert answer.calls_remaining == 5 - used
        refused = ledger.charge(task.id, worker="B", attempt=2)
        assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "calls")
        final = ledger.get_task(task.id)
        assert counters(final) == (5, 110, 0)
        assert final.status == "escalated" and final.park_code == "budget_exhausted"
    assert len(_grant_events(db_path)) == 1


def test_grant_on_an_ancestor_unblocks_its_subtree(ledger: Ledger) -> None:
    parent = ledger.create_task(llm_calls_budget=1)
    child = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
    ledger.claim(child.id, "w")
    assert ledger.charge(child.id).allowed
    assert ledger.charge(child.id).escalated
    ledger.grant(parent.id, calls=2)
    ledger.requeue(child.id)
    ledger.claim(child.id, "w")
    assert ledger.charge(child.id).allowed
    assert ledger.charge(child.id).allowed
    assert ledger.charge(child.id).exhausted == "calls"
    assert ledger.get_task(parent.id).llm_calls_used == 3


# --------------------------------------------------------------------------
# release and the attempts rule


def test_release_applies_max_attempts_and_requeue_buys_another_try(ledger: Ledger) -> None:
    task = ledger.create_task(max_attempts=2)
    first = ledger.claim(task.id, "w1")
    assert first is not None and first.attempt_count == 1
    back = ledger.release(task.id, "w1")
    assert (back.status, back.owner, back.park_code) == ("queued", None, None)

    second = ledger.claim(task.id, "w2")
    assert second is not None and second.attempt_count == 2
    with pytest.raises(StateConflict):
        ledger.release(task.id, "w1")  # not the owner
    parked = ledger.release(task.id, "w2")
    assert parked.status == "escalated"
    assert parked.park_code == "attempts_exhausted"
    assert ledger.claim(task.id, "w3") is None  # escalated is not queued

    requeued = ledger.requeue(task.id)
    assert requeued.status == "queued" and requeued.owner is None
    third = ledger.claim(task.id, "w3")  # claim ignores attempt_count
    assert third is not None
    assert (third.status, third.owner, third.attempt_count) == ("running", "w3", 3)
    # Past the maximum, the next release escalates again.
    assert ledger.release(task.id, "w3").park_code == "attempts_exhausted"


def test_release_of_a_task_that_is_not_running_is_a_conflict(ledger: Ledger) -> None:
    task = ledger.create_task()
    with pytest.raises(StateConflict):
        ledger.release(task.id, "w")
    ledger.claim(task.id, "w")
    ledger.close_task(task.id, "succeeded", worker="w")
    with pytest.raises(StateConflict):
        ledger.release(task.id, "w")
    assert ledger.get_task(task.id).status == "succeeded"


class IndexInt:
    """An integer that is not an ``int`` (as ``numpy.int64`` is): it
    converts through ``__index__`` alone."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class BrokenIndex:
    def __index__(self) -> int:
        raise RuntimeError("no value")


def test_integers_of_other_kinds_are_amounts(ledger: Ledger) -> None:
    """Token counts often come from numpy or a tokenizer as integers that
    are not ``int``: anything ``operator.index`` takes is an amount, under
    the same rules (non-negative, 64-bit). A failing conversion is bad
    input, never the conversion's own exception."""
    task = ledger.create_task(llm_calls_budget=IndexInt(5), token_budget=IndexInt(10_000))
    ledger.claim(task.id, "w")
    charge = ledger.charge(task.id, tokens=IndexInt(1_200), cost_micros=IndexInt(7), worker="w")
    assert (charge.allowed, charge.tokens_used, charge.cost_used_micros) == (True, 1_200, 7)
    assert charge.calls_budget == 5 and charge.token_budget == 10_000
    for bad in (IndexInt(-1), IndexInt(2**63), BrokenIndex()):
        with pytest.raises(InvalidInput, match=r"^tokens must be a non-negative 64-bit integer$"):
            ledger.charge(task.id, tokens=bad, worker="w")
    assert ledger.budget(task.id).tokens_used == 1_200


# ---------------------------------------------------------------------------
# Stopping a runaway tree


def test_cancel_with_subtree_stops_a_whole_tree_in_one_call(
    ledger: Ledger, clock: FrozenClock
) -> None:
    """Cancelling a parent alone leaves its running children charging against
    it; with subtree=True every task below it that is not finished is
    cancelled too (each with its own event), finished ones are left as
    they are, and the workers' next charges and heartbeats are refused."""
    root = ledger.create_task(llm_calls_budget=100)
    running = ledger.create_task(parent_id=root.id)
    queued = ledger.create_task(parent_id=root.id)
    done = ledger.create_task(parent_id=root.id, delivery_required=False)
    parked = ledger.create_task(parent_id=running.id)
    under_done = ledger.create_task(parent_id=done.id)
    ledger.claim(running.id, "w1")
    ledger.claim(parked.id, "w2")
    ledger.block(parked.id, worker="w2")
    ledger.close_task(done.id, "succeeded", code="worker_completed")
    clock.advance(5)

    answer = ledger.cancel(root.id, subtree=True)

    assert answer.id == root.id and answer.status == "cancelled"
    for task in (root, running, queued, parked, under_done):
        assert ledger.get_task(task.id).status == "cancelled", task.id
        assert ledger.events(task.id)[-1].code == "caller_cancelled"
    assert ledger.get_task(done.id).status == "succeeded"
    refused = ledger.charge(running.id, worker="w1")
    assert (refused.allowed, ledger.budget(root.id).calls_used) == (False, 0)
    with pytest.raises(StateConflict):
        ledger.heartbeat(running.id, worker="w1")
    events_before = {t.id: len(ledger.events(t.id)) for t in (root, running, parked)}
    ledger.cancel(root.id, subtree=True)  # again: nothing to do
    assert {t.id: len(ledger.events(t.id)) for t in (root, running, parked)} == events_before
    assert ledger.doctor()["healthy"] is True


def test_cancel_subtree_takes_a_bool_and_an_existing_task(ledger: Ledger) -> None:
    root = ledger.create_task()
    child = ledger.create_task(parent_id=root.id)
    with pytest.raises(InvalidInput, match="subtree must be bool"):
        ledger.cancel(root.id, subtree=1)  # type: ignore[arg-type]
    with pytest.raises(TaskNotFound):
        ledger.cancel(str(uuid.uuid4()), subtree=True)
    assert ledger.get_task(child.id).status == "queued"
    ledger.cancel(child.id, subtree=True)  # a leaf: just itself
    assert ledger.get_task(root.id).status == "queued"


def test_a_charge_names_the_task_whose_limit_ran_out(ledger: Ledger) -> None:
    """A child stopped by its parent's limit shows budget left of its own;
    exhausted_task_id says where to grant: the parent, not the child."""
    root = ledger.create_task(llm_calls_budget=1)
    child = ledger.create_task(parent_id=root.id, llm_calls_budget=10)
    own = ledger.create_task(llm_calls_budget=0)
    for task in (child, own):
        ledger.claim(task.id, "w")
    assert ledger.charge(child.id, worker="w").exhausted_task_id is None
    stopped = ledger.charge(child.id, worker="w")
    assert (stopped.escalated, stopped.exhausted, stopped.calls_remaining) == (True, "calls", 9)
    assert stopped.exhausted_task_id == root.id
    assert ledger.budget(child.id).exhausted_task_id == root.id
    assert ledger.charge(own.id, worker="w").exhausted_task_id == own.id
    ledger.grant(root.id, calls=5)
    ledger.requeue(child.id)
    assert ledger.budget(child.id).exhausted_task_id is None


def test_cancel_subtree_reads_the_clock_once_and_is_not_stopped_by_skew(db_path: Path) -> None:
    """One subtree cancel is one write: one clock reading for every task.
    A sub-agent stamped by a host whose clock runs ahead is cancelled at
    its own latest time (its times never go backwards) instead of the
    whole emergency stop being refused while the tree charges on; a plain
    cancel of that task is still refused, as every write behind a task's
    times is."""
    clock = FrozenClock(1_000.0)
    reads: list[float] = []

    def counting() -> float:
        reads.append(clock.now)
        return clock.now

    with Ledger(db_path, clock=counting) as ledger:
        root = ledger.create_task(llm_calls_budget=10)
        children = [ledger.create_task(parent_id=root.id) for _ in range(3)]
        clock.now = 1_005.0  # this sub-agent's host runs 5 s ahead
        ledger.claim(children[0].id, "fast-host")
        clock.now = 1_001.0
        with pytest.raises(StateConflict, match="clock moved backwards"):
            ledger.cancel(children[0].id)
        reads.clear()
        ledger.cancel(root.id, subtree=True)
        assert reads == [1_001.0]
        ended = {t.id: ledger.get_task(t.id).ended_at for t in (root, *children)}
        assert ended == {root.id: 1_001.0, children[0].id: 1_005.0} | {
            c.id: 1_001.0 for c in children[1:]
        }
        assert ledger.charge(children[0].id, worker="fast-host").allowed is False
        assert ledger.doctor()["healthy"] is True
        assert [e.at for e in ledger.events(children[0].id)][-1] == 1_005.0


def test_cancel_subtree_under_a_root_that_already_ended(ledger: Ledger) -> None:
    """An orchestrator timed out by reconcile while its sub-agents run on:
    the subtree cancel stops them and leaves the ended root as it is (a
    plain cancel of it is a conflict, as ever)."""
    root = ledger.create_task()
    child = ledger.create_task(parent_id=root.id)
    ledger.claim(root.id, "boss")
    ledger.claim(child.id, "w1")
    ledger.close_task(root.id, "timed_out", code="worker_lost")
    with pytest.raises(StateConflict):
        ledger.cancel(root.id)
    assert ledger.cancel(root.id, subtree=True).status == "timed_out"
    assert ledger.get_task(child.id).status == "cancelled"
    assert ledger.doctor()["healthy"] is True


def test_a_budget_escalation_is_recorded_for_the_charging_worker(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=0)
    ledger.claim(task.id, "w1")
    assert ledger.charge(task.id, worker="w1").escalated
    last = ledger.events(task.id)[-1]
    assert (last.to_state, last.code, last.worker) == ("escalated", "budget_exhausted", "w1")


def test_with_limits_used_up_on_both_the_task_and_an_ancestor_the_nearest_is_named(
    ledger: Ledger,
) -> None:
    """The chain is judged nearest first (charge.rs: "the task and its
    ancestors, nearest first"): with both the task's own limit and its
    parent's used up, exhausted_task_id names the task itself; once it is
    granted more, the parent's limit is the one left to name."""
    root = ledger.create_task(llm_calls_budget=1)
    child = ledger.create_task(parent_id=root.id, llm_calls_budget=1)
    ledger.claim(child.id, "w")
    assert ledger.charge(child.id, worker="w").allowed  # both limits now used up
    assert ledger.budget(child.id).exhausted_task_id == child.id
    stopped = ledger.charge(child.id, worker="w")
    assert (stopped.escalated, stopped.exhausted) == (True, "calls")
    assert stopped.exhausted_task_id == child.id
    refused = ledger.charge(child.id, worker="w")  # not running: budget()'s figures
    assert (refused.allowed, refused.exhausted_task_id) == (False, child.id)

    ledger.grant(child.id, calls=5)
    ledger.requeue(child.id)
    assert ledger.budget(child.id).exhausted_task_id == root.id
    ledger.claim(child.id, "w")
    again = ledger.charge(child.id, worker="w")
    assert (again.escalated, again.exhausted_task_id) == (True, root.id)


def test_budget_names_used_up_dimensions_in_the_charge_s_order(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=None, token_budget=1, cost_budget_micros=1)
    ledger.claim(task.id, "w")
    filled = ledger.charge(task.id, calls=0, tokens=1, cost_micros=1, worker="w")
    assert (filled.allowed, filled.exhausted) == (True, None)
    assert ledger.budget(task.id).exhausted == "tokens"
    stopped = ledger.charge(task.id, calls=0, tokens=1, cost_micros=1, worker="w")
    assert (stopped.escalated, stopped.exhausted) == (True, "tokens")
    # Refused now (escalated): the figures are budget()'s, in the same order.
    assert ledger.charge(task.id, cost_micros=1).exhausted == "tokens"
