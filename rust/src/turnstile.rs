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
//! and close about 1.4x as many tasks a second, sixteen about 1.5x.
//!
//! A handle takes turns only while it shares the file with other busy
//! writers: once it met a taken lock or turn in the last
//! [`CONTENDED_FOR`]. A lone writer makes no extra system call.
//!
//! A blocking `flock` cannot be given a timeout, so a writer whose turn is
//! not free at once has a short-lived thread wait in `flock` for it, and
//! waits for that thread no longer than its `busy_timeout_ms` (`LedgerBusy`
//! then), looking for signals (Ctrl-C) as the busy handler does. A thread
//! whose writer gave up gives the turn back as soon as it gets it; a
//! writer that gave up and comes back waits on the same thread rather
//! than starting another.
//!
//! The turnstile is advisory and decides nothing: SQLite's lock still does.
//! A writer that finds SQLite's lock taken anyway (by a bulk rewrite, which
//! takes no turn: it holds the lock for seconds and gains nothing from a
//! queue of short writes, by another
//! program, or by a connection closing) gives its turn up at once and
//! waits in SQLite's busy handler with its timeout, as every writer did
//! before. A file system without `flock` leaves writers to that handler.
//!
//! A turn can also be held by no writer at all: a `flock` belongs to the
//! open file description, which a forked child shares, so a writer killed
//! during its turn leaves the turn held for as long as a child of it keeps
//! the descriptor open (or another program may hold it). Waiting for it
//! would cost every writer its timeout. So a writer that has waited
//! [`STALE_AFTER`] looks, every [`SIGNAL_CHECK_EVERY`], whether SQLite's
//! write lock can be had at once (a live holder holds it through nearly
//! all of its turn); found free [`STALE_LOOKS`] times in a row, the writer
//! goes on without its turn, and the handle takes none for the next
//! [`CONTENDED_FOR`].

use std::fs::{File, TryLockError};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::busy::{Interruption, SignalWatch, SIGNAL_CHECK_EVERY};
use crate::errors::{Error, Result};

/// How long a handle goes on taking turns after it last met another
/// writer: longer than any pause of a busy fleet's workers between writes.
/// Also how long it takes none after it found a turn held by no writer.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// How long a writer waits for its turn before it looks whether the turn
/// protects anything: longer than a busy fleet's usual waits (about a
/// millisecond) and than most checkpoints a turn covers.
const STALE_AFTER: Duration = Duration::from_millis(100);

/// How many looks in a row, [`SIGNAL_CHECK_EVERY`] apart, must find
/// SQLite's write lock free before a turn counts as held by no writer:
/// one could fall between two transactions of a live holder.
const STALE_LOOKS: u32 = 2;

/// How long a long run of writes pauses between its transactions when it
/// shares the file (see [`Turnstile::make_way`]): time for a woken waiter
/// to run and take the turn. Beside six workers on a 500,000-task file,
/// the workers kept 83% of their pace during a purge instead of 29%, their
/// longest wait fell from 282 to 64 ms, and the purge took 7.3 s instead
/// of 4.6 s.
const MAKE_WAY_PAUSE: Duration = Duration::from_millis(1);

/// How many turn threads a process keeps at most. A thread whose writer
/// gave up waits on in `flock`, with its own descriptor of the WAL, until
/// it gets the turn; beside a turn held by no writer that is for as long
/// as the turn stays held, past its handle's close. A process opening one
/// handle per job beside such a turn left one thread and one descriptor
/// more per job, until opens failed for want of descriptors. Past this
/// many, a writer waits in SQLite's busy handler instead, as on a file
/// system without `flock`.
const MAX_TURN_THREADS: u64 = 16;

/// This process's turn threads: its id in the high half, the count in the
/// low one, so that a forked child (which has none of its parent's
/// threads) starts from zero instead of its parent's count. Atomic, not a
/// lock: a fork may come at any moment.
static TURN_THREADS: AtomicU64 = AtomicU64::new(0);

/// The turn threads of this process that `packed` counts (none when it
/// is a parent's count, inherited across a fork).
fn alive_here(packed: u64) -> u64 {
    if packed >> 32 == u64::from(std::process::id()) {
        packed & 0xFFFF_FFFF
    } else {
        0
    }
}

/// Counts one turn thread more for this process; false at the limit.
fn count_turn_thread() -> bool {
    let me = u64::from(std::process::id()) << 32;
    TURN_THREADS
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |packed| {
            let alive = alive_here(packed);
            (alive < MAX_TURN_THREADS).then_some(me | (alive + 1))
        })
        .is_ok()
}

/// Counts one turn thread of this process less (it ended, or never began).
fn uncount_turn_thread() {
    // Only the process that counted a thread runs it: the high half is
    // this process's id and the count is at least one.
    TURN_THREADS.fetch_sub(1, Ordering::AcqRel);
}

/// The number of turn threads this process runs (tests watch it).
#[cfg(test)]
fn turn_threads() -> u64 {
    alive_here(TURN_THREADS.load(Ordering::Acquire))
}

/// One handle's turns: shared with its busy handler, which gives a turn up.
#[derive(Clone, Default)]
pub struct Turnstile(Arc<Mutex<Turns>>);

#[derive(Default)]
struct Turns {
    /// The WAL descriptor whose turn this handle holds.
    held: Option<Arc<File>>,
    /// When this handle last found the lock or the turn taken.
    contended_at: Option<Instant>,
    /// When this handle last found a turn held by no writer.
    stale_at: Option<Instant>,
    /// The thread still waiting in `flock` for a writer that gave up.
    abandoned: Option<Arc<Wait>>,
    /// When the current write began waiting for its turn: its wait for
    /// SQLite's lock, if it has one, ends one busy timeout after that.
    wait_began: Option<Instant>,
}

/// Where a waiting thread's `flock` stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// In `flock`, for a writer waiting for it.
    Waiting,
    /// In `flock`, for nobody: the turn is given back when it comes.
    Abandoned,
    /// The turn is the writer's.
    Granted,
    /// No `flock` on this file system: the writer goes on without a turn.
    Failed,
    /// The thread got the turn for nobody, gave it back and ended.
    Returned,
}

/// One thread's wait for a turn on `wal`.
struct Wait {
    wal: Arc<File>,
    stage: Mutex<Stage>,
    changed: Condvar,
}

impl Wait {
    fn stage(&self) -> MutexGuard<'_, Stage> {
        self.stage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The thread's side: blocks in `flock`, then hands the turn to the
    /// writer, or gives it back if the writer is gone.
    fn run(&self) {
        let locked = loop {
            match self.wal.lock() {
                Ok(()) => break true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        let mut stage = self.stage();
        if *stage == Stage::Abandoned {
            if locked {
                let _ = self.wal.unlock();
            }
            *stage = Stage::Returned;
            return;
        }
        *stage = if locked {
            Stage::Granted
        } else {
            Stage::Failed
        };
        self.changed.notify_all();
    }
}

impl Turnstile {
    /// Waits, up to `timeout`, for this handle's turn on `wal` (its own
    /// descriptor of the WAL). `Err(Busy)` when the timeout passed, or a
    /// signal handler raised (its exception kept in `interruption`). Goes
    /// on without the turn when `lock_free` (SQLite's write lock can be had
    /// at once) shows that whoever holds it is not writing.
    pub fn enter(
        &self,
        wal: &Arc<File>,
        interruption: &Interruption,
        timeout: Duration,
        lock_free: &mut dyn FnMut() -> bool,
    ) -> Result<()> {
        if !self.takes_turns() {
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
        let Some(wait) = self.waiting_thread(wal) else {
            return Ok(()); // no thread to be had: SQLite's busy handler waits
        };
        self.turns().wait_began = Some(Instant::now());
        if self.await_turn(&wait, interruption, timeout, lock_free)? {
            self.hold(wal);
        }
        Ok(())
    }

    /// A thread waiting in `flock` on `wal`: the one a writer of this handle
    /// gave up on, if it still waits on this descriptor, or a new one.
    fn waiting_thread(&self, wal: &Arc<File>) -> Option<Arc<Wait>> {
        let abandoned = self.turns().abandoned.take();
        if let Some(wait) = abandoned {
            let mut stage = wait.stage();
            if *stage == Stage::Abandoned && Arc::ptr_eq(&wait.wal, wal) {
                *stage = Stage::Waiting;
                drop(stage);
                return Some(wait);
            }
        }
        let wait = Arc::new(Wait {
            wal: Arc::clone(wal),
            stage: Mutex::new(Stage::Waiting),
            changed: Condvar::new(),
        });
        if !count_turn_thread() {
            return None;
        }
        let theirs = Arc::clone(&wait);
        let spawned = std::thread::Builder::new()
            .name("taskwarden-turn".into())
            .spawn(move || {
                theirs.run();
                uncount_turn_thread();
            });
        if spawned.is_err() {
            uncount_turn_thread();
        }
        spawned.ok().map(|_| wait)
    }

    /// Waits for `wait`'s thread to get the turn: true when it did, false
    /// when it could not (no `flock`) or the turn is held by no writer.
    /// `Err(Busy)` once `timeout` passed or a signal handler raised. When
    /// it does not take the turn, the thread is left to give the turn back
    /// when it comes, or to a later writer of this handle.
    fn await_turn(
        &self,
        wait: &Arc<Wait>,
        interruption: &Interruption,
        timeout: Duration,
        lock_free: &mut dyn FnMut() -> bool,
    ) -> Result<bool> {
        let started = Instant::now();
        let mut watch = SignalWatch::from(started);
        let mut next_look = started + STALE_AFTER;
        let mut free_looks = 0;
        let mut stage = wait.stage();
        loop {
            match *stage {
                Stage::Granted => return Ok(true),
                Stage::Failed | Stage::Returned => return Ok(false),
                Stage::Waiting | Stage::Abandoned => {}
            }
            let left = timeout.saturating_sub(started.elapsed());
            // Python's handlers and the look at SQLite's lock run without
            // the thread's lock: the thread may hand over the turn
            // meanwhile, and the others wait for it.
            let (give_up, held_by_nobody) = if left.is_zero() {
                (true, false)
            } else {
                drop(stage);
                let raised = watch.signalled(interruption);
                let now = Instant::now();
                if !raised && now >= next_look {
                    next_look = now + SIGNAL_CHECK_EVERY;
                    free_looks = if lock_free() { free_looks + 1 } else { 0 };
                }
                stage = wait.stage();
                (raised, free_looks >= STALE_LOOKS)
            };
            if give_up || (held_by_nobody && *stage != Stage::Granted) {
                if *stage == Stage::Granted {
                    let _ = wait.wal.unlock();
                } else if *stage == Stage::Waiting {
                    *stage = Stage::Abandoned;
                    drop(stage);
                    self.turns().abandoned = Some(Arc::clone(wait));
                }
                if give_up {
                    return Err(Error::Busy);
                }
                // Held for a writer that is gone (a forked child keeps a
                // dead parent's descriptor, and its lock, open) or by
                // another program: it protects nothing, and would cost
                // every writer its timeout. Without turns for a while.
                self.turns().stale_at = Some(Instant::now());
                return Ok(false);
            }
            stage = wait
                .changed
                .wait_timeout(stage, left.min(SIGNAL_CHECK_EVERY))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Gives the turn up, if this handle holds one: once its commit (and
    /// the checkpoint it may run) is done, or when it must wait for a lock
    /// the turnstile does not cover.
    pub fn leave(&self) {
        let mut turns = self.turns();
        turns.wait_began = None;
        if let Some(wal) = turns.held.take() {
            // An unlock fails only for a descriptor that is not open; the
            // lock then went with it.
            let _ = wal.unlock();
        }
    }

    /// When the current write began waiting for its turn, if it waited:
    /// the start of its one busy timeout (see `busy::install`).
    #[must_use]
    pub fn wait_began(&self) -> Option<Instant> {
        self.turns().wait_began
    }

    /// This handle found SQLite's lock or the turn taken: it takes turns
    /// for the next [`CONTENDED_FOR`].
    pub fn contended(&self) {
        self.turns().contended_at = Some(Instant::now());
    }

    /// Whether this handle met another writer in the last
    /// [`CONTENDED_FOR`], and found no turn held by no writer: it then
    /// takes turns.
    fn takes_turns(&self) -> bool {
        let turns = self.turns();
        let recent = |at: Option<Instant>| at.is_some_and(|at| at.elapsed() < CONTENDED_FOR);
        recent(turns.contended_at) && !recent(turns.stale_at)
    }

    /// Between two transactions of a long run of writes (a purge's
    /// batches): a handle that met other writers lately pauses for
    /// [`MAKE_WAY_PAUSE`], so a writer woken from its wait for the turn
    /// gets it. Without the pause the run's next `try_lock` took the turn
    /// straight back (1,720 times in 1,875 batches of a purge beside six
    /// workers). A lone writer does not pause.
    pub fn make_way(&self) {
        if self.takes_turns() {
            std::thread::sleep(MAKE_WAY_PAUSE);
        }
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

    const LONG: Duration = Duration::from_secs(60);

    /// Two descriptors of one new file: two handles' views of a WAL.
    fn two_wals(name: &str) -> std::io::Result<(std::path::PathBuf, Arc<File>, Arc<File>)> {
        let dir = std::env::temp_dir().join(format!("tw-turn-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("x.db-wal");
        std::fs::write(&path, b"")?;
        Ok((
            dir,
            Arc::new(File::open(&path)?),
            Arc::new(File::open(&path)?),
        ))
    }

    fn contended() -> Turnstile {
        let turnstile = Turnstile::default();
        turnstile.contended();
        turnstile
    }

    /// A first handle holding its turn, and a second handle's view of the
    /// same WAL: the temporary directory, the first, its WAL, the second's.
    fn turn_held(name: &str) -> Result<(std::path::PathBuf, Turnstile, Arc<File>, Arc<File>)> {
        let (dir, first_wal, second_wal) = two_wals(name)?;
        let first = contended();
        first.enter(&first_wal, &Interruption::default(), LONG, &mut || false)?;
        Ok((dir, first, first_wal, second_wal))
    }

    /// A long run of writes pauses between its transactions only while
    /// the handle shares the file with other writers.
    #[test]
    fn only_a_handle_that_met_other_writers_makes_way() {
        let lone = Turnstile::default();
        assert!(!lone.takes_turns());
        let shared = contended();
        assert!(shared.takes_turns());
        let started = Instant::now();
        shared.make_way();
        assert!(started.elapsed() >= MAKE_WAY_PAUSE);
        shared.turns().stale_at = Some(Instant::now()); // a turn held by nobody
        assert!(!shared.takes_turns());
    }

    #[test]
    fn a_second_handle_waits_for_the_first_to_leave() -> Result<()> {
        let (dir, first, _, second_wal) = turn_held("queue")?;
        let (entered, heard) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let second = contended();
            let outcome = second.enter(&second_wal, &Interruption::default(), LONG, &mut || false);
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
            .map_err(|_| Error::Internal("the second never entered"))?;
        assert!(entered_at >= left);
        assert!(waiter.join().unwrap_or(false));
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }

    #[test]
    fn a_wait_ends_at_its_timeout_and_its_thread_serves_the_next() -> Result<()> {
        let (dir, first, first_wal, second_wal) = turn_held("timeout")?;
        let second = contended();
        let started = Instant::now();
        let outcome = second.enter(
            &second_wal,
            &Interruption::default(),
            Duration::from_millis(100),
            &mut || false,
        );
        assert!(matches!(outcome, Err(Error::Busy)));
        assert!(started.elapsed() >= Duration::from_millis(100));
        let left_waiting = second.turns().abandoned.clone();
        assert!(left_waiting.is_some(), "the thread was left waiting");
        // The turn comes while nobody waits for it: the thread gives it
        // back, and the first can take it again at once.
        first.leave();
        let deadline = Instant::now() + Duration::from_secs(10);
        while left_waiting
            .as_ref()
            .is_some_and(|w| *w.stage() != Stage::Returned)
        {
            assert!(Instant::now() < deadline, "the turn was never given back");
            std::thread::sleep(Duration::from_millis(5));
        }
        first_wal
            .try_lock()
            .map_err(|_| Error::Internal("the turn was kept"))?;
        first_wal.unlock()?;
        // A later wait of the same handle starts afresh and gets its turn.
        second.enter(&second_wal, &Interruption::default(), LONG, &mut || false)?;
        assert!(second.turns().held.is_some());
        second.leave();
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }

    #[test]
    fn a_turn_held_by_no_writer_is_passed_over_for_a_while() -> Result<()> {
        // The first never leaves, and SQLite's lock is free all along.
        let (dir, _first, _, second_wal) = turn_held("stale")?;
        let second = contended();
        let mut looks = 0;
        let started = Instant::now();
        second.enter(&second_wal, &Interruption::default(), LONG, &mut || {
            looks += 1;
            true
        })?;
        assert!(started.elapsed() >= STALE_AFTER);
        assert_eq!(looks, STALE_LOOKS);
        assert!(second.turns().held.is_none(), "went on without the turn");
        // The next writes of the handle take no turn, and do not look.
        second.enter(&second_wal, &Interruption::default(), LONG, &mut || {
            unreachable!("looked again")
        })?;
        assert!(second.turns().held.is_none());
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }

    /// This process's threads named as turn threads, as the kernel lists
    /// them.
    fn turn_threads_listed() -> usize {
        std::fs::read_dir("/proc/self/task").map_or(0, |tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.trim_end() == "taskwarden-turn")
                .count()
        })
    }

    /// Handles opened one after another beside a turn held by no writer
    /// each left a thread waiting in `flock` (with a descriptor of the
    /// WAL) past their close, without bound. Past the limit a writer goes
    /// to SQLite's busy handler; once the turn is given back, every thread
    /// gives it back in turn and ends.
    #[test]
    fn turn_threads_beside_a_turn_held_by_no_writer_are_bounded() -> Result<()> {
        let (dir, first, _, second_wal) = turn_held("bounded")?;
        let handles = usize::try_from(MAX_TURN_THREADS).unwrap_or(16) + 8;
        std::thread::scope(|scope| {
            for _ in 0..handles {
                let wal = Arc::clone(&second_wal);
                scope.spawn(move || {
                    let handle = contended();
                    handle.enter(&wal, &Interruption::default(), LONG, &mut || true)
                });
            }
        });
        let listed = turn_threads_listed();
        assert!(listed >= 1, "no turn thread was left waiting");
        assert!(
            listed <= usize::try_from(MAX_TURN_THREADS).unwrap_or(16),
            "{listed} turn threads"
        );
        first.leave();
        let deadline = Instant::now() + Duration::from_secs(10);
        while turn_threads() > 0 || turn_threads_listed() > 0 {
            assert!(Instant::now() < deadline, "turn threads never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }

    #[test]
    fn a_turn_whose_holder_writes_is_waited_for() -> Result<()> {
        let (dir, _first, _, second_wal) = turn_held("live")?;
        let second = contended();
        let mut looks = 0;
        let outcome = second.enter(
            &second_wal,
            &Interruption::default(),
            Duration::from_millis(300),
            &mut || {
                looks += 1;
                looks % 2 == 0 // free between two of the holder's writes
            },
        );
        assert!(matches!(outcome, Err(Error::Busy)));
        assert!(looks >= 2);
        assert!(second.takes_turns(), "a live turn is not passed over");
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }

    #[test]
    fn a_writer_that_comes_back_waits_on_the_same_thread() -> Result<()> {
        let (dir, first, _, second_wal) = turn_held("reuse")?;
        let second = contended();
        let quick = Duration::from_millis(20);
        assert!(second
            .enter(&second_wal, &Interruption::default(), quick, &mut || false)
            .is_err());
        let thread = second.turns().abandoned.clone();
        assert!(second
            .enter(&second_wal, &Interruption::default(), quick, &mut || false)
            .is_err());
        let again = second.turns().abandoned.clone();
        assert!(
            matches!((&thread, &again), (Some(a), Some(b)) if Arc::ptr_eq(a, b)),
            "a second thread was started"
        );
        first.leave();
        second.enter(&second_wal, &Interruption::default(), LONG, &mut || false)?;
        assert!(second.turns().held.is_some());
        second.leave();
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }
}
