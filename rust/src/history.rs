//! A task's history: its events, oldest first, as the ledger wrote them.
//!
//! What is returned has been replayed (see `replay`): every stored hash
//! extends the chain up to the row's head, and the events walk the state
//! machines to the row as it stands. A history that fails is refused, never
//! returned in part, so damaged or edited text is not handed out (doctor
//! counts what is wrong).

use rusqlite::Transaction;

use crate::errors::{Error, Result};
use crate::events::Event;
use crate::replay::{event_row, Chain, EVENTS_OF_TASKS, EVENT_COLUMNS};
use crate::tasks;
use crate::validate;

const UNVERIFIED: Error =
    Error::Conflict("the task's event history failed verification (run doctor)");

/// The events of task `id`, oldest first.
pub fn of_task(tx: &Transaction<'_>, id: &str) -> Result<Vec<Event>> {
    let task = tasks::get(tx, id)?;
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT {EVENT_COLUMNS} FROM {EVENTS_OF_TASKS} WHERE t.id = ?1 ORDER BY e.sequence"
    ))?;
    let rows = stmt
        .query_map([&task.id], event_row)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| match e {
            // A value of the wrong type in a row: damage, like a bad hash.
            rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..) => UNVERIFIED,
            other => other.into(),
        })?;
    let mut chain = Chain::new();
    for row in &rows {
        // The replay judges statuses and codes; a worker is free text to
        // it, so it is held to the name rule here.
        if row
            .event
            .worker
            .as_deref()
            .is_some_and(|w| validate::name(w).is_err())
        {
            return Err(UNVERIFIED);
        }
        chain.feed(row);
    }
    let claims_match = chain.claims_match(&task);
    match chain.finish(&task) {
        (false, false) if claims_match => Ok(rows.into_iter().map(|r| r.event).collect()),
        _ => Err(UNVERIFIED),
    }
}
