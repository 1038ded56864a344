//! Waiting for the write lock.
//!
//! SQLite's own busy timeout sleeps in steps that grow to 100 ms, which is
//! fine for one writer and ruinous for a fleet: with several processes
//! claiming from one file, waiters sleep far longer than the ~0.2 ms the
//! lock is held. This handler first yields the processor a few times (with
//! more processes than cores, the holder is often waiting for one), then
//! polls in short, growing pauses, and gives up (SQLITE_BUSY, surfaced as
//! `LedgerBusy`) once the timeout has passed.
//!
//! Yielding first matters once processes outnumber cores: a sleep of
//! 50 us lasts at least the kernel's timer slack and costs two context
//! switches, and with 16 processes claiming on 2 cores, waiters that only
//! slept spent twice the CPU per task and claimed half as many tasks per
//! second as waiters that yielded first (about 1,500 against 2,600).
//!
//! A long wait also looks for signals every [`SIGNAL_CHECK_EVERY`]: Ctrl-C
//! (or any Python signal handler that raises) ends it at once, and the
//! caller gets the handler's exception (`KeyboardInterrupt`) instead of
//! waiting out the timeout for a `LedgerBusy`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::{PyErr, Python};
use rusqlite::Connection;

use crate::errors::{Error, Result};
use crate::turnstile::Turnstile;

/// How often a lock wait runs Python's signal handlers. Short waits (the
/// usual hand-off between workers) never take the interpreter.
pub const SIGNAL_CHECK_EVERY: Duration = Duration::from_millis(50);

/// The exception a signal handler raised during a connection's lock wait,
/// kept until the failed call reports it.
#[derive(Clone, Default)]
pub struct Interruption(Arc<Mutex<Option<PyErr>>>);

impl Interruption {
    /// Runs Python's signal handlers (they run on the main thread only; a
    /// process without an interpreter has none). True when one raised.
    pub fn signalled(&self) -> bool {
        // A closure, not the method path: the method's lifetime is not
        // general enough for `try_attach`.
        #[allow(clippy::redundant_closure_for_method_calls)]
        let raised = Python::try_attach(|py| py.check_signals());
        match raised {
            Some(Err(raised)) => {
                if let Ok(mut slot) = self.0.lock() {
                    *slot = Some(raised);
                }
                true
            }
            _ => false,
        }
    }

    /// Forgets an exception no failed call reported (a wait whose busy
    /// answer was tolerated): it must not explain a later, unrelated one.
    pub fn forget(&self) {
        if let Ok(mut slot) = self.0.lock() {
            slot.take();
        }
    }

    /// `err`, or, when a signal handler raised during the call, that
    /// exception: a lock wait or a statement it ended fails as it must,
    /// and so may a step that reads the ended statement as something else
    /// (a migration's validation took it for damage, and the Ctrl-C was
    /// lost behind "legacy database failed validation").
    pub fn explain(&self, err: Error) -> Error {
        self.take().map_or(err, Error::Interrupted)
    }

    /// Refuses to go on once a signal handler raised during this call, even
    /// where the call tolerated the interrupted statement (doctor counts a
    /// failed read as damage): its exception, so nothing is committed.
    pub fn stop_if_signalled(&self) -> Result<()> {
        self.take()
            .map_or(Ok(()), |raised| Err(Error::Interrupted(raised)))
    }

    /// Whether a signal handler raised during this call (kept, not taken).
    #[must_use]
    pub fn is_signalled(&self) -> bool {
        self.0.lock().is_ok_and(|slot| slot.is_some())
    }

    fn take(&self) -> Option<PyErr> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

/// Signal checks for a long run of short transactions (a purge of a large
/// file takes seconds): Ctrl-C stops it between two of them, at most
/// [`SIGNAL_CHECK_EVERY`] late.
pub struct LoopSignals {
    watch: SignalWatch,
    interruption: Interruption,
}

impl LoopSignals {
    #[must_use]
    pub fn starting_now() -> Self {
        LoopSignals {
            watch: SignalWatch::from(Instant::now()),
            interruption: Interruption::default(),
        }
    }

    /// Whether the next [`check`](Self::check) runs Python's handlers.
    #[must_use]
    pub fn due(&self) -> bool {
        self.watch.due()
    }

    /// The exception a signal handler raised since the last look, if any.
    pub fn check(&mut self) -> Result<()> {
        if self.watch.signalled(&self.interruption) {
            if let Some(raised) = self.interruption.take() {
                return Err(Error::Interrupted(raised));
            }
        }
        Ok(())
    }
}

/// Whether this connection has waited for another writer's lock since it
/// was last asked: a writer that shares the file with busy others.
///
/// Not the turnstile's "met another writer in the last second": the WAL
/// helper is skipped only after a real wait in this handler. Skipped for
/// every writer taking turns instead, four processes claimed and closed
/// 5-25% fewer tasks a second (seven interleaved pairs, twelfth session).
#[derive(Clone, Default)]
pub struct Waits(Arc<AtomicBool>);

impl Waits {
    fn note(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// True when a wait happened since the last call.
    #[must_use]
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }

    /// True when a wait happened since the last [`take`](Self::take).
    #[must_use]
    pub fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// While it probes, the busy handler answers "busy" at once: a look at
/// whether SQLite's write lock is free right now, without waiting for it
/// (see `turnstile`). A probe with patience waits a few milliseconds at
/// most, whatever the connection's timeout (see `wal_growth`).
#[derive(Clone, Default)]
pub struct Probing(Arc<Mutex<Option<Instant>>>);

impl Probing {
    /// Runs `probe` with waits for the lock turned off.
    pub fn during<T>(&self, probe: impl FnOnce() -> T) -> T {
        self.within(Duration::ZERO, probe)
    }

    /// Runs `probe` with waits for a lock cut to `patience` in all.
    pub fn within<T>(&self, patience: Duration, probe: impl FnOnce() -> T) -> T {
        self.set(Some(Instant::now() + patience));
        let out = probe();
        self.set(None);
        out
    }

    fn set(&self, until: Option<Instant>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = until;
        }
    }

    /// `None` when not probing; else whether the probe may wait on.
    fn may_wait(&self) -> Option<bool> {
        let until = (*self.0.lock().ok()?)?;
        Some(Instant::now() < until)
    }
}

/// When a wait that began at `started` should next look for signals.
#[derive(Clone, Copy)]
pub struct SignalWatch {
    next: Instant,
}

impl SignalWatch {
    #[must_use]
    pub fn from(started: Instant) -> Self {
        SignalWatch {
            next: started + SIGNAL_CHECK_EVERY,
        }
    }

    /// Whether a look for signals is due.
    #[must_use]
    pub fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// True when a signal handler raised; checks at most once per period.
    pub fn signalled(&mut self, interruption: &Interruption) -> bool {
        if !self.due() {
            return false;
        }
        self.next = Instant::now() + SIGNAL_CHECK_EVERY;
        interruption.signalled()
    }
}

/// How many SQLite virtual-machine steps a statement makes between two
/// calls of the progress handler (or pages and cells an integrity check
/// walks): well under a millisecond of work, and a statement of one call
/// (a claim, a close) never reaches it.
pub const PROGRESS_STEPS: i32 = 5_000;

/// Lets a long statement on `conn` (reconcile of a large file, doctor's
/// scans, a large page of a list) stop for a signal: every
/// [`SIGNAL_CHECK_EVERY`] it runs Python's signal handlers, and one that
/// raised (Ctrl-C) interrupts the statement. The exception is kept in
/// `interruption`; the call's transaction rolls back and the caller gets
/// the exception with nothing written. A long write used to run to its
/// commit first, and then report `KeyboardInterrupt` for a write it had
/// made (a 180,000-task reconcile, 2-3 s after the signal).
pub fn install_progress(conn: &mut Connection, interruption: &Interruption) -> Result<()> {
    let interruption = interruption.clone();
    let mut watch = SignalWatch::from(Instant::now());
    conn.progress_handler(PROGRESS_STEPS, Some(move || watch.signalled(&interruption)))?;
    Ok(())
}

/// What to do before retry number `count` of one wait.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Pause {
    /// Let another runnable thread (perhaps the holder) have this core.
    Yield,
    Sleep(Duration),
}

fn pause(count: i32) -> Pause {
    match count {
        0..20 => Pause::Yield,
        20..40 => Pause::Sleep(Duration::from_micros(50)),
        40..200 => Pause::Sleep(Duration::from_micros(250)),
        _ => Pause::Sleep(Duration::from_millis(1)),
    }
}

/// Installs the handler on `conn`: retry until `timeout_ms` has passed, or
/// a signal handler raises (kept in `interruption`), or at once while
/// `probing`. Every wait is noted in `waits`, and gives up the connection's
/// turn (see `turnstile`): whoever holds SQLite's lock took no turn, and
/// the writers queued behind this one should not wait for it without their
/// own timeouts.
pub fn install(
    conn: &mut Connection,
    timeout_ms: u32,
    interruption: &Interruption,
    waits: &Waits,
    probing: &Probing,
    turnstile: &Turnstile,
) -> Result<()> {
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    let interruption = interruption.clone();
    let waits = waits.clone();
    let probing = probing.clone();
    let turnstile = turnstile.clone();
    let mut started = Instant::now();
    let mut watch = SignalWatch::from(started);
    conn.busy_handler(Some(move |count: i32| {
        if let Some(more) = probing.may_wait() {
            if more {
                std::thread::yield_now();
            }
            return more;
        }
        if count == 0 {
            // A write that waited for its turn first has one timeout for
            // both waits, not one each.
            started = turnstile.wait_began().unwrap_or_else(Instant::now);
            watch = SignalWatch::from(started);
            waits.note();
            turnstile.leave();
            turnstile.contended();
        }
        if watch.signalled(&interruption) {
            return false;
        }
        match timeout.checked_sub(started.elapsed()) {
            Some(left) if !left.is_zero() => {
                match pause(count) {
                    Pause::Yield => std::thread::yield_now(),
                    Pause::Sleep(pause) => std::thread::sleep(pause.min(left)),
                }
                true
            }
            _ => false,
        }
    }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_yield_first_then_grow_and_stay_short() {
        assert_eq!(pause(0), Pause::Yield);
        assert!(pause(0) < pause(30));
        assert!(pause(30) < pause(50));
        assert!(pause(50) < pause(500));
        assert_eq!(pause(i32::MAX), Pause::Sleep(Duration::from_millis(1)));
    }

    #[test]
    fn a_held_lock_times_out_as_busy() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(crate::errors::Error::from)?;
        let path = dir.join("busy.db");
        let holder = Connection::open(&path)?;
        holder.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS t(x); BEGIN IMMEDIATE;",
        )?;
        let mut waiter = Connection::open(&path)?;
        let waits = Waits::default();
        install(
            &mut waiter,
            30,
            &Interruption::default(),
            &waits,
            &Probing::default(),
            &Turnstile::default(),
        )?;
        let start = Instant::now();
        let outcome = waiter.execute_batch("BEGIN IMMEDIATE; ROLLBACK;");
        assert!(matches!(
            crate::errors::Error::from(outcome.unwrap_err()),
            crate::errors::Error::Busy
        ));
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(waits.take(), "the wait was noted");
        assert!(!waits.take(), "and reported once");
        drop(holder);
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }
}
