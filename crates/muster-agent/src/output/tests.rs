//! The output files' tests: copy-truncate rotations, reads across rotations, the executor's
//! capture within its bounds, and the task's output lock between them.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::capture::{Name, Pumped};
use super::files::{create_for_task, rotated_files};
use super::read::{Chunk, flock, read};
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

/// A capture of a task's output in `dir`, its lock file beside it, with small limits; and
/// the task's ends of the pipes, as files the test writes to.
fn capture(dir: &Path, limits: Limits) -> (Capture, [File; 2], PathBuf) {
    let task = dir.join("task");
    ok(fs::create_dir(&task));
    let files = ok(TaskFiles::create(&task));
    let (capture, ends) = ok(Capture::new(
        files,
        &dir.join("task.output-lock"),
        limits,
        None,
    ));
    let [stdout, stderr] = ends.ends;
    (capture, [File::from(stdout), File::from(stderr)], task)
}

/// Copies what the pipe of `stream` holds, as the executor does when it is readable.
fn pump_all(capture: &mut Capture, stream: Stream) {
    while capture.pump(stream) == Pumped::Data {}
}

/// The bytes `stream`'s files in `dir` take together.
fn on_disk(dir: &Path, stream: Stream) -> u64 {
    let mut total = fs::metadata(dir.join(stream.name())).map_or(0, |meta| meta.len());
    for (_, path) in ok(rotated_files(dir, stream)) {
        total += fs::metadata(&path).map_or(0, |meta| meta.len());
    }
    total
}

#[test]
fn the_capture_keeps_each_stream_within_its_cap_and_reads_return_the_tail() {
    let dir = dir();
    let limits = Limits {
        max_bytes: 100,
        files: 2,
    };
    let cap = 300;
    let (mut capture, [mut stdout, mut stderr], task) = capture(dir.path(), limits);
    let lock = OutputLock::default();
    let lock_file = dir.path().join("task.output-lock");
    let all: Vec<u8> = (0..5_000u32).map(|n| (n % 251) as u8).collect();
    // Writes smaller than a file, as large, one more, larger than a file (split).
    let mut written = 0;
    for size in [1, 7, 99, 100, 101, 250, 333].into_iter().cycle() {
        if written == all.len() {
            break;
        }
        let piece = &all[written..(written + size).min(all.len())];
        ok(stdout.write_all(piece));
        written += piece.len();
        pump_all(&mut capture, Stream::Stdout);
        let kept = on_disk(&task, Stream::Stdout);
        assert!(kept <= cap, "{kept} bytes kept after {written} written");
        for path in [
            task.join("stdout"),
            task.join("stdout.1"),
            task.join("stdout.2"),
        ] {
            let len = contents(&path).len();
            assert!(len <= 100, "{}: {len} bytes", path.display());
        }
        let chunk = ok(read_task(&lock, &lock_file, &task, Stream::Stdout, 0, 0));
        assert_eq!(chunk.next_offset, written as u64);
        assert_eq!(
            chunk.data,
            &all[usize::try_from(chunk.offset).unwrap_or(0)..written]
        );
        assert_eq!(
            chunk.data.len() as u64,
            kept,
            "what is kept is what is read"
        );
    }
    assert!(!task.join("stdout.3").exists());
    assert!(!task.join("stdout.base.tmp").exists());
    assert!(on_disk(&task, Stream::Stdout) > cap - 100);
    // The other stream is its own.
    assert_eq!(on_disk(&task, Stream::Stderr), 0);
    ok(stderr.write_all(b"oops\n"));
    pump_all(&mut capture, Stream::Stderr);
    let chunk = ok(read_task(&lock, &lock_file, &task, Stream::Stderr, 0, 0));
    assert_eq!((chunk.data.as_slice(), chunk.offset), (&b"oops\n"[..], 0));
}

#[test]
fn a_pipe_closed_by_the_task_reads_as_closed_after_what_it_held() {
    let dir = dir();
    let limits = Limits {
        max_bytes: 1024,
        files: 1,
    };
    let (mut capture, [mut stdout, stderr], task) = capture(dir.path(), limits);
    ok(stdout.write_all(b"last words\n"));
    drop((stdout, stderr));
    assert_eq!(capture.pump(Stream::Stdout), Pumped::Data);
    assert_eq!(contents(&task.join("stdout")), b"last words\n");
    // Closed once no process holds the writing end: a process another test forks may hold
    // a copy until its exec, so this is polled for, until a deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    while capture.pump(Stream::Stdout) != Pumped::Closed {
        assert!(Instant::now() < deadline, "the pipe never closed");
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(capture.pipes()[0], -1);
    capture.drain();
    assert_eq!(contents(&task.join("stdout")), b"last words\n");
}

#[test]
fn limits_of_zero_are_refused_with_a_clear_error() {
    let dir = dir();
    for limits in [
        Limits {
            max_bytes: 0,
            files: 1,
        },
        Limits {
            max_bytes: 10,
            files: 0,
        },
    ] {
        let files = ok(TaskFiles::create(dir.path()));
        let err = Capture::new(files, &dir.path().join("lock"), limits, None)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("must be at least 1"), "{err}");
    }
}

#[test]
fn links_a_task_leaves_in_its_directory_are_renamed_over_not_written_through() {
    let dir = dir();
    let limits = Limits {
        max_bytes: 10,
        files: 2,
    };
    let (mut capture, [mut stdout, _stderr], task) = capture(dir.path(), limits);
    let secret = dir.path().join("secret");
    ok(fs::write(&secret, b"secret"));
    for name in ["stdout.1", "stdout.2", "stdout.base", "stdout.base.tmp"] {
        ok(std::os::unix::fs::symlink(&secret, task.join(name)));
    }
    for piece in [b"0123456789", b"abcdefghij", b"ABCDEFGHIJ", b"klmnopqrst"] {
        ok(stdout.write_all(piece));
        pump_all(&mut capture, Stream::Stdout);
    }
    assert_eq!(contents(&secret), b"secret");
    assert_eq!(contents(&task.join("stdout")), b"klmnopqrst");
    assert_eq!(contents(&task.join("stdout.1")), b"ABCDEFGHIJ");
    assert_eq!(contents(&task.join("stdout.2")), b"abcdefghij");
    assert_eq!(contents(&task.join("stdout.base")), b"30\n");
    assert!(fs::symlink_metadata(task.join("stdout.2")).is_ok_and(|meta| meta.is_file()));
}

/// Whether a `flock` of this process on `path`'s file waits for the lock: `/proc/locks`
/// shows it as a blocked request (`<n>: -> FLOCK ADVISORY READ <pid> <dev>:<inode> ...`).
fn a_flock_waits_on(path: &Path) -> bool {
    let Ok(meta) = fs::metadata(path) else {
        return false;
    };
    let pid = std::process::id().to_string();
    let inode = meta.ino().to_string();
    fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"->")
                && fields.get(2) == Some(&"FLOCK")
                && fields.get(5) == Some(&pid.as_str())
                && fields
                    .get(6)
                    .and_then(|file| file.rsplit(':').next())
                    .is_some_and(|number| number == inode)
        })
}

/// Polls `condition` every millisecond until it holds; fails the test after 10 s.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not in 10 s");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_read_waits_for_a_rotation_in_progress() {
    let dir = dir();
    let task = dir.path().join("task");
    ok(fs::create_dir(&task));
    ok(fs::write(task.join("stdout"), b"hello"));
    let lock_file = dir.path().join("lock");
    let rotating = ok(File::create(&lock_file));
    ok(flock(rotating.as_raw_fd(), libc::LOCK_EX));
    let (done, finished) = mpsc::channel();
    let reader = {
        let lock_file = lock_file.clone();
        thread::spawn(move || {
            let chunk = read_task(
                &OutputLock::default(),
                &lock_file,
                &task,
                Stream::Stdout,
                0,
                0,
            );
            let _ = done.send(chunk.map(|chunk| chunk.data));
        })
    };
    // The reader waits for the lock (the kernel says so)...
    wait_until("the reader waiting for the lock", || {
        a_flock_waits_on(&lock_file)
    });
    assert_eq!(
        finished.try_recv().map(|_| ()),
        Err(mpsc::TryRecvError::Empty),
        "a reader answered while a rotation held the lock"
    );
    // ...and answers once it is released.
    drop(rotating);
    let data = finished.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(&data, Ok(Ok(data)) if data == b"hello"),
        "{data:?}"
    );
    assert!(reader.join().is_ok());
}

#[test]
fn a_read_of_a_task_with_a_lock_file_does_not_take_the_agent_s_lock() {
    let dir = dir();
    let task = dir.path().join("task");
    ok(fs::create_dir(&task));
    ok(fs::write(task.join("stdout"), b"hello"));
    let lock_file = dir.path().join("lock");
    ok(fs::write(&lock_file, b""));
    let lock = OutputLock::default();
    // Held as a long copy-truncate rotation of another task would hold it.
    let held = lock.0.lock().unwrap_or_else(PoisonError::into_inner);
    let (done, finished) = mpsc::channel();
    let reader = {
        let lock = lock.clone();
        thread::spawn(move || {
            let chunk = read_task(&lock, &lock_file, &task, Stream::Stdout, 0, 0);
            let _ = done.send(chunk.map(|chunk| chunk.data));
        })
    };
    // A deadline for the failure only: a read that waited for the agent's lock never
    // answers while it is held.
    let data = finished.recv_timeout(Duration::from_secs(30));
    assert!(
        matches!(&data, Ok(Ok(data)) if data == b"hello"),
        "{data:?}"
    );
    drop(held);
    assert!(reader.join().is_ok());
}

/// 40 bytes, all `n`: a piece of output whose number a read can tell.
fn piece(n: u8) -> Vec<u8> {
    vec![n; 40]
}

/// Reads `stream` from `offset` on (holding the task's lock shared, as the agent does) and
/// appends what it gets to `seen`; the next offset.
fn follow(task: &Path, lock_file: &Path, offset: u64, seen: &mut Vec<u8>) -> u64 {
    let chunk = ok(read_task(
        &OutputLock::default(),
        lock_file,
        task,
        Stream::Stdout,
        offset,
        0,
    ));
    assert_eq!(chunk.offset, offset, "a follower's offset moved: {chunk:?}");
    assert_eq!(chunk.next_offset, offset + chunk.data.len() as u64);
    seen.extend_from_slice(&chunk.data);
    chunk.next_offset
}

#[test]
fn the_capture_never_waits_on_a_reader_and_drops_what_it_cannot_rotate() {
    let dir = dir();
    let limits = Limits {
        max_bytes: 100,
        files: 2,
    };
    let (capture, [stdout, _stderr], task) = capture(dir.path(), limits);
    let lock_file = dir.path().join("task.output-lock");
    // A reader holds the lock throughout, as an agent stopped in the middle of a read.
    let reader = ok(File::open(&lock_file));
    ok(flock(reader.as_raw_fd(), libc::LOCK_SH));
    let (done, pumped) = mpsc::channel();
    let pumping = {
        let (task, lock_file) = (task.clone(), lock_file.clone());
        thread::spawn(move || {
            let (mut capture, mut stdout) = (capture, stdout);
            let (mut offset, mut seen) = (0, Vec::new());
            // Pieces 0 and 1 fill the live file to 80 bytes; each later one needs a
            // rotation, which the reader's lock keeps from happening: dropped.
            for n in 0..10 {
                ok(stdout.write_all(&piece(n)));
                pump_all(&mut capture, Stream::Stdout);
                assert!(on_disk(&task, Stream::Stdout) <= 300);
                offset = follow(&task, &lock_file, offset, &mut seen);
            }
            let _ = done.send(());
            (capture, stdout, offset, seen)
        })
    };
    // A deadline for the failure only: a capture that waited for the lock would never
    // finish while the reader holds it.
    assert!(
        pumped.recv_timeout(Duration::from_secs(60)).is_ok(),
        "the capture waited on a reader's lock"
    );
    let (mut capture, mut stdout, mut offset, mut seen) = match pumping.join() {
        Ok(pumped) => pumped,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    assert_eq!(
        contents(&task.join("stdout")),
        [piece(0), piece(1)].concat()
    );
    assert!(!task.join("stdout.1").exists());
    assert!(!task.join("stdout.base").exists());
    assert!(!task.join("stdout.base.tmp").exists());
    assert_eq!(capture.streams[0].dropped, 8 * 40);
    assert_eq!(offset, 80, "dropped bytes are not counted");

    // Once the reader is gone, rotations resume, and offsets go on from the last byte kept.
    drop(reader);
    for n in 10..20 {
        ok(stdout.write_all(&piece(n)));
        pump_all(&mut capture, Stream::Stdout);
        offset = follow(&task, &lock_file, offset, &mut seen);
        assert!(on_disk(&task, Stream::Stdout) <= 300);
    }
    assert_eq!(capture.streams[0].dropped, 8 * 40);
    let kept: Vec<u8> = [0, 1].into_iter().chain(10..20).flat_map(piece).collect();
    assert_eq!(seen, kept, "a follower saw every kept byte once, in order");
    let chunk = ok(read_task(
        &OutputLock::default(),
        &lock_file,
        &task,
        Stream::Stdout,
        0,
        0,
    ));
    assert_eq!(chunk.next_offset, kept.len() as u64);
    assert_eq!(
        chunk.data,
        &kept[usize::try_from(chunk.offset).unwrap_or(0)..]
    );
    assert_eq!(chunk.data.len() as u64, on_disk(&task, Stream::Stdout));
}

/// A capture with limits of 100 bytes and 2 files, whose stdout has been rotated once
/// (`stdout.1` holds pieces 0 and 1, the live file 2 and 3, the base is 80): the capture,
/// the task's end of its stdout, the task's directory and its lock file.
fn rotated_once(dir: &Path) -> (Capture, File, PathBuf, PathBuf) {
    let limits = Limits {
        max_bytes: 100,
        files: 2,
    };
    let (mut capture, [mut stdout, _stderr], task) = capture(dir, limits);
    for n in 0..4 {
        ok(stdout.write_all(&piece(n)));
        pump_all(&mut capture, Stream::Stdout);
    }
    assert_eq!(
        contents(&task.join("stdout.1")),
        [piece(0), piece(1)].concat()
    );
    assert_eq!(
        contents(&task.join("stdout")),
        [piece(2), piece(3)].concat()
    );
    assert_eq!(contents(&task.join("stdout.base")), b"80\n");
    (capture, stdout, task, dir.join("task.output-lock"))
}

/// The rotation that `block` kept from happening changed nothing, the chunk was dropped
/// and the lock released; once `unblock` ran, the next rotation is whole and the offsets
/// go on from the last byte kept.
fn check_not_rotated(dir: &Path, block: impl FnOnce(&Path), unblock: impl FnOnce(&Path)) {
    let (mut capture, mut stdout, task, lock_file) = rotated_once(dir);
    block(&task);
    ok(stdout.write_all(&piece(4)));
    pump_all(&mut capture, Stream::Stdout);
    assert_eq!(
        contents(&task.join("stdout.1")),
        [piece(0), piece(1)].concat()
    );
    assert!(
        !task.join("stdout.2").exists(),
        "shifted without a rotation"
    );
    assert_eq!(
        contents(&task.join("stdout")),
        [piece(2), piece(3)].concat()
    );
    assert_eq!(contents(&task.join("stdout.base")), b"80\n");
    assert!(!task.join("stdout.base.tmp").is_file());
    assert_eq!(capture.streams[0].dropped, 40);
    let chunk = ok(read_task(
        &OutputLock::default(),
        &lock_file,
        &task,
        Stream::Stdout,
        0,
        0,
    ));
    let kept: Vec<u8> = (0..4).flat_map(piece).collect();
    assert_eq!((chunk.offset, chunk.next_offset), (0, 160));
    assert_eq!(chunk.data, kept);
    // The lock was released.
    let other = ok(File::open(&lock_file));
    ok(flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB));
    drop(other);

    unblock(&task);
    ok(stdout.write_all(&piece(5)));
    pump_all(&mut capture, Stream::Stdout);
    assert_eq!(
        contents(&task.join("stdout.2")),
        [piece(0), piece(1)].concat()
    );
    assert_eq!(
        contents(&task.join("stdout.1")),
        [piece(2), piece(3)].concat()
    );
    assert_eq!(contents(&task.join("stdout")), piece(5));
    assert_eq!(contents(&task.join("stdout.base")), b"160\n");
    let chunk = ok(read_task(
        &OutputLock::default(),
        &lock_file,
        &task,
        Stream::Stdout,
        0,
        0,
    ));
    let kept: Vec<u8> = [0, 1, 2, 3, 5].into_iter().flat_map(piece).collect();
    assert_eq!((chunk.offset, chunk.next_offset), (0, 200));
    assert_eq!(chunk.data, kept);
}

/// Something the executor cannot remove or create a file over: a directory that is not
/// empty.
fn block_name(task: &Path, name: &str) {
    ok(fs::create_dir(task.join(name)));
    ok(fs::write(task.join(name).join("x"), b""));
}

#[test]
fn a_base_that_cannot_be_written_stops_the_rotation_before_it_starts() {
    let dir = dir();
    check_not_rotated(
        dir.path(),
        |task| block_name(task, "stdout.base.tmp"),
        |task| ok(fs::remove_dir_all(task.join("stdout.base.tmp"))),
    );
}

#[test]
fn a_live_file_that_cannot_be_renamed_is_not_rotated_and_nothing_shifts() {
    let dir = dir();
    check_not_rotated(
        dir.path(),
        |task| block_name(task, "stdout.rotating"),
        |task| ok(fs::remove_dir_all(task.join("stdout.rotating"))),
    );
}

#[test]
fn stream_file_names_are_built_on_the_stack() {
    assert_eq!(
        Name::new(Stream::Stderr, b".base.tmp").as_c_str(),
        c"stderr.base.tmp"
    );
    assert_eq!(Name::numbered(Stream::Stdout, 1).as_c_str(), c"stdout.1");
    assert_eq!(
        Name::numbered(Stream::Stderr, u32::MAX).as_c_str(),
        c"stderr.4294967295"
    );
}
