//! Muster's actor runtime, in the manner of Mesos's libprocess.
//!
//! A [`Process`] owns its state and handles one message at a time. Other code reaches it through
//! a typed [`Pid`]: [`tell`](Pid::tell) moves a message into its mailbox (no `Clone` bound, no
//! encoding), [`ask`](Pid::ask) waits for an answer, [`dispatch`](Pid::dispatch) runs a closure on
//! it. Processes [`link`](Context::link) to each other and hear of each other's end, set timers
//! on tokio time, and [`defer`](Context::defer) futures so that no handler blocks. Processes on
//! other nodes are reached by address ([`Upid`]) through the `muster-transport` crate's
//! `Node`, over one tonic stream per peer: this crate links no network stack.
//!
//! # Layout
//! - [`process`](Process), [`Pid`], [`Context`], [`Reply`]: the core.
//! - [`System`]: the running processes, dead letters, graceful shutdown.
//! - [`Pool`]: workers behind one handle, least-loaded routing.
//! - [`Supervisor`]: one-for-one restarts within a limit.
//! - [`Upid`]: the address of a process on another node; [`RemoteResponder`],
//!   [`Pid::tell_all`], [`Pid::on_exit`], [`Context::exit_notifier`]: what a transport needs.
//! - errors: [`TellError`] hands the message back; [`AskError`], [`RemoteError`].
//!
//! # Examples
//! ```
//! use muster_actor::{Context, Process};
//!
//! struct Greeter;
//!
//! impl Process for Greeter {
//!     type Message = (String, muster_actor::Reply<String>);
//!     async fn handle(&mut self, (name, reply): Self::Message, _ctx: &mut Context<Self>) {
//!         reply.send(format!("hello, {name}"));
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let greeter = muster_actor::spawn(Greeter);
//! let answer = greeter.ask(|reply| ("ada".to_owned(), reply)).await?;
//! assert_eq!(answer, "hello, ada");
//! # Ok(())
//! # }
//! ```

mod context;
mod error;
mod exit;
mod lifecycle;
mod mailbox;
mod pid;
mod pool;
mod process;
mod reply;
mod supervisor;
mod sync;
mod system;
mod timer;
mod upid;

pub use context::Context;
pub use error::{AskError, RemoteError, TellError};
pub use exit::{ExitReason, ProcessId, ProcessRef};
pub use mailbox::MailboxCapacity;
pub use pid::Pid;
pub use pool::{Pool, PoolBuilder, Routing};
pub use process::Process;
pub use reply::{RemoteResponder, Reply};
pub use supervisor::{Restart, Supervised, Supervisor, SupervisorMsg};
pub use system::{ShutdownReport, System, spawn};
pub use timer::TimerHandle;
pub use upid::Upid;
