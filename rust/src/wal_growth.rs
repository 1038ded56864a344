//! Reads make way for the WAL to start over once it has grown too large.
//!
//! SQLite starts the WAL over (writes from its first frame again) only at a
//! write that finds every frame copied back into the database file and no
//! read using the WAL. A read pins the frames up to the commit it started
//! at: the checkpoint copies no further until it ends. While reads overlap
//! (a supervisor polling without pause beside busy workers, or several
//! readers), some read always pins an older frame, and the WAL grows by
//! everything the fleet writes: 3.3 GiB in 30 s beside four workers.
//!
//! So once the WAL file is past [`WAL_SIZE_LIMIT_BYTES`], a read of this
//! library first waits for it to start over. Every reader does, so the
//! reads in progress end and none starts; a waiting reader then finds the
//! WAL copied back whole (a passive checkpoint) and starts it over itself
//! (a `TRUNCATE` checkpoint), unless a writer's commit did first. That
//! checkpoint waits for locks a few milliseconds at most, whatever the
//! handle's busy timeout: a writer is held up while it copies the frames
//! written since and for that wait, never for a reader's read, and a
//! reader that misses the moment tries again 5 ms later.
//!
//! A read whose wait ends without that (at most 1 s, and at most half the
//! handle's busy timeout) goes on as before. When the WAL stayed pinned at
//! one frame all along (a reader of another library, or a read-only
//! handle, in a long read), the handle then stops waiting for a while:
//! waiting again would only slow its reads down. The check before a read
//! is one `fstat` of the WAL.

use std::fs::File;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::busy::{Interruption, Probing, SignalWatch};
use crate::errors::Result;

/// SQLite cuts the WAL back to at most this when it starts it over
/// (`journal_size_limit`), not after every checkpoint; past it, reads wait
/// for the WAL to start over. A WAL that keeps starting over never gets
/// here.
pub const WAL_SIZE_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

/// How long one read waits at most: for the reads already in progress to
/// end, and a checkpoint of what they pinned. Never more than half the
/// handle's busy timeout either: other calls on the handle queue behind the
/// wait, and a handle that may not wait at all (`busy_timeout_ms=0`) does
/// not.
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// How often a waiting read looks at the WAL.
const POLL: Duration = Duration::from_millis(1);

/// Every how many looks a waiting read tries to start the WAL over itself.
const START_OVER_EVERY: u32 = 5;

/// How long a waiting read's attempt to start the WAL over waits for
/// locks: writers queued for the write lock it holds each hold a read lock
/// for an instant at every try, and one of them refused a restart that
/// never waited in most attempts (4 workers, 4 readers).
const START_OVER_PATIENCE: Duration = Duration::from_millis(5);

/// After a wait that ran out with the WAL pinned at one frame all along
/// its second half (another library's read that does not end), how long
/// this handle reads without waiting: waiting again would only slow its
/// reads down. A wait that ran out while the checkpoints still moved on
/// (other readers' reads ending, one after another) does not stop the
/// next: five seconds of free reads there kept the WAL pinned from handle
/// to handle, and it grew to 6.5 GiB in a review (4 workers, 3 readers).
const STOP_WAITING_FOR: Duration = Duration::from_secs(5);

/// How often a handle that stopped waiting looks whether the pin is gone
/// (a passive checkpoint that copies past it): the WAL grew by up to 1 GiB
/// in the five seconds after a 2 s read of another library ended.
const PIN_LOOK_EVERY: Duration = Duration::from_millis(100);

/// One handle's part in keeping its WAL from growing without bound.
#[derive(Default)]
pub struct WalGrowth {
    /// While reads go on without waiting: until when, the frame the WAL
    /// was pinned at, and when to look at it again.
    quiet: Option<Quiet>,
}

/// A handle's pause in waiting, for a WAL pinned by a read that is not
/// ending.
struct Quiet {
    until: Instant,
    pinned_at: i64,
    next_look: Instant,
}

impl Quiet {
    /// Whether reads still go on without waiting: the pause is not over
    /// and, as far as the last look saw, the pin is still there.
    fn holds(&mut self, conn: &Connection, now: Instant) -> bool {
        if now >= self.until {
            return false;
        }
        if now < self.next_look {
            return true;
        }
        self.next_look = now + PIN_LOOK_EVERY;
        checkpoint(conn).is_none_or(|(_, copied)| copied == self.pinned_at)
    }
}

impl WalGrowth {
    /// Before a read transaction on `conn`, whose WAL is `wal`: while the
    /// WAL is too large, waits (up to [`LONGEST_WAIT`]) for it to start
    /// over, and tries to start it over now and then. Fails only for a
    /// signal (Ctrl-C) during the wait, as a lock wait does: the read goes
    /// on as before whatever else happens here.
    pub fn make_way_before_read(
        &mut self,
        conn: &Connection,
        wal: &File,
        busy_timeout: Duration,
        guards: (&Probing, &Interruption),
    ) -> Result<()> {
        let (probing, interruption) = guards;
        let start = Instant::now();
        if let Some(quiet) = &mut self.quiet {
            if quiet.holds(conn, start) {
                return Ok(());
            }
            self.quiet = None;
        }
        let longest = LONGEST_WAIT.min(busy_timeout / 2);
        let mut watch = SignalWatch::from(start);
        let mut pin = Pin::default();
        let mut looks = 0;
        while is_oversized(wal) {
            if watch.signalled(interruption) {
                return interruption.stop_if_signalled();
            }
            if looks % START_OVER_EVERY == START_OVER_EVERY - 1 && pin.lifted(checkpoint(conn)) {
                probing.within(START_OVER_PATIENCE, || start_over(conn));
            }
            if start.elapsed() >= longest {
                self.quiet = pin.held_since(start + longest / 2).map(|pinned_at| {
                    let now = Instant::now();
                    Quiet {
                        until: now + STOP_WAITING_FOR,
                        pinned_at,
                        next_look: now + PIN_LOOK_EVERY,
                    }
                });
                return Ok(());
            }
            std::thread::sleep(POLL);
            looks += 1;
        }
        Ok(())
    }
}

/// What one wait's passive checkpoints found: the frame they copied up to
/// (where the oldest read pins the WAL), and since when it stood there.
#[derive(Default)]
struct Pin {
    at: Option<(i64, Instant)>,
}

impl Pin {
    /// Takes one checkpoint's `(frames, copied)` in; true when it copied
    /// the WAL back whole, so that no read pins it any more.
    fn lifted(&mut self, found: Option<(i64, i64)>) -> bool {
        let Some((frames, copied)) = found else {
            return false;
        };
        if self.at.is_none_or(|(before, _)| before != copied) {
            self.at = Some((copied, Instant::now()));
        }
        copied >= frames
    }

    /// The frame the checkpoints have found the WAL pinned at since
    /// `moment` or earlier, if they have.
    fn held_since(&self, moment: Instant) -> Option<i64> {
        self.at
            .filter(|&(_, since)| since <= moment)
            .map(|(frame, _)| frame)
    }
}

/// Whether the WAL file is past [`WAL_SIZE_LIMIT_BYTES`]: it has not started
/// over since it grew there (false when that cannot be told).
fn is_oversized(wal: &File) -> bool {
    wal.metadata().is_ok_and(|m| m.len() > WAL_SIZE_LIMIT_BYTES)
}

/// Runs `PRAGMA wal_checkpoint(mode)`: whether it was kept from its lock,
/// the frames in the WAL, and how many are copied back (SQLite's three
/// answers; -1 for the counts when the WAL could not be read).
pub fn wal_checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(bool, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get::<_, i64>(0)? != 0, r.get(1)?, r.get(2)?))
    })
}

/// Runs a passive checkpoint (it copies what no read pins, and waits for
/// nothing): the frames in the WAL and how many are copied back, or
/// `None` when another checkpoint was running or it failed.
fn checkpoint(conn: &Connection) -> Option<(i64, i64)> {
    wal_checkpoint(conn, "PASSIVE")
        .ok()
        .filter(|&(busy, _, _)| !busy)
        .map(|(_, frames, copied)| (frames, copied))
}

/// Copies the WAL back whole and cuts it to nothing, if no read pins it and
/// the locks are had within [`START_OVER_PATIENCE`] (a `TRUNCATE`
/// checkpoint: writers are held up while it copies the few frames written
/// since and for that wait at most, never for a reader's read). An error
/// (a full disk, a damaged file) is not this check's to report: the read
/// goes on and meets it.
fn start_over(conn: &Connection) {
    let _ = wal_checkpoint(conn, "TRUNCATE");
}
