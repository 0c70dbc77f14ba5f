//! The files of a stream in a task's working directory: the live file (`stdout`), the rotated
//! files (`stdout.1`, `stdout.2`, ...) and the base (`stdout.base`), and how the agent opens
//! and makes them where the task can reach.
//!
//! # Absolute offsets
//!
//! Each stream counts its kept bytes from the task's start: `stdout.base` holds the absolute
//! offset at which the live file starts (the bytes rotated away so far), rewritten atomically
//! (temporary file and rename) at each rotation. The rotated files end where the next newer one
//! starts: `stdout.1` ends at the base, `stdout.2` where `stdout.1` starts, and so on. [`read`]
//! maps an absolute offset onto these files, oldest first. Lost bytes (above) are not counted,
//! so offsets stay continuous.
//!
//! An agent killed in the middle of a copy-truncate rotation (after the copy is in place as
//! `stdout.1`, before the truncation) leaves the copied bytes both in `stdout.1` and at the start
//! of the live file: the stream then holds them twice; offsets stay consistent. A copy cut short
//! leaves only a temporary `stdout.rotating`, replaced by the next rotation.
//!
//! # Files a task can touch
//!
//! The task's user owns its working directory, so it may replace these files with links,
//! FIFOs or directories. The agent opens them with `O_NOFOLLOW | O_NONBLOCK` and uses only
//! regular files; it truncates only a live file with no other hard link, and creates its own
//! files with `O_EXCL` after removing whatever had the name. The executor works relative to the
//! directory it opened before the task started, renames names (never following them), and
//! creates its files with `O_EXCL | O_NOFOLLOW` too; a task that spoils the names spoils only
//! its own output. The agent's copy-truncate rotations and its reads of those tasks' output are
//! serialized by an [`OutputLock`](super::OutputLock).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use super::Stream;

/// The largest `stdout.base` file the agent reads (a number and a newline).
const BASE_FILE_MAX: u64 = 64;

/// Creates (or empties) a stream's live file in `dir` for a new task, open for appending: a
/// truncation by [`rotate`](super::rotate) makes the task's next write land at offset 0. What an earlier task
/// of the same id left of the stream (rotated files, its base) goes first, so the new task's
/// offsets start at 0.
pub(crate) fn create_for_task(dir: &Path, stream: Stream) -> io::Result<File> {
    for (_, path) in rotated_files(dir, stream)? {
        remove_file(&path)?;
    }
    remove_file(&base_path(dir, stream))?;
    let path = dir.join(stream.name());
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        // `append(true)` cannot be combined with `truncate(true)`; the flag can.
        .custom_flags(libc::O_APPEND | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| at(&path, e))
}

/// The rotated files of `stream` in `dir` (`stdout.<n>`, n ≥ 1), by number, newest first.
pub(super) fn rotated_files(dir: &Path, stream: Stream) -> io::Result<Vec<(u32, PathBuf)>> {
    let prefix = format!("{}.", stream.name());
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| at(dir, e))? {
        let entry = entry.map_err(|e| at(dir, e))?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|name| name.strip_prefix(&prefix))
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<u32>().ok())
            .filter(|number| *number >= 1)
        else {
            continue;
        };
        found.push((number, entry.path()));
    }
    found.sort_unstable_by_key(|(number, _)| *number);
    Ok(found)
}

/// The file holding where `stream`'s live file starts.
pub(super) fn base_path(dir: &Path, stream: Stream) -> PathBuf {
    dir.join(format!("{}.base", stream.name()))
}

/// Where `stream`'s live file starts, in absolute offsets (0 before its first rotation).
pub(super) fn read_base(dir: &Path, stream: Stream) -> io::Result<u64> {
    let path = base_path(dir, stream);
    let Some((file, _)) = open_regular(&path, false)? else {
        return Ok(0);
    };
    let mut text = String::new();
    file.take(BASE_FILE_MAX)
        .read_to_string(&mut text)
        .map_err(|e| at(&path, e))?;
    text.trim().parse().map_err(|_| {
        at(
            &path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("holds {:?}, not an offset", text.trim()),
            ),
        )
    })
}

/// Records, atomically (temporary file and rename), that `stream`'s live file starts at `base`.
pub(super) fn write_base(dir: &Path, stream: Stream, base: u64) -> io::Result<()> {
    let path = base_path(dir, stream);
    let tmp = dir.join(format!("{}.base.tmp", stream.name()));
    let mut file = create_new(&tmp)?;
    file.write_all(format!("{base}\n").as_bytes())
        .map_err(|e| at(&tmp, e))?;
    drop(file);
    fs::rename(&tmp, &path).map_err(|e| at(&tmp, e))
}

/// Opens `path` if it is a regular file (not following a link, not blocking on a FIFO), with
/// its metadata; `None` if there is nothing by that name.
pub(super) fn open_regular(path: &Path, write: bool) -> io::Result<Option<(File, fs::Metadata)>> {
    let opened = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(at(
                path,
                io::Error::other("a symbolic link, not the task's file"),
            ));
        }
        Err(e) => return Err(at(path, e)),
    };
    let meta = file.metadata().map_err(|e| at(path, e))?;
    if !meta.is_file() {
        return Err(at(path, io::Error::other("not a regular file")));
    }
    Ok(Some((file, meta)))
}

/// Creates `path` anew for the agent's own writing: whatever had the name is removed first, and
/// the file is created exclusively (so never through a link a task left there).
pub(super) fn create_new(path: &Path) -> io::Result<File> {
    remove_file(path)?;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| at(path, e))
}

/// Removes `path` if it is there.
pub(super) fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at(path, e)),
        _ => Ok(()),
    }
}

/// `error`, naming `path`.
pub(super) fn at(path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}
