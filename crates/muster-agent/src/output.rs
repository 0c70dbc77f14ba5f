//! A task's output files, `stdout` and `stderr` in its working directory: opening them for the
//! task, keeping them bounded, and reading them back across rotations.
//!
//! # Rotation, copy-truncate style
//!
//! The task holds its output files itself (its executor outlives the agent), so the agent
//! cannot rotate them by renaming. It rotates them as logrotate's `copytruncate` does: when a
//! stream's live file (`stdout`) is past its size limit, [`rotate`] copies it to `stdout.1`
//! (shifting `stdout.1` to `stdout.2` and so on, and dropping those past the number of files
//! kept), records how far the live file now starts, then truncates it. The task opened it with
//! `O_APPEND` (see [`create_for_task`]), so its next write lands at offset 0, leaving no hole.
//! This works across agent restarts: the task keeps writing the same file whoever rotates it.
//!
//! Bytes the task writes between the agent's last look at the file's size and the truncation
//! are lost, as with logrotate's `copytruncate`. The agent keeps that window narrow: once the
//! copy is in place it copies what the task appended meanwhile, and truncates only when a look
//! at the size finds nothing new (or after a few rounds of catching up with a task that never
//! pauses), so the window is the two system calls between that look and the `ftruncate`.
//!
//! # Absolute offsets
//!
//! Each stream counts its kept bytes from the task's start: `stdout.base` holds the absolute
//! offset at which the live file starts (the bytes rotated away so far), rewritten atomically
//! (temporary file and rename) before each truncation. The rotated files end where the next
//! newer one starts: `stdout.1` ends at the base, `stdout.2` where `stdout.1` starts, and so
//! on. [`read`] maps an absolute offset onto these files, oldest first. Lost bytes (above) are
//! not counted, so offsets stay continuous.
//!
//! An agent killed in the middle of a rotation (after the copy is in place as `stdout.1`, before
//! the truncation) leaves the copied bytes both in `stdout.1` and at the start of the live file:
//! the stream then holds them twice; offsets stay consistent. A copy cut short leaves only a
//! temporary `stdout.rotating`, replaced by the next rotation.
//!
//! # Files a task can touch
//!
//! The task's user owns its working directory, so it may replace these files with links,
//! FIFOs or directories. The agent opens them with `O_NOFOLLOW | O_NONBLOCK` and uses only
//! regular files; it truncates only a live file with no other hard link, and creates its own
//! files with `O_EXCL` after removing whatever had the name. Rotations and reads of one agent
//! are serialized by an [`OutputLock`], so a read never sees a rotation half done.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The most bytes one [`read`] returns.
pub(crate) const READ_LIMIT_MAX: usize = 1024 * 1024;

/// How many times a rotation catches up with what the task wrote during its last steps
/// before it truncates anyway (see [`rotate`]).
const CATCH_UP_ROUNDS: u32 = 4;

/// The largest `stdout.base` file the agent reads (a number and a newline).
const BASE_FILE_MAX: u64 = 64;

/// One of a task's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    /// Its standard output, `stdout`.
    Stdout,
    /// Its standard error, `stderr`.
    Stderr,
}

impl Stream {
    /// Both streams.
    pub(crate) const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// The live file's name, which the other files' names start with.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How large a stream's live file may grow, and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Past this size the live file is rotated.
    pub(crate) max_bytes: u64,
    /// Rotated files kept per stream (at least 1).
    pub(crate) files: u32,
}

/// Serializes one agent's rotations and reads of output files, so that a read never sees a
/// rotation half done. Clones share the lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutputLock(Arc<Mutex<()>>);

impl OutputLock {
    /// Runs `work` holding the lock (a panic of an earlier holder does not matter: the files
    /// are consistent between the steps of a rotation too, see the module's docs).
    fn hold<T>(&self, work: impl FnOnce() -> T) -> T {
        let _held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        work()
    }
}

/// What a [`rotate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rotated {
    /// Bytes copied to the newest rotated file (and truncated from the live file).
    pub(crate) copied: u64,
    /// The absolute offset where the live file now starts.
    pub(crate) base: u64,
}

/// A piece of a stream, as [`read`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// The bytes from `offset` on.
    pub(crate) data: Vec<u8>,
    /// The absolute offset of `data`'s first byte.
    pub(crate) offset: u64,
    /// Where a next read continues: `offset` + `data.len()`.
    pub(crate) next_offset: u64,
    /// The oldest byte still kept.
    pub(crate) first_offset: u64,
}

/// Creates (or empties) a stream's live file in `dir` for a new task, open for appending: a
/// truncation by [`rotate`] makes the task's next write land at offset 0. What an earlier task
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
        // `append(true)` cannot be combined with `truncate(true)`; the flag can.
        .custom_flags(libc::O_APPEND | libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| at(&path, e))
}

/// Rotates `stream`'s live file in `dir` if it is larger than `limits.max_bytes`, as the
/// module says; `None` if it is not (or does not exist).
///
/// # Errors
/// The file that could not be read, written, renamed or removed, and why; a live file that is
/// not a regular file or has other hard links is not rotated.
pub(crate) fn rotate(
    lock: &OutputLock,
    dir: &Path,
    stream: Stream,
    limits: Limits,
) -> io::Result<Option<Rotated>> {
    lock.hold(|| rotate_locked(dir, stream, limits))
}

fn rotate_locked(dir: &Path, stream: Stream, limits: Limits) -> io::Result<Option<Rotated>> {
    let name = stream.name();
    let live_path = dir.join(name);
    let Some((live, meta)) = open_regular(&live_path, true)? else {
        return Ok(None);
    };
    if meta.len() <= limits.max_bytes {
        return Ok(None);
    }
    if meta.nlink() != 1 {
        return Err(at(
            &live_path,
            io::Error::other(format!(
                "it has {} hard links: not truncating a file that is not only the task's",
                meta.nlink()
            )),
        ));
    }
    let base = read_base(dir, stream)?;

    // The copy first, under a temporary name: an agent stopped during it changes nothing.
    let copying = dir.join(format!("{name}.rotating"));
    let mut copy = create_new(&copying)?;
    // Up to what the task appends meanwhile, bounded so a fast writer cannot keep it going.
    let bound = meta.len().saturating_add(limits.max_bytes);
    let mut copied = io::copy(&mut (&live).take(bound), &mut copy).map_err(|e| at(&copying, e))?;
    if let Ok(copy_meta) = copy.metadata()
        && (copy_meta.uid(), copy_meta.gid()) != (meta.uid(), meta.gid())
    {
        // Owned as the live file is (the task's user), where the agent may (as root). A file
        // the agent keeps owning is no harm: the task can still read it.
        if let Err(error) = std::os::unix::fs::fchown(&copy, Some(meta.uid()), Some(meta.gid())) {
            tracing::debug!(path = %copying.display(), %error, "cannot give a rotated file the task's owner");
        }
    }

    // Shift the rotated files, oldest (highest number) first, so that every name is free when
    // a file is renamed to it.
    for (number, path) in rotated_files(dir, stream)?.into_iter().rev() {
        if number >= limits.files {
            remove_file(&path)?;
        } else {
            let to = dir.join(format!("{name}.{}", number + 1));
            fs::rename(&path, &to).map_err(|e| at(&path, e))?;
        }
    }
    let newest = dir.join(format!("{name}.1"));
    fs::rename(&copying, &newest).map_err(|e| at(&copying, e))?;

    // Where the live file starts once truncated, recorded before the truncation. What the
    // task wrote since the copy reached the end is copied too (the descriptor still is the
    // newest file's), so that only a write between the last look at the size and the
    // truncation is lost.
    let mut rounds = 0;
    loop {
        write_base(dir, stream, base.saturating_add(copied))?;
        let now = live.metadata().map_err(|e| at(&live_path, e))?.len();
        if now <= copied || rounds == CATCH_UP_ROUNDS {
            live.set_len(0).map_err(|e| at(&live_path, e))?;
            break;
        }
        (&live)
            .seek(SeekFrom::Start(copied))
            .map_err(|e| at(&live_path, e))?;
        copied +=
            io::copy(&mut (&live).take(now - copied), &mut copy).map_err(|e| at(&newest, e))?;
        rounds += 1;
    }
    let base = base.saturating_add(copied);
    Ok(Some(Rotated { copied, base }))
}

/// Reads up to `limit` bytes (at most [`READ_LIMIT_MAX`]; 0 for that much) of `stream` in
/// `dir` from absolute offset `offset`, across the rotated files and the live file. An offset
/// below the oldest byte kept reads from that byte; one past the end reads nothing, at the end.
///
/// # Errors
/// The file that could not be read, and why (a missing directory included).
pub(crate) fn read(
    lock: &OutputLock,
    dir: &Path,
    stream: Stream,
    offset: u64,
    limit: usize,
) -> io::Result<Chunk> {
    lock.hold(|| read_locked(dir, stream, offset, limit))
}

/// One file of a stream, as a range of absolute offsets.
#[derive(Debug)]
struct Segment {
    path: PathBuf,
    start: u64,
    len: u64,
}

fn read_locked(dir: &Path, stream: Stream, offset: u64, limit: usize) -> io::Result<Chunk> {
    let dir_meta = fs::metadata(dir).map_err(|e| at(dir, e))?;
    if !dir_meta.is_dir() {
        return Err(at(dir, io::Error::other("not a directory")));
    }
    let limit = if limit == 0 {
        READ_LIMIT_MAX
    } else {
        limit.min(READ_LIMIT_MAX)
    };
    let base = read_base(dir, stream)?;
    let live_path = dir.join(stream.name());
    let live_len = match fs::symlink_metadata(&live_path) {
        Ok(meta) if meta.is_file() => meta.len(),
        Ok(_) => return Err(at(&live_path, io::Error::other("not a regular file"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(at(&live_path, e)),
    };
    // Newest first, each ending where the newer one starts; a file that cannot fit below the
    // base (the files and the base disagree) ends the history.
    let mut segments = Vec::new();
    let mut end = base;
    for (_, path) in rotated_files(dir, stream)? {
        let len = match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(at(&path, e)),
        };
        let Some(start) = end.checked_sub(len) else {
            break;
        };
        segments.push(Segment { path, start, len });
        end = start;
    }
    let first_offset = end;
    segments.reverse();
    segments.push(Segment {
        path: live_path,
        start: base,
        len: live_len,
    });
    let last = base.saturating_add(live_len);
    let offset = offset.clamp(first_offset, last);
    let want = usize::try_from(last - offset).map_or(limit, |left| left.min(limit));
    let mut data = Vec::with_capacity(want);
    let mut at_offset = offset;
    for segment in &segments {
        if data.len() >= want {
            break;
        }
        let segment_end = segment.start.saturating_add(segment.len);
        if segment.len == 0 || segment_end <= at_offset {
            continue;
        }
        let Some((file, _)) = open_regular(&segment.path, false)? else {
            break;
        };
        let from = at_offset - segment.start;
        let room = want - data.len();
        let take = usize::try_from(segment_end - at_offset).map_or(room, |left| left.min(room));
        let got = read_at(&file, &segment.path, from, take, &mut data)?;
        at_offset = at_offset.saturating_add(got as u64);
        if got < take {
            // The file is shorter than it was a moment ago: what follows is not where the
            // offsets say. Stop here; the next read starts from what was read.
            break;
        }
    }
    Ok(Chunk {
        next_offset: offset.saturating_add(data.len() as u64),
        data,
        offset,
        first_offset,
    })
}

/// Appends up to `len` bytes of `file` from position `from` to `data`; how many it read (fewer
/// at the file's end).
fn read_at(
    file: &File,
    path: &Path,
    from: u64,
    len: usize,
    data: &mut Vec<u8>,
) -> io::Result<usize> {
    let start = data.len();
    data.resize(start + len, 0);
    let mut got = 0;
    while got < len {
        match file.read_at(&mut data[start + got..], from.saturating_add(got as u64)) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                data.truncate(start);
                return Err(at(path, e));
            }
        }
    }
    data.truncate(start + got);
    Ok(got)
}

/// The rotated files of `stream` in `dir` (`stdout.<n>`, n ≥ 1), by number, newest first.
fn rotated_files(dir: &Path, stream: Stream) -> io::Result<Vec<(u32, PathBuf)>> {
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
fn base_path(dir: &Path, stream: Stream) -> PathBuf {
    dir.join(format!("{}.base", stream.name()))
}

/// Where `stream`'s live file starts, in absolute offsets (0 before its first rotation).
fn read_base(dir: &Path, stream: Stream) -> io::Result<u64> {
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
fn write_base(dir: &Path, stream: Stream, base: u64) -> io::Result<()> {
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
fn open_regular(path: &Path, write: bool) -> io::Result<Option<(File, fs::Metadata)>> {
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
fn create_new(path: &Path) -> io::Result<File> {
    remove_file(path)?;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| at(path, e))
}

/// Removes `path` if it is there.
fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at(path, e)),
        _ => Ok(()),
    }
}

/// `error`, naming `path`.
fn at(path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_bytes: 10,
        files: 2,
    };

    fn dir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("no tempdir: {e}"),
        }
    }

    fn ok<T>(result: io::Result<T>) -> T {
        match result {
            Ok(value) => value,
            Err(e) => panic!("{e}"),
        }
    }

    /// Appends `bytes` to the live file as the task would, through an O_APPEND descriptor.
    fn write(file: &mut File, bytes: &[u8]) {
        ok(file.write_all(bytes));
    }

    fn contents(path: &Path) -> Vec<u8> {
        fs::read(path).unwrap_or_default()
    }

    fn read_all(lock: &OutputLock, dir: &Path, offset: u64, limit: usize) -> Chunk {
        ok(read(lock, dir, Stream::Stdout, offset, limit))
    }

    #[test]
    fn a_truncated_append_file_takes_the_next_write_at_offset_zero() {
        let dir = dir();
        let mut file = ok(create_for_task(dir.path(), Stream::Stdout));
        write(&mut file, b"0123456789abcdef");
        let lock = OutputLock::default();
        let rotated = ok(rotate(&lock, dir.path(), Stream::Stdout, LIMITS));
        assert_eq!(
            rotated,
            Some(Rotated {
                copied: 16,
                base: 16
            })
        );
        write(&mut file, b"xyz");
        assert_eq!(contents(&dir.path().join("stdout")), b"xyz");
        assert_eq!(contents(&dir.path().join("stdout.1")), b"0123456789abcdef");
        assert_eq!(contents(&dir.path().join("stdout.base")), b"16\n");
        // Creating it again for a new task empties it and forgets the old rotations.
        drop(ok(create_for_task(dir.path(), Stream::Stdout)));
        assert_eq!(contents(&dir.path().join("stdout")), b"");
        assert!(!dir.path().join("stdout.1").exists());
        assert!(!dir.path().join("stdout.base").exists());
    }

    #[test]
    fn a_file_within_its_limit_or_missing_is_not_rotated() {
        let dir = dir();
        let lock = OutputLock::default();
        assert_eq!(ok(rotate(&lock, dir.path(), Stream::Stderr, LIMITS)), None);
        let mut file = ok(create_for_task(dir.path(), Stream::Stderr));
        write(&mut file, b"0123456789");
        assert_eq!(ok(rotate(&lock, dir.path(), Stream::Stderr, LIMITS)), None);
        assert!(!dir.path().join("stderr.1").exists());
    }

    #[test]
    fn rotation_shifts_the_files_and_drops_the_oldest() {
        let dir = dir();
        let lock = OutputLock::default();
        let mut file = ok(create_for_task(dir.path(), Stream::Stdout));
        // A file left past the limit of an earlier, larger config goes too.
        ok(fs::write(dir.path().join("stdout.7"), b"old"));
        for round in 0..4u8 {
            let bytes = vec![b'a' + round; 11];
            write(&mut file, &bytes);
            let rotated = ok(rotate(&lock, dir.path(), Stream::Stdout, LIMITS));
            assert_eq!(
                rotated,
                Some(Rotated {
                    copied: 11,
                    base: 11 * u64::from(round + 1)
                })
            );
        }
        assert_eq!(contents(&dir.path().join("stdout.1")), vec![b'd'; 11]);
        assert_eq!(contents(&dir.path().join("stdout.2")), vec![b'c'; 11]);
        assert!(!dir.path().join("stdout.3").exists());
        assert!(!dir.path().join("stdout.7").exists());
        assert!(!dir.path().join("stdout.rotating").exists());
        assert!(!dir.path().join("stdout.base.tmp").exists());
        let chunk = read_all(&lock, dir.path(), 0, 0);
        assert_eq!(chunk.first_offset, 22);
        assert_eq!(chunk.offset, 22);
        assert_eq!(chunk.data, [vec![b'c'; 11], vec![b'd'; 11]].concat());
        assert_eq!(chunk.next_offset, 44);
    }

    /// Three rotations of a numbered sequence: `stdout.2`, `stdout.1` and the live file.
    fn three_files(dir: &Path) -> (OutputLock, Vec<u8>) {
        let lock = OutputLock::default();
        let limits = Limits {
            max_bytes: 10,
            files: 2,
        };
        let mut file = ok(create_for_task(dir, Stream::Stdout));
        let all: Vec<u8> = (0..50u8).collect();
        // 0..15 is rotated away, 15..30 is stdout.2, 30..42 is stdout.1, 42..50 live.
        for piece in [&all[0..15], &all[15..30], &all[30..42]] {
            write(&mut file, piece);
            assert!(ok(rotate(&lock, dir, Stream::Stdout, limits)).is_some());
        }
        write(&mut file, &all[42..50]);
        (lock, all)
    }

    #[test]
    fn reads_cross_the_rotated_files_and_the_live_file() {
        let dir = dir();
        let (lock, all) = three_files(dir.path());
        let chunk = read_all(&lock, dir.path(), 15, 0);
        assert_eq!(chunk.first_offset, 15);
        assert_eq!((chunk.offset, chunk.next_offset), (15, 50));
        assert_eq!(chunk.data, &all[15..50]);
        // Across stdout.2 -> stdout.1 -> live, with a limit.
        let chunk = read_all(&lock, dir.path(), 27, 20);
        assert_eq!((chunk.offset, chunk.next_offset), (27, 47));
        assert_eq!(chunk.data, &all[27..47]);
        // Within the live file.
        let chunk = read_all(&lock, dir.path(), 45, 2);
        assert_eq!(chunk.data, &all[45..47]);
        // Following: from next_offset until nothing is left.
        let mut offset = 0;
        let mut followed = Vec::new();
        loop {
            let chunk = read_all(&lock, dir.path(), offset, 4);
            if chunk.data.is_empty() {
                break;
            }
            followed.extend_from_slice(&chunk.data);
            offset = chunk.next_offset;
        }
        assert_eq!(followed, &all[15..50]);
    }

    #[test]
    fn reads_below_the_first_kept_byte_or_past_the_end_are_clamped() {
        let dir = dir();
        let (lock, all) = three_files(dir.path());
        let chunk = read_all(&lock, dir.path(), 3, 5);
        assert_eq!((chunk.offset, chunk.next_offset), (15, 20));
        assert_eq!(chunk.data, &all[15..20]);
        let chunk = read_all(&lock, dir.path(), 50, 0);
        assert_eq!((chunk.offset, chunk.next_offset), (50, 50));
        assert!(chunk.data.is_empty());
        let chunk = read_all(&lock, dir.path(), 1_000, 0);
        assert_eq!(
            (chunk.offset, chunk.next_offset, chunk.first_offset),
            (50, 50, 15)
        );
        assert!(chunk.data.is_empty());
    }

    #[test]
    fn the_read_limit_is_capped() {
        let dir = dir();
        let lock = OutputLock::default();
        let mut file = ok(create_for_task(dir.path(), Stream::Stdout));
        write(&mut file, &vec![7u8; READ_LIMIT_MAX + 100]);
        let chunk = read_all(&lock, dir.path(), 0, 0);
        assert_eq!(chunk.data.len(), READ_LIMIT_MAX);
        let chunk = read_all(&lock, dir.path(), 0, READ_LIMIT_MAX * 4);
        assert_eq!(chunk.data.len(), READ_LIMIT_MAX);
        assert_eq!(chunk.next_offset, READ_LIMIT_MAX as u64);
        let chunk = read_all(&lock, dir.path(), chunk.next_offset, 0);
        assert_eq!(chunk.data.len(), 100);
    }

    #[test]
    fn a_stream_never_written_reads_empty_and_a_missing_directory_is_named() {
        let dir = dir();
        let lock = OutputLock::default();
        let chunk = read_all(&lock, dir.path(), 0, 0);
        assert_eq!(
            (chunk.offset, chunk.next_offset, chunk.first_offset),
            (0, 0, 0)
        );
        let missing = dir.path().join("nope");
        let err = read(&lock, &missing, Stream::Stdout, 0, 0)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn links_and_fifos_a_task_leaves_are_not_followed() {
        let dir = dir();
        let lock = OutputLock::default();
        let secret = dir.path().join("secret");
        ok(fs::write(&secret, vec![b's'; 100]));
        let task = dir.path().join("task");
        ok(fs::create_dir(&task));
        ok(std::os::unix::fs::symlink(&secret, task.join("stdout")));
        let err = rotate(&lock, &task, Stream::Stdout, LIMITS)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(
            contents(&secret).len(),
            100,
            "the link's target is untouched"
        );
        // A hard link to another file is not truncated either.
        ok(fs::remove_file(task.join("stdout")));
        ok(fs::hard_link(&secret, task.join("stdout")));
        let err = rotate(&lock, &task, Stream::Stdout, LIMITS)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("hard links"), "{err}");
        assert_eq!(contents(&secret).len(), 100);
        // A link in place of a rotated file, or the agent's temporary file, is not read or
        // written through.
        ok(fs::remove_file(task.join("stdout")));
        let mut file = ok(create_for_task(&task, Stream::Stdout));
        write(&mut file, b"0123456789abc");
        ok(std::os::unix::fs::symlink(
            &secret,
            task.join("stdout.rotating"),
        ));
        ok(std::os::unix::fs::symlink(
            &secret,
            task.join("stdout.base.tmp"),
        ));
        assert!(ok(rotate(&lock, &task, Stream::Stdout, LIMITS)).is_some());
        assert_eq!(contents(&secret), vec![b's'; 100]);
        ok(fs::remove_file(task.join("stdout.1")));
        ok(std::os::unix::fs::symlink(&secret, task.join("stdout.1")));
        let chunk = read_all(&lock, &task, 0, 0);
        assert!(!chunk.data.contains(&b's'), "{chunk:?}");
        // A FIFO in place of the live file: refused, not waited on.
        ok(fs::remove_file(task.join("stdout")));
        let fifo = std::ffi::CString::new(task.join("stdout").as_os_str().as_encoded_bytes())
            .unwrap_or_default();
        // SAFETY: mkfifo reads the NUL-terminated path and nothing else.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let err = read(&lock, &task, Stream::Stdout, 0, 0)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
