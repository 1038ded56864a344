//! The storage boundary: opening a ledger (writable, read-only or in
//! memory), its pragmas and schema, and the transaction helpers every
//! operation runs in. Only this module and the SQL modules it runs (the
//! domain modules, through the transactions it hands them) know the ledger
//! is SQLite.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::busy;
use crate::doctor;
use crate::errors::{Error, Result};
use crate::events;
use crate::fsguard::{self, DbPath, DirStamp, Identity, Sidecars};
use crate::held_files::Lease;
use crate::layout_upgrade;
use crate::reconcile;
use crate::schema::{self, DamagedRows, Earlier, Found, LayoutUpgrade};
use crate::sidecar_loss::{self, Loss};
use crate::snapshot;
use crate::turnstile::Turnstile;
use crate::wal_flush;
use crate::wal_growth::{self, WalGrowth, Watch, WAL_SIZE_LIMIT_BYTES};

/// Page cache per connection for everyday work (negative: KiB). Kept
/// small on purpose: a commit whose b-tree balance renumbered pages (most
/// batched claims) makes SQLite sweep the cache's whole hash table, so a
/// large cache costs every such commit; 16 MiB spent 7% of batched claims
/// there. Rows are found through few pages, and the OS caches the rest.
const CACHE_KIB: i64 = -4_096;
/// Page cache while a migration rebuilds a small file (see
/// [`IN_MEMORY_BULK_MAX_FILE_BYTES`]). It writes each new page once, in
/// order, so pages spilled to the WAL before the commit are not touched
/// again. At 100,000 tasks it was 4% faster than the everyday cache, for
/// 109 MiB at its peak against 30. At a million tasks (a 394 MB peer
/// file) 1 GiB once made it no faster than this and more than doubled its
/// peak (497 to 1,152 MiB), and the everyday cache made it 6% faster
/// (19.6-20.2 s against 21.0-21.5 s) at 145 MiB against 406.
const MIGRATION_CACHE_KIB: i64 = -262_144;
/// Page cache while reconcile rewrites rows all over a small file (see
/// [`IN_MEMORY_BULK_MAX_FILE_BYTES`]): large enough that no page it
/// changes is spilled to the WAL before the commit and then written again.
/// A cache limit, not an allocation: the apply takes only the pages it
/// touches.
const REWRITE_CACHE_KIB: i64 = -1_048_576;

/// Up to this file size, a bulk rewrite keeps its work in memory: its
/// changed pages (see [`REWRITE_CACHE_KIB`], and [`MIGRATION_CACHE_KIB`]
/// for a migration) and, in reconcile, its statement journals.
/// Each of its multi-row statements that calls an SQL function first
/// copies every page it changes to such a journal (SQLite must be able to
/// undo a statement whose function fails halfway; reconcile's row updates
/// are written to need none). At 100,000 tasks (a 59 MB file) that was
/// 54 MB in 27,492 writes to a temporary file; in memory the apply spent
/// about 40 ms less in the kernel (5% of its time) for 15 MiB more at its
/// peak, and with the everyday cache it wrote spilled pages twice and took
/// about 10% longer. Past this size memory costs more than it saves: every
/// page a process takes fresh from the kernel is zeroed first, and at a
/// million tasks (a 450 MB file, 600,000 rows changed) the large cache
/// grew the apply's peak from 24 to 344 MiB and made it 10-20% slower,
/// spills and all (3.2-3.4 s against 3.7-4.5 s, interleaved runs); an
/// in-memory journal doubled the peak and gained nothing.
const IN_MEMORY_BULK_MAX_FILE_BYTES: u64 = 128 * 1024 * 1024;

/// Whether the write under way waited for its turn or for SQLite's lock
/// (the busy handler notes its waits; a turn's wait is remembered until
/// the turn is given up).
fn waited_for_the_lock(waits: &busy::Waits, turnstile: &Turnstile) -> bool {
    waits.happened() || turnstile.wait_began().is_some()
}

/// Whether a bulk rewrite of a file `file_len` long (unknown: an in-memory
/// ledger, or metadata that could not be read) keeps its work in memory.
fn bulk_in_memory(file_len: Option<u64>) -> bool {
    file_len.is_some_and(|len| len <= IN_MEMORY_BULK_MAX_FILE_BYTES)
}

/// Page size of new files (no effect on existing ones). Every commit
/// writes each page it touches to the WAL whole, so smaller pages make
/// writes cheaper; 2048 still holds a full task row without overflow pages.
const PAGE_SIZE: i64 = 2048;

/// WAL frames between automatic checkpoints.
const WAL_CHECKPOINT_PAGES: i64 = 10_000;
/// How long a check of the file's names is trusted while the directory's
/// times stand still.
const NAMES_TRUSTED_FOR: Duration = Duration::from_secs(1);

/// How hard commits are pushed to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=NORMAL`: in WAL mode a commit survives a process crash;
    /// a power cut may lose the last transactions, never corrupt the file.
    Normal,
    /// `synchronous=FULL`: every commit is on disk before it returns.
    Full,
}

impl Durability {
    /// Parses `"normal"` or `"full"`.
    pub fn parse(raw: &str) -> Result<Durability> {
        match raw {
            "normal" => Ok(Durability::Normal),
            "full" => Ok(Durability::Full),
            _ => Err(Error::Invalid("durability must be 'normal' or 'full'")),
        }
    }

    fn pragma(self) -> &'static str {
        match self {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        }
    }

    /// The name reported by `storage_info`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Normal => "normal",
            Durability::Full => "full",
        }
    }
}

/// Options for [`Store::open`].
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub busy_timeout_ms: u32,
    pub durability: Durability,
    pub read_only: bool,
    pub snapshot_max_bytes: u64,
    pub euid: u32,
    pub may: FileChanges,
}

/// What a writable open may do to the file it finds, beyond opening it.
#[derive(Clone, Copy, Debug)]
pub struct FileChanges {
    /// Make a missing file (and its parents); without it a path with no
    /// file is refused.
    pub create: bool,
    /// Migrate a task-state-guard file (one-way); without it such a file is
    /// refused and left as it is.
    pub migrate: bool,
}

/// SQLite could not open the file (a read-only open: gone, or its
/// sidecars changing, at that moment).
const CONNECTION_FAILED: &str = "database connection failed";

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

/// A writable open told not to migrate met a file of an earlier schema.
fn not_migrated(earlier: Earlier) -> Error {
    Error::Conflict(match earlier {
        Earlier::Peer(_) => {
            "the ledger is a task-state-guard file, and this open may not migrate it"
        }
        Earlier::Layout(_) => {
            "the ledger is in an earlier taskwarden layout, and this open may not upgrade it"
        }
    })
}

/// A read-write connection to an existing, secured ledger file (never
/// created by SQLite: `fsguard` made it). SQLite resolves the name again:
/// a symlink put there since `fsguard` looked is refused, not followed
/// (SQLite's own opens already refuse one at a sidecar).
fn open_writable(path: &DbPath) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    Connection::open_with_flags(&path.file, flags).map_err(|_| Error::Conflict(CONNECTION_FAILED))
}

/// Whether SQLite's write lock can be had at once: taken (`BEGIN
/// IMMEDIATE`, with the busy handler probing) and given straight back.
fn write_lock_free(conn: &Connection) -> bool {
    let free = conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").is_ok();
    if !conn.is_autocommit() {
        // Taken but not given back: never leave a transaction open.
        let _ = conn.execute_batch("ROLLBACK");
    }
    free
}

/// Which peer files a migration takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// Anything doctor would flag stays the peer's, untouched: the file
    /// itself is rewritten, or a read-only handle's private copy of it.
    DoctorClean,
    /// A refused file's private copy is migrated for doctor to read,
    /// carrying the rows the peer itself would not migrate.
    CarryDamaged,
}

/// How much a transaction writes, which decides how it commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Size {
    /// A few pages: it takes its turn, and its frames reach the disk by the
    /// WAL helper or the next checkpoint.
    Short,
    /// A rewrite of many pages (reconcile, migration): no turn, and the WAL
    /// is synced while the commit writes it (see `wal_flush`).
    Large,
}

/// Where the connection's data lives.
#[derive(Clone, Debug)]
enum Backing {
    /// A file opened for writing; checked before every operation.
    File {
        path: DbPath,
        identity: Identity,
        euid: u32,
    },
    /// A read-only view: a live WAL file or a private snapshot of `path`,
    /// which is checked before every operation like a writable file.
    ReadOnly {
        journal_mode: &'static str,
        path: DbPath,
        identity: Identity,
        euid: u32,
        /// The schema of a file of an earlier schema previewed through a
        /// migrated private copy: what the file itself still is.
        earlier: Option<Earlier>,
        /// Why the file's own migration would be refused, for a damaged
        /// peer file: only doctor reads it, as any other answer would be
        /// one that a writable open of the same file refuses to give.
        legacy_refusal: Option<&'static str>,
    },
    /// `Ledger.in_memory()`.
    Memory,
}

/// One open ledger.
pub struct Store {
    conn: Connection,
    /// Our own handle on the WAL the connection writes (files only); see
    /// [`Store::replace_connection_if_sidecars_lost`] and `wal_flush`. Declared after
    /// `conn`, so it is released after the connection.
    wal: Option<wal_flush::Pacer>,
    /// The `-shm` the connection keeps its WAL locks and index in, as found
    /// when it opened (files only); see `sidecar_loss`.
    shm: Option<fsguard::FileKey>,
    /// This handle's use of the process's one descriptor on the file,
    /// released after `conn` (declared after it): see `held_files`.
    file_lease: Option<Lease>,
    /// The directory as it stood when the names in it were last checked,
    /// and when that was.
    names_checked: Option<(DirStamp, Instant)>,
    backing: Backing,
    busy_timeout_ms: u32,
    /// A signal that ended this connection's lock wait, until reported.
    interruption: busy::Interruption,
    /// Whether this connection waited for another writer since its last
    /// commit's WAL hand-over (see `wal_flush`).
    waits: busy::Waits,
    /// Set while this connection looks whether the write lock is free.
    probing: busy::Probing,
    /// This handle's turn for the write lock, while it holds one.
    turnstile: Turnstile,
    /// Whether reads wait for an oversized WAL to start over (files only).
    wal_growth: WalGrowth,
    /// A read-only handle reading a live file in place: the names of its
    /// `-wal` and `-shm`, which its reads watch (see `wal_growth`).
    live_wal_names: Option<(PathBuf, PathBuf)>,
    durability: Durability,
}

/// Why every handle of a process refuses calls after the ledger's `-shm`
/// was deleted, until one alone is left to open again.
const SHM_LOST_UNDER_OTHER_HANDLES: &str = "the ledger's -shm was deleted while open (by hand, \
     or by another SQLite library in this process closing its connection), and other handles in \
     this process still use it: close every handle on this ledger here, then open it again";

impl Drop for Store {
    /// A connection whose `-shm` was replaced, or whose WAL was deleted
    /// while another connection now writes a new one, must not close as
    /// SQLite's last one would: that copies a stale WAL over the file
    /// through an index that describes another, and deletes the WAL at
    /// the name. A WAL deleted alone, with no new one written, is copied
    /// in first, without waiting for readers (a close must not hang; those
    /// readers copy it at their own next call); the close then runs as
    /// usual, and as the last one it removes the sidecars left behind.
    /// With both sidecars removed and none back at the names it runs as
    /// usual too: SQLite copies our WAL only as the file's last connection,
    /// and no connection has opened since. A handle already closing without
    /// a checkpoint (a forked child's) is left alone.
    fn drop(&mut self) {
        let closing_plainly = self
            .conn
            .db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE)
            .unwrap_or(true);
        if closing_plainly {
            return;
        }
        let close_as_usual = match self.sidecar_loss() {
            // A connection that opened since the deletion may have written
            // the file and left a WAL at the name: as the last connection,
            // SQLite would copy our older pages over its and delete that WAL.
            Loss::None | Loss::BothRemoved { reopened: false } => true,
            Loss::WalDeletedAlone { copy_first: true } => self.copy_lost_wal("PASSIVE").is_ok(),
            Loss::ShmReplaced
            | Loss::WalDeletedAlone { copy_first: false }
            | Loss::BothRemoved { reopened: true } => false,
        };
        if !close_as_usual {
            let _ = self
                .conn
                .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
        }
    }
}

/// What `storage_info` reports.
#[derive(Clone, Debug)]
pub struct StorageInfo {
    pub journal_mode: String,
    pub busy_timeout_ms: u32,
    pub foreign_keys: bool,
    pub permission_model: &'static str,
    pub durability: &'static str,
    /// The `synchronous` level SQLite reports: "normal", "full" or another.
    pub synchronous: &'static str,
    /// Bytes of the file and of its WAL (`None` in memory), as `stats`
    /// gives them, without counting a single task: a supervisor that
    /// watches the WAL grow polls this.
    pub sizes: Option<(u64, u64)>,
}

impl Store {
    /// Opens the ledger at `raw_path`, creating or migrating it unless
    /// read-only. A current schema is checked without taking the write lock.
    pub fn open(raw_path: &str, opts: &OpenOptions) -> Result<Store> {
        // Every statement of the open may wait for a lock, not only its
        // transactions: a signal that ended any of those waits is reported.
        let interruption = busy::Interruption::default();
        Store::open_with(raw_path, opts, &interruption).map_err(|e| interruption.explain(e))
    }

    fn open_with(
        raw_path: &str,
        opts: &OpenOptions,
        interruption: &busy::Interruption,
    ) -> Result<Store> {
        let path = fsguard::resolve(raw_path)?;
        fsguard::prepare_parent(&path, !opts.read_only && opts.may.create)?;
        fsguard::check_parent_security(&path, opts.euid)?;
        if opts.read_only {
            return Store::open_read_only_settled(&path, opts, interruption);
        }
        fsguard::secure_sidecars(&path, true)?;
        let (identity, mut lease) = fsguard::prepare_file(&path, true, opts.may.create)?;
        if !lease.enter_as_writer() {
            return Err(Error::Conflict(
                "a read-only handle in this process has this live ledger open, and SQLite \
                 would share its read-only memory with a writer: close it first, or open \
                 the writable handle before the read-only one",
            ));
        }
        let conn = open_writable(&path)?;
        let backing = Backing::File {
            path: path.clone(),
            identity,
            euid: opts.euid,
        };
        let timing = (opts.busy_timeout_ms, opts.durability);
        let mut store = Store::new(conn, backing, Some(lease), timing, interruption.clone());
        store.configure()?;
        store.conn.pragma_update(None, "page_size", PAGE_SIZE)?;
        store.prepare_file_with_retries(opts.busy_timeout_ms, opts.may)?;
        fsguard::verify_identity(&path, identity)?;
        fsguard::secure_sidecars(&path, true)?;
        store.wal = Some(wal_flush::Pacer::new(fsguard::open_wal(&path)?));
        store.shm = sidecar_loss::shm_key(&path);
        store.refuse_unless_the_process_maps_this_shm()?;
        Ok(store)
    }

    /// Switches to WAL and creates or checks the schema. When several
    /// processes open a brand-new file at once, SQLite can answer busy
    /// without consulting the busy handler (a journal-mode switch, a WAL
    /// being initialised); so the whole step is retried until the busy
    /// timeout has passed, and only then is `LedgerBusy` raised.
    fn prepare_file_with_retries(&mut self, busy_timeout_ms: u32, may: FileChanges) -> Result<()> {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(u64::from(busy_timeout_ms));
        let mut watch = busy::SignalWatch::from(started);
        loop {
            // Explained before a retry: a wait a signal ended (in a pragma,
            // outside any transaction) must not be retried and forgotten.
            match self
                .judge_then_prepare(may)
                .map_err(|e| self.interruption.explain(e))
            {
                Err(Error::Busy) if watch.signalled(&self.interruption) => {
                    return Err(self.interruption.explain(Error::Busy));
                }
                Err(Error::Busy) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                outcome => return outcome,
            }
        }
    }

    /// A private in-memory ledger for tests.
    pub fn in_memory(busy_timeout_ms: u32) -> Result<Store> {
        let conn = Connection::open_in_memory()?;
        let timing = (busy_timeout_ms, Durability::Normal);
        let mut store = Store::new(
            conn,
            Backing::Memory,
            None,
            timing,
            busy::Interruption::default(),
        );
        store.configure()?;
        store.settle_schema()?;
        Ok(store)
    }

    /// A read-only open that met a writer opening or closing the file (its
    /// sidecars half made or half removed, the file changed between the
    /// snapshot's two reads, or gone before the live connection opened)
    /// tries again for a moment: such a state lasts microseconds, and a
    /// writer that opens and closes per command (as the CLI's do) failed a
    /// fifth of the read-only opens beside it. A state that stays (a crashed
    /// writer's sidecars, a writer appearing again and again) is refused as
    /// before, once [`SETTLE_MIN`] to [`SETTLE_MAX`] (`busy_timeout_ms`
    /// within those) has passed.
    fn open_read_only_settled(
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

    /// A store around `conn`, with no WAL handle yet and no names checked.
    fn new(
        conn: Connection,
        backing: Backing,
        file_lease: Option<Lease>,
        (busy_timeout_ms, durability): (u32, Durability),
        interruption: busy::Interruption,
    ) -> Store {
        Store {
            conn,
            wal: None,
            shm: None,
            file_lease,
            names_checked: None,
            backing,
            busy_timeout_ms,
            interruption,
            waits: busy::Waits::default(),
            probing: busy::Probing::default(),
            turnstile: Turnstile::default(),
            wal_growth: WalGrowth::default(),
            live_wal_names: None,
            durability,
        }
    }

    /// The connection's busy handler, sharing this store's wait state.
    fn install_busy_handler(&mut self) -> Result<()> {
        busy::install(
            &mut self.conn,
            self.busy_timeout_ms,
            &self.interruption,
            &self.waits,
            &self.probing,
            &self.turnstile,
        )
    }

    fn configure(&mut self) -> Result<()> {
        self.install_busy_handler()?;
        busy::install_progress(&mut self.conn, &self.interruption)?;
        pin_query_plans(&self.conn)?;
        self.conn.pragma_update(None, "foreign_keys", true)?;
        let fk: bool = self
            .conn
            .pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
        if !fk {
            return Err(Error::Conflict("database configuration failed"));
        }
        self.conn
            .pragma_update(None, "synchronous", self.durability.pragma())?;
        // `list_tasks` alone builds 144 texts (its filters' combinations):
        // with room for 64, a supervisor varying them re-prepared on most
        // calls (44-53 us a list and get against 20).
        self.conn.set_prepared_statement_cache_capacity(256);
        self.conn.pragma_update(None, "cache_size", CACHE_KIB)?;
        // Each checkpoint copies pages back into the file and syncs it; at
        // SQLite's default (1000 pages) that is a third of a write's cost.
        // Ten times fewer checkpoints rewrite hot pages once instead of ten
        // times; the WAL is truncated back to a bounded size afterwards.
        self.conn
            .pragma_update(None, "wal_autocheckpoint", WAL_CHECKPOINT_PAGES)?;
        self.conn
            .pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES as i64)?;
        events::register_sql_functions(&self.conn)?;
        reconcile::register_sql_function(&self.conn)?;
        Ok(())
    }

    /// Judges the file before changing anything about it: a file that is
    /// not a ledger, or a peer file that fails migration, keeps every byte
    /// (even its journal mode). Only then is it switched to WAL, and a new
    /// file given its schema, if this open may create one: an existing
    /// file that holds no ledger yet (empty, another program's empty
    /// database) is no more a ledger to a reading command than a missing
    /// one.
    fn judge_then_prepare(&mut self, may: FileChanges) -> Result<()> {
        let found = self.read(|tx| schema::inspect(tx))?;
        if matches!(found, Found::Empty) && !may.create {
            return Err(fsguard::NO_LEDGER_YET);
        }
        if let Found::Earlier(earlier) = found {
            if !may.migrate {
                return Err(not_migrated(earlier));
            }
        }
        // WAL first, so a file left in rollback-journal mode migrates as
        // any other does (inside the WAL).
        self.ensure_wal()?;
        if matches!(found, Found::Earlier(_)) {
            self.migrate_and_compact()?;
        }
        match found {
            Found::Empty => self.settle_schema(),
            Found::Earlier(_) | Found::Current => Ok(()),
        }
    }

    /// Switching to WAL needs the write lock, so it is only asked for when
    /// the file is not in WAL mode yet.
    fn ensure_wal(&mut self) -> Result<()> {
        let mode: String = self
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))?;
        if mode.eq_ignore_ascii_case("wal") {
            return Ok(());
        }
        let mode: String = self
            .conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Conflict("database configuration failed"));
        }
        // The switch leaves the `-wal` file to the next transaction, and
        // the open holds that file from here on (a file left in rollback
        // mode by another tool had none yet): one read creates it.
        self.read(|tx| Ok(tx.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))?))
    }

    /// Gives a new file its schema, judged again under the write lock:
    /// another process opening the same file may have been first.
    fn settle_schema(&mut self) -> Result<()> {
        self.write(|tx| match schema::inspect(tx)? {
            Found::Empty => schema::create(tx),
            Found::Current => Ok(()),
            Found::Earlier(_) => Err(Error::Conflict("schema changed while opening")),
        })
    }

    fn migrate_and_compact(&mut self) -> Result<()> {
        if !self.migrate(Gate::DoctorClean)? {
            return Ok(());
        }
        // The old tables' pages are free now; give them back so the file
        // holds no more pages than a fresh v3 ledger of the same tasks (and
        // stays under the read-only snapshot cap longer). Only an
        // optimisation: a busy reader simply postpones it (but a Ctrl-C
        // during its wait is the caller's).
        let vacuumed = self.conn.execute_batch("VACUUM");
        match vacuumed.map_err(|e| self.interruption.explain(e.into())) {
            Err(interrupted @ Error::Interrupted(_)) => Err(interrupted),
            _ => Ok(()),
        }
    }

    /// Brings the file to the current schema; whether its tables were
    /// rebuilt (and so left pages free).
    fn migrate(&mut self, gate: Gate) -> Result<bool> {
        // Foreign keys cannot be switched inside a transaction, and the
        // table rebuild must not cascade; they are checked before commit.
        self.conn.pragma_update(None, "foreign_keys", false)?;
        // The rebuild touches every page of the file once: a small file's
        // rebuild gets a larger cache, given back afterwards.
        if bulk_in_memory(self.file_len()) {
            self.conn
                .pragma_update(None, "cache_size", MIGRATION_CACHE_KIB)?;
        }
        let outcome = self.transaction(TransactionBehavior::Immediate, Size::Large, |tx| {
            match schema::inspect(tx)? {
                // An earlier layout is taskwarden's own: its rows are
                // carried as they are, for doctor to judge as before.
                Found::Earlier(Earlier::Layout(upgrade)) => {
                    layout_upgrade::migrate(tx, upgrade)?;
                    Ok(upgrade == LayoutUpgrade::Rebuild)
                }
                Found::Earlier(Earlier::Peer(_)) => match gate {
                    Gate::CarryDamaged => {
                        schema::migrate_peer(tx, DamagedRows::Carry).map(|()| true)
                    }
                    Gate::DoctorClean => {
                        schema::migrate_peer(tx, DamagedRows::Refuse)?;
                        // Before commit, every check doctor makes: a peer file
                        // with rows taskwarden would never write (free text, a
                        // bad id, a broken invariant) stays the peer's.
                        if doctor::check(tx).logically_sound() {
                            Ok(true)
                        } else {
                            Err(Error::Conflict("legacy database failed validation"))
                        }
                    }
                },
                Found::Current => Ok(false),
                Found::Empty => Err(Error::Conflict("schema changed while opening")),
            }
        });
        self.conn.pragma_update(None, "foreign_keys", true)?;
        self.conn.pragma_update(None, "cache_size", CACHE_KIB)?;
        outcome
    }

    /// Before every operation on a file: its directory is still private,
    /// the file opened still has one name, that name still leads to it, the
    /// WAL the connection writes is still the one beside it and the
    /// sidecars are still single, private files. The ancestors
    /// above it were checked at open; walking them again on every call cost
    /// a stat per path component for each operation (the peer's weak spot
    /// #2).
    ///
    /// The names are looked up again only when the directory's times have
    /// moved since they were last found right ([`DirStamp`]), and at least
    /// every [`NAMES_TRUSTED_FOR`] (for what leaves a directory's times
    /// alone: a bind mount over the file, a file system with coarse or
    /// cached times). A stat of the WAL on every call also made the kernel
    /// stamp every WAL write with a fine-grained time, an inode update per
    /// commit.
    fn verify(&mut self) -> Result<()> {
        let Some((path, identity, euid)) = self.on_disk() else {
            return Ok(());
        };
        let parent = fsguard::check_direct_parent(path, euid)?;
        let unchanged = self
            .names_checked
            .is_some_and(|(stamp, at)| stamp.still(&parent) && at.elapsed() < NAMES_TRUSTED_FOR);
        if unchanged {
            // The name's lookup below also counts the links; here only
            // the descriptor is asked.
            return match &self.file_lease {
                Some(lease) => fsguard::verify_single_link(lease.file()),
                None => Ok(()),
            };
        }
        fsguard::verify_identity(path, identity)?;
        if let Some(wal) = &self.wal {
            if let Err(moved) = fsguard::verify_wal_name(path, wal.wal()) {
                // The file beside the WAL is written by connections that
                // never read it now: copying it back, on close, could
                // overwrite their pages. It stays where it is.
                self.conn
                    .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
                return Err(moved);
            }
        }
        // Sidecars as at open: a link made since is refused, a mode
        // loosened since is tightened (a read-only handle touches nothing).
        fsguard::secure_sidecars(path, matches!(self.backing, Backing::File { .. }))?;
        self.replace_connection_if_sidecars_lost()?;
        // Stamped as the directory was *before* the names were checked: a
        // change made meanwhile shows at the next call.
        self.names_checked = DirStamp::settled(&parent).map(|stamp| (stamp, Instant::now()));
        Ok(())
    }

    /// The database file's path, as resolved at open (`None` in memory).
    #[must_use]
    pub fn file_path(&self) -> Option<&std::path::Path> {
        self.on_disk().map(|(path, _, _)| path.file.as_path())
    }

    /// The file behind a file-backed handle: its path, identity and owner.
    fn on_disk(&self) -> Option<(&DbPath, Identity, u32)> {
        match &self.backing {
            Backing::File {
                path,
                identity,
                euid,
            }
            | Backing::ReadOnly {
                path,
                identity,
                euid,
                ..
            } => Some((path, *identity, *euid)),
            Backing::Memory => None,
        }
    }

    /// What became of the sidecars this connection uses (`sidecar_loss`).
    fn sidecar_loss(&self) -> Loss {
        match (&self.backing, &self.wal) {
            (Backing::File { path, .. }, Some(wal)) => {
                sidecar_loss::judge(path, wal.wal(), self.shm)
            }
            _ => Loss::None,
        }
    }

    /// Before a call (once the directory shows a change): if our WAL has
    /// no name left, or the `-shm` at its name is not the one we opened,
    /// the connection is replaced (see `sidecar_loss` for how either
    /// happens). A WAL deleted by hand alone, with no new one written, is
    /// first copied into the database file through the old connection,
    /// which then closes without a last connection's checkpoint and WAL
    /// removal (its views are stale, and a WAL at the name now is
    /// another's) before the new one opens, as closing releases the
    /// process's locks on the file.
    fn replace_connection_if_sidecars_lost(&mut self) -> Result<()> {
        let loss = self.sidecar_loss();
        let Backing::File { path, .. } = &self.backing else {
            return Ok(());
        };
        if loss == Loss::None {
            return Ok(());
        }
        // SQLite maps a file's `-shm` once per process: while another
        // handle here keeps the deleted one mapped, a new connection would
        // map it again, and go on unseen by other processes.
        let shm_lost = matches!(loss, Loss::ShmReplaced | Loss::BothRemoved { .. });
        if shm_lost && self.file_lease.as_ref().is_some_and(Lease::shared) {
            return Err(Error::Conflict(SHM_LOST_UNDER_OTHER_HANDLES));
        }
        let path = path.clone();
        if loss == (Loss::WalDeletedAlone { copy_first: true }) {
            // Waits for readers (RESTART), so that the next writer starts
            // the WAL at the name afresh, with a header, instead of adding
            // frames after ones that file lacks; until they let go the
            // call is busy, and the copy is tried again at the next.
            self.copy_lost_wal("RESTART")
                .map_err(|e| self.interruption.explain(e))?;
        }
        self.conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        let stale = std::mem::replace(&mut self.conn, Connection::open_in_memory()?);
        stale.close().map_err(|(_, e)| Error::from(e))?;
        self.conn = open_writable(&path)?;
        self.configure()?;
        self.ensure_wal()?;
        fsguard::secure_sidecars(&path, true)?;
        self.wal = Some(wal_flush::Pacer::new(fsguard::open_wal(&path)?));
        self.shm = sidecar_loss::shm_key(&path);
        self.refuse_unless_the_process_maps_this_shm()
    }

    /// A handle opened beside others of its process gets SQLite's one
    /// mapping of the file's `-shm` in the process: after that file was
    /// deleted, the old one, whatever is at the name now. It would go on
    /// unseen by other processes (a review had 25 of 25 tasks claimed
    /// twice), so it is refused while the others keep it.
    fn refuse_unless_the_process_maps_this_shm(&self) -> Result<()> {
        match &self.file_lease {
            Some(lease) if !lease.maps_shm(self.shm) => {
                Err(Error::Conflict(SHM_LOST_UNDER_OTHER_HANDLES))
            }
            _ => Ok(()),
        }
    }

    /// Copies every commit of a WAL deleted by hand into the database file
    /// (a checkpoint in `mode`), so they outlive it: `Busy` when readers
    /// kept some from being copied.
    fn copy_lost_wal(&mut self, mode: &str) -> Result<()> {
        let (busy, frames, copied) = wal_growth::wal_checkpoint(&self.conn, mode)?;
        if busy || copied < frames {
            return Err(Error::Busy);
        }
        Ok(())
    }

    fn transaction<T>(
        &mut self,
        behavior: TransactionBehavior,
        size: Size,
        op: impl FnOnce(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.interruption.forget();
        let racing_reads = self.read_race_timeout();
        let outcome = (|| {
            let reads = matches!(behavior, TransactionBehavior::Deferred);
            let watch = match (reads, &self.wal, &self.live_wal_names) {
                (false, ..) | (true, None, None) => None,
                (true, Some(wal), _) => Some(Watch::Writable {
                    conn: &self.conn,
                    wal: wal.wal(),
                    probing: &self.probing,
                }),
                (true, None, Some((wal, shm))) => self
                    .file_lease
                    .as_ref()
                    .map(|lease| Watch::ReadOnly { lease, wal, shm }),
            };
            if let Some(watch) = watch {
                self.wal_growth.make_way_before_read(
                    &watch,
                    Duration::from_millis(u64::from(self.busy_timeout_ms)),
                    &self.interruption,
                )?;
            }
            let tx = self.conn.transaction_with_behavior(behavior)?;
            if let (true, Some(timeout)) = (reads, racing_reads) {
                begin_snapshot(&tx, timeout)?;
            }
            let out = op(&tx)?;
            // A wait looks for signals only every SIGNAL_CHECK_EVERY: a
            // Ctrl-C during a shorter one would otherwise be raised after
            // this commit, for a write the caller is told did not happen.
            if !reads && waited_for_the_lock(&self.waits, &self.turnstile) {
                self.interruption.signalled();
            }
            self.interruption.stop_if_signalled()?;
            match (size, &self.wal) {
                (Size::Large, Some(wal)) => wal.syncing_while(|| tx.commit())?,
                _ => tx.commit()?,
            }
            Ok(out)
        })();
        outcome.map_err(|e| self.interruption.explain(e))
    }

    /// Between two transactions of a long run of writes: lets writers
    /// waiting for their turn have it (see `Turnstile::make_way`).
    pub fn make_way(&self) {
        self.turnstile.make_way();
    }

    /// Runs `op` in one write transaction (`BEGIN IMMEDIATE`): all or nothing.
    pub fn write<T>(&mut self, op: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        self.write_sized(Size::Short, op)
    }

    /// A write transaction; a short one first waits for this handle's turn
    /// (see `turnstile`).
    fn write_sized<T>(
        &mut self,
        size: Size,
        op: impl FnOnce(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        if self.is_read_only() {
            return Err(Error::Conflict("ledger is read-only"));
        }
        self.verify()?;
        if size == Size::Short {
            if let Err(busy) = self.take_turn() {
                self.turnstile.leave(); // forgets when this wait began
                return Err(busy);
            }
        }
        let out = self.transaction(TransactionBehavior::Immediate, size, op);
        // Given up only now, after the checkpoint a commit may run: while
        // writers go on beside it, readers keep pinning older frames and
        // the checkpoint rarely gets to the end of the WAL, which then
        // grows, and every page read must search more of its index.
        self.turnstile.leave();
        let out = out?;
        // Under `full` every commit has synced the WAL already.
        let contended = self.waits.take();
        if let (Some(wal), Durability::Normal) = (&mut self.wal, self.durability) {
            wal.after_commit(contended);
        }
        Ok(out)
    }

    /// Waits for this handle's turn for the write lock (see `turnstile`).
    fn take_turn(&mut self) -> Result<()> {
        let Some(wal) = &self.wal else {
            return Ok(());
        };
        self.interruption.forget();
        let (conn, probing) = (&self.conn, &self.probing);
        self.turnstile
            .enter(
                wal.wal(),
                &self.interruption,
                Duration::from_millis(u64::from(self.busy_timeout_ms)),
                &mut || probing.during(|| write_lock_free(conn)),
            )
            .map_err(|e| self.interruption.explain(e))
    }

    /// Like [`Store::write`], for one large rewrite (reconcile): for a file
    /// of up to [`IN_MEMORY_BULK_MAX_FILE_BYTES`] the page cache is raised
    /// for the transaction and statement journals stay in memory, and the
    /// WAL is synced while the commit writes it. It takes no turn:
    /// turns pay off for short writes that change hands often, and a
    /// rewrite that holds the lock for seconds gains nothing from a queue;
    /// writers meeting it wait in the busy handler, as for any holder.
    ///
    /// Foreign keys are not checked inside, so `op` must not be able to
    /// break a reference. Reconcile cannot: it writes events for the very
    /// rows its statements read, and changes no id or parent. Checked, each
    /// event cost a search of the tasks' id index: about 7% of a
    /// 100,000-task apply.
    pub fn bulk_write<T>(&mut self, op: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let out = self
            .enter_bulk_settings()
            .and_then(|()| self.write_sized(Size::Large, op));
        let restored = self.restore_everyday_settings();
        let out = out?;
        restored?;
        Ok(out)
    }

    /// The length of the file behind the handle, if it has one and it can
    /// be read.
    fn file_len(&self) -> Option<u64> {
        let lease = self.file_lease.as_ref()?;
        lease.file().metadata().ok().map(|m| m.len())
    }

    /// The settings of [`Store::bulk_write`], all outside its transaction:
    /// SQLite reads `temp_store` when a transaction begins and ignores
    /// `foreign_keys` inside one.
    fn enter_bulk_settings(&self) -> Result<()> {
        if bulk_in_memory(self.file_len()) {
            self.conn
                .pragma_update(None, "cache_size", REWRITE_CACHE_KIB)?;
            self.conn.pragma_update(None, "temp_store", "MEMORY")?;
        }
        self.conn.pragma_update(None, "foreign_keys", false)?;
        Ok(())
    }

    /// Back to every handle's settings after a bulk write, whether it
    /// succeeded, failed or never began: each one is tried, whatever the
    /// others do.
    fn restore_everyday_settings(&self) -> Result<()> {
        let restored: rusqlite::Result<()> = [
            self.conn.pragma_update(None, "foreign_keys", true),
            self.conn.pragma_update(None, "cache_size", CACHE_KIB),
            self.conn.pragma_update(None, "temp_store", "DEFAULT"),
        ]
        .into_iter()
        .collect();
        Ok(restored?)
    }

    /// Runs `op` in one read transaction: one consistent snapshot.
    pub fn read<T>(&mut self, op: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        self.verify()?;
        if let Backing::ReadOnly {
            legacy_refusal: Some(why),
            ..
        } = self.backing
        {
            return Err(Error::Conflict(why));
        }
        self.transaction(TransactionBehavior::Deferred, Size::Short, op)
    }

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

    /// How long a read may retry its start, for a connection whose reads
    /// can race a writer (see [`begin_snapshot`]); `None` for others.
    fn read_race_timeout(&self) -> Option<Duration> {
        matches!(
            self.backing,
            Backing::ReadOnly {
                journal_mode: "wal",
                ..
            }
        )
        .then(|| Duration::from_millis(u64::from(self.busy_timeout_ms)))
    }

    /// Bytes of the database file and of its WAL (files only).
    #[must_use]
    pub fn file_sizes(&self) -> Option<(u64, u64)> {
        // The file as it is now, read-only or not: sizes touch nothing.
        let path = self.on_disk()?.0;
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        Some((size(&path.file), size(&fsguard::sidecar(path, "-wal"))))
    }

    /// Closes the connection without the checkpoint (and WAL removal) of a
    /// last connection: for a forked child's inherited handle, whose view
    /// of the WAL and its shared memory is the parent's, not the file's.
    pub fn close_without_checkpoint(self) {
        self.conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .ok();
    }

    /// How long this handle waits for a lock.
    #[must_use]
    pub fn busy_timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.busy_timeout_ms))
    }

    /// True for `Ledger.in_memory()`.
    #[must_use]
    pub fn is_in_memory(&self) -> bool {
        matches!(self.backing, Backing::Memory)
    }

    /// True for a read-only handle.
    #[must_use]
    pub fn is_read_only(&self) -> bool {
        matches!(self.backing, Backing::ReadOnly { .. })
    }

    /// The facts `storage_info` reports.
    pub fn info(&self) -> Result<StorageInfo> {
        let journal_mode = match &self.backing {
            Backing::ReadOnly { journal_mode, .. } => (*journal_mode).to_string(),
            _ => self
                .conn
                .pragma_query_value(None, "journal_mode", |r| r.get(0))?,
        };
        let foreign_keys: bool = self
            .conn
            .pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
        Ok(StorageInfo {
            journal_mode,
            busy_timeout_ms: self.busy_timeout_ms,
            foreign_keys,
            // The file's mode is enforced on every open (this crate builds
            // for POSIX systems only).
            permission_model: "posix_mode",
            durability: self.durability.as_str(),
            synchronous: match self
                .conn
                .pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))?
            {
                0 => "off",
                1 => "normal",
                2 => "full",
                _ => "extra",
            },
            sizes: self.file_sizes(),
        })
    }
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
fn begin_snapshot(tx: &Connection, timeout: Duration) -> Result<()> {
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

/// A statement's plan may not depend on the values bound to it. Without
/// this, SQLite peeks at bound values (a `LIMIT ?`, a `status = ?` next to
/// a partial index) and then re-prepares the statement after every bind:
/// about a tenth of the cost of a claim.
fn pin_query_plans(conn: &Connection) -> Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

fn uri_escape(path: &str) -> String {
    path.replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23")
}

#[cfg(test)]
mod tests {
    use super::{
        Durability, FileChanges, OpenOptions, Store, CACHE_KIB, IN_MEMORY_BULK_MAX_FILE_BYTES,
        REWRITE_CACHE_KIB,
    };
    use crate::errors::{Error, Result};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// `temp_store`, `cache_size` and `foreign_keys` as a connection sees
    /// them.
    fn settings(conn: &rusqlite::Connection) -> Result<(i64, i64, bool)> {
        let temp_store = conn.query_row("PRAGMA temp_store", [], |r| r.get(0))?;
        let cache_size = conn.query_row("PRAGMA cache_size", [], |r| r.get(0))?;
        let foreign_keys = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
        Ok((temp_store, cache_size, foreign_keys))
    }

    /// A small file's bulk write journals in memory (the setting is read
    /// when its transaction begins) with the rewrite's larger page cache
    /// and no foreign key checks, and the handle is back to its everyday
    /// settings afterwards, whether the write succeeded or failed. Past
    /// the bound, only the foreign key checks are off.
    #[test]
    fn a_bulk_write_works_in_memory_up_to_the_bound_then_restores() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-bulk-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let opts = OpenOptions {
            busy_timeout_ms: 1000,
            durability: Durability::Normal,
            read_only: false,
            snapshot_max_bytes: 1 << 20,
            euid: std::fs::metadata(&dir)?.uid(),
            may: FileChanges {
                create: true,
                migrate: true,
            },
        };
        let path = dir.join("bulk.db");
        let mut store = Store::open(&path.to_string_lossy(), &opts)?;
        let everyday = (0, CACHE_KIB, true); // temp_store DEFAULT
        assert_eq!(settings(&store.conn)?, everyday);
        let inside = store.bulk_write(|tx| settings(tx))?;
        assert_eq!(
            inside,
            (2, REWRITE_CACHE_KIB, false),
            "MEMORY, no foreign keys inside the bulk write"
        );
        assert_eq!(settings(&store.conn)?, everyday, "restored after it");
        let failed: Result<()> = store.bulk_write(|_| Err(Error::Conflict("refused")));
        assert!(failed.is_err());
        assert_eq!(
            settings(&store.conn)?,
            everyday,
            "restored after a failed one too"
        );
        // A sparse tail past the bound: SQLite reads the size its header
        // gives, and the rewrite judges by the file's length.
        let file = std::fs::OpenOptions::new().write(true).open(&path)?;
        file.set_len(IN_MEMORY_BULK_MAX_FILE_BYTES)?;
        let at_bound = store.bulk_write(|tx| settings(tx))?;
        assert_eq!(at_bound, (2, REWRITE_CACHE_KIB, false), "the bound itself");
        file.set_len(IN_MEMORY_BULK_MAX_FILE_BYTES + 1)?;
        let past = store.bulk_write(|tx| settings(tx))?;
        assert_eq!(
            past,
            (0, CACHE_KIB, false),
            "a temporary file, everyday cache"
        );
        assert_eq!(settings(&store.conn)?, everyday);
        drop(store);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
