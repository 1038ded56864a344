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
//! reads in progress end and none starts. A writable handle's waiting read
//! then finds the WAL copied back whole (a passive checkpoint) and starts
//! it over itself (a `TRUNCATE` checkpoint), unless a writer's commit did
//! first. That checkpoint waits for locks a few milliseconds at most,
//! whatever the handle's busy timeout: a writer is held up while it copies
//! the frames written since and for that wait, never for a reader's read,
//! and a reader that misses the moment tries again 5 ms later. A read-only
//! handle may not checkpoint (that writes the database file): it reads how
//! far the checkpoints have come in SQLite's WAL index (`wal_index`) and
//! leaves the copying and the start over to the writers' commits. Before,
//! two read-only supervisors polling every 100 ms beside four workers grew
//! the WAL to 2.3 GiB in 30 s.
//!
//! A read whose wait ends without that (at most 1 s, and at most half the
//! handle's busy timeout) goes on as before. When the WAL stayed pinned at
//! one frame all along (a reader of another library in a long read), the
//! handle then stops waiting for a while: waiting again would only slow
//! its reads down. A wait also ends once nothing moves at all (no commit,
//! no copying) for a quarter of a second, as for a pin; or for 20 ms, when
//! the WAL is copied back whole, and then the handle stops waiting until
//! the WAL moves again: a WAL that no one writes does not grow, and no one
//! would start it over. The check before a read is one `fstat` (a `stat`
//! of the `-wal` name on a read-only handle).

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::busy::{Interruption, Probing, SignalWatch};
use crate::errors::Result;
use crate::held_files::Lease;
use crate::wal_index;

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

/// How often a waiting read looks at the WAL's size.
const POLL: Duration = Duration::from_millis(1);

/// Every how many polls a waiting read looks how far the WAL has been
/// copied back (a writable handle: with a passive checkpoint, which copies
/// what it may) and, if whole, starts it over. The first poll looks too: a
/// handle whose wait is short (a busy timeout of 10 ms) must still see
/// where the WAL is pinned, or it waits its whole wait on every read.
const LOOK_EVERY: u32 = 5;

/// How long a writable handle's attempt to start the WAL over waits for
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

/// How long the WAL must stand still (no commit, no frame copied back)
/// before a wait ends for want of anyone to start it over, while a read
/// pins it. Longer than a checkpoint's stall of the writers (70-150 ms on
/// a 500,000-task file), so that busy writers are not taken for idle ones.
/// The handle then stops waiting as for a pin: a writer committing every
/// 400 ms beside another library's long read otherwise made every read
/// wait 250 ms after each commit (13 of 20 s spent waiting, in a review).
const STANDSTILL: Duration = Duration::from_millis(250);

/// The same for a WAL copied back whole, which any commit would start
/// over: one that comes no sooner finds no reads of this library in its
/// way. A read-only handle (which cannot start the WAL over itself) opened
/// on an idle fleet's oversized WAL paid 250 ms for each open.
const STANDSTILL_COPIED: Duration = Duration::from_millis(20);

/// How often a handle that stopped waiting looks whether the WAL moved on
/// (a pin gone, a commit): the WAL grew by up to 1 GiB in the five seconds
/// after a 2 s read of another library ended.
const PIN_LOOK_EVERY: Duration = Duration::from_millis(100);

/// How a waiting read sees the WAL, and whether it may start it over.
pub enum Watch<'a> {
    /// A writable handle: its own descriptor of the WAL, and its
    /// connection, whose passive checkpoints look (copying what no read
    /// pins) and whose `TRUNCATE` checkpoint starts the WAL over.
    Writable {
        conn: &'a Connection,
        wal: &'a File,
        probing: &'a Probing,
    },
    /// A read-only handle of a live file: the names of its `-wal` and
    /// `-shm`, looked at, never written, and its lease on the file, which
    /// holds the descriptor the `-shm` is read through.
    ReadOnly {
        lease: &'a Lease,
        wal: &'a Path,
        shm: &'a Path,
    },
}

impl Watch<'_> {
    /// Whether the WAL file is past [`WAL_SIZE_LIMIT_BYTES`]: it has not
    /// started over since it grew there (false when that cannot be told).
    fn is_oversized(&self) -> bool {
        let size = match self {
            Watch::Writable { wal, .. } => wal.metadata(),
            Watch::ReadOnly { wal, .. } => std::fs::metadata(wal),
        };
        size.is_ok_and(|m| m.len() > WAL_SIZE_LIMIT_BYTES)
    }

    /// The frames in the WAL and how many are copied back, or `None` when
    /// that cannot be told now (another checkpoint running, a WAL index
    /// being written).
    fn look(&self) -> Option<(i64, i64)> {
        match self {
            Watch::Writable { conn, .. } => checkpoint(conn),
            Watch::ReadOnly { lease, shm, .. } => {
                let progress = wal_index::read(&*lease.shm(shm)?)?;
                Some((i64::from(progress.frames), i64::from(progress.copied)))
            }
        }
    }

    /// Starts the WAL over, when this handle may (see [`start_over`]).
    fn start_over(&self) {
        if let Watch::Writable { conn, probing, .. } = self {
            probing.within(START_OVER_PATIENCE, || start_over(conn));
        }
    }
}

/// One handle's part in keeping its WAL from growing without bound.
#[derive(Default)]
pub struct WalGrowth {
    /// While reads go on without waiting: for what, and when to look again.
    quiet: Option<Quiet>,
}

/// A handle's pause in waiting, while the WAL does not move as it must to
/// start over.
struct Quiet {
    /// When the pause ends whatever the looks find (none while nothing
    /// moves at all: that lasts as long as it lasts).
    until: Option<Instant>,
    still: Still,
    next_look: Instant,
}

/// What keeps a WAL from starting over, as the looks found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Still {
    /// Copied back up to this frame and no further: a read pins it there.
    PinnedAt(i64),
    /// This many frames, copied back up to that one: no commit, no copying.
    Idle(i64, i64),
}

impl Still {
    /// Whether a look's `(frames, copied)` finds the WAL still so.
    fn holds_for(self, (frames, copied): (i64, i64)) -> bool {
        match self {
            Still::PinnedAt(at) => copied == at,
            Still::Idle(in_wal, at) => frames == in_wal && copied == at,
        }
    }
}

impl Quiet {
    fn new(lasting: Option<Duration>, still: Still) -> Quiet {
        let now = Instant::now();
        Quiet {
            until: lasting.map(|d| now + d),
            still,
            next_look: now + PIN_LOOK_EVERY,
        }
    }

    /// Whether reads still go on without waiting: the pause is not over
    /// and, as far as the last look saw, the WAL is still as it was.
    fn holds(&mut self, watch: &Watch<'_>, now: Instant) -> bool {
        if self.until.is_some_and(|until| now >= until) {
            return false;
        }
        if now < self.next_look {
            return true;
        }
        self.next_look = now + PIN_LOOK_EVERY;
        watch.look().is_none_or(|found| self.still.holds_for(found))
    }
}

impl WalGrowth {
    /// Before a read transaction: while the WAL is too large, waits (up to
    /// [`LONGEST_WAIT`]) for it to start over, and, on a writable handle,
    /// tries to start it over now and then. Fails only for a signal
    /// (Ctrl-C) during the wait, as a lock wait does: the read goes on as
    /// before whatever else happens here.
    pub fn make_way_before_read(
        &mut self,
        watch: &Watch<'_>,
        busy_timeout: Duration,
        interruption: &Interruption,
    ) -> Result<()> {
        let start = Instant::now();
        if let Some(quiet) = &mut self.quiet {
            if quiet.holds(watch, start) {
                return Ok(());
            }
            self.quiet = None;
        }
        let longest = LONGEST_WAIT.min(busy_timeout / 2);
        let mut signals = SignalWatch::from(start);
        let mut looks = Looks::default();
        let mut polls = 0;
        while watch.is_oversized() {
            if signals.signalled(interruption) {
                return interruption.stop_if_signalled();
            }
            if polls % LOOK_EVERY == 0 {
                match watch.look() {
                    Some(found) => {
                        if looks.take(found) {
                            watch.start_over();
                        }
                        if let Some(quiet) = looks.idle() {
                            self.quiet = Some(quiet);
                            return Ok(());
                        }
                    }
                    // A read-only handle that cannot read the WAL index
                    // cannot tell what it would wait for.
                    None if matches!(watch, Watch::ReadOnly { .. }) => return Ok(()),
                    None => {}
                }
            }
            if start.elapsed() >= longest {
                self.quiet = looks
                    .pinned_since(start + longest / 2)
                    .map(|at| Quiet::new(Some(STOP_WAITING_FOR), Still::PinnedAt(at)));
                return Ok(());
            }
            std::thread::sleep(POLL);
            polls += 1;
        }
        Ok(())
    }
}

/// What one wait's looks found: since when the WAL has held its frames,
/// and since when it has been copied back up to the same frame (where the
/// oldest read pins it).
#[derive(Default)]
struct Looks {
    frames: Standstill,
    copied: Standstill,
}

impl Looks {
    /// Takes one look's `(frames, copied)` in; true when the WAL is copied
    /// back whole, so that no read pins it any more.
    fn take(&mut self, (frames, copied): (i64, i64)) -> bool {
        self.frames.see(frames);
        self.copied.see(copied);
        copied >= frames
    }

    /// The pause in waiting for a WAL that has stood still long enough,
    /// with no commit and no copying (see [`STANDSTILL`]), if it has: while
    /// nothing moves, when copied back whole; as for a pin, when not.
    fn idle(&self) -> Option<Quiet> {
        let (Some((frames, _)), Some((copied, _))) = (self.frames.at, self.copied.at) else {
            return None;
        };
        let whole = copied >= frames;
        let span = if whole { STANDSTILL_COPIED } else { STANDSTILL };
        self.frames.for_at_least(span)?;
        self.copied.for_at_least(span)?;
        Some(if whole {
            Quiet::new(None, Still::Idle(frames, copied))
        } else {
            Quiet::new(Some(STOP_WAITING_FOR), Still::PinnedAt(copied))
        })
    }

    /// The frame the WAL has been copied back up to since `moment` or
    /// earlier, if it has.
    fn pinned_since(&self, moment: Instant) -> Option<i64> {
        self.copied.since(moment)
    }
}

/// One count as the looks saw it, and since when it stood there.
#[derive(Default)]
struct Standstill {
    at: Option<(i64, Instant)>,
}

impl Standstill {
    fn see(&mut self, value: i64) {
        if self.at.is_none_or(|(before, _)| before != value) {
            self.at = Some((value, Instant::now()));
        }
    }

    fn since(&self, moment: Instant) -> Option<i64> {
        self.at
            .filter(|&(_, since)| since <= moment)
            .map(|(value, _)| value)
    }

    fn for_at_least(&self, span: Duration) -> Option<i64> {
        self.at
            .filter(|&(_, since)| since.elapsed() >= span)
            .map(|(value, _)| value)
    }
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
