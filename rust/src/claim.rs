//! Atomic claims across threads and processes: a queued task gets exactly
//! one owner, because the claim is a guarded status change inside a write
//! transaction that only one connection can hold.

use rusqlite::{params, Transaction};

use crate::errors::{Error, Result};
use crate::fsm::TaskStatus;
use crate::task::{TaskRow, COLUMNS};
use crate::tasks::{self, Clock, Fence};

/// Claims `id` for `worker` if it is queued; `None` if it is not.
pub fn claim(
    tx: &Transaction<'_>,
    id: &str,
    worker: &str,
    clock: Clock<'_>,
) -> Result<Option<TaskRow>> {
    let task = tasks::get(tx, id)?;
    if task.status != TaskStatus::Queued {
        return Ok(None);
    }
    let now = clock()?;
    tasks::transition(
        tx,
        &task,
        TaskStatus::Running,
        Some("claimed"),
        Some(worker),
        now,
    )
    .map(Some)
}

/// Claims up to `limit` of the oldest queued tasks (by creation time, then
/// id), optionally of one tenant, all in the caller's one transaction.
pub fn claim_next(
    tx: &Transaction<'_>,
    worker: &str,
    tenant: Option<&str>,
    limit: i64,
    clock: Clock<'_>,
) -> Result<Vec<TaskRow>> {
    let queued = {
        let mut stmt = tx.prepare_cached(&queue_sql(tenant.is_some()))?;
        let mut rows = match tenant {
            Some(tenant) => stmt.query(params![limit, tenant])?,
            None => stmt.query(params![limit])?,
        };
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(TaskRow::checked(row)?);
        }
        out
    };
    if queued.is_empty() {
        return Ok(queued);
    }
    let now = clock()?;
    queued
        .iter()
        .map(|task| {
            tasks::transition(
                tx,
                task,
                TaskStatus::Running,
                Some("claimed"),
                Some(worker),
                now,
            )
        })
        .collect()
}

/// The oldest queued tasks (`?1` of them), of one tenant (`?2`) or of all:
/// read in order from a partial queue index, never sorted.
fn queue_sql(by_tenant: bool) -> String {
    let tenant_filter = if by_tenant { "AND tenant = ?2" } else { "" };
    format!(
        "SELECT {COLUMNS} FROM tasks WHERE status = 'queued' {tenant_filter} \
         ORDER BY created_at, id LIMIT ?1"
    )
}

/// The owner gives a running task back: it is queued again, or escalated
/// (`attempts_exhausted`) once it has been claimed `max_attempts` times.
/// With `attempt`, a worker name reused by an older claim is fenced too.
pub fn release(
    tx: &Transaction<'_>,
    id: &str,
    worker: &str,
    attempt: Option<i64>,
    clock: Clock<'_>,
) -> Result<TaskRow> {
    let task = tasks::get(tx, id)?;
    if task.status != TaskStatus::Running {
        return Err(Error::Conflict("only a running task can be released"));
    }
    Fence {
        worker: Some(worker.to_owned()),
        attempt,
    }
    .check(&task)?;
    let now = clock()?;
    if task.attempt_count >= task.max_attempts {
        tasks::transition(
            tx,
            &task,
            TaskStatus::Escalated,
            Some("attempts_exhausted"),
            Some(worker),
            now,
        )
    } else {
        tasks::transition(
            tx,
            &task,
            TaskStatus::Queued,
            Some("released"),
            Some(worker),
            now,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::queue_sql;
    use crate::schema::test_support::plan;

    #[test]
    fn claims_read_the_queue_index_in_order() -> crate::errors::Result<()> {
        assert_eq!(
            plan(&queue_sql(false))?,
            "SCAN tasks USING INDEX tasks_queue_idx"
        );
        assert_eq!(
            plan(&queue_sql(true))?,
            "SEARCH tasks USING INDEX tasks_tenant_queue_idx (tenant=?)"
        );
        Ok(())
    }
}
