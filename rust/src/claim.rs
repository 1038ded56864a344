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
///
/// A task dated after this claimer's clock (written by a process whose
/// clock ran ahead, or before the clock stepped back) cannot be claimed
/// now without moving time backwards: it is passed over and stays queued,
/// rather than failing the whole batch and stalling the worker's loop. So
/// is a task whose timeout gives no finite deadline at this clock's time
/// (`claim` and `start_task` refuse it, as the peer's start does).
pub fn claim_next(
    tx: &Transaction<'_>,
    worker: &str,
    tenant: Option<&str>,
    limit: i64,
    clock: Clock<'_>,
) -> Result<Vec<TaskRow>> {
    let wanted = usize::try_from(limit).map_err(|_| Error::Internal("limit was not checked"))?;
    let Some((now, batch)) = claimable(tx, tenant, wanted, clock)? else {
        return Ok(Vec::new());
    };
    // The queue's cursor is closed by now: the claims below move rows out
    // of the index it read.
    batch
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

/// Up to `wanted` queued tasks this clock can claim, with the clock's
/// reading; `None` if the queue is empty. The queue is read lazily: the
/// clock only once a task is found, rows past the batch never.
fn claimable(
    tx: &Transaction<'_>,
    tenant: Option<&str>,
    wanted: usize,
    clock: Clock<'_>,
) -> Result<Option<(f64, Vec<TaskRow>)>> {
    let mut stmt = tx.prepare_cached(&queue_sql(tenant.is_some()))?;
    let mut rows = match tenant {
        Some(tenant) => stmt.query(params![tenant])?,
        None => stmt.query([])?,
    };
    let Some(first) = rows.next()? else {
        return Ok(None);
    };
    let now = clock()?;
    let mut batch = Vec::new();
    let mut row = Some(first);
    while let Some(found) = row {
        // A row no write accepts (damage, which doctor counts) is passed
        // over: one flipped bit must not stall every worker's queue.
        let Ok(task) = TaskRow::checked(found) else {
            row = rows.next()?;
            continue;
        };
        if task.created_at > now {
            // The queue is in creation order: no task after this one can
            // be claimed either, and the write lock is held while it reads.
            break;
        }
        if task.latest_timestamp() <= now && task.deadline_if_started(now).is_ok() {
            batch.push(task);
            if batch.len() == wanted {
                break;
            }
        }
        row = rows.next()?;
    }
    Ok(Some((now, batch)))
}

/// The queued tasks, oldest first, of one tenant (`?1`) or of all: read in
/// order from a partial queue index, never sorted.
/// A row at the last version or attempt is left out: its claim could not
/// count up, and one such row refused every worker's whole batch.
fn queue_sql(by_tenant: bool) -> String {
    let tenant = if by_tenant { "AND tenant = ?1" } else { "" };
    format!(
        "SELECT {COLUMNS} FROM tasks WHERE status = 'queued' {tenant} \
         AND version < 9223372036854775807 AND attempt_count < 9223372036854775807 \
         ORDER BY created_at, id"
    )
}

/// The owner gives a running task back: it is queued again, or escalated
/// (`attempts_exhausted`) once it has been started `max_attempts` times
/// (every move into running counts: claims, `start_task`, transitions).
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
        // A release is always made for the worker's claim.
        return Err(Error::ClaimLost("only a running task can be released"));
    }
    Fence {
        worker: Some(worker.to_owned()),
        attempt,
    }
    .check(&task)?;
    let now = clock()?;
    let (to, code) = task.release_target();
    tasks::transition(tx, &task, to, Some(code), Some(worker), now)
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
