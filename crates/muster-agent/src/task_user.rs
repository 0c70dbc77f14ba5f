//! Whom a task runs as. An agent running as root runs tasks as unprivileged users: its
//! `task_user` if its config names one, else each task as a uid of its own (see
//! `crate::task_uids`); a task may name another user only if the agent's `allowed_task_users`
//! lists it. An agent that is not root runs tasks as itself and refuses a task that names
//! another user: it could not switch to it.

use std::ffi::{CStr, CString};
use std::io;
use std::path::Path;

/// A user's ids, looked up before the fork, for the task to switch to before its exec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// The user id.
    pub(crate) uid: libc::uid_t,
    /// Its primary group, the task's only group.
    pub(crate) gid: libc::gid_t,
}

impl Credentials {
    /// A dynamic task uid (see `crate::task_uids`): the group is the same number.
    pub(crate) fn dynamic(uid: libc::uid_t) -> Credentials {
        Credentials { uid, gid: uid }
    }

    /// Looks `name` up in the user database.
    ///
    /// # Errors
    /// No such user, or the lookup failed.
    pub(crate) fn of(name: &str) -> io::Result<Credentials> {
        let c_name = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a user name holds NUL"))?;
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: a zeroed passwd is a valid out-parameter.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call, and `buffer.len()` is its size.
        let error = unsafe {
            libc::getpwnam_r(
                c_name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut found,
            )
        };
        if error != 0 {
            return Err(io::Error::from_raw_os_error(error));
        }
        if found.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no user {name:?} on this machine"),
            ));
        }
        Ok(Credentials {
            uid: entry.pw_uid,
            gid: entry.pw_gid,
        })
    }

    /// Gives `path` to this user (the task's working directory, its stdout and stderr).
    pub(crate) fn own(&self, path: &Path) -> io::Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
    }

    /// Becomes this user: no supplementary groups, then the group, then the user. Runs in the
    /// task between fork and exec: raw system calls only (the glibc wrappers would signal the
    /// agent's other threads, which do not exist in the child).
    pub(crate) fn assume_in_child(&self) -> io::Result<()> {
        let groups = [self.gid];
        // SAFETY: raw system calls on integers and a one-element array that outlives them.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 1 as libc::size_t, groups.as_ptr()) < 0
                || libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) < 0
                || libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Whether the agent runs as root (and so can, and must, switch tasks to another user).
pub(crate) fn agent_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The user name of uid `uid`, for messages; the number if it has none.
pub(crate) fn name_of(uid: libc::uid_t) -> String {
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call, and `buffer.len()` is its size.
    let error = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if error != 0 || found.is_null() || entry.pw_name.is_null() {
        return uid.to_string();
    }
    // SAFETY: getpwuid_r filled `pw_name` with a NUL-terminated string inside `buffer`.
    unsafe { CStr::from_ptr(entry.pw_name) }
        .to_string_lossy()
        .into_owned()
}

/// The name of `user`, or of the agent's own user for `None`: for logs.
pub(crate) fn name_or_own(user: Option<&str>) -> String {
    match user {
        Some(user) => user.to_owned(),
        // SAFETY: geteuid has no preconditions.
        None => name_of(unsafe { libc::geteuid() }),
    }
}

/// Why a task cannot run as the user it names, or as the one it would run as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UserError {
    /// The task names a user the agent's rule does not allow.
    #[error(
        "the task asks to run as user {requested:?}, which this agent does not allow \
         (its allowed task users: {})",
        allowed_list(allowed)
    )]
    NotAllowed {
        /// The user it names.
        requested: String,
        /// The users a task may name.
        allowed: Vec<String>,
    },
    /// The task should run as another user than the agent's, which is not root.
    #[error(
        "the task should run as user {user:?}, but the agent runs as {agent:?}, not root, \
         and cannot switch users"
    )]
    CannotSwitch {
        /// The user it should run as.
        user: String,
        /// The agent's user.
        agent: String,
    },
    /// The user could not be looked up (there is no such user, or the lookup failed).
    #[error("cannot run the task as user {user:?}: {reason}")]
    Lookup {
        /// The user.
        user: String,
        /// What the lookup said.
        reason: String,
    },
}

/// The allowed users as a refusal lists them.
fn allowed_list(allowed: &[String]) -> String {
    if allowed.is_empty() {
        "none".to_owned()
    } else {
        allowed.join(", ")
    }
}

/// Whom the agent runs its tasks as, by its rule: the user a task runs as when it names none,
/// and the users it may name. Whether and how the machine can run a task as that user is its
/// runner's (see [`Credentials::for_task`]); a task that comes to no user here runs as its
/// runner's default (the process runner's: a dynamic uid when the agent is root, else the
/// agent's own user).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskUsers {
    /// The user a task runs as when it names none (`None`: as the agent's user).
    default: Option<String>,
    /// Users a task may name.
    allowed: Vec<String>,
}

impl TaskUsers {
    /// From the agent's config, `task_user` (a task's default) and `allowed` (the users a task
    /// may name), and its runner's `machine_default`, the user for a task when neither it nor
    /// the config names one (`None`: the runner's default).
    pub(crate) fn new(
        task_user: Option<String>,
        allowed: Vec<String>,
        machine_default: Option<&str>,
    ) -> TaskUsers {
        TaskUsers {
            default: task_user
                .filter(|user| !user.is_empty())
                .or_else(|| machine_default.map(str::to_owned)),
            allowed,
        }
    }

    /// The user a task that names `requested` (empty: none) runs as by the agent's rule:
    /// `None` for its runner's default.
    ///
    /// # Errors
    /// [`UserError::NotAllowed`] if the task names a user the agent does not allow.
    pub(crate) fn named<'a>(&'a self, requested: &'a str) -> Result<Option<&'a str>, UserError> {
        if requested.is_empty() {
            return Ok(self.default.as_deref());
        }
        if self.default.as_deref() == Some(requested) || self.allowed.iter().any(|u| u == requested)
        {
            return Ok(Some(requested));
        }
        Err(UserError::NotAllowed {
            requested: requested.to_owned(),
            allowed: self.allowed.clone(),
        })
    }
}

impl Credentials {
    /// Whom a task that runs as the named `user` runs as on this machine: `None` for the
    /// agent's own user; the user's ids, looked up, if the agent is `root` and so can switch
    /// to them. A task that names no user (`None`, as [`TaskUsers::named`] answers) gets
    /// `None` here: whom it runs as is the runner's to choose (a dynamic uid for a root agent,
    /// see `crate::process_runner`).
    ///
    /// # Errors
    /// [`UserError::CannotSwitch`] for another user than the agent's when it is not root,
    /// [`UserError::Lookup`] for a user that cannot be looked up.
    pub(crate) fn for_task(
        user: Option<&str>,
        root: bool,
    ) -> Result<Option<Credentials>, UserError> {
        let Some(name) = user else {
            return Ok(None);
        };
        if !root {
            let me = name_or_own(None);
            if me == name {
                return Ok(None);
            }
            return Err(UserError::CannotSwitch {
                user: name.to_owned(),
                agent: me,
            });
        }
        Credentials::of(name)
            .map(Some)
            .map_err(|e| UserError::Lookup {
                user: name.to_owned(),
                reason: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_user_is_the_default_and_only_allowed_users_may_be_named() {
        let users = TaskUsers::new(Some("nobody".into()), vec!["root".into()], None);
        let nobody = users
            .named("")
            .and_then(|user| Credentials::for_task(user, true));
        assert!(matches!(nobody, Ok(Some(c)) if c.uid != 0), "{nobody:?}");
        // Without one, the runner chooses (a root agent's process runner: a dynamic uid).
        let dynamic = TaskUsers::new(None, vec!["root".into()], None);
        assert_eq!(dynamic.named(""), Ok(None));
        let root = users
            .named("root")
            .and_then(|user| Credentials::for_task(user, true));
        assert!(matches!(root, Ok(Some(c)) if c.uid == 0));
        let refused = users.named("daemon").unwrap_err().to_string();
        assert!(
            refused.contains("\"daemon\"") && refused.contains("root"),
            "{refused}"
        );
        let missing = TaskUsers::new(Some("no-such-user-here".into()), Vec::new(), None);
        let error = missing
            .named("")
            .and_then(|user| Credentials::for_task(user, true))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no-such-user-here"), "{error}");
    }

    #[test]
    fn a_non_root_agent_runs_tasks_as_itself_and_cannot_switch() {
        let users = TaskUsers::new(None, vec!["nobody".into()], None);
        let own = users
            .named("")
            .and_then(|user| Credentials::for_task(user, false));
        assert_eq!(own, Ok(None));
        let error = users
            .named("nobody")
            .and_then(|user| Credentials::for_task(user, false))
            .unwrap_err()
            .to_string();
        assert!(error.contains("cannot switch"), "{error}");
    }
}
