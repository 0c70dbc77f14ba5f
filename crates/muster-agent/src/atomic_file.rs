//! Writing a file whole or not at all: through a temporary file beside it and a rename, for
//! the agent's state files ([`crate::store`]) and its executors' records
//! ([`crate::executor`]), readable and writable by the agent alone (0600).

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
/// With `durable`, the file and then the directory are fsynced.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no directory"))?;
    let mut tmp_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?
        .to_owned();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    {
        // The agent's own state (ids, terms, checkpoints holding environments): its alone.
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A temporary file left by a crash keeps its mode through `create`: set it again.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
    }
    fs::rename(&tmp, path)?;
    if durable {
        // Makes the rename itself durable. Directories cannot be opened for sync everywhere;
        // where they can (Linux), a failure is an error.
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
