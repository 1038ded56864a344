//! A read-only handle: a live WAL read in place, or a private snapshot of
//! a closed file (migrated in memory when the file is a peer's), and the
//! start of a read that may race a writer.

use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::schema_at_open::Gate;
use super::{pin_query_plans, Backing, OpenOptions, Store, CONNECTION_FAILED};
use crate::busy;
use crate::errors::{Error, Result};
use crate::events;
use crate::fsguard::{self, DbPath, Sidecars};
use crate::schema::{self, Found};
use crate::snapshot;

/// A read-only open found a crashed writer's sidecars. Any writable open
/// (a writing command, `doctor` without `--read-only`) recovers the file.
const INCOMPLETE_SIDECARS: &str = "SQLite sidecar state is incomplete (a writer stopped \
     halfway): open the ledger writable once to recover it";

/// How long a read-only open tries again after meeting a writer in
/// passing, at least and at most (see `Store::open_read_only_settled`).
const SETTLE_MIN: Duration = Duration::from_millis(20);

const SETTLE_MAX: Duration = Duration::from_millis(250);

/// What a read-only open answers when a writer was opening or closing the
/// file at that moment.
fn met_a_writer_in_passing(err: &Error) -> bool {
    matches!(err, Error::Conflict(why)
        if [
            INCOMPLETE_SIDECARS,
            snapshot::NOT_CLOSED_TEXT,
            snapshot::CHANGED_TEXT,
            CONNECTION_FAILED,
        ]
        .contains(why))
}

/// Starts `tx`'s read. A read-only connection to a live WAL file reads the
/// WAL index without the right to repair it, and SQLite answers a read
/// that meets a writer mid-update with `SQLITE_READONLY_RECOVERY` ("a race
/// with a writer", in its own words) instead of waiting in the busy
/// handler: a reader beside a busy fleet failed about one read in a few
/// thousand ("ledger is read-only"), and doctor called a healthy ledger
/// unhealthy. Such a start is retried like a lock wait, then `Busy`
/// (Ctrl-C ends it): for `timeout`, but never less than
/// [`READ_RACE_MIN_RETRY`], as a race is no lock and a reader that must
/// not wait for locks (`busy_timeout_ms=0`) still reads.
pub(super) fn begin_snapshot(tx: &Connection, timeout: Duration) -> Result<()> {
    let timeout = timeout.max(READ_RACE_MIN_RETRY);
    let started = Instant::now();
    let mut signals = busy::LoopSignals::starting_now();
    let mut start = tx.prepare_cached("PRAGMA schema_version")?;
    let mut attempts = 0u32;
    loop {
        match start.query_row([], |_| Ok(())) {
            Ok(()) => return Ok(()),
            Err(e) if !is_read_race(&e) => return Err(e.into()),
            Err(_) if started.elapsed() >= timeout => return Err(Error::Busy),
            Err(_) => {}
        }
        signals.check()?;
        if attempts < 20 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
        attempts = attempts.saturating_add(1);
    }
}

/// A private copy of the database `conn` reads, its size judged and its
/// pages read in one read snapshot (started as every read is, see
/// [`begin_snapshot`]): two separate reads could judge one size and copy
/// another, or meet a writer's race unguarded.
fn copy_in_one_snapshot(
    conn: &mut Connection,
    racing_reads: Option<Duration>,
    max_bytes: u64,
) -> Result<Connection> {
    conn.execute_batch("BEGIN DEFERRED")?;
    let copied = racing_reads
        .map_or(Ok(()), |timeout| begin_snapshot(conn, timeout))
        .and_then(|()| snapshot::copy_of(conn, max_bytes));
    let ended = conn.execute_batch("ROLLBACK");
    let copy = copied?;
    ended?;
    Ok(copy)
}

/// How long a read retries its start against a writer's race at least:
/// a race lasts microseconds.
const READ_RACE_MIN_RETRY: Duration = Duration::from_millis(20);

/// SQLite's answers to a read-only reader that met a writer updating the
/// WAL index: transient, gone on the next try.
fn is_read_race(err: &rusqlite::Error) -> bool {
    matches!(err, rusqlite::Error::SqliteFailure(e, _)
        if e.extended_code == rusqlite::ffi::SQLITE_READONLY_RECOVERY
            || e.extended_code == rusqlite::ffi::SQLITE_READONLY_CANTINIT)
}

fn uri_escape(path: &str) -> String {
    path.replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23")
}

impl Store {
    /// A read-only open that met a writer opening or closing the file (its
    /// sidecars half made or half removed, the file changed between the
    /// snapshot's two reads, or gone before the live connection opened)
    /// tries again for a moment: such a state lasts microseconds, and a
    /// writer that opens and closes per command (as the CLI's do) failed a
    /// fifth of the read-only opens beside it. A state that stays (a crashed
    /// writer's sidecars, a writer appearing again and again) is refused as
    /// before, once [`SETTLE_MIN`] to [`SETTLE_MAX`] (`busy_timeout_ms`
    /// within those) has passed.
    pub(super) fn open_read_only_settled(
        path: &DbPath,
        opts: &OpenOptions,
        interruption: &busy::Interruption,
    ) -> Result<Store> {
        let started = Instant::now();
        let window =
            Duration::from_millis(u64::from(opts.busy_timeout_ms)).clamp(SETTLE_MIN, SETTLE_MAX);
        let mut watch = busy::SignalWatch::from(started);
        loop {
            match Store::open_read_only(path.clone(), opts, interruption) {
                Err(e) if met_a_writer_in_passing(&e) && started.elapsed() < window => {
                    if watch.signalled(interruption) {
                        return Err(interruption.explain(Error::Busy));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                outcome => return outcome,
            }
        }
    }

    fn open_read_only(
        path: DbPath,
        opts: &OpenOptions,
        interruption: &busy::Interruption,
    ) -> Result<Store> {
        let (identity, mut lease) = fsguard::prepare_file(&path, false, false)?;
        fsguard::secure_sidecars(&path, false)?;
        let (conn, journal_mode) = match fsguard::sidecar_state(&path) {
            // What a writer killed halfway through its close (or its
            // transaction) leaves; reading it in place could miss pages.
            Sidecars::Incomplete => return Err(Error::Conflict(INCOMPLETE_SIDECARS)),
            Sidecars::LiveWal => {
                let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_NOFOLLOW
                    | OpenFlags::SQLITE_OPEN_URI;
                // readonly_shm: SQLite opens -shm read-only too, so not even
                // its read marks are written (it reads the WAL index into
                // private memory where it must); the sidecars keep every byte.
                // Not beside a writer of this process, which shares the
                // mapping and must be able to write it.
                let shm = if lease.enter_as_reader() {
                    "&readonly_shm=1"
                } else {
                    ""
                };
                let uri = format!(
                    "file:{}?mode=ro{shm}",
                    uri_escape(&path.file.to_string_lossy())
                );
                let conn = Connection::open_with_flags(uri, flags)
                    .map_err(|_| Error::Conflict(CONNECTION_FAILED))?;
                fsguard::verify_identity(&path, identity)?;
                (conn, "wal")
            }
            Sidecars::Closed => (
                snapshot::load(&path, identity, opts.snapshot_max_bytes)?,
                "memory",
            ),
        };
        let live_wal_names = (journal_mode == "wal").then(|| {
            (
                fsguard::sidecar(&path, "-wal"),
                fsguard::sidecar(&path, "-shm"),
            )
        });
        let backing = Backing::ReadOnly {
            journal_mode,
            path,
            identity,
            euid: opts.euid,
            earlier: None,
            legacy_refusal: None,
        };
        let timing = (opts.busy_timeout_ms, opts.durability);
        let mut store = Store::new(conn, backing, Some(lease), timing, interruption.clone());
        store.live_wal_names = live_wal_names;
        store.install_busy_handler()?;
        busy::install_progress(&mut store.conn, &store.interruption)?;
        store.conn.pragma_update(None, "foreign_keys", true)?;
        // First, as it reads the schema in a read that may race a writer
        // (see `begin_snapshot`): `synchronous` would read it too, unguarded.
        store.prepare_read_only_schema(opts.snapshot_max_bytes)?;
        // Nothing is committed here; set only so `storage_info` tells the
        // level this handle was opened with, not SQLite's default.
        store
            .conn
            .pragma_update(None, "synchronous", opts.durability.pragma())?;
        store.conn.pragma_update(None, "query_only", true)?;
        pin_query_plans(&store.conn)?;
        Ok(store)
    }

    /// A read-only view of a peer v1/v2 file previews exactly what a
    /// migrated file would show: its private copy (of a live file too, up
    /// to `max_bytes`) is migrated in memory, and the file itself is never
    /// touched.
    fn prepare_read_only_schema(&mut self, max_bytes: u64) -> Result<()> {
        match self.read(|tx| schema::inspect(tx))? {
            Found::Current => Ok(()),
            Found::Empty => Err(Error::Conflict("read-only database is not initialized")),
            Found::Earlier(found) => {
                let racing_reads = self.read_race_timeout();
                if let Backing::ReadOnly {
                    journal_mode,
                    earlier,
                    ..
                } = &mut self.backing
                {
                    *earlier = Some(found);
                    if *journal_mode == "wal" {
                        *journal_mode = "memory";
                        let copy = copy_in_one_snapshot(&mut self.conn, racing_reads, max_bytes)?;
                        events::register_sql_functions(&copy)?;
                        self.conn = copy;
                        self.live_wal_names = None;
                        // The live connection and its read-only mapping
                        // of the shared memory are gone.
                        if let Some(lease) = &mut self.file_lease {
                            lease.step_down();
                        }
                    }
                }
                self.migrate_private_copy()
            }
        }
    }

    /// Migrates the private copy of a peer file under the rules of a
    /// writable open: the peer's own migration rules (codes in its
    /// registry, whole parent links, its CHECKs), then every check doctor
    /// makes. If they refuse it, the copy carries the damaged rows over for
    /// doctor to count (or, if even that fails, stays unmigrated, for
    /// doctor to report unreadable), and every other read is refused with
    /// the same reason: a preview must not answer for a file that no
    /// writable open would migrate. The gate costs a whole doctor on each
    /// read-only open of a peer file (never of a v3 one).
    fn migrate_private_copy(&mut self) -> Result<()> {
        let refusal = match self.migrate(Gate::DoctorClean) {
            Err(Error::Conflict(why) | Error::Storage(why)) => why,
            Err(Error::Corrupt) => crate::errors::CORRUPT_TEXT,
            other => return other.map(|_| ()),
        };
        if let Backing::ReadOnly { legacy_refusal, .. } = &mut self.backing {
            *legacy_refusal = Some(refusal);
        }
        match self.migrate(Gate::CarryDamaged) {
            Err(interrupted @ Error::Interrupted(_)) => Err(interrupted),
            _ => Ok(()),
        }
    }

    /// How long a read may retry its start, for a connection whose reads
    /// can race a writer (see [`begin_snapshot`]); `None` for others.
    pub(super) fn read_race_timeout(&self) -> Option<Duration> {
        matches!(
            self.backing,
            Backing::ReadOnly {
                journal_mode: "wal",
                ..
            }
        )
        .then(|| Duration::from_millis(u64::from(self.busy_timeout_ms)))
    }
}
