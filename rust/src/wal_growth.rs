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
//! (a `TRUNCATE` checkpoint), unless a writer's commit did first. Its busy
//! handler waits for nothing meanwhile: a writer is held up only while
//! the checkpoint copies the frames written since, never while it waits
//! for readers, and a reader that misses the moment tries again 5 ms
//! later. Beside four workers, the WAL then peaked at 98-255 MiB in 30 s
//! (one to four readers), the workers kept their pace, and the readers
//! waited 6-23 ms a cycle at the median.
//!
//! A read whose wait ends without that (a reader of another library pins
//! the WAL) goes on as before, and this handle stops waiting for a while:
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
/// end, and a checkpoint of what they pinned.
const LONGEST_WAIT: Duration = Duration::from_secs(1);

/// How often a waiting read looks at the WAL.
const POLL: Duration = Duration::from_millis(1);

/// Every how many looks a waiting read tries to start the WAL over itself.
const START_OVER_EVERY: u32 = 5;

/// After a wait that did not see the WAL start over, how long this handle
/// reads without waiting.
const STOP_WAITING_FOR: Duration = Duration::from_secs(5);

/// One handle's part in keeping its WAL from growing without bound.
#[derive(Default)]
pub struct WalGrowth {
    /// Until when reads go on without looking at the WAL.
    quiet_until: Option<Instant>,
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
        probing: &Probing,
        interruption: &Interruption,
    ) -> Result<()> {
        let start = Instant::now();
        if self.quiet_until.is_some_and(|until| start < until) {
            return Ok(());
        }
        let mut watch = SignalWatch::from(start);
        let mut looks = 0;
        while is_oversized(wal) {
            if watch.signalled(interruption) {
                return interruption.stop_if_signalled();
            }
            if looks % START_OVER_EVERY == START_OVER_EVERY - 1 && copies_back_whole(conn) {
                probing.during(|| start_over(conn));
            }
            if start.elapsed() >= LONGEST_WAIT {
                self.quiet_until = Some(Instant::now() + STOP_WAITING_FOR);
                return Ok(());
            }
            std::thread::sleep(POLL);
            looks += 1;
        }
        Ok(())
    }
}

/// Whether the WAL file is past [`WAL_SIZE_LIMIT_BYTES`]: it has not started
/// over since it grew there (false when that cannot be told).
fn is_oversized(wal: &File) -> bool {
    wal.metadata().is_ok_and(|m| m.len() > WAL_SIZE_LIMIT_BYTES)
}

/// Runs a passive checkpoint (it copies what no read pins, and waits for
/// nothing): whether the WAL is now copied back whole, so that no read
/// pins it any more. Only then is starting it over worth the write lock.
fn copies_back_whole(conn: &Connection) -> bool {
    let outcome = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    });
    outcome.is_ok_and(|(busy, frames, copied)| busy == 0 && copied >= frames)
}

/// Copies the WAL back whole and cuts it to nothing, if no read pins it and
/// the write lock is free this instant (a `TRUNCATE` checkpoint run while
/// the busy handler waits for nothing: writers are held up only while it
/// copies the few frames written since, never while it waits). An error (a
/// full disk, a damaged file) is not this check's to report: the read goes
/// on and meets it.
fn start_over(conn: &Connection) {
    let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
}
