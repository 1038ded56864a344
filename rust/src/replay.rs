//! Replaying one task's events: does each stored hash extend the chain,
//! and does the chain tell a path through the state machines that ends in
//! the row as stored? Shared by `doctor`, which counts what fails, and by
//! `history`, which refuses to return a history that fails.

use rusqlite::Row;

use crate::events::{self, Event, Hash};
use crate::fsm::{self, DeliveryStatus, TaskStatus};
use crate::task::TaskRow;

/// The columns [`event_row`] reads, in its order, from [`EVENTS_OF_TASKS`]:
/// an event names its task by number, and the chain hashes its task's id.
pub const EVENT_COLUMNS: &str = "t.id, e.event_kind, e.from_value, e.to_value, e.occurred_at, \
    e.code, e.worker, e.grant_calls, e.grant_tokens, e.grant_cost_micros, e.event_hash, \
    e.sequence, e.task_no";

/// Every event beside its task (an event whose task is missing is not
/// here). `CROSS JOIN` keeps the tasks the outer loop: in the order of an
/// index of theirs, each task's events then follow through the events'
/// index, already in order, where SQLite would otherwise sort them all.
pub const EVENTS_OF_TASKS: &str = "tasks t CROSS JOIN task_events e ON e.task_no = t.task_no";

/// One event row as read.
pub struct EventRow {
    pub event: Event,
    pub stored_hash: Option<Hash>,
    pub sequence: i64,
    /// The number of the task it names.
    pub task_no: i64,
    /// Some but not all of the three grant columns are set. Such a row has
    /// no grant to hash, so only this flag tells it from an untouched one.
    partial_grant: bool,
}

/// Decodes a row selected with [`EVENT_COLUMNS`].
pub fn event_row(row: &Row<'_>) -> rusqlite::Result<EventRow> {
    let grant: (Option<i64>, Option<i64>, Option<i64>) = (row.get(7)?, row.get(8)?, row.get(9)?);
    let task_id: String = row.get(0)?;
    let sequence = row.get(11).unwrap_or(-1);
    let stored_hash = match row.get_ref(10)? {
        rusqlite::types::ValueRef::Blob(b) => b.try_into().ok(),
        _ => None,
    };
    Ok(EventRow {
        event: Event {
            task_id,
            kind: row.get(1)?,
            from: row.get(2)?,
            to: row.get(3)?,
            at: row.get(4)?,
            code: row.get(5)?,
            worker: row.get(6)?,
            grant: match grant {
                (Some(c), Some(t), Some(m)) => Some((c, t, m)),
                _ => None,
            },
        },
        sequence,
        task_no: row.get(12)?,
        stored_hash,
        partial_grant: {
            let set = [grant.0.is_some(), grant.1.is_some(), grant.2.is_some()];
            set.contains(&true) && set.contains(&false)
        },
    })
}

/// Replays one task's events: the hash chain and the state machine.
pub struct Chain {
    hash: Hash,
    broken: bool,
    bad: bool,
    count: usize,
    status: TaskStatus,
    /// When the `created` event says the task was created.
    created_at: Option<f64>,
    /// When the last status event (or the `created` one) happened: a
    /// task's `updated_at` moves with each, and without an event only by a
    /// heartbeat, which only a running task takes.
    last_status_at: Option<f64>,
    last_running_at: Option<f64>,
    terminal: Option<(f64, Option<String>)>,
    park_code: Option<String>,
    delivery: Option<(DeliveryStatus, f64, Option<String>)>,
    /// Claim bookkeeping as the events tell it: each move into running is
    /// an attempt by the event's worker; back to the queue drops the owner.
    owner: Option<String>,
    attempts: i64,
}

impl Chain {
    #[must_use]
    pub fn new() -> Chain {
        Chain {
            hash: events::GENESIS,
            broken: false,
            bad: false,
            count: 0,
            status: TaskStatus::Queued,
            created_at: None,
            last_status_at: None,
            last_running_at: None,
            terminal: None,
            park_code: None,
            delivery: None,
            owner: None,
            attempts: 0,
        }
    }

    /// Takes the task's next event, in sequence order.
    pub fn feed(&mut self, row: &EventRow) {
        let e = &row.event;
        let expected = events::chain_hash(&self.hash, e);
        if row.stored_hash != Some(expected) {
            self.broken = true;
        }
        self.hash = row.stored_hash.unwrap_or(expected);
        let first = self.count == 0;
        self.count += 1;
        // Only a grant event carries grant amounts, and then all three.
        let grant_ok =
            !row.partial_grant && (e.grant.is_some() == (e.kind == events::BUDGET_GRANTED));
        let ok = match (first, e.kind.as_str()) {
            (true, events::CREATED) => {
                self.created_at = Some(e.at);
                self.last_status_at = Some(e.at);
                e.from.is_none() && e.to == "queued" && e.code.as_deref() == Some("created")
            }
            (false, events::TASK_TRANSITION) => self.task_transition(e),
            (false, events::DELIVERY_TRANSITION) => self.delivery_transition(e),
            (false, events::BUDGET_GRANTED) => {
                // A grant's time is in its event only (no row time checks
                // it): at least bound it, finite and not before the task.
                e.at.is_finite()
                    && self.created_at.is_some_and(|created| e.at >= created)
                    && e.from.is_none()
                    && e.to == self.status.as_str()
                    && e.code.as_deref() == Some("budget_granted")
                    && e.grant.is_some_and(|(c, t, m)| c >= 0 && t >= 0 && m >= 0)
            }
            _ => false,
        };
        self.bad |= !(ok && grant_ok);
    }

    fn task_transition(&mut self, e: &Event) -> bool {
        let (Some(from), Ok(to)) = (e.from.as_deref(), TaskStatus::from_stored(&e.to)) else {
            return false;
        };
        let code_ok = match e.code.as_deref() {
            Some(c) => fsm::stored_codes(to).contains(&c),
            None => to.is_terminal(),
        };
        if from != self.status.as_str() || !fsm::can_transition(self.status, to) || !code_ok {
            return false;
        }
        self.status = to;
        self.last_status_at = Some(e.at);
        match to {
            TaskStatus::Running => {
                self.last_running_at = Some(e.at);
                self.attempts = self.attempts.saturating_add(1);
                self.owner.clone_from(&e.worker);
            }
            TaskStatus::Queued => self.owner = None,
            TaskStatus::Blocked | TaskStatus::Escalated => self.park_code.clone_from(&e.code),
            s if s.is_terminal() => self.terminal = Some((e.at, e.code.clone())),
            _ => {}
        }
        true
    }

    fn delivery_transition(&mut self, e: &Event) -> bool {
        let Ok(to) = DeliveryStatus::from_stored(&e.to) else {
            return false;
        };
        let code_ok = e
            .code
            .as_deref()
            .is_none_or(|c| fsm::delivery_codes(to).contains(&c));
        let ok = self.status.is_terminal()
            && self.delivery.is_none()
            && e.from.as_deref() == Some("pending")
            && to.is_terminal()
            && code_ok;
        self.delivery = Some((to, e.at, e.code.clone()));
        ok
    }

    /// Whether the row's owner and attempt count are the ones its events
    /// tell; only judged on an intact chain (a broken one is counted there).
    #[must_use]
    pub fn claims_match(&self, task: &TaskRow) -> bool {
        self.broken || self.bad || (self.owner == task.owner && self.attempts == task.attempt_count)
    }

    /// (chain broken, events inconsistent with the row).
    #[must_use]
    pub fn finish(self, task: &TaskRow) -> (bool, bool) {
        let broken = self.broken || self.hash != task.event_head;
        let terminal_ok = !task.status.is_terminal()
            || self.terminal.as_ref().is_some_and(|(at, code)| {
                Some(*at) == task.ended_at && *code == task.terminal_code
            });
        let start_ok = task
            .started_at
            .is_none_or(|s| self.last_running_at == Some(s));
        let park_ok = !task.status.is_parked() || self.park_code == task.park_code;
        let times_ok = self.created_at == Some(task.created_at)
            && self.last_status_at.is_some_and(|at| match task.status {
                TaskStatus::Running => task.updated_at >= at,
                _ => task.updated_at == at,
            });
        let delivery_ok = match &self.delivery {
            None => !task.delivery_status.is_terminal(),
            Some((to, at, code)) => {
                *to == task.delivery_status
                    && *at == task.delivery_updated_at
                    && *code == task.delivery_code
            }
        };
        let consistent = self.count > 0
            && self.status == task.status
            && terminal_ok
            && start_ok
            && park_ok
            && times_ok
            && delivery_ok;
        (broken, self.bad || !consistent)
    }
}
