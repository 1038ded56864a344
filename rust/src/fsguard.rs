//! File-system safety for the ledger file (SPEC §7): private modes, no
//! links at the database name or its sidecars, a private parent, and a
//! stable file identity so a replaced database is noticed.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::errors::{Error, Result};
use crate::file_mount;
use crate::held_files::{self, Lease};

/// The database file and its resolved parent directory.
#[derive(Clone, Debug)]
pub struct DbPath {
    pub file: PathBuf,
    pub parent: PathBuf,
}

/// Device and inode of the database file, recorded at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
}

/// What SQLite's sidecar files say about the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sidecars {
    /// None present (or only an empty `-wal`): the file alone is the
    /// database.
    Closed,
    /// Both `-wal` and `-shm`: a live WAL database.
    LiveWal,
    /// A `-journal`, or one of the WAL pair without the other.
    Incomplete,
}

const SIDECAR_SUFFIXES: [&str; 3] = ["-journal", "-wal", "-shm"];

/// The longest file name the common POSIX file systems allow, in bytes.
const NAME_MAX: usize = 255;
/// The longest full path SQLite's unix VFS opens, in bytes. Longer paths
/// are refused up front, before a missing parent is created for nothing.
const SQLITE_PATH_MAX: usize = 512;

/// Makes `raw` absolute, follows links in the existing ancestors (as the
/// peer does) and keeps the final name literal.
pub fn resolve(raw: &str) -> Result<DbPath> {
    // The peer's words where the peer refuses the same.
    if raw.is_empty() || raw.contains('\0') {
        return Err(Error::Invalid("database path must be a nonempty text path"));
    }
    if raw == ":memory:" {
        return Err(Error::Invalid(
            "use a file-backed database so connections share state",
        ));
    }
    let absolute = lexical_absolute(raw)?;
    // The name as written must name a file: `dir/.` would otherwise become
    // a file called `dir`, as path normalisation drops the dot.
    let written = raw.rsplit('/').next().unwrap_or(raw);
    let name = match absolute.components().next_back() {
        Some(Component::Normal(name)) if !matches!(written, "" | "." | "..") => name.to_owned(),
        _ => return Err(Error::Invalid("database path is invalid")),
    };
    // SQLite adds `-journal` to the name; every sidecar must fit NAME_MAX.
    if name.len() + "-journal".len() > NAME_MAX {
        return Err(Error::Invalid("database file name is too long"));
    }
    let parent = resolve_lenient(absolute.parent().unwrap_or(Path::new("/")));
    let file = parent.join(name);
    // Every sidecar's full path too, and every directory's name.
    let too_long = file.as_os_str().len() + "-journal".len() > SQLITE_PATH_MAX
        || parent.iter().any(|part| part.len() > NAME_MAX);
    if too_long {
        return Err(Error::Invalid("database path is too long"));
    }
    Ok(DbPath { file, parent })
}

/// `raw` made absolute with `.` and `..` taken away by name, before any
/// link is followed, as Python's `os.path.abspath` does (and so the peer
/// and `Ledger.path`): `link/../x.db` is `x.db` beside the link, not in the
/// parent of the link's target.
fn lexical_absolute(raw: &str) -> Result<PathBuf> {
    let absolute =
        std::path::absolute(raw).map_err(|_| Error::Invalid("database path is invalid"))?;
    let mut out = PathBuf::new();
    for part in absolute.components() {
        match part {
            // At the root `pop` does nothing: `/..` is `/`, as for abspath.
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// `canonicalize` for the longest existing prefix, the rest appended
/// (`path` holds no `.` or `..`).
fn resolve_lenient(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(real) = fs::canonicalize(&existing) {
            let mut out = real;
            out.extend(rest.iter().rev());
            return out;
        }
        match (existing.components().next_back(), existing.parent()) {
            (Some(last), Some(up)) => {
                rest.push(last.as_os_str().to_owned());
                existing = up.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Walks every component of the parent: each must be a real directory (not
/// a link). Missing ones are created with mode 0700 when `create` is set.
pub fn prepare_parent(path: &DbPath, create: bool) -> Result<()> {
    let mut current = PathBuf::new();
    for part in path.parent.components() {
        current.push(part);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(_) => return Err(Error::Invalid("database parent must be a real directory")),
            Err(e) if e.kind() == ErrorKind::NotFound && create => {
                match DirBuilder::new().mode(0o700).create(&current) {
                    Ok(()) => sync_entry_of(&current),
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(_) => return Err(Error::Invalid("database parent cannot be created")),
                }
            }
            Err(_) => return Err(Error::Invalid("database parent does not exist")),
        }
    }
    Ok(())
}

/// Makes a folder we just created survive a power cut: its name lives in
/// its parent, which SQLite never syncs (it syncs only the database's own
/// folder, once it has made the WAL there). Without this a commit that
/// `durability="full"` reported on disk could vanish with its new folder.
/// A failed sync is ignored, as SQLite ignores one of a folder: some file
/// systems cannot sync a folder at all, and the open must not fail there.
fn sync_entry_of(created: &Path) {
    let parent = match created.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if let Ok(folder) = File::open(parent) {
        let _ = folder.sync_all();
    }
}

// The refusals name the rule that failed, in the peer's words.
const PARENT_UNAVAILABLE: Error = Error::Invalid("database parent is unavailable");
const PARENT_NOT_OURS: Error = Error::Invalid("database parent must be owned by the current user");
const PARENT_SHARED: Error = Error::Invalid("database parent must not be group/world writable");
const ANCESTOR_UNAVAILABLE: Error = Error::Invalid("database ancestor is unavailable");
const ANCESTOR_UNSAFE: Error = Error::Invalid("database ancestor permits unsafe replacement");

/// The directory holding the file belongs to us and nobody else may write
/// to it: checked before every operation, as it is the cheap half. Returns
/// what the check saw, for [`DirStamp`].
pub fn check_direct_parent(path: &DbPath, euid: u32) -> Result<Metadata> {
    let meta = fs::metadata(&path.parent).map_err(|_| PARENT_UNAVAILABLE)?;
    if meta.uid() != euid {
        return Err(PARENT_NOT_OURS);
    }
    if meta.mode() & 0o022 != 0 {
        return Err(PARENT_SHARED);
    }
    Ok(meta)
}

/// How long a directory must have stood unchanged before its times can
/// vouch for its names: any later change is then stamped with a different
/// time. A file system that keeps whole seconds needs two of them.
const SETTLED_WHOLE_SECONDS: Duration = Duration::from_secs(2);

/// The same for a file system whose times show fractions of a second:
/// Linux stamps them from a clock that ticks at least every 10 ms. Two
/// seconds here meant that for two seconds after any change to the
/// directory (a WAL created at open, say) every call looked up every name
/// again, two more system calls a call. Either way, names are looked up
/// again at least every second (`NAMES_TRUSTED_FOR` in `store`).
const SETTLED_FINE: Duration = Duration::from_millis(100);

/// The parent directory as seen when the names in it (the database and its
/// WAL) were last checked. Adding, removing or renaming a name changes the
/// directory's modification and change times, so while the directory shows
/// the same identity and times, the names still lead where they did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirStamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl DirStamp {
    fn of(meta: &Metadata) -> DirStamp {
        DirStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The stamp of a directory whose last change is old enough to rely
    /// on; `None` for a recent one (a change within the same clock tick
    /// could keep its times), which is then checked name by name.
    #[must_use]
    pub fn settled(meta: &Metadata) -> Option<DirStamp> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
        let stamp = DirStamp::of(meta);
        stamp.settled_by(now).then_some(stamp)
    }

    /// Whether the last change is old enough at `now` (since the epoch).
    /// Times before the epoch or after `now` never are.
    fn settled_by(&self, now: Duration) -> bool {
        let (secs, nanos) = self.mtime.max(self.ctime);
        let (Ok(secs), Ok(nanos)) = (u64::try_from(secs), u32::try_from(nanos)) else {
            return false;
        };
        // A fine file system leaves both fractions zero only by chance, and
        // is then merely checked for longer.
        let wait = if self.mtime.1 != 0 || self.ctime.1 != 0 {
            SETTLED_FINE
        } else {
            SETTLED_WHOLE_SECONDS
        };
        now.checked_sub(Duration::new(secs, nanos))
            .is_some_and(|age| age >= wait)
    }

    /// Whether the directory `meta` describes is this one, unchanged.
    #[must_use]
    pub fn still(&self, meta: &Metadata) -> bool {
        DirStamp::of(meta) == *self
    }
}

/// The direct parent must belong to us and be writable by nobody else;
/// every shared-writable ancestor must carry the sticky bit.
pub fn check_parent_security(path: &DbPath, euid: u32) -> Result<()> {
    check_direct_parent(path, euid)?;
    for ancestor in path.parent.ancestors().skip(1) {
        let meta = fs::metadata(ancestor).map_err(|_| ANCESTOR_UNAVAILABLE)?;
        if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
            return Err(ANCESTOR_UNSAFE);
        }
    }
    Ok(())
}

fn is_single_regular(meta: &Metadata) -> bool {
    meta.file_type().is_file() && meta.nlink() == 1 && meta.ino() != 0
}

/// An open that may not create met a file that holds no ledger yet: a
/// state of the file (the class a read-only open gives it, as the peer's
/// does), where a path with no file at all is a bad argument.
pub const NO_LEDGER_YET: Error = Error::Conflict("database file holds no ledger yet");

/// Opens (creating when writable and `create`) the database file without
/// following a link, checks it is one regular file with one name, sets mode 0600 (or,
/// read-only, requires it) and returns its identity, with a lease on the
/// process's shared descriptor of it (see `held_files`).
pub fn prepare_file(path: &DbPath, writable: bool, create: bool) -> Result<(Identity, Lease)> {
    const NOT_REGULAR: Error = Error::Invalid("database file must be a single-link regular file");
    let before = match fs::symlink_metadata(&path.file) {
        Ok(meta) if is_single_regular(&meta) => Some(meta),
        Ok(_) => return Err(NOT_REGULAR),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let opened = match &before {
        // Refused before its mode is touched (the CLI's reads open with
        // `create` off; a read-only open judges an empty file later).
        Some(b) if writable && !create && b.len() == 0 => return Err(NO_LEDGER_YET),
        Some(b) => held_files::lease(Some((b.dev(), b.ino())), || {
            OpenOptions::new()
                .read(true)
                .write(writable)
                .open(&path.file)
        }),
        None if !writable => return Err(Error::Invalid("read-only database must already exist")),
        None if !create => return Err(Error::Invalid("database file does not exist")),
        // O_EXCL refuses a link planted at the name, even a dangling one.
        None => held_files::lease(None, || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path.file)
        }),
    };
    let lease = match opened {
        Ok(lease) => lease,
        Err(e) if before.is_none() && e.kind() == ErrorKind::AlreadyExists => {
            return prepare_file(path, writable, create)
        }
        Err(e) => return Err(e.into()),
    };
    let meta = lease.file().metadata()?;
    let same = before
        .as_ref()
        .is_none_or(|b| b.dev() == meta.dev() && b.ino() == meta.ino());
    if !is_single_regular(&meta) || !same {
        return Err(NOT_REGULAR);
    }
    file_mount::refuse_file_mounted_alone(lease.file(), &path.file, &path.parent)?;
    secure_mode(lease.file(), &meta, writable)?;
    let identity = Identity {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    Ok((identity, lease))
}

/// Exactly 0600, the set-id and sticky bits included (as the peer reads a
/// mode): a writable open sets it, a read-only one refuses anything else.
fn secure_mode(file: &File, meta: &Metadata, writable: bool) -> Result<()> {
    if meta.mode() & 0o7777 == 0o600 {
        return Ok(());
    }
    if !writable {
        return Err(Error::Invalid("read-only database must have mode 0600"));
    }
    // A mistyped path (`--db /etc/passwd`) must not lose its mode before
    // the open finds that it is no ledger: only an empty file or a SQLite
    // one is made private.
    if meta.len() > 0 && !is_sqlite(file)? {
        return Err(Error::Corrupt);
    }
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    if file.metadata()?.mode() & 0o7777 != 0o600 {
        return Err(Error::Invalid("database permissions cannot be secured"));
    }
    Ok(())
}

/// Whether `file` starts with SQLite's header string.
fn is_sqlite(file: &File) -> Result<bool> {
    const MAGIC: &[u8; 16] = b"SQLite format 3\0";
    let mut head = [0u8; 16];
    match file.read_exact_at(&mut head, 0) {
        Ok(()) => Ok(&head == MAGIC),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The file opened is still one regular file with one name: through the
/// process's own descriptor, so no path is walked. A link made to it
/// anywhere, or its deletion, shows in its link count.
pub fn verify_single_link(file: &File) -> Result<()> {
    match file.metadata() {
        Ok(meta) if is_single_regular(&meta) => Ok(()),
        _ => Err(Error::Conflict("database file identity changed")),
    }
}

/// The file at the database name is still the one opened.
pub fn verify_identity(path: &DbPath, identity: Identity) -> Result<()> {
    match fs::symlink_metadata(&path.file) {
        Ok(meta)
            if is_single_regular(&meta)
                && meta.dev() == identity.dev
                && meta.ino() == identity.ino =>
        {
            Ok(())
        }
        _ => Err(Error::Conflict("database file identity changed")),
    }
}

/// A read handle on the ledger's WAL: while it is open, a link count of
/// zero means the file was unlinked under the connection.
///
/// A WAL that cannot be opened refuses the open: a handle without it would
/// go on for its whole life without the checks that need it (a WAL moved
/// away, unlinked by another SQLite copy) and without writer turns. Near
/// the process's descriptor limit that used to happen silently.
pub fn open_wal(path: &DbPath) -> Result<File> {
    File::open(sidecar(path, "-wal")).map_err(|_| Error::Storage(WAL_NOT_OPENED))
}

/// Why a writable open failed when the WAL beside the database could not
/// be opened (most often: too many open files in the process).
pub const WAL_NOT_OPENED: &str = "the ledger's WAL could not be opened";

/// Refuses to go on when the WAL held open (`wal`, from [`open_wal`]) still
/// has a name, but not the one beside the database's: the directory was
/// moved and the file put back without it, say. Commits would then go to a
/// WAL no other connection reads, lost to them. (A WAL with no name left
/// was unlinked by SQLite itself, which the store handles by reopening.)
pub fn verify_wal_name(path: &DbPath, wal: &File) -> Result<()> {
    let Ok(held) = wal.metadata() else {
        return Err(Error::Conflict("database WAL cannot be inspected"));
    };
    if held.nlink() == 0 {
        return Ok(());
    }
    match fs::symlink_metadata(sidecar(path, "-wal")) {
        Ok(named) if (named.dev(), named.ino()) == (held.dev(), held.ino()) => Ok(()),
        _ => Err(Error::Conflict(
            "database WAL is no longer beside the database",
        )),
    }
}

/// A file's device and inode: what names it, whatever its name.
pub type FileKey = (u64, u64);

/// The key of the file at `name` now, if one is there (by `lstat`: a link
/// is a file of its own).
#[must_use]
pub fn key_at(name: &Path) -> Option<FileKey> {
    fs::symlink_metadata(name).ok().map(|m| (m.dev(), m.ino()))
}

/// The name of the ledger's sidecar with `suffix` (`-wal`, `-shm`, ...).
pub fn sidecar(path: &DbPath, suffix: &str) -> PathBuf {
    let mut name = path.file.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Each sidecar that exists must be one regular file with one name and mode
/// 0600; a writable ledger tightens the mode, a read-only one refuses.
pub fn secure_sidecars(path: &DbPath, tighten: bool) -> Result<()> {
    for suffix in SIDECAR_SUFFIXES {
        let side = sidecar(path, suffix);
        let meta = match fs::symlink_metadata(&side) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(_) => return Err(Error::Conflict("SQLite sidecar cannot be inspected safely")),
        };
        if meta.file_type().is_symlink() {
            return Err(Error::Conflict(
                "SQLite sidecar must not be a symbolic link",
            ));
        }
        if !meta.file_type().is_file() {
            return Err(Error::Conflict("SQLite sidecar must be a regular file"));
        }
        if meta.nlink() == 0 {
            continue; // SQLite is removing it right now
        }
        if meta.nlink() > 1 {
            return Err(Error::Conflict(
                "SQLite sidecar must not have multiple links",
            ));
        }
        if meta.mode() & 0o7777 != 0o600 {
            if !tighten {
                return Err(Error::Conflict(
                    "SQLite sidecar permissions cannot be secured",
                ));
            }
            match fs::set_permissions(&side, fs::Permissions::from_mode(0o600)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(_) => {
                    return Err(Error::Conflict(
                        "SQLite sidecar permissions cannot be secured",
                    ))
                }
            }
        }
    }
    Ok(())
}

/// Which sidecars exist (by `lstat`, so a link counts as present).
#[must_use]
pub fn sidecar_state(path: &DbPath) -> Sidecars {
    let present = |suffix| fs::symlink_metadata(sidecar(path, suffix)).is_ok();
    match (present("-journal"), present("-wal"), present("-shm")) {
        (false, false, false) => Sidecars::Closed,
        (false, true, true) => Sidecars::LiveWal,
        // An empty WAL holds no frame: nothing to recover, the file is the
        // database. A read-only open that races the last writer's close
        // leaves one (SQLite opens the WAL with O_CREAT), and refusing it
        // failed every later dry run until a writable open.
        (false, true, false)
            if fs::symlink_metadata(sidecar(path, "-wal")).is_ok_and(|m| m.len() == 0) =>
        {
            Sidecars::Closed
        }
        _ => Sidecars::Incomplete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(mtime: (i64, i64), ctime: (i64, i64)) -> DirStamp {
        DirStamp {
            dev: 1,
            ino: 2,
            mtime,
            ctime,
        }
    }

    #[test]
    fn a_directory_settles_after_its_file_systems_tick() {
        let at = |secs: f64| Duration::from_secs_f64(secs);
        // Whole seconds: two of them after the later of the two times.
        let whole = stamp((100, 0), (101, 0));
        assert!(!whole.settled_by(at(102.9)));
        assert!(whole.settled_by(at(103.0)));
        // Fractions: a tenth of a second.
        let fine = stamp((100, 5_000_000), (100, 2_000_000));
        assert!(!fine.settled_by(at(100.104)));
        assert!(fine.settled_by(at(100.106)));
        // A change stamped in the future, or before the epoch, never is.
        assert!(!fine.settled_by(at(99.0)));
        assert!(!stamp((-5, 0), (-5, 0)).settled_by(at(100.0)));
    }

    #[test]
    fn memory_and_empty_paths_are_refused() {
        for raw in ["", ":memory:", "a\0b", "dir/"] {
            assert!(matches!(resolve(raw), Err(Error::Invalid(_))), "{raw:?}");
        }
    }

    #[test]
    fn dot_dot_goes_back_by_name_before_a_link_is_followed() -> Result<()> {
        let base = fs::canonicalize(std::env::temp_dir())?
            .join(format!("tw-dotdot-{}", std::process::id()));
        fs::create_dir_all(base.join("real/deep"))?;
        fs::create_dir_all(base.join("cwd"))?;
        let _ = fs::remove_file(base.join("cwd/link"));
        std::os::unix::fs::symlink(base.join("real/deep"), base.join("cwd/link"))?;
        let raw = base.join("cwd/link/../l.db");
        let resolved = resolve(raw.to_str().ok_or(Error::Internal("path"))?);
        fs::remove_dir_all(&base)?;
        let resolved = resolved?;
        assert_eq!(resolved.file, base.join("cwd/l.db"));
        assert_eq!(resolved.parent, base.join("cwd"));
        assert_eq!(resolve("/../..//x.db")?.file, Path::new("/x.db"));
        Ok(())
    }

    #[test]
    fn relative_paths_become_absolute() -> Result<()> {
        let p = resolve("some/missing/dir/ledger.db")?;
        assert!(p.file.is_absolute());
        assert!(p.file.ends_with("some/missing/dir/ledger.db"));
        Ok(())
    }
}
