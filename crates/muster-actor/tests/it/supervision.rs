//! Supervision: one-for-one restarts within a limit, and the supervisor's end past it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use muster_actor::{
    Context, ExitReason, Pid, Process, Reply, Restart, Supervised, Supervisor, SupervisorMsg,
    System,
};

use crate::support::{Told, Watcher};

/// A child that answers with its generation: how many instances its factory had made.
struct Child {
    generation: usize,
}

enum ChildMsg {
    Generation(Reply<usize>),
    Panic,
    Stop,
}

impl Process for Child {
    type Message = ChildMsg;

    async fn handle(&mut self, msg: ChildMsg, ctx: &mut Context<Self>) {
        match msg {
            ChildMsg::Generation(reply) => reply.send(self.generation),
            ChildMsg::Panic => panic!("child failed"),
            ChildMsg::Stop => ctx.stop(),
        }
    }
}

/// Adds a child whose instances count their generation from 1.
fn add_child(supervisor: &mut Supervisor, name: &str, restart: Restart) -> Supervised<Child> {
    let made = Arc::new(AtomicUsize::new(0));
    supervisor.child(name, restart, move || Child {
        generation: made.fetch_add(1, Ordering::SeqCst) + 1,
    })
}

/// Spawns the supervisor and waits until it has started its children.
async fn start(system: &System, supervisor: Supervisor) -> anyhow::Result<Pid<Supervisor>> {
    let supervisor = system.spawn(supervisor);
    // `started` (which starts the children) runs before the first message.
    assert_eq!(supervisor.ask(SupervisorMsg::Restarts).await?, 0);
    Ok(supervisor)
}

fn current(child: &Supervised<Child>) -> Pid<Child> {
    child
        .pid()
        .expect("the supervisor has started its children")
}

/// Makes the child's current process panic and waits for it to end.
async fn crash(child: &Supervised<Child>) -> anyhow::Result<()> {
    let pid = current(child);
    pid.tell(ChildMsg::Panic).told()?;
    assert!(matches!(pid.wait().await, ExitReason::Panicked(_)));
    Ok(())
}

#[tokio::test]
async fn a_panicking_child_is_restarted_and_its_siblings_are_untouched() -> anyhow::Result<()> {
    let system = System::new();
    let mut supervisor = Supervisor::new(3, Duration::from_secs(10));
    let flaky = add_child(&mut supervisor, "flaky", Restart::Permanent);
    let steady = add_child(&mut supervisor, "steady", Restart::Transient);
    let supervisor = start(&system, supervisor).await?;
    let first = current(&flaky);
    let sibling = current(&steady);

    crash(&flaky).await?;

    // The exit notice reached the supervisor before this ask.
    assert_eq!(supervisor.ask(SupervisorMsg::Restarts).await?, 1);
    let second = current(&flaky);
    assert_ne!(second.id(), first.id());
    assert_eq!(second.ask(ChildMsg::Generation).await?, 2);
    assert_eq!(current(&steady), sibling);
    assert_eq!(sibling.ask(ChildMsg::Generation).await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_transient_child_is_restarted_after_a_panic_but_not_after_a_normal_stop()
-> anyhow::Result<()> {
    let system = System::new();
    let mut supervisor = Supervisor::new(3, Duration::from_secs(10));
    let child = add_child(&mut supervisor, "transient", Restart::Transient);
    let supervisor = start(&system, supervisor).await?;

    crash(&child).await?;
    assert_eq!(supervisor.ask(SupervisorMsg::Restarts).await?, 1);
    let restarted = current(&child);
    assert_eq!(restarted.ask(ChildMsg::Generation).await?, 2);

    restarted.tell(ChildMsg::Stop).told()?;
    assert_eq!(restarted.wait().await, ExitReason::Normal);

    assert_eq!(supervisor.ask(SupervisorMsg::Restarts).await?, 1);
    assert_eq!(current(&child), restarted, "a normal stop was restarted");
    assert!(supervisor.is_alive());
    Ok(())
}

#[tokio::test]
async fn past_the_restart_limit_the_supervisor_fails() -> anyhow::Result<()> {
    let system = System::new();
    let mut supervisor = Supervisor::new(2, Duration::from_secs(10));
    let flaky = add_child(&mut supervisor, "flaky", Restart::Permanent);
    let steady = add_child(&mut supervisor, "steady", Restart::Permanent);
    let supervisor = start(&system, supervisor).await?;
    let (watcher, mut exits) = Watcher::new();
    let watcher = system.spawn(watcher);
    let watched = supervisor.clone();
    watcher.dispatch(move |_, ctx| ctx.link(&watched)).await?;

    crash(&flaky).await?;
    crash(&flaky).await?;
    assert_eq!(supervisor.ask(SupervisorMsg::Restarts).await?, 2);
    crash(&flaky).await?;

    let reason = supervisor.wait().await;
    assert!(
        matches!(&reason, ExitReason::Failed(why) if why.contains("flaky")),
        "{reason:?}"
    );
    assert_eq!(exits.recv().await, Some((supervisor.process_ref(), reason)));
    // Giving up stops the other children too, and restarts no one.
    assert_eq!(current(&steady).wait().await, ExitReason::Terminated);
    assert_eq!(
        current(&flaky).exit_reason().map(|r| r.is_normal()),
        Some(false)
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn restarts_spread_beyond_the_window_are_all_allowed() -> anyhow::Result<()> {
    let system = System::new();
    let mut supervisor = Supervisor::new(1, Duration::from_secs(1));
    let flaky = add_child(&mut supervisor, "flaky", Restart::Permanent);
    let supervisor = start(&system, supervisor).await?;

    for restarts in 1..=4 {
        crash(&flaky).await?;
        assert_eq!(supervisor.ask(SupervisorMsg::Restarts).await?, restarts);
        let generation = current(&flaky).ask(ChildMsg::Generation).await?;
        assert_eq!(generation as u64, restarts + 1);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert!(supervisor.is_alive());
    Ok(())
}
