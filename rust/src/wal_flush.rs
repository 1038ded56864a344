//! Writing the WAL to disk ahead of the checkpoint that needs it there.
//!
//! Under `synchronous=NORMAL` a commit only copies its frames into the
//! kernel's page cache. The disk sees them when a checkpoint syncs the WAL
//! (before it may copy pages into the database file), and with a
//! 10,000-frame WAL that sync found about 20 MB never written and waited
//! for all of it. Measured with one process claiming and closing tasks,
//! a third of the wall time went to those waits.
//!
//! So a writer hands its WAL, at most once per [`INTERVAL`], to one helper
//! thread per process that syncs it (`fdatasync`) while the writer goes on:
//! the disk works during the next transactions, and the checkpoint's own
//! sync finds at most the last interval's worth. The helper does
//! nothing else. It never touches SQLite, and nothing depends on it:
//! durability stays exactly SQLite's, a sync that fails or never happens
//! leaves the pages for the checkpoint's sync to write and report, and a
//! writer never waits for the helper (a busy hand-over is skipped).
//!
//! One large commit (a bulk rewrite's) writes tens of MB of frames at once
//! and then runs the checkpoint that must sync them all. For it, a thread
//! of its own syncs the WAL over and over while the commit writes
//! ([`Pacer::syncing_while`]), so the disk takes the frames as they come.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a writer hands its WAL over: often enough that a checkpoint's
/// sync finds little left (a 10,000-frame WAL fills in about a quarter of
/// a second of claims), rarely enough that each sync covers many commits.
/// One process claiming and closing: 20 ms and 50 ms both gained about a
/// quarter; 5 ms less (each sync also flushes the disk's cache).
const INTERVAL: Duration = Duration::from_millis(50);

/// How often the WAL is synced while a large commit writes it: each sync
/// then finds a few MB at most, and the checkpoint's own sync little more.
const LARGE_COMMIT_STEP: Duration = Duration::from_millis(2);

/// What the helper is asked to do.
#[derive(Default)]
struct Work {
    /// At most one entry per WAL file (by device and inode): handles
    /// opened and closed beside a long-lived one each brought their own
    /// descriptor, and one sync serves them all. Queued per handle, a
    /// process writing through short-lived handles kept hundreds of closed
    /// handles' descriptors waiting here (up to its descriptor limit).
    waiting: Vec<(WalKey, Arc<File>)>,
    stop: bool,
}

/// The helper's work, and its wake-up call.
#[derive(Default)]
struct Queue {
    work: Mutex<Work>,
    wake: Condvar,
}

/// This process's helper: a child inherits the parent's record of it, but
/// not the thread, so the record names the process that started it.
struct Helper {
    pid: u32,
    queue: Arc<Queue>,
    thread: JoinHandle<()>,
}

static HELPER: Mutex<Option<Helper>> = Mutex::new(None);

/// WALs synced so far by this process's helper (tests watch it).
static SYNCED: AtomicU64 = AtomicU64::new(0);

/// Syncs made so far during large commits (tests watch it).
static SYNCED_IN_LARGE_COMMITS: AtomicU64 = AtomicU64::new(0);

/// One connection's hand-overs of its WAL.
#[derive(Debug)]
pub struct Pacer {
    wal: Arc<File>,
    key: WalKey,
    last: Option<Instant>,
}

/// Which file a WAL descriptor names, when its metadata could be read.
type WalKey = Option<crate::fsguard::FileKey>;

impl Pacer {
    #[must_use]
    pub fn new(wal: File) -> Pacer {
        use std::os::unix::fs::MetadataExt;
        let key = wal.metadata().ok().map(|m| (m.dev(), m.ino()));
        Pacer {
            wal: Arc::new(wal),
            key,
            last: None,
        }
    }

    /// The WAL handle itself (shared with `turnstile`'s waiting threads).
    #[must_use]
    pub fn wal(&self) -> &Arc<File> {
        &self.wal
    }

    /// Runs `commit`, one large commit, while a thread syncs the WAL every
    /// [`LARGE_COMMIT_STEP`] until it returns. At 100,000 tasks a reconcile
    /// writes about 35 MB of frames and its checkpoint synced all of them
    /// only after the last was written; overlapped, the commit took about
    /// 25 ms less (of 150-190). The thread is joined before this returns, so
    /// no fork ever copies the process while it runs; if it cannot be
    /// started, the commit simply runs without it.
    pub fn syncing_while<T>(&self, commit: impl FnOnce() -> T) -> T {
        std::thread::scope(|scope| {
            // Dropped when the commit returns, or as it unwinds if it
            // panics: either way the thread wakes and ends, and the scope
            // never waits for it for ever.
            let (done, stopped) = mpsc::channel::<()>();
            // If it cannot be started, the commit runs without it.
            let _syncer = std::thread::Builder::new()
                .name("taskwarden-wal-sync-large".into())
                .spawn_scoped(scope, move || {
                    while let Err(RecvTimeoutError::Timeout) =
                        stopped.recv_timeout(LARGE_COMMIT_STEP)
                    {
                        // An error is the checkpoint's to find and report.
                        let _ = self.wal.sync_data();
                        SYNCED_IN_LARGE_COMMITS.fetch_add(1, Ordering::Relaxed);
                    }
                });
            let out = commit();
            drop(done);
            out
        })
    }

    /// After a commit: hands the WAL to the helper unless that was done
    /// less than [`INTERVAL`] ago, or this connection `contended` for the
    /// lock since. Never waits.
    ///
    /// Contended: other processes write the same file, and while one of
    /// them waits in a checkpoint's sync the others use the processors. An
    /// early sync then buys nothing and costs each process its own syncs
    /// (each one also a flush of the disk's cache): four and sixteen
    /// processes on two cores ran 2-8% slower with it.
    pub fn after_commit(&mut self, contended: bool) {
        let now = Instant::now();
        if contended
            || self
                .last
                .is_some_and(|at| now.duration_since(at) < INTERVAL)
        {
            return;
        }
        self.last = Some(now);
        let Some(queue) = queue() else {
            return;
        };
        // `try_lock`: the helper and other writers hold this lock only for
        // a moment; a hand-over missed now is made after the next interval.
        let Ok(mut work) = queue.work.try_lock() else {
            return;
        };
        let queued = work
            .waiting
            .iter()
            .any(|(key, wal)| Arc::ptr_eq(wal, &self.wal) || (key.is_some() && *key == self.key));
        if !queued {
            work.waiting.push((self.key, Arc::clone(&self.wal)));
        }
        drop(work);
        queue.wake.notify_one();
    }
}

/// This process's helper queue, starting the helper on first use (or
/// first use in a forked child). `None` if it cannot be had now.
fn queue() -> Option<Arc<Queue>> {
    // Never waits: in a forked child this lock may be held for ever by a
    // thread of the parent that did not survive the fork.
    let mut helper = HELPER.try_lock().ok()?;
    let pid = std::process::id();
    if let Some(running) = helper.as_ref().filter(|h| h.pid == pid) {
        return Some(Arc::clone(&running.queue));
    }
    let queue = Arc::new(Queue::default());
    let work = Arc::clone(&queue);
    let thread = std::thread::Builder::new()
        .name("taskwarden-wal-sync".into())
        .spawn(move || serve(&work))
        .ok()?;
    *helper = Some(Helper {
        pid,
        queue: Arc::clone(&queue),
        thread,
    });
    Some(queue)
}

/// The helper's loop: sync whatever WALs were handed over, then sleep
/// until more are, or until told to stop. A handle the helper holds last
/// is closed here; no process-wide lock of SQLite's lives on a WAL's
/// descriptor.
fn serve(queue: &Queue) {
    loop {
        let batch = {
            let mut work = queue.work.lock().unwrap_or_else(PoisonError::into_inner);
            while work.waiting.is_empty() && !work.stop {
                work = queue
                    .wake
                    .wait(work)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if work.stop {
                return;
            }
            std::mem::take(&mut work.waiting)
        };
        for (_, wal) in batch {
            // An error is the checkpoint's to find and report.
            let _ = wal.sync_data();
            SYNCED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The helper's record, held across a fork: no writer starts a helper
/// while the fork is under way.
pub struct ForkLock {
    _record: MutexGuard<'static, Option<Helper>>,
}

/// Before a fork (an `os.register_at_fork` hook): ends this process's
/// helper and waits for it, so the fork copies a process with no thread of
/// ours in it (from Python 3.12 on, forking a multi-threaded process is
/// warned about, as the child may inherit locks held by threads it lacks).
/// Until the returned lock is dropped after the fork, hand-overs are
/// skipped; the next one, in the parent or the child, starts a new helper.
pub fn stop_for_fork() -> ForkLock {
    let mut helper = HELPER.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(running) = helper.take() {
        // A parent's record names a thread that is not in this process.
        if running.pid == std::process::id() {
            running
                .queue
                .work
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stop = true;
            running.queue.wake.notify_one();
            // A helper that panicked has stopped too.
            let _ = running.thread.join();
        }
    }
    ForkLock { _record: helper }
}

#[cfg(test)]
mod tests {
    use super::{Pacer, SYNCED, SYNCED_IN_LARGE_COMMITS};
    use std::fs::File;
    use std::io::Write;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    fn scratch_wal(name: &str) -> std::io::Result<(std::path::PathBuf, Pacer)> {
        let path = std::env::temp_dir().join(format!("tw-{name}-{}", std::process::id()));
        let mut file = File::create(&path)?;
        file.write_all(&[7; 4096])?;
        let pacer = Pacer::new(File::open(&path)?);
        Ok((path, pacer))
    }

    #[test]
    fn a_large_commit_runs_while_the_wal_is_synced_and_ends_the_syncing() -> std::io::Result<()> {
        let (path, pacer) = scratch_wal("large-commit")?;
        let before = SYNCED_IN_LARGE_COMMITS.load(Ordering::Relaxed);
        let out = pacer.syncing_while(|| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while SYNCED_IN_LARGE_COMMITS.load(Ordering::Relaxed) < before + 2 {
                assert!(Instant::now() < deadline, "the WAL was never synced");
                std::thread::sleep(Duration::from_millis(1));
            }
            "committed"
        });
        assert_eq!(out, "committed");
        let after = SYNCED_IN_LARGE_COMMITS.load(Ordering::Relaxed);
        std::thread::sleep(super::LARGE_COMMIT_STEP * 5);
        assert_eq!(
            SYNCED_IN_LARGE_COMMITS.load(Ordering::Relaxed),
            after,
            "syncing went on after the commit"
        );
        // A commit that panics still ends the syncing thread (or the scope
        // would wait for it for ever).
        let panicked = std::panic::catch_unwind(|| pacer.syncing_while(|| panic!("commit")));
        assert!(panicked.is_err());
        std::fs::remove_file(&path)
    }

    #[test]
    fn a_commit_hands_the_wal_over_at_most_once_per_interval() -> std::io::Result<()> {
        let (path, mut pacer) = scratch_wal("wal-sync")?;
        let before = SYNCED.load(Ordering::Relaxed);
        pacer.after_commit(true);
        assert_eq!(pacer.last, None, "a contended commit is not handed over");
        pacer.after_commit(false);
        let first = pacer.last;
        assert!(first.is_some());
        pacer.after_commit(false);
        assert_eq!(
            pacer.last, first,
            "a second commit at once is not handed over"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while SYNCED.load(Ordering::Relaxed) == before {
            assert!(Instant::now() < deadline, "the helper never synced");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(super::INTERVAL);
        pacer.after_commit(false);
        assert!(
            pacer.last > first,
            "a commit after the interval is handed over"
        );
        std::fs::remove_file(&path)
    }
}
