//! The read-only snapshot of a cleanly closed ledger (SPEC §5).
//!
//! The file is read twice; identity, size, times and SHA-256 must agree, so
//! a writer that appears in between is caught. The second pass streams
//! straight into SQLite's own buffer: memory is one copy of the file. The
//! source file is never opened by SQLite, so nothing on disk can change.

use std::fs::{File, Metadata};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;

use rusqlite::{Connection, MAIN_DB};
use sha2::{Digest, Sha256};

use crate::errors::{Error, Result};
use crate::fsguard::{self, DbPath, Identity, Sidecars};

/// The default cap: the peer's 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

const CHUNK: usize = 1 << 20;
const CHANGED: Error = Error::Conflict("database changed during read-only snapshot");

/// Everything about the file that a writer would disturb.
#[derive(Debug, PartialEq, Eq)]
struct Signature {
    dev: u64,
    ino: u64,
    nlink: u64,
    mode: u32,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Signature {
    fn of(meta: &Metadata) -> Signature {
        Signature {
            dev: meta.dev(),
            ino: meta.ino(),
            nlink: meta.nlink(),
            mode: meta.mode(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// A reader that hashes what it reads and, in the bytes it hands on, sets
/// the WAL header bytes 18-19 to 1: SQLite cannot load a WAL-mode image
/// into memory, and the hash must cover the bytes as they are on disk.
struct HashingReader {
    file: File,
    hasher: Sha256,
    offset: u64,
    patch_header: bool,
    header: [u8; 20],
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hasher.update(&buf[..n]);
        for (i, byte) in buf[..n].iter_mut().enumerate() {
            let at = self.offset + i as u64;
            if at >= 20 {
                break;
            }
            self.header[at as usize] = *byte;
            if self.patch_header && (at == 18 || at == 19) {
                *byte = 1;
            }
        }
        self.offset += n as u64;
        Ok(n)
    }
}

struct Pass {
    signature: Signature,
    digest: Vec<u8>,
    header: [u8; 20],
}

fn open_checked(path: &DbPath, identity: Identity, max_bytes: u64) -> Result<(File, Metadata)> {
    fsguard::verify_identity(path, identity)?;
    if fsguard::sidecar_state(path) != Sidecars::Closed {
        return Err(Error::Conflict(
            "read-only snapshot requires a closed WAL database",
        ));
    }
    let file =
        File::open(&path.file).map_err(|_| Error::Conflict("snapshot cannot be read safely"))?;
    let meta = file
        .metadata()
        .map_err(|_| Error::Conflict("snapshot cannot be read safely"))?;
    if meta.dev() != identity.dev || meta.ino() != identity.ino || meta.nlink() != 1 {
        return Err(Error::Conflict("database file identity changed"));
    }
    if meta.size() > max_bytes {
        return Err(Error::Conflict("database exceeds snapshot limit"));
    }
    Ok((file, meta))
}

fn finish(
    reader: HashingReader,
    before: Metadata,
    path: &DbPath,
    identity: Identity,
) -> Result<Pass> {
    let after = reader.file.metadata().map_err(|_| CHANGED)?;
    if Signature::of(&before) != Signature::of(&after) || reader.offset != after.size() {
        return Err(CHANGED);
    }
    fsguard::verify_identity(path, identity)?;
    if fsguard::sidecar_state(path) != Sidecars::Closed {
        return Err(CHANGED);
    }
    Ok(Pass {
        signature: Signature::of(&after),
        digest: reader.hasher.finalize().to_vec(),
        header: reader.header,
    })
}

fn hash_pass(path: &DbPath, identity: Identity, max_bytes: u64) -> Result<Pass> {
    let (file, meta) = open_checked(path, identity, max_bytes)?;
    let mut reader = HashingReader {
        file,
        hasher: Sha256::new(),
        offset: 0,
        patch_header: false,
        header: [0; 20],
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(_) if reader.offset > max_bytes => {
                return Err(Error::Conflict("database exceeds snapshot limit"))
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(Error::Conflict("snapshot cannot be read safely")),
        }
    }
    finish(reader, meta, path, identity)
}

fn check_header(header: &[u8; 20]) -> Result<()> {
    if &header[..16] != b"SQLite format 3\0" || header[18] != 2 || header[19] != 2 {
        return Err(Error::Conflict("read-only snapshot requires WAL mode"));
    }
    Ok(())
}

/// Loads a private in-memory copy of the closed ledger at `path`.
pub fn load(path: &DbPath, identity: Identity, max_bytes: u64) -> Result<Connection> {
    let first = hash_pass(path, identity, max_bytes)?;
    check_header(&first.header)?;
    let (file, meta) = open_checked(path, identity, max_bytes)?;
    let size = usize::try_from(meta.size())
        .map_err(|_| Error::Conflict("database exceeds snapshot limit"))?;
    let mut reader = HashingReader {
        file,
        hasher: Sha256::new(),
        offset: 0,
        patch_header: true,
        header: [0; 20],
    };
    let mut conn = Connection::open_in_memory()?;
    conn.deserialize_read_exact(MAIN_DB, &mut reader, size, false)
        .map_err(|_| Error::Conflict("deserialization failed"))?;
    // Anything past the size seen at open means the file grew meanwhile.
    let mut probe = [0u8; 1];
    if reader.file.read(&mut probe).map_err(|_| CHANGED)? != 0 {
        return Err(CHANGED);
    }
    let second = finish(reader, meta, path, identity)?;
    if second.signature != first.signature
        || second.digest != first.digest
        || second.header != first.header
    {
        return Err(CHANGED);
    }
    Ok(conn)
}

/// A private in-memory copy of the database `conn` reads (a live WAL
/// file, say), so that it can be changed without touching the file.
pub fn copy_of(conn: &mut Connection) -> Result<Connection> {
    let mut image = conn.serialize(MAIN_DB)?.to_vec();
    // As in `load`: SQLite cannot load a WAL-mode image into memory until
    // its header says rollback journal.
    if image.len() >= 20 {
        image[18] = 1;
        image[19] = 1;
    }
    let mut copy = Connection::open_in_memory()?;
    copy.deserialize_read_exact(MAIN_DB, &image[..], image.len(), false)?;
    Ok(copy)
}
