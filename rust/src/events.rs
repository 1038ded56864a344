//! The per-task event log and its hash chain.
//!
//! Each event's hash covers its predecessor's hash and its own fields, and
//! the task row stores the hash of its last event, so an edited, deleted,
//! inserted or reordered event breaks the chain where doctor can see it.

use rusqlite::functions::Context;
use rusqlite::types::ValueRef;
use rusqlite::{params, Transaction};
use sha2::{Digest, Sha256};

use crate::errors::Result;

/// A chain hash: SHA-256, stored as a 32-byte blob.
pub type Hash = [u8; 32];

/// The hash a chain starts from (before a task's first event).
pub const GENESIS: Hash = [0; 32];

// Event kinds as stored.
/// A task was created.
pub const CREATED: &str = "created";
/// A change of task status.
pub const TASK_TRANSITION: &str = "task_transition";
/// A change of delivery status.
pub const DELIVERY_TRANSITION: &str = "delivery_transition";
/// An operator raised a task's limits.
pub const BUDGET_GRANTED: &str = "budget_granted";
/// Every event kind the schema allows.
pub const KINDS: [&str; 4] = [
    CREATED,
    TASK_TRANSITION,
    DELIVERY_TRANSITION,
    BUDGET_GRANTED,
];

/// One event, as stored (no free text: statuses, codes, ids and numbers).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub task_id: String,
    pub kind: String,
    pub from: Option<String>,
    pub to: String,
    pub at: f64,
    pub code: Option<String>,
    pub worker: Option<String>,
    /// Amounts granted: calls, tokens, cost in micro-units.
    pub grant: Option<(i64, i64, i64)>,
}

/// The fields an event's hash covers, borrowed: built from an [`Event`]
/// or straight from SQL arguments without copying them.
pub struct Fields<'a> {
    pub task_id: &'a str,
    pub kind: &'a str,
    pub from: Option<&'a str>,
    pub to: &'a str,
    pub at: f64,
    pub code: Option<&'a str>,
    pub worker: Option<&'a str>,
    pub grant: Option<(i64, i64, i64)>,
}

impl Event {
    /// This event's hashed fields.
    #[must_use]
    pub fn fields(&self) -> Fields<'_> {
        Fields {
            task_id: &self.task_id,
            kind: &self.kind,
            from: self.from.as_deref(),
            to: &self.to,
            at: self.at,
            code: self.code.as_deref(),
            worker: self.worker.as_deref(),
            grant: self.grant,
        }
    }
}

/// The hash of `event` chained onto `prev`.
#[must_use]
pub fn chain_hash(prev: &Hash, event: &Event) -> Hash {
    hash_fields(prev, &event.fields())
}

/// The hash of an event with these fields chained onto `prev`. Fields are
/// separated by a byte that no stored value may contain, and absent values
/// are marked, so two different events never hash the same input.
#[must_use]
pub fn hash_fields(prev: &Hash, event: &Fields<'_>) -> Hash {
    let mut h = Sha256::new();
    h.update(b"taskwarden-event-v1");
    let field = |h: &mut Sha256, value: Option<&str>| {
        h.update([0x1f]);
        match value {
            Some(v) => h.update(v.as_bytes()),
            None => h.update([0x00]),
        }
    };
    h.update(prev);
    field(&mut h, Some(event.task_id));
    field(&mut h, Some(event.kind));
    field(&mut h, event.from);
    field(&mut h, Some(event.to));
    field(&mut h, std::str::from_utf8(&hex16(event.at.to_bits())).ok());
    field(&mut h, event.code);
    field(&mut h, event.worker);
    let grant = event.grant.map(|(c, t, m)| format!("{c}/{t}/{m}"));
    field(&mut h, grant.as_deref());
    h.finalize().into()
}

/// `bits` as 16 lowercase hex digits (what `{:016x}` writes, without an
/// allocation: this runs for every event doctor replays).
fn hex16(bits: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[((bits >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// Appends `event` after `prev` and returns the new chain head, which the
/// caller stores on the task row in the same transaction.
pub fn append(tx: &Transaction<'_>, prev: &Hash, event: &Event) -> Result<Hash> {
    let hash = chain_hash(prev, event);
    let (calls, tokens, cost) = match event.grant {
        Some((c, t, m)) => (Some(c), Some(t), Some(m)),
        None => (None, None, None),
    };
    tx.prepare_cached(
        "INSERT INTO task_events (task_no, event_kind, from_value, to_value, occurred_at, code,
            worker, grant_calls, grant_tokens, grant_cost_micros, event_hash)
         VALUES ((SELECT task_no FROM tasks WHERE id = ?1), ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,
            ?11)",
    )?
    .execute(params![
        event.task_id,
        event.kind,
        event.from,
        event.to,
        event.at,
        event.code,
        event.worker,
        calls,
        tokens,
        cost,
        hash
    ])?;
    Ok(hash)
}

/// Registers `tw_event_hash(prev, task_id, kind, from, to, at, code, worker)`
/// so set-based statements (reconcile) can extend each task's chain in one
/// pass, with exactly the hash [`chain_hash`] computes.
pub fn register_sql_functions(conn: &rusqlite::Connection) -> Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "tw_event_hash",
        8,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            // Borrowed, not copied: set-based reconcile calls this twice
            // for every row it changes.
            //
            // The head, the id and the worker come from the task's row. One
            // flipped bit can store any of them with another type; such a
            // row is still decided by its status and times, and the hash
            // over a stand-in value breaks its chain where doctor sees it.
            let prev: Hash = match ctx.get_raw(0) {
                ValueRef::Blob(b) => b.try_into().unwrap_or(DAMAGED_HEAD),
                _ => DAMAGED_HEAD,
            };
            let event = Fields {
                task_id: stored_text(ctx, 1).unwrap_or(DAMAGED_TEXT),
                kind: required_text(ctx, 2)?,
                from: text(ctx, 3)?,
                to: required_text(ctx, 4)?,
                at: ctx.get(5)?,
                code: text(ctx, 6)?,
                worker: match ctx.get_raw(7) {
                    ValueRef::Null => None,
                    _ => Some(stored_text(ctx, 7).unwrap_or(DAMAGED_TEXT)),
                },
                grant: None,
            };
            Ok(hash_fields(&prev, &event))
        },
    )?;
    Ok(())
}

/// What `tw_event_hash` chains onto when a row's stored head is not a
/// 32-byte blob: no real chain ends in it.
const DAMAGED_HEAD: Hash = [0xff; 32];

/// What `tw_event_hash` hashes in place of a row's id or worker stored as
/// something other than UTF-8 text.
const DAMAGED_TEXT: &str = "\u{fffd}";

/// A value read from a task row, when it is the text it should be.
fn stored_text<'a>(ctx: &'a Context<'_>, index: usize) -> Option<&'a str> {
    match ctx.get_raw(index) {
        ValueRef::Text(t) => std::str::from_utf8(t).ok(),
        _ => None,
    }
}

fn bad_argument(index: usize, value: ValueRef<'_>) -> rusqlite::Error {
    let message = format!("tw_event_hash argument {index} is {}", value.data_type());
    rusqlite::Error::UserFunctionError(message.into())
}

/// Argument `index` as text, or `None` for NULL; any other type is an error.
fn text<'a>(ctx: &'a Context<'_>, index: usize) -> rusqlite::Result<Option<&'a str>> {
    match ctx.get_raw(index) {
        ValueRef::Null => Ok(None),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(Some)
            .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e))),
        other => Err(bad_argument(index, other)),
    }
}

fn required_text<'a>(ctx: &'a Context<'_>, index: usize) -> rusqlite::Result<&'a str> {
    text(ctx, index)?.ok_or_else(|| bad_argument(index, ValueRef::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex16_matches_format() {
        for bits in [0, 1, 0xdead_beef, u64::MAX, 1.5f64.to_bits()] {
            assert_eq!(hex16(bits), format!("{bits:016x}").as_bytes());
        }
    }

    fn sample() -> Event {
        Event {
            task_id: "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9".into(),
            kind: TASK_TRANSITION.into(),
            from: Some("queued".into()),
            to: "running".into(),
            at: 1.5,
            code: Some("claimed".into()),
            worker: Some("w1".into()),
            grant: None,
        }
    }

    #[test]
    fn every_field_changes_the_hash() {
        let base = chain_hash(&GENESIS, &sample());
        let mut variants = Vec::new();
        let mut e = sample();
        e.at = 1.500_000_1;
        variants.push(e);
        let mut e = sample();
        e.code = None;
        variants.push(e);
        let mut e = sample();
        e.worker = Some("w2".into());
        variants.push(e);
        let mut e = sample();
        e.from = None;
        variants.push(e);
        let mut e = sample();
        e.grant = Some((1, 0, 0));
        variants.push(e);
        for v in variants {
            assert_ne!(chain_hash(&GENESIS, &v), base);
        }
        assert_ne!(chain_hash(&[1; 32], &sample()), base);
        assert_eq!(chain_hash(&GENESIS, &sample()), base);
    }

    /// The SQL function reconcile uses hashes exactly as the Rust writers
    /// do, NULLs included, and refuses arguments of the wrong type.
    #[test]
    fn the_sql_function_hashes_like_chain_hash() -> Result<()> {
        let conn = rusqlite::Connection::open_in_memory()?;
        register_sql_functions(&conn)?;
        let prev = [7u8; 32];
        for e in [
            sample(),
            Event {
                from: None,
                code: None,
                worker: None,
                ..sample()
            },
        ] {
            let from_sql: Vec<u8> = conn.query_row(
                "SELECT tw_event_hash(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![prev, e.task_id, e.kind, e.from, e.to, e.at, e.code, e.worker],
                |r| r.get(0),
            )?;
            assert_eq!(from_sql, chain_hash(&prev, &e));
        }
        // Values from a damaged row hash as their stand-ins; the arguments
        // the statement itself spells must be right.
        let stand_in = Event {
            task_id: DAMAGED_TEXT.into(),
            worker: Some(DAMAGED_TEXT.into()),
            ..sample()
        };
        let damaged: Vec<u8> = conn.query_row(
            "SELECT tw_event_hash(CAST(?1 AS TEXT), CAST(?2 AS BLOB), ?3, ?4, ?5, ?6, ?7, 7)",
            params![
                prev,
                stand_in.task_id,
                stand_in.kind,
                stand_in.from,
                stand_in.to,
                stand_in.at,
                stand_in.code
            ],
            |r| r.get(0),
        )?;
        assert_eq!(damaged, chain_hash(&DAMAGED_HEAD, &stand_in));
        for bad in [
            "SELECT tw_event_hash(zeroblob(32), 'a', 'b', 5, 'c', 1.0, NULL, NULL)",
            "SELECT tw_event_hash(zeroblob(32), 'a', NULL, NULL, 'c', 1.0, NULL, NULL)",
        ] {
            assert!(
                conn.query_row(bad, [], |r| r.get::<_, Vec<u8>>(0)).is_err(),
                "{bad}"
            );
        }
        Ok(())
    }
}
