//! The task and delivery state machines: statuses, the transition table
//! (SPEC §3) and the reason-code registry. Pure: no storage, no Python.

use crate::errors::{Error, Result};

/// A task's lifecycle status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    Queued,
    Running,
    Blocked,
    Escalated,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
}

/// Every task status, in table order.
pub const ALL_TASK_STATUSES: [TaskStatus; 8] = [
    TaskStatus::Queued,
    TaskStatus::Running,
    TaskStatus::Blocked,
    TaskStatus::Escalated,
    TaskStatus::Succeeded,
    TaskStatus::Failed,
    TaskStatus::TimedOut,
    TaskStatus::Cancelled,
];

impl TaskStatus {
    /// The stored and printed name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::Blocked => "blocked",
            TaskStatus::Escalated => "escalated",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::TimedOut => "timed_out",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Parses a caller's status, accepting the `@sockt/fsm` aliases.
    pub fn parse(raw: &str) -> Result<TaskStatus> {
        ALL_TASK_STATUSES
            .into_iter()
            .find(|s| s.as_str() == raw)
            .or_else(|| {
                STATUS_ALIASES
                    .iter()
                    .find(|(a, _)| *a == raw)
                    .map(|(_, s)| *s)
            })
            .ok_or(Error::Invalid("unknown task status"))
    }

    /// Parses a stored status: only canonical names are valid on disk.
    pub fn from_stored(raw: &str) -> Result<TaskStatus> {
        ALL_TASK_STATUSES
            .into_iter()
            .find(|s| s.as_str() == raw)
            .ok_or(Error::Conflict("stored task metadata failed validation"))
    }

    /// Terminal statuses never change again.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded
                | TaskStatus::Failed
                | TaskStatus::TimedOut
                | TaskStatus::Cancelled
        )
    }

    /// Parked statuses wait for a person or an operator.
    #[must_use]
    pub fn is_parked(self) -> bool {
        matches!(self, TaskStatus::Blocked | TaskStatus::Escalated)
    }
}

/// A task's delivery status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeliveryStatus {
    Pending,
    Delivered,
    Failed,
    NotApplicable,
}

/// Every delivery status, in table order.
pub const ALL_DELIVERY_STATUSES: [DeliveryStatus; 4] = [
    DeliveryStatus::Pending,
    DeliveryStatus::Delivered,
    DeliveryStatus::Failed,
    DeliveryStatus::NotApplicable,
];

impl DeliveryStatus {
    /// The stored and printed name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::NotApplicable => "not_applicable",
        }
    }

    /// Parses a caller's delivery status.
    pub fn parse(raw: &str) -> Result<DeliveryStatus> {
        ALL_DELIVERY_STATUSES
            .into_iter()
            .find(|s| s.as_str() == raw)
            .ok_or(Error::Invalid("unknown delivery status"))
    }

    /// Parses a stored delivery status.
    pub fn from_stored(raw: &str) -> Result<DeliveryStatus> {
        DeliveryStatus::parse(raw)
            .map_err(|_| Error::Conflict("stored task metadata failed validation"))
    }

    /// Terminal delivery states are never rewritten.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        self != DeliveryStatus::Pending
    }
}

/// The edges of SPEC §3. A terminal status has none: repeating it is a
/// no-op handled by the caller, anything else is a conflict.
#[must_use]
pub fn can_transition(from: TaskStatus, to: TaskStatus) -> bool {
    use TaskStatus::{Blocked, Cancelled, Escalated, Queued, Running};
    match from {
        Queued => to == Running || to.is_terminal(),
        Running => to.is_terminal() || matches!(to, Blocked | Escalated | Queued),
        Blocked | Escalated => matches!(to, Queued | Cancelled),
        _ => false,
    }
}

/// The `@sockt/fsm` names a caller may give for a status.
pub const STATUS_ALIASES: [(&str, TaskStatus); 3] = [
    ("pending", TaskStatus::Queued),
    ("in_progress", TaskStatus::Running),
    ("completed", TaskStatus::Succeeded),
];

/// Every registered reason code: the peer's twelve and taskwarden's nine.
pub const REASON_CODES: [&str; 21] = [
    "attempts_exhausted",
    "budget_exhausted",
    "budget_granted",
    "caller_cancelled",
    "claimed",
    "completed",
    "created",
    "deadline_exceeded",
    "delivery_grace_expired",
    "escalated_manually",
    "internal_task",
    "needs_input",
    "released",
    "requeued",
    "restart_stale",
    "started",
    "transport_acknowledged",
    "transport_failed",
    "worker_completed",
    "worker_failed",
    "worker_lost",
];

/// Codes a caller may attach when moving a task into `to`. The ledger writes
/// `created`, `started`, `claimed`, `released`, `requeued`, `budget_granted`,
/// `budget_exhausted` and `attempts_exhausted` itself.
#[must_use]
pub fn caller_codes(to: TaskStatus) -> &'static [&'static str] {
    match to {
        TaskStatus::Succeeded => &["completed", "worker_completed"],
        TaskStatus::Failed => &["worker_failed"],
        TaskStatus::TimedOut => &["deadline_exceeded", "restart_stale", "worker_lost"],
        TaskStatus::Cancelled => &["caller_cancelled"],
        TaskStatus::Blocked => &["needs_input"],
        TaskStatus::Escalated => &["escalated_manually"],
        TaskStatus::Queued | TaskStatus::Running => &[],
    }
}

/// The codes task-state-guard 0.1.0's registry allows for each status it
/// knows (`None` for the parked ones it has not): what a peer file may
/// hold to be migrated, whatever taskwarden itself would accept.
#[must_use]
pub fn peer_codes(status: TaskStatus) -> Option<&'static [&'static str]> {
    match status {
        TaskStatus::Queued | TaskStatus::Running => Some(&[]),
        TaskStatus::Succeeded => Some(&["completed", "worker_completed"]),
        TaskStatus::Failed => Some(&["worker_failed"]),
        TaskStatus::TimedOut => Some(&["deadline_exceeded", "restart_stale"]),
        TaskStatus::Cancelled => Some(&["caller_cancelled"]),
        TaskStatus::Blocked | TaskStatus::Escalated => None,
    }
}

/// Every code that may be stored for a task status, ledger-written included.
#[must_use]
pub fn stored_codes(to: TaskStatus) -> &'static [&'static str] {
    match to {
        TaskStatus::Escalated => &[
            "escalated_manually",
            "budget_exhausted",
            "attempts_exhausted",
        ],
        TaskStatus::Queued => &["released", "requeued"],
        TaskStatus::Running => &["started", "claimed"],
        other => caller_codes(other),
    }
}

/// Codes allowed for a delivery outcome.
#[must_use]
pub fn delivery_codes(to: DeliveryStatus) -> &'static [&'static str] {
    match to {
        DeliveryStatus::Delivered => &["transport_acknowledged"],
        DeliveryStatus::Failed => &["delivery_grace_expired", "transport_failed"],
        DeliveryStatus::NotApplicable => &["internal_task"],
        DeliveryStatus::Pending => &[],
    }
}

/// A registered code that a task status does not take, in the peer's words.
pub const NOT_FOR_TASK_STATUS: &str = "code is not valid for the requested task status";
/// A registered code that a delivery status does not take.
pub const NOT_FOR_DELIVERY_STATUS: &str = "code is not valid for the requested delivery status";

/// Checks a caller's code in the peer's order: format, registry, target
/// (`allowed`; outside it, the refusal says `not_allowed`).
pub fn check_code(code: &str, allowed: &[&str], not_allowed: &'static str) -> Result<()> {
    crate::validate::code_format(code)?;
    if !REASON_CODES.contains(&code) {
        return Err(Error::Invalid(
            "code is not in the public reason-code registry",
        ));
    }
    if !allowed.contains(&code) {
        return Err(Error::Invalid(not_allowed));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_spec() {
        use TaskStatus::*;
        let expected: &[(TaskStatus, &[TaskStatus])] = &[
            (Queued, &[Running, Succeeded, Failed, TimedOut, Cancelled]),
            (
                Running,
                &[
                    Queued, Blocked, Escalated, Succeeded, Failed, TimedOut, Cancelled,
                ],
            ),
            (Blocked, &[Queued, Cancelled]),
            (Escalated, &[Queued, Cancelled]),
            (Succeeded, &[]),
            (Failed, &[]),
            (TimedOut, &[]),
            (Cancelled, &[]),
        ];
        for (from, tos) in expected {
            for to in ALL_TASK_STATUSES {
                assert_eq!(
                    can_transition(*from, to),
                    tos.contains(&to),
                    "{from:?}->{to:?}"
                );
            }
        }
    }

    #[test]
    fn aliases_parse_to_canonical_names() -> Result<()> {
        assert_eq!(TaskStatus::parse("pending")?, TaskStatus::Queued);
        assert_eq!(TaskStatus::parse("in_progress")?, TaskStatus::Running);
        assert_eq!(TaskStatus::parse("completed")?, TaskStatus::Succeeded);
        assert!(TaskStatus::parse("Queued").is_err());
        assert!(TaskStatus::from_stored("pending").is_err());
        Ok(())
    }

    #[test]
    fn codes_are_checked_in_order() {
        assert!(
            matches!(check_code("Bad", &[], NOT_FOR_TASK_STATUS), Err(Error::Invalid(m)) if m.contains("1-64"))
        );
        assert!(
            matches!(check_code("nope", &[], NOT_FOR_TASK_STATUS), Err(Error::Invalid(m)) if m.contains("registry"))
        );
        assert!(matches!(
            check_code("created", caller_codes(TaskStatus::Succeeded), NOT_FOR_TASK_STATUS),
            Err(Error::Invalid(m)) if m == NOT_FOR_TASK_STATUS
        ));
        assert!(check_code(
            "worker_completed",
            caller_codes(TaskStatus::Succeeded),
            NOT_FOR_TASK_STATUS
        )
        .is_ok());
    }

    #[test]
    fn registry_is_sorted_and_unique() {
        let mut sorted = REASON_CODES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, REASON_CODES.to_vec());
    }
}
