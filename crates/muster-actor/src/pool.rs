//! [`Pool`]: worker processes behind one handle, each request routed to the least-loaded member.
//!
//! Round-robin sends every n-th request to a member however busy it is: the nanomsg
//! load-balancing test (art4711/nanomsg-lb-test on GitHub) shows one slow worker collecting a
//! fifth of a burst while the others idle. Here a member's
//! load is its requests in flight (queued plus running). Least-loaded routing compares two random
//! members (power of two choices) and picks the lighter; a member already at the in-flight limit
//! is "busy, go away", and the request waits in the pool's backlog until the first member frees
//! up. Round-robin stays available for comparison.
//!
//! Members are not restarted: a member that ends is routed around, and once none is left, sends
//! fail with `Stopped` and the backlog is dropped (its asks fail). Put a pool under a
//! [`Supervisor`](crate::Supervisor)'s care by supervising the process that owns it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use crate::sync::lock;
use crate::{AskError, Pid, Process, Reply, System, TellError};

/// How a [`Pool`] picks the member for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// The lighter of two random members, with pushback to the backlog at the in-flight limit.
    #[default]
    LeastLoaded,
    /// Each member in turn, whatever its load (for comparison: it ignores the limit).
    RoundRobin,
}

/// Configures and starts a [`Pool`].
#[derive(Debug, Clone)]
pub struct PoolBuilder {
    size: usize,
    routing: Routing,
    max_in_flight: usize,
}

impl PoolBuilder {
    /// A pool of `size` members, least-loaded routing, at most one request in flight per member.
    ///
    /// # Panics
    /// If `size` is zero.
    pub fn new(size: usize) -> Self {
        assert!(size > 0, "a pool needs at least one member");
        PoolBuilder {
            size,
            routing: Routing::LeastLoaded,
            max_in_flight: 1,
        }
    }

    /// How requests are routed; least-loaded by default.
    pub fn routing(mut self, routing: Routing) -> Self {
        self.routing = routing;
        self
    }

    /// Requests one member may hold (queued plus running) before least-loaded routing keeps
    /// further requests in the backlog. The default, 1, gives the lowest latency when request
    /// costs vary wildly; raise it to let members pipeline cheap requests.
    ///
    /// # Panics
    /// If `limit` is zero.
    pub fn max_in_flight(mut self, limit: usize) -> Self {
        assert!(limit > 0, "max_in_flight must be at least 1");
        self.max_in_flight = limit;
        self
    }

    /// Starts `size` members made by `make(index)`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn<P: Process>(self, system: &System, mut make: impl FnMut(usize) -> P) -> Pool<P> {
        let members: Vec<Member<P>> = (0..self.size)
            .map(|index| Member {
                pid: system.spawn(make(index)),
                load: AtomicUsize::new(0),
            })
            .collect();
        let shared = Arc::new(PoolShared {
            members,
            routing: self.routing,
            max_in_flight: self.max_in_flight,
            next: AtomicUsize::new(0),
            backlog: Mutex::new(VecDeque::new()),
            backlog_len: AtomicUsize::new(0),
        });
        for (index, member) in shared.members.iter().enumerate() {
            let pool = Arc::downgrade(&shared);
            let _ = member.pid.inner.after_message.set(Box::new(move || {
                if let Some(pool) = pool.upgrade() {
                    pool.member_done(index);
                }
            }));
            let pool = Arc::downgrade(&shared);
            member.pid.inner.on_exit(Box::new(move |_| {
                if let Some(pool) = pool.upgrade() {
                    pool.member_exited();
                }
            }));
        }
        Pool { shared }
    }
}

/// A fixed set of identical worker processes behind one handle. Cheap to clone.
pub struct Pool<P: Process> {
    shared: Arc<PoolShared<P>>,
}

struct PoolShared<P: Process> {
    members: Vec<Member<P>>,
    routing: Routing,
    max_in_flight: usize,
    /// Round-robin cursor.
    next: AtomicUsize,
    /// Requests that found every member at its limit, oldest first.
    backlog: Mutex<VecDeque<P::Message>>,
    /// `backlog.len()`, readable without the lock by members finishing a request.
    backlog_len: AtomicUsize,
}

struct Member<P: Process> {
    pid: Pid<P>,
    /// Requests routed to this member and not yet handled.
    load: AtomicUsize,
}

impl<P: Process> Pool<P> {
    /// Routes `msg` to a member, or to the backlog if every member is at its limit.
    ///
    /// # Errors
    /// [`TellError::Stopped`] with the message if the chosen member has ended.
    pub fn tell(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        self.shared.route(msg)
    }

    /// Routes the request built by `make` and waits for the answer.
    ///
    /// # Errors
    /// As [`Pid::ask`].
    ///
    /// # Cancel safety
    /// Cancelling drops the answer; the request still runs.
    pub async fn ask<R>(&self, make: impl FnOnce(Reply<R>) -> P::Message) -> Result<R, AskError> {
        let (reply, answer) = Reply::local();
        self.tell(make(reply)).map_err(|_| AskError::Stopped)?;
        answer.await.map_err(|_| {
            if self.shared.any_alive() {
                AskError::NoReply
            } else {
                AskError::Stopped
            }
        })
    }

    /// The members, in index order.
    pub fn members(&self) -> Vec<Pid<P>> {
        self.shared.members.iter().map(|m| m.pid.clone()).collect()
    }

    /// Each member's requests in flight, in index order.
    pub fn loads(&self) -> Vec<usize> {
        self.shared
            .members
            .iter()
            .map(|m| m.load.load(SeqCst))
            .collect()
    }

    /// Requests waiting for a member.
    pub fn backlog(&self) -> usize {
        self.shared.backlog_len.load(SeqCst)
    }

    /// Terminates every member.
    pub fn terminate(&self) {
        for member in &self.shared.members {
            member.pid.terminate();
        }
    }
}

impl<P: Process> PoolShared<P> {
    fn route(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        let index = match self.routing {
            Routing::RoundRobin => {
                let n = self.members.len();
                let Some(index) = (0..n)
                    .map(|_| self.next.fetch_add(1, SeqCst) % n)
                    .find(|&i| self.members[i].pid.is_alive())
                else {
                    return Err(TellError::Stopped(msg));
                };
                self.members[index].load.fetch_add(1, SeqCst);
                index
            }
            Routing::LeastLoaded => match self.reserve_least_loaded() {
                Some(index) => index,
                None => return self.route_busy(msg),
            },
        };
        self.deliver(index, msg)
    }

    /// The lighter of two random members, reserved, if it is below the limit.
    fn reserve_least_loaded(&self) -> Option<usize> {
        let n = self.members.len();
        let index = if n == 1 {
            0
        } else {
            let a = fastrand::usize(..n);
            let mut b = fastrand::usize(..n - 1);
            if b >= a {
                b += 1;
            }
            let load = |i: usize| self.members[i].load.load(SeqCst);
            if load(a) <= load(b) { a } else { b }
        };
        self.try_reserve(index).then_some(index)
    }

    /// Every member we looked at was busy: try them all under the backlog lock, else queue.
    fn route_busy(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        let mut backlog = lock(&self.backlog);
        if let Some(index) = self.reserve_any() {
            drop(backlog);
            return self.deliver(index, msg);
        }
        if !self.any_alive() {
            return Err(TellError::Stopped(msg));
        }
        backlog.push_back(msg);
        self.backlog_len.fetch_add(1, SeqCst);
        // A member may have finished after the scan but before the push became visible, and
        // found the backlog empty: with sequentially consistent counters, this second scan
        // sees its lower load, so the request cannot be stranded.
        if let Some(index) = self.reserve_any() {
            if let Some(msg) = backlog.pop_front() {
                self.backlog_len.fetch_sub(1, SeqCst);
                drop(backlog);
                return self.deliver(index, msg);
            }
            self.release(index);
        }
        Ok(())
    }

    fn reserve_any(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.try_reserve(i))
    }

    fn any_alive(&self) -> bool {
        self.members.iter().any(|m| m.pid.is_alive())
    }

    /// Takes one of `index`'s in-flight slots, if it is alive and below the limit.
    fn try_reserve(&self, index: usize) -> bool {
        if !self.members[index].pid.is_alive() {
            return false;
        }
        let load = &self.members[index].load;
        let mut current = load.load(SeqCst);
        while current < self.max_in_flight {
            match load.compare_exchange_weak(current, current + 1, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
        false
    }

    fn deliver(&self, index: usize, msg: P::Message) -> Result<(), TellError<P::Message>> {
        let member = &self.members[index];
        member.pid.tell(msg).inspect_err(|_| self.release(index))
    }

    /// A member ended. Once none is left, nobody will take the backlog: drop it, so its asks
    /// fail instead of waiting forever.
    fn member_exited(&self) {
        if self.any_alive() {
            return;
        }
        let abandoned = std::mem::take(&mut *lock(&self.backlog));
        self.backlog_len.store(0, SeqCst);
        if !abandoned.is_empty() {
            tracing::warn!(
                requests = abandoned.len(),
                "every pool member has ended; dropping the backlog"
            );
        }
    }

    /// Gives back one of `index`'s in-flight slots. Saturating: a message told to a member
    /// directly (through [`Pool::members`]) was never counted, and must not wrap the count.
    fn release(&self, index: usize) {
        let _ = self.members[index]
            .load
            .fetch_update(SeqCst, SeqCst, |load| load.checked_sub(1));
    }

    /// A member handled a request: it takes the oldest backlog entry if there is one.
    fn member_done(&self, index: usize) {
        self.release(index);
        if self.backlog_len.load(SeqCst) == 0 {
            return;
        }
        let msg = {
            let mut backlog = lock(&self.backlog);
            if backlog.is_empty() || !self.try_reserve(index) {
                return;
            }
            self.backlog_len.fetch_sub(1, SeqCst);
            backlog.pop_front()
        };
        if let Some(msg) = msg
            && self.deliver(index, msg).is_err()
        {
            tracing::warn!(
                member = index,
                "pool member has stopped; a backlog request is lost"
            );
        }
    }
}

impl<P: Process> Clone for Pool<P> {
    fn clone(&self) -> Self {
        Pool {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<P: Process> fmt::Debug for Pool<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("routing", &self.shared.routing)
            .field("loads", &self.loads())
            .field("backlog", &self.backlog())
            .finish()
    }
}
