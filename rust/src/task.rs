//! A task row as stored, how it is read, and the invariants every read
//! re-checks (so a tampered row is refused rather than believed).

use rusqlite::Row;

use crate::errors::{Error, Result};
use crate::fsm::{self, DeliveryStatus, TaskStatus};
use crate::validate;

/// Column list matching [`TaskRow::from_row`].
pub const COLUMNS: &str = "id, parent_id, status, delivery_status, delivery_required, \
    payload_hash, timeout_seconds, created_at, started_at, updated_at, ended_at, deadline_at, \
    delivery_updated_at, terminal_code, delivery_code, version, tenant, owner, park_code, \
    attempt_count, max_attempts, llm_calls_used, llm_calls_budget, tokens_used, token_budget, \
    cost_used_micros, cost_budget_micros, event_head";

/// One task, every column.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRow {
    pub id: String,
    pub parent_id: Option<String>,
    pub status: TaskStatus,
    pub delivery_status: DeliveryStatus,
    pub delivery_required: bool,
    pub payload_hash: Option<String>,
    pub timeout_seconds: Option<f64>,
    pub created_at: f64,
    pub started_at: Option<f64>,
    pub updated_at: f64,
    pub ended_at: Option<f64>,
    pub deadline_at: Option<f64>,
    pub delivery_updated_at: f64,
    pub terminal_code: Option<String>,
    pub delivery_code: Option<String>,
    pub version: i64,
    pub tenant: Option<String>,
    pub owner: Option<String>,
    pub park_code: Option<String>,
    pub attempt_count: i64,
    pub max_attempts: i64,
    pub usage: Usage,
    pub limits: Limits,
    pub event_head: crate::events::Hash,
}

/// What a task has consumed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub calls: i64,
    pub tokens: i64,
    pub cost_micros: i64,
}

/// A task's limits; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub calls: Option<i64>,
    pub tokens: Option<i64>,
    pub cost_micros: Option<i64>,
}

const BAD_ROW: Error = Error::Conflict("stored task metadata failed validation");

impl TaskRow {
    /// Reads a row selected with [`COLUMNS`]. A value of the wrong type or an
    /// unknown status is a conflict, never a crash.
    pub fn from_row(row: &Row<'_>) -> Result<TaskRow> {
        let bad = |_| BAD_ROW;
        let status: String = row.get(2).map_err(bad)?;
        let delivery: String = row.get(3).map_err(bad)?;
        let required: i64 = row.get(4).map_err(bad)?;
        Ok(TaskRow {
            id: row.get(0).map_err(bad)?,
            parent_id: row.get(1).map_err(bad)?,
            status: TaskStatus::from_stored(&status)?,
            delivery_status: DeliveryStatus::from_stored(&delivery)?,
            delivery_required: match required {
                0 => false,
                1 => true,
                _ => return Err(BAD_ROW),
            },
            payload_hash: row.get(5).map_err(bad)?,
            timeout_seconds: row.get(6).map_err(bad)?,
            created_at: row.get(7).map_err(bad)?,
            started_at: row.get(8).map_err(bad)?,
            updated_at: row.get(9).map_err(bad)?,
            ended_at: row.get(10).map_err(bad)?,
            deadline_at: row.get(11).map_err(bad)?,
            delivery_updated_at: row.get(12).map_err(bad)?,
            terminal_code: row.get(13).map_err(bad)?,
            delivery_code: row.get(14).map_err(bad)?,
            version: row.get(15).map_err(bad)?,
            tenant: row.get(16).map_err(bad)?,
            owner: row.get(17).map_err(bad)?,
            park_code: row.get(18).map_err(bad)?,
            attempt_count: row.get(19).map_err(bad)?,
            max_attempts: row.get(20).map_err(bad)?,
            usage: Usage {
                calls: row.get(21).map_err(bad)?,
                tokens: row.get(23).map_err(bad)?,
                cost_micros: row.get(25).map_err(bad)?,
            },
            limits: Limits {
                calls: row.get(22).map_err(bad)?,
                tokens: row.get(24).map_err(bad)?,
                cost_micros: row.get(26).map_err(bad)?,
            },
            event_head: row
                .get::<_, Vec<u8>>(27)
                .map_err(bad)?
                .try_into()
                .map_err(|_| BAD_ROW)?,
        })
    }

    /// Reads and validates: what every public read returns.
    pub fn checked(row: &Row<'_>) -> Result<TaskRow> {
        let task = TaskRow::from_row(row)?;
        if task.state_problem()
            || task.owner_problem()
            || task.budget_problem()
            || task.timestamp_problem()
        {
            return Err(BAD_ROW);
        }
        Ok(task)
    }

    /// The timestamps a new write at `now` must not precede.
    #[must_use]
    pub fn latest_timestamp(&self) -> f64 {
        [
            Some(self.created_at),
            self.started_at,
            Some(self.updated_at),
            self.ended_at,
        ]
        .into_iter()
        .flatten()
        .chain(std::iter::once(self.delivery_updated_at))
        .fold(f64::NEG_INFINITY, f64::max)
    }

    /// True when identity, enum, code, owner or counter rules are broken.
    #[must_use]
    pub fn state_problem(&self) -> bool {
        let ids_ok = validate::is_canonical_uuid(&self.id)
            && self
                .parent_id
                .as_deref()
                .is_none_or(validate::is_canonical_uuid);
        let hash_ok = self
            .payload_hash
            .as_deref()
            .is_none_or(validate::is_sha256_hex);
        let timeout_ok = self
            .timeout_seconds
            .is_none_or(|t| t.is_finite() && t >= 0.0);
        let tenant_ok = self
            .tenant
            .as_deref()
            .is_none_or(|n| validate::name(n).is_ok());
        let attempts_ok = self.attempt_count >= 0 && self.max_attempts >= 0;
        !(ids_ok
            && hash_ok
            && timeout_ok
            && tenant_ok
            && attempts_ok
            && self.codes_ok()
            && self.delivery_ok())
    }

    /// True when the owner is malformed, or set on a queued task.
    #[must_use]
    pub fn owner_problem(&self) -> bool {
        let name_ok = self
            .owner
            .as_deref()
            .is_none_or(|n| validate::name(n).is_ok());
        // A queued task has no owner; every other status keeps the last one
        // (a task started through the peer's start_task has none at all).
        !(name_ok && (self.status != TaskStatus::Queued || self.owner.is_none()))
    }

    /// True when a usage counter is negative or above its limit.
    #[must_use]
    pub fn budget_problem(&self) -> bool {
        let within =
            |used: i64, limit: Option<i64>| used >= 0 && limit.is_none_or(|l| l >= 0 && used <= l);
        !(within(self.usage.calls, self.limits.calls)
            && within(self.usage.tokens, self.limits.tokens)
            && within(self.usage.cost_micros, self.limits.cost_micros))
    }

    fn codes_ok(&self) -> bool {
        let terminal_ok = match &self.terminal_code {
            None => true,
            Some(c) => {
                self.status.is_terminal() && fsm::stored_codes(self.status).contains(&c.as_str())
            }
        };
        let park_ok = match &self.park_code {
            None => true,
            Some(c) => {
                self.status.is_parked() && fsm::stored_codes(self.status).contains(&c.as_str())
            }
        };
        let delivery_ok = match &self.delivery_code {
            None => true,
            Some(c) => {
                self.delivery_status.is_terminal()
                    && fsm::delivery_codes(self.delivery_status).contains(&c.as_str())
            }
        };
        terminal_ok && park_ok && delivery_ok
    }

    fn delivery_ok(&self) -> bool {
        let flag_ok = match self.delivery_status {
            DeliveryStatus::NotApplicable => !self.delivery_required,
            DeliveryStatus::Delivered | DeliveryStatus::Failed => self.delivery_required,
            DeliveryStatus::Pending => true,
        };
        let order_ok = !self.delivery_status.is_terminal() || self.status.is_terminal();
        let floor = i64::from(self.started_at.is_some())
            + i64::from(self.status.is_terminal())
            + i64::from(self.delivery_status.is_terminal());
        flag_ok && order_ok && self.version >= floor
    }

    /// True when a timestamp is non-finite or out of order (the peer's rules
    /// extended to parked statuses).
    #[must_use]
    pub fn timestamp_problem(&self) -> bool {
        let all = [
            Some(self.created_at),
            self.started_at,
            Some(self.updated_at),
            self.ended_at,
            self.deadline_at,
            Some(self.delivery_updated_at),
        ];
        if !all.iter().flatten().all(|t| t.is_finite()) {
            return true;
        }
        let c = self.created_at;
        let mut ok = self.updated_at >= c && self.delivery_updated_at >= c;
        if let Some(s) = self.started_at {
            ok &= s >= c && self.updated_at >= s;
        }
        if let Some(e) = self.ended_at {
            ok &= e >= c && self.started_at.is_none_or(|s| e >= s);
        }
        ok &= match self.status {
            // A released or requeued task forgets its start: the next claim
            // starts a new attempt with a new deadline.
            TaskStatus::Queued => {
                self.started_at.is_none() && self.ended_at.is_none() && self.deadline_at.is_none()
            }
            TaskStatus::Running | TaskStatus::Blocked | TaskStatus::Escalated => {
                self.started_at.is_some() && self.ended_at.is_none()
            }
            _ => self.ended_at.is_some() && self.ended_at == Some(self.updated_at),
        };
        ok &= match (self.deadline_at, self.timeout_seconds, self.started_at) {
            (None, None, _) | (None, Some(_), None) => true,
            (Some(d), Some(t), Some(s)) => d == s + t,
            _ => false,
        };
        ok &= if self.delivery_status.is_terminal() {
            self.ended_at.is_some_and(|e| self.delivery_updated_at >= e)
        } else {
            self.delivery_updated_at == c
        };
        !ok
    }
}

impl TaskRow {
    /// Where a release (`running -> queued`, by `release` or `transition`)
    /// takes this task, and its code: back to the queue, or, once it has
    /// been started `max_attempts` times, escalated instead (SPEC 3), or a
    /// worker could loop a task for ever.
    #[must_use]
    pub fn release_target(&self) -> (TaskStatus, &'static str) {
        if self.attempt_count >= self.max_attempts {
            (TaskStatus::Escalated, "attempts_exhausted")
        } else {
            (TaskStatus::Queued, "released")
        }
    }

    /// The version a write of this row stores. A stored `i64::MAX` can only
    /// be damage, so it is the same conflict as any other bad row.
    pub fn next_version(&self) -> Result<i64> {
        self.version.checked_add(1).ok_or(BAD_ROW)
    }

    /// The deadline a start at `now` gives (`None` without a timeout); a
    /// timeout so long that the sum is not finite cannot be started (the
    /// peer refuses it as input too).
    pub fn deadline_if_started(&self, now: f64) -> Result<Option<f64>> {
        match self.timeout_seconds {
            Some(t) if (now + t).is_finite() => Ok(Some(now + t)),
            Some(_) => Err(Error::Invalid("timeout produces a non-finite deadline")),
            None => Ok(None),
        }
    }

    /// The row after moving to `to` at `now`: the column rules of SPEC §3.
    /// Pure; the caller has checked that the edge is in the table.
    pub fn moved(
        &self,
        to: TaskStatus,
        code: Option<&str>,
        now: f64,
        worker: Option<&str>,
    ) -> Result<TaskRow> {
        let mut next = self.clone();
        next.status = to;
        next.updated_at = now;
        next.version = self.next_version()?;
        next.park_code = None;
        match to {
            TaskStatus::Running => {
                next.started_at = Some(now);
                next.deadline_at = self.deadline_if_started(now)?;
                next.attempt_count = self.attempt_count.checked_add(1).ok_or(BAD_ROW)?;
                next.owner = worker.map(str::to_owned);
            }
            TaskStatus::Queued => {
                next.started_at = None;
                next.deadline_at = None;
                next.owner = None;
            }
            TaskStatus::Blocked | TaskStatus::Escalated => {
                next.park_code = code.map(str::to_owned);
            }
            _ => {
                next.ended_at = Some(now);
                next.terminal_code = code.map(str::to_owned);
            }
        }
        Ok(next)
    }
}
