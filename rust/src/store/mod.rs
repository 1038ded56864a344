//! The storage boundary: opening a ledger (writable, read-only or in
//! memory), its pragmas, and the transaction helpers every operation runs
//! in. Only this module and the SQL modules it runs (the domain modules,
//! through the transactions it hands them) know the ledger is SQLite.
//!
//! What a handle does beyond the everyday open and transaction lives in
//! its own file: a read-only view (`read_only`), the schema a writable open
//! finds (`schema_at_open`), sidecars deleted under an open handle
//! (`lost_sidecars`), large rewrites (`bulk`) and doctor's run (`checkup`).

mod bulk;
mod checkup;
mod lost_sidecars;
mod read_only;
mod schema_at_open;

use read_only::begin_snapshot;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::busy;
use crate::errors::{Error, Result};
use crate::events;
use crate::fsguard::{self, DbPath, DirStamp, Identity};
use crate::held_files::Lease;
use crate::reconcile;
use crate::schema::Earlier;
use crate::sidecar_loss;
use crate::turnstile::Turnstile;
use crate::wal_flush;
use crate::wal_growth::{WalGrowth, Watch, WAL_SIZE_LIMIT_BYTES};

/// Page cache per connection for everyday work (negative: KiB). Kept
/// small on purpose: a commit whose b-tree balance renumbered pages (most
/// batched claims) makes SQLite sweep the cache's whole hash table, so a
/// large cache costs every such commit; 16 MiB spent 7% of batched claims
/// there. Rows are found through few pages, and the OS caches the rest.
const CACHE_KIB: i64 = -4_096;

/// Whether the write under way waited for its turn or for SQLite's lock
/// (the busy handler notes its waits; a turn's wait is remembered until
/// the turn is given up).
fn waited_for_the_lock(waits: &busy::Waits, turnstile: &Turnstile) -> bool {
    waits.happened() || turnstile.wait_began().is_some()
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

/// A statement's plan may not depend on the values bound to it. Without
/// this, SQLite peeks at bound values (a `LIMIT ?`, a `status = ?` next to
/// a partial index) and then re-prepares the statement after every bind:
/// about a tenth of the cost of a claim.
fn pin_query_plans(conn: &Connection) -> Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}
