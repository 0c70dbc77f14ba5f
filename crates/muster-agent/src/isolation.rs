//! Bounding and tracking each task's processes: a cgroup per task (v2 where the agent can use
//! it, v1 otherwise) with the task's memory, CPU and process limits, or, where the agent
//! cannot use cgroups, the task's process group alone.
//!
//! A process joins its task's cgroup in the child, between fork and exec, so nothing it starts
//! can escape: killing a task kills every process in the cgroup, whatever session or process
//! group it made for itself. The kernel's OOM killer, bounded to the cgroup, is told apart
//! from other deaths by the cgroup's own count (`oom_kill` in `memory.events` or
//! `memory.oom_control`).

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::decimal::{DECIMAL_BUFFER, decimal_line};

const MIB: u64 = 1024 * 1024;

/// How the agent bounds its tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// A cgroup v2 directory per task under `scope`.
    CgroupV2 {
        /// The agent's directory in the unified hierarchy.
        scope: PathBuf,
    },
    /// A cgroup v1 directory per task under the agent's directory of each controller.
    CgroupV1 {
        /// The agent's directory in the memory hierarchy.
        memory: PathBuf,
        /// ... in the cpu hierarchy.
        cpu: PathBuf,
        /// ... in the pids hierarchy.
        pids: PathBuf,
    },
    /// No cgroups: each task's process group. Memory, CPU and process counts are not enforced,
    /// and a process that leaves the group (`setsid`) escapes a kill.
    ProcessGroup {
        /// Why not cgroups.
        reason: String,
    },
}

/// A task's limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Memory in MiB (0: none).
    pub mem_mb: u64,
    /// CPUs, as a share of the machine (weights are relative).
    pub cpus: f64,
    /// Most processes and threads at once.
    pub pids: u64,
}

impl Isolation {
    /// Finds how this agent can bound tasks, making its own directory (`scope`, e.g.
    /// `muster/agent-1a2b`) in the hierarchy it will use.
    pub fn detect(scope: &str) -> Isolation {
        let mounts = match std::fs::read_to_string("/proc/self/mountinfo") {
            Ok(text) => text,
            Err(e) => {
                return Isolation::ProcessGroup {
                    reason: format!("cannot read /proc/self/mountinfo: {e}"),
                };
            }
        };
        let mut problems = Vec::new();
        match v2(&mounts, scope) {
            Ok(isolation) => return isolation,
            Err(e) => problems.push(format!("cgroup v2: {e}")),
        }
        match v1(&mounts, scope) {
            Ok(isolation) => return isolation,
            Err(e) => problems.push(format!("cgroup v1: {e}")),
        }
        Isolation::ProcessGroup {
            reason: problems.join("; "),
        }
    }

    /// Removes the agent's own cgroup directories if no task's is left in them (the agent
    /// stops; a directory still in use stays).
    pub fn release(&self) {
        let dirs: Vec<&PathBuf> = match self {
            Isolation::CgroupV2 { scope } => vec![scope],
            Isolation::CgroupV1 { memory, cpu, pids } => vec![memory, cpu, pids],
            Isolation::ProcessGroup { .. } => Vec::new(),
        };
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Removes the task cgroups in the agent's directories that belong to none of `keep` (the
    /// tasks it took back): cgroups an earlier run left behind. A process still in one runs
    /// for no task the agent knows, and is killed first. Returns how many were removed.
    pub(crate) fn sweep(&self, keep: &std::collections::HashSet<String>) -> usize {
        let parents: Vec<&PathBuf> = match self {
            Isolation::CgroupV2 { scope } => vec![scope],
            Isolation::CgroupV1 { memory, cpu, pids } => vec![memory, cpu, pids],
            Isolation::ProcessGroup { .. } => return 0,
        };
        let mut removed = 0;
        for parent in parents {
            let Ok(entries) = std::fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let dir = entry.path();
                let stale = entry.file_type().is_ok_and(|t| t.is_dir())
                    && entry
                        .file_name()
                        .to_str()
                        .is_some_and(|id| !keep.contains(id));
                if !stale {
                    continue;
                }
                for _ in 0..100 {
                    if kill_listed(&dir, libc::SIGKILL) == 0 {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                if std::fs::remove_dir(&dir).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Its name, as `muster status` shows it (the agent's `muster.isolation` attribute).
    pub fn name(&self) -> &'static str {
        match self {
            Isolation::CgroupV2 { .. } => "cgroup-v2",
            Isolation::CgroupV1 { .. } => "cgroup-v1",
            Isolation::ProcessGroup { .. } => "process-group",
        }
    }

    /// The cgroup task `id` would have, if it exists: for a task whose start an earlier run
    /// of the agent did not see through.
    pub(crate) fn existing_for(&self, id: &str) -> Option<TaskCgroup> {
        let (dirs, memory, v2) = match self {
            Isolation::ProcessGroup { .. } => return None,
            Isolation::CgroupV2 { scope } => (vec![scope.join(id)], scope.join(id), true),
            Isolation::CgroupV1 { memory, cpu, pids } => (
                vec![memory.join(id), cpu.join(id), pids.join(id)],
                memory.join(id),
                false,
            ),
        };
        memory
            .exists()
            .then(|| TaskCgroup::existing(dirs, memory, v2))
    }

    /// A new cgroup for task `id` with `limits`; `None` without cgroups.
    ///
    /// # Errors
    /// The cgroup could not be made or its limits written.
    pub(crate) fn for_task(&self, id: &str, limits: Limits) -> io::Result<Option<TaskCgroup>> {
        match self {
            Isolation::ProcessGroup { .. } => Ok(None),
            Isolation::CgroupV2 { scope } => {
                let dir = fresh_dir(&scope.join(id))?;
                if limits.mem_mb > 0 {
                    write(&dir, "memory.max", &(limits.mem_mb * MIB).to_string())?;
                    // Best effort: swap would let a task run past its memory.
                    let _ = write(&dir, "memory.swap.max", "0");
                }
                if limits.cpus > 0.0 {
                    let weight = (limits.cpus * 100.0).round().clamp(1.0, 10_000.0) as u64;
                    write(&dir, "cpu.weight", &weight.to_string())?;
                }
                write(&dir, "pids.max", &limits.pids.to_string())?;
                TaskCgroup::new(vec![dir.clone()], dir, true)
            }
            Isolation::CgroupV1 { memory, cpu, pids } => {
                let memory = fresh_dir(&memory.join(id))?;
                let cpu = fresh_dir(&cpu.join(id))?;
                let pids = fresh_dir(&pids.join(id))?;
                if limits.mem_mb > 0 {
                    let bytes = (limits.mem_mb * MIB).to_string();
                    write(&memory, "memory.limit_in_bytes", &bytes)?;
                    // Best effort (needs swap accounting): no running on in swap.
                    let _ = write(&memory, "memory.memsw.limit_in_bytes", &bytes);
                }
                if limits.cpus > 0.0 {
                    let shares = (limits.cpus * 1024.0).round().clamp(2.0, 262_144.0) as u64;
                    write(&cpu, "cpu.shares", &shares.to_string())?;
                }
                write(&pids, "pids.max", &limits.pids.to_string())?;
                TaskCgroup::new(vec![memory.clone(), cpu, pids], memory, false)
            }
        }
    }
}

/// Where `controllers` (all of them) are mounted: for v2, the unified mount's path with no
/// controller named; for v1, the mount of the hierarchy holding `controller`.
fn mount_point(mounts: &str, v2: bool, controller: &str) -> Option<PathBuf> {
    for line in mounts.lines() {
        // id parent major:minor root mountpoint options - fstype source superoptions
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let mut after = after.split_whitespace();
        let fstype = after.next().unwrap_or_default();
        let _source = after.next();
        let options = after.next().unwrap_or_default();
        let Some(mount) = before.split_whitespace().nth(4) else {
            continue;
        };
        if v2 && fstype == "cgroup2" {
            return Some(PathBuf::from(mount));
        }
        if !v2 && fstype == "cgroup" && options.split(',').any(|o| o == controller) {
            return Some(PathBuf::from(mount));
        }
    }
    None
}

/// Why a cgroup hierarchy cannot bound the agent's tasks (see [`Isolation::detect`]).
#[derive(Debug, thiserror::Error)]
enum Unusable {
    /// No cgroup v2 hierarchy is mounted.
    #[error("not mounted")]
    NotMounted,
    /// No cgroup v1 hierarchy holds this controller.
    #[error("no {0} hierarchy mounted")]
    NoHierarchy(&'static str),
    /// The unified hierarchy lacks these controllers.
    #[error("{} lacks the {} controller(s)", root.display(), missing.join(", "))]
    LacksControllers {
        /// The hierarchy's root.
        root: PathBuf,
        /// The controllers it lacks.
        missing: Vec<&'static str>,
    },
    /// A directory or file of the hierarchy could not be read, made or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// What the operating system said.
        error: io::Error,
    },
}

impl Unusable {
    /// What to say of a failed operation on `path`.
    fn at(path: &Path) -> impl FnOnce(io::Error) -> Unusable + '_ {
        move |error| Unusable::Io {
            path: path.to_owned(),
            error,
        }
    }
}

fn v2(mounts: &str, scope: &str) -> Result<Isolation, Unusable> {
    let root = mount_point(mounts, true, "").ok_or(Unusable::NotMounted)?;
    let available =
        std::fs::read_to_string(root.join("cgroup.controllers")).map_err(Unusable::at(&root))?;
    let missing: Vec<&'static str> = ["memory", "cpu", "pids"]
        .into_iter()
        .filter(|c| !available.split_whitespace().any(|a| a == *c))
        .collect();
    if !missing.is_empty() {
        return Err(Unusable::LacksControllers { root, missing });
    }
    // Controllers are handed down one level at a time, from the root (which may hold
    // processes) to the agent's directory (which holds none: only task directories do).
    let mut dir = root.clone();
    for part in Path::new(scope).components() {
        write(&dir, "cgroup.subtree_control", "+memory +cpu +pids").map_err(Unusable::at(&dir))?;
        dir.push(part);
        std::fs::create_dir_all(&dir).map_err(Unusable::at(&dir))?;
    }
    write(&dir, "cgroup.subtree_control", "+memory +cpu +pids").map_err(Unusable::at(&dir))?;
    Ok(Isolation::CgroupV2 { scope: dir })
}

fn v1(mounts: &str, scope: &str) -> Result<Isolation, Unusable> {
    let dir_of = |controller: &'static str| {
        let root =
            mount_point(mounts, false, controller).ok_or(Unusable::NoHierarchy(controller))?;
        let dir = root.join(scope);
        std::fs::create_dir_all(&dir).map_err(Unusable::at(&dir))?;
        Ok::<_, Unusable>(dir)
    };
    let (memory, cpu, pids) = (dir_of("memory")?, dir_of("cpu")?, dir_of("pids")?);
    // Children count against their parents' limits only if the hierarchy says so.
    let _ = write(&memory, "memory.use_hierarchy", "1");
    Ok(Isolation::CgroupV1 { memory, cpu, pids })
}

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.join(file).display())))
}

/// `dir`, made new: one left by an earlier run of a task with this id is emptied and
/// replaced.
fn fresh_dir(dir: &Path) -> io::Result<PathBuf> {
    if dir.exists() {
        kill_listed(dir, libc::SIGKILL);
        let _ = std::fs::remove_dir(dir);
    }
    std::fs::create_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    Ok(dir.to_owned())
}

/// The processes in the cgroup at `dir`.
fn members(dir: &Path) -> Vec<libc::pid_t> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// Sends `signal` to every process in the cgroup at `dir`; how many there were.
fn kill_listed(dir: &Path, signal: libc::c_int) -> usize {
    let pids = members(dir);
    for pid in &pids {
        // SAFETY: kill takes two integers. A pid listed in cgroup.procs belongs to the
        // cgroup's process until it is reaped; our own children are reaped only by us.
        unsafe {
            libc::kill(*pid, signal);
        }
    }
    pids.len()
}

/// One task's cgroup. It outlives the agent with the task; it is removed once the task ended
/// ([`TaskCgroup::remove`]).
#[derive(Clone, Debug)]
pub(crate) struct TaskCgroup {
    /// Its directory in each hierarchy (one for v2).
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each, ready for the child to write to between fork and exec.
    procs: Vec<CString>,
    /// The directory holding the memory controller's files.
    memory: PathBuf,
    v2: bool,
}

impl TaskCgroup {
    fn new(dirs: Vec<PathBuf>, memory: PathBuf, v2: bool) -> io::Result<Option<TaskCgroup>> {
        Ok(Some(TaskCgroup::existing(dirs, memory, v2)))
    }

    /// A cgroup made earlier (by this run of the agent or an earlier one).
    pub(crate) fn existing(dirs: Vec<PathBuf>, memory: PathBuf, v2: bool) -> TaskCgroup {
        // A path with a NUL byte cannot name a cgroup; such a path has no `cgroup.procs` to
        // join, and joining it fails in the child.
        let procs = dirs
            .iter()
            .map(|dir| {
                CString::new(
                    dir.join("cgroup.procs")
                        .into_os_string()
                        .into_encoded_bytes(),
                )
                .unwrap_or_default()
            })
            .collect();
        TaskCgroup {
            dirs,
            procs,
            memory,
            v2,
        }
    }

    /// Its directories, the one with the memory controller, and whether it is v2.
    pub(crate) fn parts(&self) -> (&[PathBuf], &Path, bool) {
        (&self.dirs, &self.memory, self.v2)
    }

    /// The directories holding its CPU and memory accounting, for the agent's metrics: the
    /// one directory on v2; on v1 the cpu hierarchy's (`cpuacct` is mounted with `cpu`) and the
    /// memory hierarchy's.
    pub(crate) fn usage_paths(&self) -> crate::metrics::CgroupPaths {
        let cpu = if self.v2 {
            self.memory.clone()
        } else {
            // Made as [memory, cpu, pids] (see `Isolation::for_task`).
            self.dirs
                .get(1)
                .cloned()
                .unwrap_or_else(|| self.memory.clone())
        };
        crate::metrics::CgroupPaths::new(cpu, self.memory.clone(), self.v2)
    }

    /// What the child needs to join the cgroup, made before the fork.
    pub(crate) fn join_handle(&self) -> JoinHandle {
        JoinHandle {
            procs: self.procs.clone(),
        }
    }
}

/// The `cgroup.procs` files a new task process writes its pid to.
#[derive(Debug)]
pub(crate) struct JoinHandle {
    procs: Vec<CString>,
}

impl JoinHandle {
    /// Moves the calling process into the cgroup. Runs in the child between fork and exec,
    /// so it only makes system calls: no allocation, no locks.
    pub(crate) fn join_in_child(&self) -> io::Result<()> {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let mut buffer = [0u8; DECIMAL_BUFFER];
        let text = decimal_line(i64::from(pid), &mut buffer);
        for path in &self.procs {
            // SAFETY: `path` is a NUL-terminated string that outlives the calls; `text`
            // points to `text.len()` readable bytes.
            let written = unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, text.as_ptr().cast(), text.len());
                libc::close(fd);
                written
            };
            if written < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

impl TaskCgroup {
    /// Sends `signal` to every process in the cgroup.
    pub(crate) fn signal(&self, signal: libc::c_int) {
        kill_listed(&self.memory, signal);
    }

    /// Kills every process in the cgroup and waits (up to a few seconds) until it is empty.
    pub(crate) async fn kill_all(&self) {
        if self.v2 && write(&self.memory, "cgroup.kill", "1").is_ok() {
            for _ in 0..500 {
                if members(&self.memory).is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        for _ in 0..500 {
            if kill_listed(&self.memory, libc::SIGKILL) == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!(cgroup = %self.memory.display(), "processes left in a task's cgroup after SIGKILL");
    }

    /// Whether the kernel killed a process of the task for running out of memory.
    pub(crate) fn oom_killed(&self) -> bool {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.memory.join(file))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.strip_prefix("oom_kill "))
            .any(|count| count.trim().parse::<u64>().is_ok_and(|n| n > 0))
    }

    /// Removes the (empty) cgroup.
    pub(crate) fn remove(&self) {
        for dir in &self.dirs {
            if let Err(e) = std::fs::remove_dir(dir) {
                tracing::debug!(cgroup = %dir.display(), error = %e, "cannot remove a task's cgroup");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
35 24 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 24 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
37 24 0:32 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
38 24 0:33 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn mount_points_are_read_from_mountinfo() {
        assert_eq!(
            mount_point(MOUNTINFO, false, "cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(
            mount_point(MOUNTINFO, false, "pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        assert_eq!(mount_point(MOUNTINFO, false, "blkio"), None);
        assert_eq!(
            mount_point(MOUNTINFO, true, ""),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }
}
