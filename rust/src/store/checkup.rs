//! doctor's run on a handle: the logical checks in one read snapshot,
//! with `quick_check` on a second connection beside them for a file.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use super::read_only::begin_snapshot;
use super::{Backing, Size, Store};
use crate::busy;
use crate::doctor;
use crate::errors::{Error, Result};
use crate::schema::{self, Earlier};

impl Store {
    /// Runs doctor: the logical checks in one read transaction on this
    /// connection while, for a file, `PRAGMA quick_check` runs at the same
    /// time on a second read-only connection (its own consistent snapshot),
    /// so the doctor costs little more than `quick_check` alone.
    pub fn doctor(&mut self) -> Result<doctor::Report> {
        let Backing::File { path, .. } = &self.backing else {
            let report = self.check_snapshot(true)?;
            return Ok(match self.backing {
                Backing::ReadOnly {
                    earlier: Some(earlier),
                    legacy_refusal,
                    ..
                } => {
                    let report = report.with_schema_version(earlier.version());
                    if legacy_refusal.is_some() && matches!(earlier, Earlier::Peer(_)) {
                        // Refused, yet perhaps sound by taskwarden's rules.
                        report
                            .with_peer_code_problems(self.read_anyway(schema::peer_code_problems)?)
                    } else {
                        report
                    }
                }
                _ => report,
            });
        };
        let file = path.file.clone();
        let busy = Duration::from_millis(u64::from(self.busy_timeout_ms));
        let stop = Arc::new(AtomicBool::new(false));
        std::thread::scope(|scope| {
            let stopped = Arc::clone(&stop);
            let quick = scope.spawn(move || {
                // Pages and records only: the scan judges CHECK constraints.
                let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_NOFOLLOW;
                let mut conn = Connection::open_with_flags(&file, flags).ok()?;
                conn.busy_timeout(busy).ok()?;
                // Signals reach the calling thread only: it says when to stop.
                conn.progress_handler(
                    busy::PROGRESS_STEPS,
                    Some(move || stopped.load(Ordering::Relaxed)),
                )
                .ok()?;
                Some(doctor::quick_check(&conn))
            });
            let report = self.check_snapshot(false);
            // The scan is often done first: the page walk's wait still ends
            // for a signal.
            let mut watch = busy::SignalWatch::from(Instant::now());
            while report.is_ok() && !quick.is_finished() {
                if watch.signalled(&self.interruption) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if report.is_err() || self.interruption.is_signalled() {
                stop.store(true, Ordering::Relaxed);
            }
            let quick = quick.join().ok().flatten().unwrap_or(false);
            self.interruption.stop_if_signalled()?;
            Ok(report?.with_quick_check(quick))
        })
    }

    /// `op` in a read transaction, even on a peer file whose migration was
    /// refused (for doctor to count why).
    fn read_anyway<T>(&mut self, op: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        self.verify()?;
        self.transaction(TransactionBehavior::Deferred, Size::Short, op)
    }

    /// Doctor's logical checks in one read transaction. The transaction is
    /// only ever rolled back: on a damaged file even the end of a read can
    /// fail, and the report must survive that. `with_quick_check` also runs
    /// this connection's `quick_check` in that same transaction.
    fn check_snapshot(&mut self, with_quick_check: bool) -> Result<doctor::Report> {
        self.verify()?;
        self.interruption.forget();
        let racing_reads = self.read_race_timeout();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Deferred)?;
        match racing_reads.map_or(Ok(()), |timeout| begin_snapshot(&tx, timeout)) {
            // Damage at the start of the read is the checks' to report.
            Ok(()) | Err(Error::Corrupt | Error::Storage(_)) => {}
            Err(e) => return Err(e),
        }
        let mut report = doctor::check(&tx);
        if with_quick_check {
            report = report.with_quick_check(doctor::quick_check(&tx));
        }
        tx.rollback().ok();
        // An interrupted scan reads as damage: report the signal instead.
        self.interruption.stop_if_signalled()?;
        Ok(report)
    }
}
