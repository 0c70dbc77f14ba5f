//! [`Supervisor`]: restarts children one-for-one, within a restart limit.
//!
//! A panic ends only the process that panicked; its supervisor hears of it through its link and
//! starts a fresh child from the child's factory. More than `max_restarts` restarts within
//! `within` means the fault is not transient: the supervisor gives up, stops its other children
//! and ends with [`ExitReason::Failed`], which reaches whoever is linked to it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::lock;
use crate::{Context, ExitReason, Pid, Process, ProcessId, ProcessRef, Reply, System};

/// When a child is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Restart {
    /// Only after an abnormal end (panic, failure); a child that stops normally stays stopped.
    #[default]
    Transient,
    /// After any end, except when the supervisor itself is stopping.
    Permanent,
}

/// The current process of a supervised child; it changes when the child is restarted.
pub struct Supervised<P: Process> {
    current: Arc<Mutex<Option<Pid<P>>>>,
}

impl<P: Process> Supervised<P> {
    /// The child's current process, or `None` before the supervisor started it.
    pub fn pid(&self) -> Option<Pid<P>> {
        lock(&self.current).clone()
    }
}

impl<P: Process> Clone for Supervised<P> {
    fn clone(&self) -> Self {
        Supervised {
            current: Arc::clone(&self.current),
        }
    }
}

impl<P: Process> fmt::Debug for Supervised<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervised")
            .field("pid", &self.pid())
            .finish()
    }
}

/// A running child, whatever its process type.
trait Child: Send {
    fn id(&self) -> ProcessId;
    fn terminate(&self);
    fn link_from(&self, ctx: &Context<Supervisor>);
}

impl<P: Process> Child for Pid<P> {
    fn id(&self) -> ProcessId {
        Pid::id(self)
    }
    fn terminate(&self) {
        Pid::terminate(self);
    }
    fn link_from(&self, ctx: &Context<Supervisor>) {
        ctx.link(self);
    }
}

type StartFn = Box<dyn FnMut(&System) -> Box<dyn Child> + Send>;

struct ChildSpec {
    name: String,
    restart: Restart,
    start: StartFn,
    running: Option<Box<dyn Child>>,
}

/// A process that starts children and restarts them one-for-one.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use muster_actor::{Context, Process, Restart, Supervisor, System};
///
/// struct Worker;
/// impl Process for Worker {
///     type Message = ();
///     async fn handle(&mut self, _: (), _: &mut Context<Self>) {}
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let system = System::new();
/// let mut supervisor = Supervisor::new(3, Duration::from_secs(10));
/// let worker = supervisor.child("worker", Restart::Transient, || Worker);
/// let supervisor = system.spawn(supervisor);
/// # let _ = (worker, supervisor);
/// # }
/// ```
pub struct Supervisor {
    max_restarts: usize,
    within: Duration,
    children: Vec<ChildSpec>,
    /// When recent restarts happened, oldest first; entries older than `within` are dropped.
    restarts: VecDeque<Instant>,
    total_restarts: u64,
}

/// What a [`Supervisor`] answers.
#[derive(Debug)]
#[non_exhaustive]
pub enum SupervisorMsg {
    /// How many restarts it has made in all.
    Restarts(Reply<u64>),
}

impl Supervisor {
    /// A supervisor that gives up after more than `max_restarts` restarts within `within`.
    pub fn new(max_restarts: usize, within: Duration) -> Self {
        Supervisor {
            max_restarts,
            within,
            children: Vec::new(),
            restarts: VecDeque::new(),
            total_restarts: 0,
        }
    }

    /// Adds a child made by `make`, started when the supervisor starts and again on each
    /// restart. The returned handle always names the child's current process.
    pub fn child<P: Process>(
        &mut self,
        name: impl Into<String>,
        restart: Restart,
        mut make: impl FnMut() -> P + Send + 'static,
    ) -> Supervised<P> {
        let handle = Supervised {
            current: Arc::new(Mutex::new(None)),
        };
        let current = Arc::clone(&handle.current);
        self.children.push(ChildSpec {
            name: name.into(),
            restart,
            start: Box::new(move |system: &System| {
                let pid = system.spawn(make());
                *lock(&current) = Some(pid.clone());
                Box::new(pid)
            }),
            running: None,
        });
        handle
    }

    fn start_child(&mut self, index: usize, ctx: &Context<Self>) {
        let spec = &mut self.children[index];
        let child = (spec.start)(ctx.system());
        child.link_from(ctx);
        spec.running = Some(child);
    }

    /// Records a restart; false if that makes more than the limit within the window.
    fn admit_restart(&mut self) -> bool {
        let now = Instant::now();
        while let Some(&oldest) = self.restarts.front() {
            if now.duration_since(oldest) >= self.within {
                self.restarts.pop_front();
            } else {
                break;
            }
        }
        self.restarts.push_back(now);
        self.restarts.len() <= self.max_restarts
    }
}

impl Process for Supervisor {
    type Message = SupervisorMsg;

    async fn started(&mut self, ctx: &mut Context<Self>) {
        for index in 0..self.children.len() {
            self.start_child(index, ctx);
        }
    }

    async fn handle(&mut self, msg: SupervisorMsg, _ctx: &mut Context<Self>) {
        match msg {
            SupervisorMsg::Restarts(reply) => reply.send(self.total_restarts),
        }
    }

    fn exited(&mut self, who: ProcessRef, reason: ExitReason, ctx: &mut Context<Self>) {
        let ProcessRef::Local(id) = who else { return };
        let Some(index) = self
            .children
            .iter()
            .position(|c| c.running.as_ref().is_some_and(|r| r.id() == id))
        else {
            return;
        };
        let spec = &mut self.children[index];
        spec.running = None;
        let restart = match spec.restart {
            Restart::Permanent => reason != ExitReason::Shutdown,
            Restart::Transient => !reason.is_normal(),
        };
        if !restart {
            return;
        }
        let name = spec.name.clone();
        if !self.admit_restart() {
            tracing::error!(child = %name, %reason, limit = self.max_restarts, within = ?self.within,
                "restart limit reached; supervisor gives up");
            ctx.stop_with(ExitReason::Failed(format!(
                "child {name:?} needed more than {} restarts within {:?} (last: {reason})",
                self.max_restarts, self.within
            )));
            return;
        }
        tracing::warn!(child = %name, %reason, "restarting child");
        self.total_restarts += 1;
        self.start_child(index, ctx);
    }

    fn stopped(&mut self, _reason: &ExitReason) {
        for child in self.children.iter_mut().filter_map(|c| c.running.take()) {
            child.terminate();
        }
    }
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.children.iter().map(|c| c.name.as_str()).collect();
        f.debug_struct("Supervisor")
            .field("children", &names)
            .field("max_restarts", &self.max_restarts)
            .field("within", &self.within)
            .finish()
    }
}
