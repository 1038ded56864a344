//! The lifecycle operations of SPEC §2.1 and §3: create, read, start,
//! heartbeat, close, delivery, and the one guarded write path that every
//! status change goes through.

use std::collections::HashSet;
use std::sync::LazyLock;

use rusqlite::{params, ToSql, Transaction};

use crate::errors::{Error, Result};
use crate::events::{self, Event};
use crate::fsm::{self, DeliveryStatus, TaskStatus};
use crate::task::{Limits, TaskRow, Usage, COLUMNS};

/// Reads the clock inside the transaction, when (and only when) a write is
/// about to happen, as the peer does.
pub type Clock<'a> = &'a dyn Fn() -> Result<f64>;

/// The arguments of `create_task`, validated.
#[derive(Clone, Debug, Default)]
pub struct NewTask {
    pub id: Option<String>,
    pub parent_id: Option<String>,
    pub payload_hash: Option<String>,
    pub timeout_seconds: Option<f64>,
    pub delivery_required: bool,
    pub tenant: Option<String>,
    pub limits: Limits,
    pub max_attempts: i64,
}

/// Who is writing: when given, the write is refused unless the task is
/// still owned by `worker` and still in attempt `attempt` (zombie fencing).
#[derive(Clone, Debug, Default)]
pub struct Fence {
    pub worker: Option<String>,
    pub attempt: Option<i64>,
}

impl Fence {
    /// Whether the write is made for a claim at all.
    #[must_use]
    pub fn is_given(&self) -> bool {
        self.worker.is_some() || self.attempt.is_some()
    }

    /// Refuses a writer whose claim is no longer the current one. A task
    /// without an owner (back in the queue, or closed while it was queued)
    /// is held by no claim: whoever fences it holds one that ended, even
    /// before the next claim raises the attempt count. A task run without
    /// an owner (by `start_task`, or by a `queued -> running` transition
    /// that named no worker) is held by its attempt alone, running, parked
    /// or ended: only `attempt=` can name that run (SPEC 2.2). Its start
    /// time tells it from a task that went back to the queue, which loses
    /// it.
    pub fn check(&self, task: &TaskRow) -> Result<()> {
        if !self.is_given() {
            return Ok(());
        }
        match (&self.worker, task.owner.as_deref()) {
            (None, None) if task.started_at.is_some() => {}
            (_, None) => return Err(Error::ClaimLost("no claim holds this task")),
            (Some(worker), Some(owner)) if worker != owner => {
                return Err(Error::ClaimLost("task is not owned by this worker"));
            }
            _ => {}
        }
        self.matches_attempt(task)
    }

    /// The attempt alone: what a claim through `transition` compares, as
    /// its worker is about to become the owner.
    fn matches_attempt(&self, task: &TaskRow) -> Result<()> {
        if let Some(attempt) = self.attempt {
            if task.attempt_count != attempt {
                return Err(Error::ClaimLost(
                    "the task's current claim is another attempt",
                ));
            }
        }
        Ok(())
    }

    /// A refusal because of the task's status: for a write made for a
    /// claim that no longer holds the task running, the claim is over
    /// ([`Error::ClaimLost`]); otherwise (no claim named, or the caller's
    /// own claim still runs the task and asked for a move it does not
    /// allow) the stored state simply does not allow it.
    #[must_use]
    pub fn status_refusal(&self, task: &TaskRow, why: &'static str) -> Error {
        let holds = task.status == TaskStatus::Running && self.check(task).is_ok();
        if self.is_given() && !holds {
            Error::ClaimLost(why)
        } else {
            Error::Conflict(why)
        }
    }
}

/// One task by id. Built once: nearly every call loads a task, and the
/// statement cache is looked up by this long text.
static LOAD_SQL: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {COLUMNS} FROM tasks WHERE id = ?1"));

/// Loads and validates one task, if it exists.
pub fn load(tx: &Transaction<'_>, id: &str) -> Result<Option<TaskRow>> {
    let mut stmt = tx.prepare_cached(&LOAD_SQL)?;
    let mut rows = stmt.query([id])?;
    match rows.next()? {
        Some(row) => Ok(Some(TaskRow::checked(row)?)),
        None => Ok(None),
    }
}

/// Loads one task or fails with `NotFound`.
pub fn get(tx: &Transaction<'_>, id: &str) -> Result<TaskRow> {
    load(tx, id)?.ok_or(Error::NotFound)
}

/// The direct children of `id`, oldest first.
pub fn children(tx: &Transaction<'_>, id: &str) -> Result<Vec<TaskRow>> {
    get(tx, id)?;
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM tasks WHERE parent_id = ?1 ORDER BY created_at, id"
    ))?;
    let mut rows = stmt.query([id])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(TaskRow::checked(row)?);
    }
    Ok(out)
}

fn not_before(now: f64, task: &TaskRow) -> Result<()> {
    if now < task.latest_timestamp() {
        return Err(Error::Conflict(
            "clock moved backwards across a persisted transition",
        ));
    }
    Ok(())
}

/// The fields no later operation changes. Budget limits are left out on
/// purpose: `grant` raises them, and a retry after a grant is still a retry.
fn same_identity(task: &TaskRow, new: &NewTask) -> bool {
    task.parent_id == new.parent_id
        && task.payload_hash == new.payload_hash
        && task.timeout_seconds == new.timeout_seconds
        && task.delivery_required == new.delivery_required
        && task.tenant == new.tenant
        && task.max_attempts == new.max_attempts
}

thread_local! {
    /// Orders the ids one thread makes, even at one clock reading (a
    /// frozen test clock): a later id never sorts before an earlier one.
    static ID_SEQUENCE: uuid::ContextV7 = const { uuid::ContextV7::new() };
}

/// The latest time a version 7 UUID can hold (2^48 - 1 milliseconds).
const LATEST_ID_SECONDS: f64 = 281_474_976_710.655;

/// A new task id: a version 7 UUID carrying the task's creation time by
/// the ledger's clock, so an injected clock's ids agree with the tasks'
/// `created_at`. A time the UUID cannot hold (before 1970, after the
/// year 10889) is clamped: ids stay unique by their random bits, and no
/// clock setting can make the id fail (a system clock before 1970 once
/// made the UUID library panic).
fn new_id(now: f64) -> String {
    let seconds = if now > 0.0 {
        now.min(LATEST_ID_SECONDS)
    } else {
        0.0
    };
    // In range by the clamp: the casts neither wrap nor saturate.
    let whole = seconds.trunc() as u64;
    let nanos = ((seconds - seconds.trunc()) * 1e9) as u32;
    ID_SEQUENCE.with(|sequence| {
        uuid::Uuid::new_v7(uuid::Timestamp::from_unix(sequence, whole, nanos)).to_string()
    })
}

/// Creates a queued task, or returns the existing one when `new` repeats
/// its immutable fields (idempotent retry); other differences conflict.
pub fn create(tx: &Transaction<'_>, new: &NewTask, clock: Clock<'_>) -> Result<TaskRow> {
    let now = clock()?;
    let id = new.id.clone().unwrap_or_else(|| new_id(now));
    if let Some(existing) = load(tx, &id)? {
        return if same_identity(&existing, new) {
            Ok(existing)
        } else {
            Err(Error::Conflict(
                "task id already exists with different immutable fields",
            ))
        };
    }
    if let Some(parent_id) = &new.parent_id {
        let parent = get(tx, parent_id)?;
        not_before(now, &parent)?;
    }
    let event = Event {
        task_id: id.clone(),
        kind: events::CREATED.into(),
        from: None,
        to: TaskStatus::Queued.as_str().into(),
        at: now,
        code: Some("created".into()),
        worker: None,
        grant: None,
    };
    let task = TaskRow {
        id,
        parent_id: new.parent_id.clone(),
        status: TaskStatus::Queued,
        delivery_status: DeliveryStatus::Pending,
        delivery_required: new.delivery_required,
        payload_hash: new.payload_hash.clone(),
        // SQLite stores `-0.0` as `0.0`: the answer shows what is stored.
        timeout_seconds: new.timeout_seconds.map(|t| t + 0.0),
        created_at: now,
        started_at: None,
        updated_at: now,
        ended_at: None,
        deadline_at: None,
        delivery_updated_at: now,
        terminal_code: None,
        delivery_code: None,
        version: 0,
        tenant: new.tenant.clone(),
        owner: None,
        park_code: None,
        attempt_count: 0,
        max_attempts: new.max_attempts,
        usage: Usage::default(),
        limits: new.limits,
        event_head: events::chain_hash(&events::GENESIS, &event),
    };
    insert(tx, &task)?;
    events::append(tx, &events::GENESIS, &event)?;
    Ok(task)
}

fn insert(tx: &Transaction<'_>, t: &TaskRow) -> Result<()> {
    tx.prepare_cached(&format!(
        "INSERT INTO tasks ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, \
         ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28)"
    ))?
    .execute(params![
        t.id,
        t.parent_id,
        t.status.as_str(),
        t.delivery_status.as_str(),
        t.delivery_required,
        t.payload_hash,
        t.timeout_seconds,
        t.created_at,
        t.started_at,
        t.updated_at,
        t.ended_at,
        t.deadline_at,
        t.delivery_updated_at,
        t.terminal_code,
        t.delivery_code,
        t.version,
        t.tenant,
        t.owner,
        t.park_code,
        t.attempt_count,
        t.max_attempts,
        t.usage.calls,
        t.limits.calls,
        t.usage.tokens,
        t.limits.tokens,
        t.usage.cost_micros,
        t.limits.cost_micros,
        t.event_head
    ])?;
    Ok(())
}

/// Which columns a write changes. SQLite rewrites every index whose
/// columns appear in an UPDATE's SET list, changed or not, so each kind of
/// write names only its own columns: a heartbeat touches no index but
/// `updated_at`'s, a delivery none of the status indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Columns {
    /// A status change that does not end the task (no `ended_at`).
    Status,
    /// A status change into a terminal status (sets `ended_at`).
    Terminal,
    /// `updated_at` only (heartbeat).
    Heartbeat,
    /// The delivery columns.
    Delivery,
    /// Usage counters and limits (charge, grant).
    Budget,
}

impl Columns {
    fn sql(self) -> &'static str {
        match self {
            Columns::Status => {
                "UPDATE tasks SET status = ?3, started_at = ?4, updated_at = ?5, deadline_at = ?6,
                    owner = ?7, park_code = ?8, attempt_count = ?9, version = ?10, event_head = ?11
                 WHERE id = ?1 AND status = ?2 AND version = ?12"
            }
            Columns::Terminal => {
                "UPDATE tasks SET status = ?3, updated_at = ?4, ended_at = ?5, terminal_code = ?6,
                    park_code = ?7, version = ?8, event_head = ?9
                 WHERE id = ?1 AND status = ?2 AND version = ?10"
            }
            Columns::Heartbeat => {
                "UPDATE tasks SET updated_at = ?3, version = ?4
                 WHERE id = ?1 AND status = ?2 AND version = ?5"
            }
            Columns::Delivery => {
                "UPDATE tasks SET delivery_status = ?3, delivery_updated_at = ?4,
                    delivery_code = ?5, version = ?6, event_head = ?7
                 WHERE id = ?1 AND status = ?2 AND version = ?8"
            }
            Columns::Budget => {
                "UPDATE tasks SET llm_calls_used = ?3, tokens_used = ?4, cost_used_micros = ?5,
                    llm_calls_budget = ?6, token_budget = ?7, cost_budget_micros = ?8,
                    version = ?9, event_head = ?10
                 WHERE id = ?1 AND status = ?2 AND version = ?11"
            }
        }
    }
}

/// Writes `after`'s columns of the given kind, guarded by the status and
/// version that `before` was read with: a row that changed underneath is a
/// conflict, never silently overwritten.
pub fn save(
    tx: &Transaction<'_>,
    before: &TaskRow,
    after: &TaskRow,
    columns: Columns,
) -> Result<()> {
    let mut stmt = tx.prepare_cached(columns.sql())?;
    let (id, was, v) = (&after.id, before.status.as_str(), before.version);
    let changed = match columns {
        Columns::Status => stmt.execute(params![
            id,
            was,
            after.status.as_str(),
            after.started_at,
            after.updated_at,
            after.deadline_at,
            after.owner,
            after.park_code,
            after.attempt_count,
            after.version,
            &after.event_head[..],
            v
        ])?,
        Columns::Terminal => stmt.execute(params![
            id,
            was,
            after.status.as_str(),
            after.updated_at,
            after.ended_at,
            after.terminal_code,
            after.park_code,
            after.version,
            &after.event_head[..],
            v
        ])?,
        Columns::Heartbeat => stmt.execute(params![id, was, after.updated_at, after.version, v])?,
        Columns::Delivery => stmt.execute(params![
            id,
            was,
            after.delivery_status.as_str(),
            after.delivery_updated_at,
            after.delivery_code,
            after.version,
            &after.event_head[..],
            v
        ])?,
        Columns::Budget => stmt.execute(params![
            id,
            was,
            after.usage.calls,
            after.usage.tokens,
            after.usage.cost_micros,
            after.limits.calls,
            after.limits.tokens,
            after.limits.cost_micros,
            after.version,
            &after.event_head[..],
            v
        ])?,
    };
    if changed == 1 {
        Ok(())
    } else {
        Err(Error::Conflict("task changed concurrently"))
    }
}

/// The one path for a status change: checks the edge against the table,
/// computes the new row, appends the chained event and saves it guarded.
pub fn transition(
    tx: &Transaction<'_>,
    task: &TaskRow,
    to: TaskStatus,
    code: Option<&str>,
    worker: Option<&str>,
    now: f64,
) -> Result<TaskRow> {
    if !fsm::can_transition(task.status, to) {
        return Err(Error::Conflict(
            "transition is not allowed from the current status",
        ));
    }
    not_before(now, task)?;
    let mut next = task.moved(to, code, now, worker)?;
    let event = Event {
        task_id: task.id.clone(),
        kind: events::TASK_TRANSITION.into(),
        from: Some(task.status.as_str().into()),
        to: to.as_str().into(),
        at: now,
        code: code.map(str::to_owned),
        worker: worker.map(str::to_owned),
        grant: None,
    };
    next.event_head = events::append(tx, &task.event_head, &event)?;
    let columns = if to.is_terminal() {
        Columns::Terminal
    } else {
        Columns::Status
    };
    save(tx, task, &next, columns)?;
    Ok(next)
}

/// `start_task`: queued -> running (code `started`, no owner); a running
/// task is returned unchanged without reading the clock.
pub fn start(tx: &Transaction<'_>, id: &str, clock: Clock<'_>) -> Result<TaskRow> {
    let task = get(tx, id)?;
    match task.status {
        TaskStatus::Running => Ok(task),
        TaskStatus::Queued => transition(
            tx,
            &task,
            TaskStatus::Running,
            Some("started"),
            None,
            clock()?,
        ),
        status if status.is_terminal() => Err(Error::Conflict("terminal tasks cannot be started")),
        _ => Err(Error::Conflict(
            "task cannot be started from its current status",
        )),
    }
}

/// `heartbeat`: a running task proves it is alive (no event is written).
pub fn heartbeat(
    tx: &Transaction<'_>,
    id: &str,
    fence: &Fence,
    clock: Clock<'_>,
) -> Result<TaskRow> {
    let task = get(tx, id)?;
    if task.status != TaskStatus::Running {
        return Err(fence.status_refusal(&task, "only running tasks accept heartbeats"));
    }
    fence.check(&task)?;
    let now = clock()?;
    not_before(now, &task)?;
    let mut next = task.clone();
    next.updated_at = now;
    next.version = task.next_version()?;
    save(tx, &task, &next, Columns::Heartbeat)?;
    Ok(next)
}

/// A caller's reason code as given: text (or none), or something that is
/// not text. It is judged only where it would be written: the same
/// terminal status again ignores it, whatever it is, and a conflict is
/// reported before it (peer rules).
#[derive(Clone, Copy, Debug)]
pub enum CallerCode<'a> {
    Given(Option<&'a str>),
    NotText,
}

impl<'a> CallerCode<'a> {
    /// A code argument after conversion: `None` when it was not text.
    #[must_use]
    pub fn from_converted(converted: Option<&'a Option<String>>) -> CallerCode<'a> {
        match converted {
            Some(code) => CallerCode::Given(code.as_deref()),
            None => CallerCode::NotText,
        }
    }

    fn judged(self) -> Result<Option<&'a str>> {
        match self {
            CallerCode::Given(code) => Ok(code),
            CallerCode::NotText => Err(Error::Invalid(crate::validate::BAD_CODE_FORMAT)),
        }
    }
}

/// `close_task`: any edge of the table into a terminal status. The same
/// terminal status again is a no-op whose code is ignored (peer rule).
pub fn close(
    tx: &Transaction<'_>,
    id: &str,
    to: TaskStatus,
    code: CallerCode<'_>,
    fence: &Fence,
    clock: Clock<'_>,
) -> Result<TaskRow> {
    if !to.is_terminal() {
        return Err(Error::Invalid("close status must be terminal"));
    }
    let task = get(tx, id)?;
    if task.status == to {
        // Closing again is a no-op for the claim that held the task last
        // (the owner stays for audit), whoever ended it; never a success
        // for an older claim's zombie.
        fence.check(&task)?;
        return Ok(task);
    }
    if task.status.is_terminal() {
        return Err(fence.status_refusal(&task, "task already has a different terminal state"));
    }
    let code = code.judged()?;
    if let Some(code) = code {
        fsm::check_code(code, fsm::caller_codes(to), fsm::NOT_FOR_TASK_STATUS)?;
    }
    fence.check(&task)?;
    if !fsm::can_transition(task.status, to) {
        return Err(
            fence.status_refusal(&task, "transition is not allowed from the current status")
        );
    }
    transition(tx, &task, to, code, fence.worker.as_deref(), clock()?)
}

/// `set_delivery`: pending -> delivered | failed | not_applicable, only
/// after the task is terminal, and only the outcome its kind allows. A
/// fenced writer must be the claim that held the task last: a worker that
/// lost its task cannot decide the outcome of another worker's run.
pub fn set_delivery(
    tx: &Transaction<'_>,
    id: &str,
    to: DeliveryStatus,
    code: CallerCode<'_>,
    fence: &Fence,
    clock: Clock<'_>,
) -> Result<TaskRow> {
    if !to.is_terminal() {
        return Err(Error::Invalid("delivery close status must be terminal"));
    }
    let task = get(tx, id)?;
    fence.check(&task)?;
    if !task.status.is_terminal() {
        return Err(Error::Conflict(
            "delivery cannot close before the task is terminal",
        ));
    }
    if task.delivery_status == to {
        return Ok(task);
    }
    if task.delivery_status.is_terminal() {
        return Err(Error::Conflict(
            "delivery already has a different terminal state",
        ));
    }
    if task.delivery_required && to == DeliveryStatus::NotApplicable {
        return Err(Error::Conflict(
            "delivery-required tasks cannot be not_applicable",
        ));
    }
    if !task.delivery_required && to != DeliveryStatus::NotApplicable {
        return Err(Error::Conflict(
            "internal tasks require not_applicable delivery",
        ));
    }
    let code = code.judged()?;
    if let Some(code) = code {
        fsm::check_code(code, fsm::delivery_codes(to), fsm::NOT_FOR_DELIVERY_STATUS)?;
    }
    let now = clock()?;
    deliver(tx, &task, to, code, fence.worker.as_deref(), now)
}

/// Applies a delivery outcome, recording the worker it was set for.
pub fn deliver(
    tx: &Transaction<'_>,
    task: &TaskRow,
    to: DeliveryStatus,
    code: Option<&str>,
    worker: Option<&str>,
    now: f64,
) -> Result<TaskRow> {
    not_before(now, task)?;
    let mut next = task.clone();
    next.delivery_status = to;
    next.delivery_updated_at = now;
    next.delivery_code = code.map(str::to_owned);
    next.version = task.next_version()?;
    let event = Event {
        task_id: task.id.clone(),
        kind: events::DELIVERY_TRANSITION.into(),
        from: Some(DeliveryStatus::Pending.as_str().into()),
        to: to.as_str().into(),
        at: now,
        code: code.map(str::to_owned),
        worker: worker.map(str::to_owned),
        grant: None,
    };
    next.event_head = events::append(tx, &task.event_head, &event)?;
    save(tx, task, &next, Columns::Delivery)?;
    Ok(next)
}

/// Default and allowed codes for a caller-driven status change: the code
/// the ledger writes when none is given, and the check of a given one.
fn code_for_move(
    from: TaskStatus,
    to: TaskStatus,
    code: Option<&str>,
    worker: Option<&str>,
) -> Result<Option<String>> {
    let default = match to {
        TaskStatus::Running => Some(if worker.is_some() {
            "claimed"
        } else {
            "started"
        }),
        TaskStatus::Queued if from == TaskStatus::Running => Some("released"),
        TaskStatus::Queued => Some("requeued"),
        TaskStatus::Blocked => Some("needs_input"),
        TaskStatus::Escalated => Some("escalated_manually"),
        _ => None,
    };
    match code {
        None => Ok(default.map(str::to_owned)),
        Some(c) => {
            fsm::check_code(c, fsm::caller_codes(to), fsm::NOT_FOR_TASK_STATUS)?;
            Ok(Some(c.to_owned()))
        }
    }
}

/// Judges a caller's code for a move into `to` before anything is read or
/// written, where it can be: only the same terminal status again ignores
/// its code (SPEC 2.2.1), so a code for any other status is checked up
/// front, and bad input writes nothing (not even a new file), whatever the
/// task. Codes for terminal statuses are judged when written.
pub fn check_code_ahead(to: TaskStatus, code: Option<&str>) -> Result<()> {
    match code {
        Some(c) if !to.is_terminal() => {
            fsm::check_code(c, fsm::caller_codes(to), fsm::NOT_FOR_TASK_STATUS)
        }
        _ => Ok(()),
    }
}

/// Compare-and-set along the table: the stored status must be `expected`
/// (checked first), the edge must exist, and a fenced writer must still
/// hold the claim. The same terminal status again is a no-op.
pub fn compare_and_set(
    tx: &Transaction<'_>,
    id: &str,
    expected: TaskStatus,
    to: TaskStatus,
    code: Option<&str>,
    fence: &Fence,
    clock: Clock<'_>,
) -> Result<TaskRow> {
    let task = get(tx, id)?;
    // A `queued -> running` transition with a worker makes a claim; any
    // other fenced one is made for a claim, which a refusal ends.
    let makes_claim = expected == TaskStatus::Queued && to == TaskStatus::Running;
    let refusal = |why| {
        if makes_claim {
            Error::Conflict(why)
        } else {
            fence.status_refusal(&task, why)
        }
    };
    if task.status != expected {
        return Err(refusal("task is not in the expected status"));
    }
    if to.is_terminal() && task.status == to {
        fence.check(&task)?;
        return Ok(task);
    }
    if !fsm::can_transition(task.status, to) {
        return Err(refusal("transition is not allowed from the current status"));
    }
    let code = code_for_move(task.status, to, code, fence.worker.as_deref())?;
    if makes_claim {
        // A claim: the worker becomes the owner, so only the attempt the
        // caller expects is compared; a claim not made is no claim lost.
        fence
            .matches_attempt(&task)
            .map_err(|_| Error::Conflict("the task's current claim is another attempt"))?;
    } else {
        fence.check(&task)?;
    }
    let is_release = task.status == TaskStatus::Running && to == TaskStatus::Queued;
    let (to, code) = match task.release_target() {
        // This edge is a release, which escalates once attempts are used up.
        (escalated @ TaskStatus::Escalated, exhausted) if is_release => {
            (escalated, Some(exhausted.to_owned()))
        }
        _ => (to, code),
    };
    transition(
        tx,
        &task,
        to,
        code.as_deref(),
        fence.worker.as_deref(),
        clock()?,
    )
}

/// Moves a task from whatever it is now into `to` (block, escalate,
/// requeue, cancel), with the table as the only judge.
pub fn move_to(
    tx: &Transaction<'_>,
    id: &str,
    to: TaskStatus,
    code: Option<&str>,
    fence: &Fence,
    clock: Clock<'_>,
) -> Result<TaskRow> {
    let task = get(tx, id)?;
    // `requeue` is the operator's way back from a parked status; a running
    // task goes back to the queue only through its owner's `release`.
    if to == TaskStatus::Queued && !task.status.is_parked() {
        return Err(Error::Conflict(
            "only a blocked or escalated task can be requeued",
        ));
    }
    compare_and_set(tx, id, task.status, to, code, fence, clock)
}

/// Cancels `id` and every task below it that is not terminal yet, in one
/// transaction: the operator's stop for a runaway tree, whose running
/// tasks would otherwise go on charging against their ancestors. Each
/// cancellation is its own event (`caller_cancelled`); terminal tasks,
/// the root included (an orchestrator reconcile timed out while its
/// sub-agents ran on), are left as they are. Returns the root.
///
/// The clock is read once, as for any write. A task whose own times are
/// later than that reading (a worker's host clock ran ahead) is cancelled
/// at its latest time, so its times never go backwards: an emergency stop
/// refused for a few seconds of skew would leave the tree charging. For
/// the same reason a damaged descendant is passed over, not a refusal.
pub fn cancel_tree(tx: &Transaction<'_>, id: &str, clock: Clock<'_>) -> Result<TaskRow> {
    let root = get(tx, id)?;
    let now = clock()?;
    // A tree of 100,000 tasks takes seconds: Ctrl-C stops it, and its
    // transaction writes nothing.
    let mut signals = crate::busy::LoopSignals::starting_now();
    for task in open_descendants(tx, &root.id)? {
        if signals.due() {
            signals.check()?;
        }
        cancel_at(tx, &task, now)?;
    }
    if root.status.is_terminal() {
        return Ok(root);
    }
    cancel_at(tx, &root, now)
}

/// The tasks below `root` that are not terminal yet, read in one
/// statement. A damaged row (one no write accepts) is passed over, left for
/// doctor: it must not stop the rest of the tree.
fn open_descendants(tx: &Transaction<'_>, root: &str) -> Result<Vec<TaskRow>> {
    // UNION, not UNION ALL: a parent cycle in a damaged file ends the walk.
    let mut stmt = tx.prepare_cached(&format!(
        "WITH RECURSIVE below(id) AS (
            SELECT id FROM tasks WHERE parent_id = ?1
            UNION SELECT t.id FROM tasks t JOIN below b ON t.parent_id = b.id)
         SELECT {COLUMNS} FROM tasks WHERE id IN (SELECT id FROM below WHERE id <> ?1)
         ORDER BY id"
    ))?;
    let mut rows = stmt.query([root])?;
    let mut open = Vec::new();
    while let Some(row) = rows.next()? {
        if let Ok(task) = TaskRow::checked(row) {
            if !task.status.is_terminal() && task.next_version().is_ok() {
                open.push(task);
            }
        }
    }
    Ok(open)
}

/// One cancellation of a subtree cancel, at `now` or, when the task's own
/// times are later, at its latest time.
fn cancel_at(tx: &Transaction<'_>, task: &TaskRow, now: f64) -> Result<TaskRow> {
    let at = now.max(task.latest_timestamp());
    compare_and_set(
        tx,
        &task.id,
        task.status,
        TaskStatus::Cancelled,
        Some("caller_cancelled"),
        &Fence::default(),
        &|| Ok(at),
    )
}

/// An operator raises a task's limits (never lowers them); recorded as a
/// `budget_granted` event carrying the amounts it added.
pub fn grant(tx: &Transaction<'_>, id: &str, amount: Usage, clock: Clock<'_>) -> Result<TaskRow> {
    // A grant of nothing is a mistake (a CLI `grant` without amounts), not
    // an operator's decision worth an event and a version.
    if amount == Usage::default() {
        return Err(Error::Invalid("a grant needs at least one positive amount"));
    }
    let task = get(tx, id)?;
    let amount = crate::budget::granted(task.limits, amount);
    if amount == Usage::default() {
        // Every amount asked was for an unlimited dimension: nothing to
        // raise, nothing to record.
        return Ok(task);
    }
    let limits = crate::budget::raise(task.limits, amount)?;
    let now = clock()?;
    not_before(now, &task)?;
    let event = Event {
        task_id: task.id.clone(),
        kind: events::BUDGET_GRANTED.into(),
        from: None,
        to: task.status.as_str().into(),
        at: now,
        code: Some("budget_granted".into()),
        worker: None,
        grant: Some((amount.calls, amount.tokens, amount.cost_micros)),
    };
    let mut next = task.clone();
    next.limits = limits;
    next.version = task.next_version()?;
    next.event_head = events::append(tx, &task.event_head, &event)?;
    save(tx, &task, &next, Columns::Budget)?;
    Ok(next)
}

/// Filters and a keyset cursor for `list_tasks`.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    pub status: Option<TaskStatus>,
    pub tenant: Option<String>,
    pub owner: Option<String>,
    pub parent_id: Option<String>,
    pub limit: i64,
    /// List tasks after this one in (created_at, id) order.
    pub after: Option<String>,
}

/// Tasks matching every given filter, oldest first, at most `limit`.
pub fn list(tx: &Transaction<'_>, q: &ListQuery) -> Result<Vec<TaskRow>> {
    // An unknown parent is `TaskNotFound`, as it is for `children_of`.
    if let Some(parent) = &q.parent_id {
        get(tx, parent)?;
    }
    let cursor = match &q.after {
        Some(id) => {
            let t = get(tx, id)?;
            Some((t.created_at, t.id))
        }
        None => None,
    };
    let mut stmt = tx.prepare_cached(&list_sql(q, cursor.is_some()))?;
    let given: [(&str, Option<&dyn ToSql>); 6] = [
        (":tenant", q.tenant.as_ref().map(|v| v as &dyn ToSql)),
        (":owner", q.owner.as_ref().map(|v| v as &dyn ToSql)),
        (":parent", q.parent_id.as_ref().map(|v| v as &dyn ToSql)),
        (":after_at", cursor.as_ref().map(|c| &c.0 as &dyn ToSql)),
        (":after_id", cursor.as_ref().map(|c| &c.1 as &dyn ToSql)),
        (":limit", Some(&q.limit as &dyn ToSql)),
    ];
    let bound: Vec<(&str, &dyn ToSql)> = given
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| (name, v)))
        .collect();
    let mut rows = stmt.query(bound.as_slice())?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(TaskRow::checked(row)?);
    }
    Ok(out)
}

/// The page query with a term for each filter given, and no other: one
/// generic statement (`?1 IS NULL OR status = ?1`, ...) could use no index,
/// so every page scanned and sorted the whole table. A status is written
/// as its literal (one of a fixed few, never caller text), so SQLite can
/// use the partial index made for it: the queue's, the running tasks'.
/// Any other page reads the tasks' creation order (or a parent's children
/// in theirs) from its cursor on. The keyset cursor is a row value, a
/// range on (created_at, id).
fn list_sql(q: &ListQuery, after: bool) -> String {
    let status = q.status.map(|s| format!("status = '{}'", s.as_str()));
    // Running tasks are few and the newest: walking the creation order to
    // them would pass every closed task first. Their own index, sorted, is
    // bounded by how many run at once.
    let index = if q.status == Some(TaskStatus::Running) {
        "INDEXED BY tasks_running_idx"
    } else {
        ""
    };
    let terms: Vec<String> = [
        status,
        q.tenant.as_ref().map(|_| "tenant = :tenant".to_owned()),
        q.owner.as_ref().map(|_| "owner = :owner".to_owned()),
        q.parent_id
            .as_ref()
            .map(|_| "parent_id = :parent".to_owned()),
        after.then(|| "(created_at, id) > (:after_at, :after_id)".to_owned()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let filter = if terms.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", terms.join(" AND "))
    };
    format!("SELECT {COLUMNS} FROM tasks {index} {filter} ORDER BY created_at, id LIMIT :limit")
}

/// A task's ancestors, nearest first. A cycle (only possible in a tampered
/// file) is a conflict rather than an endless walk.
pub fn ancestors(tx: &Transaction<'_>, task: &TaskRow) -> Result<Vec<TaskRow>> {
    let mut out: Vec<TaskRow> = Vec::new();
    // A set, not a search of `out`: a chain 30,000 deep took seconds to
    // walk, inside a charge's write transaction.
    let mut seen = HashSet::from([task.id.clone()]);
    let mut next = task.parent_id.clone();
    while let Some(id) = next.take() {
        if !seen.insert(id.clone()) {
            return Err(Error::Conflict("task tree has a cycle"));
        }
        let parent = get(tx, &id)?;
        next.clone_from(&parent.parent_id);
        out.push(parent);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{list_sql, ListQuery};
    use crate::fsm::TaskStatus;
    use crate::schema::test_support::plan;

    fn query(status: Option<TaskStatus>, tenant: bool, parent: bool) -> ListQuery {
        ListQuery {
            status,
            tenant: tenant.then(|| "t".to_owned()),
            owner: None,
            parent_id: parent.then(|| "p".to_owned()),
            limit: 100,
            after: None,
        }
    }

    /// A page reads from an index wherever one fits the filters instead
    /// of scanning the whole table: the queue's, a parent's children's and
    /// the creation order's from the cursor on; the running tasks' (an
    /// index in another order) all of their entries, sorted.
    #[test]
    fn list_pages_read_the_index_that_fits() -> crate::errors::Result<()> {
        let queued = query(Some(TaskStatus::Queued), false, false);
        assert_eq!(
            plan(&list_sql(&queued, true))?,
            "SEARCH tasks USING INDEX tasks_queue_idx ((created_at,id)>(?,?))"
        );
        assert_eq!(
            plan(&list_sql(
                &query(Some(TaskStatus::Queued), true, false),
                true
            ))?,
            "SEARCH tasks USING INDEX tasks_tenant_queue_idx (tenant=? AND (created_at,id)>(?,?))"
        );
        assert_eq!(
            plan(&list_sql(&query(None, false, true), true))?,
            "SEARCH tasks USING INDEX tasks_parent_idx (parent_id=? AND (created_at,id)>(?,?))"
        );
        let running = plan(&list_sql(
            &query(Some(TaskStatus::Running), false, false),
            false,
        ))?;
        assert!(
            running.starts_with("SCAN tasks USING INDEX tasks_running_idx"),
            "{running}"
        );
        for other in [
            query(None, false, false),
            query(None, true, false),
            query(Some(TaskStatus::Succeeded), false, false),
            query(Some(TaskStatus::Escalated), true, false),
        ] {
            assert_eq!(
                plan(&list_sql(&other, true))?,
                "SEARCH tasks USING INDEX tasks_created_idx ((created_at,id)>(?,?))"
            );
        }
        Ok(())
    }
}
