//! A ledger file mounted on its own (`docker run -v /host/t.db:/app/t.db`,
//! a Kubernetes `subPath`): refused at open.
//!
//! SQLite keeps a ledger's WAL and its locks (`-shm`) beside the name it
//! opened. Through a file mounted alone, each side of the mount makes its
//! own beside its own name, so two WALs run over one database file: a
//! review had every task of a host worker and a container worker claimed
//! twice, and the file damaged. With one side alone, the commits not yet
//! copied into the file live in the container's layer, gone with it. A
//! directory mounted whole keeps the sidecars beside the file for all.
//!
//! The kernel lists every mount point of the process in
//! `/proc/self/mountinfo`; a file that is one is mounted alone. Where the
//! list cannot be read, nothing is refused.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::errors::{Error, Result};

const MOUNTED_ALONE: &str = "database file is mounted on its own (a bind mount of the file, \
     not its directory): processes on either side would keep separate WALs over one file; \
     mount its directory instead";

/// Refuses `file` (an absolute path, links in its directory resolved) when
/// it is a mount point.
pub fn refuse_file_mounted_alone(file: &Path) -> Result<()> {
    let Ok(mounts) = std::fs::read("/proc/self/mountinfo") else {
        return Ok(());
    };
    if is_mount_point(&mounts, file) {
        return Err(Error::Conflict(MOUNTED_ALONE));
    }
    Ok(())
}

/// Whether `path` is the mount point (the fifth field) of a line of
/// `mountinfo`.
fn is_mount_point(mountinfo: &[u8], path: &Path) -> bool {
    let wanted = path.as_os_str().as_bytes();
    mountinfo
        .split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .any(|point| unescaped(point) == wanted)
}

/// A mountinfo field as the path it names: the kernel writes a space, tab,
/// newline and backslash in a path as `\040`, `\011`, `\012` and `\134`.
fn unescaped(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&first, tail)) = rest.split_first() {
        let octal = tail
            .get(..3)
            .filter(|digits| first == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        if let Some(digits) = octal {
            let value = digits.iter().fold(0u32, |n, d| n * 8 + u32::from(d - b'0'));
            out.push(value as u8);
            rest = &tail[3..];
        } else {
            out.push(first);
            rest = tail;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::is_mount_point;
    use std::path::Path;

    const MOUNTINFO: &[u8] = b"22 27 0:21 / /proc rw,relatime - proc proc rw\n\
        31 27 254:0 /srv/state/t.db /app/state/t.db rw,relatime - ext4 /dev/vda rw\n\
        32 27 254:0 /srv/a\\040b /mnt/a\\040b/x.db rw - ext4 /dev/vda rw\n";

    /// Only a path that is itself a mount point is one; escaped spaces in
    /// mount points are read as spaces.
    #[test]
    fn finds_files_that_are_mount_points() {
        assert!(is_mount_point(MOUNTINFO, Path::new("/app/state/t.db")));
        assert!(is_mount_point(MOUNTINFO, Path::new("/mnt/a b/x.db")));
        assert!(!is_mount_point(MOUNTINFO, Path::new("/app/state")));
        assert!(!is_mount_point(MOUNTINFO, Path::new("/app/state/t.db-wal")));
        assert!(!is_mount_point(MOUNTINFO, Path::new("/srv/state/t.db")));
        assert!(!is_mount_point(b"", Path::new("/proc")));
    }
}
