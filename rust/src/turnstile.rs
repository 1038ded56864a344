//! Writers take turns for the write lock instead of polling for it.
//!
//! SQLite's write lock has no queue: a writer that finds it taken is told
//! "busy" and tries again later (see `busy`). With several processes
//! claiming from one file, the lock changes hands every few dozen
//! microseconds, and the waiters' retries (each one a round of lock
//! syscalls and a look at the shared memory, then a yield or a sleep) cost
//! more processor time than the writes: four processes on two cores spent
//! 187 us of CPU per claimed-and-closed task where one process spends 69.
//!
//! So a short write first takes its turn: an exclusive `flock` on the
//! handle's own descriptor of the WAL, held from before `BEGIN IMMEDIATE`
//! until its commit returns. The kernel queues the waiters, and each
//! sleeps until the one before it is done; the next one then finds
//! SQLite's lock free. Its own descriptor: `flock` belongs to an open file
//! description, so two handles of one process queue like two processes.
//!
//! The turn covers the checkpoint a commit may run too. Given up before
//! it, the others wrote beside the checkpoint, their readers pinned older
//! frames, and checkpoints rarely reached the end of the WAL: four
//! processes then gained nothing. Held through it, four processes claim
//! and close about 1.35x as many tasks a second, sixteen about 1.6x.
//!
//! A handle takes turns only while it shares the file with other busy
//! writers: once it met a taken lock or turn in the last
//! [`CONTENDED_FOR`]. A lone writer makes no extra system call.
//!
//! The turnstile is advisory and decides nothing: SQLite's lock still does.
//! A writer that finds SQLite's lock taken anyway (by a bulk rewrite, which
//! takes no turn because it may hold the lock for seconds, by another
//! program, or by a connection closing) gives its turn up at once and
//! waits in SQLite's busy handler with its timeout, as every writer did
//! before. A file system without `flock` leaves writers to that handler.
//!
//! The one wait `busy_timeout_ms` does not bound: a turn held by a process
//! that is stopped (a debugger, `SIGSTOP`) in the middle of a short write.
//! Its queue then waits until it goes on or ends, where without the
//! turnstile each waiter would give up with `LedgerBusy`. A signal handler
//! that raises (Ctrl-C) still ends the wait at once.

use std::fs::{File, TryLockError};
use std::io::ErrorKind;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::busy::Interruption;
use crate::errors::{Error, Result};

/// How long a handle goes on taking turns after it last met another
/// writer: longer than any pause of a busy fleet's workers between writes.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// One handle's turns: shared with its busy handler, which gives a turn up.
#[derive(Clone, Default)]
pub struct Turnstile(Arc<Mutex<Turns>>);

#[derive(Default)]
struct Turns {
    /// The WAL descriptor whose turn this handle holds.
    held: Option<Arc<File>>,
    /// When this handle last found the lock or the turn taken.
    contended_at: Option<Instant>,
}

impl Turnstile {
    /// Waits for this handle's turn on `wal` (its own descriptor of the
    /// WAL). `Err(Busy)` when a signal handler raised meanwhile: the
    /// exception is kept in `interruption` to explain it.
    pub fn enter(&self, wal: &Arc<File>, interruption: &Interruption) -> Result<()> {
        let recently = |at: Instant| at.elapsed() < CONTENDED_FOR;
        if !self.turns().contended_at.is_some_and(recently) {
            return Ok(());
        }
        match wal.try_lock() {
            Ok(()) => {
                self.hold(wal);
                return Ok(());
            }
            Err(TryLockError::WouldBlock) => self.contended(),
            // No `flock` here: SQLite's lock and busy handler alone.
            Err(TryLockError::Error(_)) => return Ok(()),
        }
        loop {
            match wal.lock() {
                Ok(()) => {
                    self.hold(wal);
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {
                    if interruption.signalled() {
                        return Err(Error::Busy);
                    }
                }
                Err(_) => return Ok(()),
            }
        }
    }

    /// Gives the turn up, if this handle holds one: once its commit (and
    /// the checkpoint it may run) is done, or when it must wait for a lock
    /// the turnstile does not cover.
    pub fn leave(&self) {
        if let Some(wal) = self.turns().held.take() {
            // An unlock fails only for a descriptor that is not open; the
            // lock then went with it.
            let _ = wal.unlock();
        }
    }

    /// This handle found SQLite's lock or the turn taken: it takes turns
    /// for the next [`CONTENDED_FOR`].
    pub fn contended(&self) {
        self.turns().contended_at = Some(Instant::now());
    }

    fn hold(&self, wal: &Arc<File>) {
        self.turns().held = Some(Arc::clone(wal));
    }

    fn turns(&self) -> MutexGuard<'_, Turns> {
        // Every change to it is one assignment: a panic elsewhere cannot
        // leave it half made.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn wal_file(name: &str) -> std::io::Result<(std::path::PathBuf, Arc<File>)> {
        let dir = std::env::temp_dir().join(format!("tw-turn-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("x.db-wal");
        std::fs::write(&path, b"")?;
        let file = Arc::new(File::open(&path)?);
        Ok((dir, file))
    }

    #[test]
    fn a_second_handle_waits_for_the_first_to_leave() -> std::io::Result<()> {
        let (dir, first_wal) = wal_file("queue")?;
        let second_wal = Arc::new(File::open(dir.join("x.db-wal"))?);
        let first = Turnstile::default();
        first.contended();
        first
            .enter(&first_wal, &Interruption::default())
            .map_err(|_| std::io::Error::other("enter"))?;
        let (entered, heard) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let second = Turnstile::default();
            second.contended();
            let outcome = second.enter(&second_wal, &Interruption::default());
            entered.send(Instant::now()).ok();
            second.leave();
            outcome.is_ok()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(heard.try_recv().is_err(), "the second entered a held turn");
        let left = Instant::now();
        first.leave();
        first.leave(); // twice is harmless
        let entered_at = heard
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| std::io::Error::other("the second never entered"))?;
        assert!(entered_at >= left);
        assert!(waiter.join().unwrap_or(false));
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }
}
