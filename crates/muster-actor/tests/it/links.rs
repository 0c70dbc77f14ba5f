//! Links: a process hears, through `exited`, how a process it linked to ended.

use muster_actor::{Context, ExitReason, Pid, Process, ProcessRef, Reply, System};
use tokio::sync::mpsc;

use crate::support::{Told, Watcher, WatcherMsg};

struct Target;

enum TargetMsg {
    Stop,
    Panic,
}

impl Process for Target {
    type Message = TargetMsg;

    async fn handle(&mut self, msg: TargetMsg, ctx: &mut Context<Self>) {
        match msg {
            TargetMsg::Stop => ctx.stop(),
            TargetMsg::Panic => panic!("boom"),
        }
    }
}

/// Links `watcher` to `target` from inside the watcher.
async fn link(watcher: &Pid<Watcher>, target: &Pid<Target>) -> anyhow::Result<()> {
    let target = target.clone();
    watcher.dispatch(move |_, ctx| ctx.link(&target)).await?;
    Ok(())
}

#[tokio::test]
async fn a_linked_process_hears_a_normal_stop() -> anyhow::Result<()> {
    let system = System::new();
    let (watcher, mut exits) = Watcher::new();
    let watcher = system.spawn(watcher);
    let target = system.spawn(Target);
    link(&watcher, &target).await?;

    target.tell(TargetMsg::Stop).told()?;

    assert_eq!(target.wait().await, ExitReason::Normal);
    let (who, reason) = exits.recv().await.expect("watcher is alive");
    assert_eq!(who, ProcessRef::Local(target.id()));
    assert_eq!(who, target.process_ref());
    assert_eq!(reason, ExitReason::Normal);
    Ok(())
}

#[tokio::test]
async fn a_linked_process_hears_a_panic_and_lives_on() -> anyhow::Result<()> {
    let system = System::new();
    let (watcher, mut exits) = Watcher::new();
    let watcher = system.spawn(watcher);
    let target = system.spawn(Target);
    link(&watcher, &target).await?;

    target.tell(TargetMsg::Panic).told()?;

    match target.wait().await {
        ExitReason::Panicked(message) => assert!(message.contains("boom"), "{message:?}"),
        other => panic!("expected a panic, got {other:?}"),
    }
    let (who, reason) = exits.recv().await.expect("watcher is alive");
    assert_eq!(who, ProcessRef::Local(target.id()));
    assert!(
        matches!(&reason, ExitReason::Panicked(message) if message.contains("boom")),
        "{reason:?}"
    );
    // The panic ended the target only.
    assert_eq!(watcher.ask(WatcherMsg::Ping).await?, 1);
    assert!(watcher.is_alive());
    Ok(())
}

#[tokio::test]
async fn a_linked_process_hears_a_termination() -> anyhow::Result<()> {
    let system = System::new();
    let (watcher, mut exits) = Watcher::new();
    let watcher = system.spawn(watcher);
    let target = system.spawn(Target);
    link(&watcher, &target).await?;

    target.terminate();

    assert_eq!(target.wait().await, ExitReason::Terminated);
    let (who, reason) = exits.recv().await.expect("watcher is alive");
    assert_eq!(who, ProcessRef::Local(target.id()));
    assert_eq!(reason, ExitReason::Terminated);
    Ok(())
}

#[tokio::test]
async fn linking_to_an_ended_process_notifies_at_once() -> anyhow::Result<()> {
    let system = System::new();
    let (watcher, mut exits) = Watcher::new();
    let watcher = system.spawn(watcher);
    let target = system.spawn(Target);
    target.tell(TargetMsg::Stop).told()?;
    assert_eq!(target.wait().await, ExitReason::Normal);

    link(&watcher, &target).await?;

    // The notice was queued while the link was made, so it is handled before this ping.
    assert_eq!(watcher.ask(WatcherMsg::Ping).await?, 1);
    let (who, reason) = exits.try_recv()?;
    assert_eq!(who, ProcessRef::Local(target.id()));
    assert_eq!(reason, ExitReason::Normal);
    Ok(())
}

/// Links to its target in `started`, before its first message, and forwards what it hears.
struct EagerWatcher {
    target: Pid<Target>,
    exits: mpsc::UnboundedSender<(ProcessRef, ExitReason)>,
}

impl Process for EagerWatcher {
    type Message = Reply<()>;

    async fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.link(&self.target);
    }

    async fn handle(&mut self, reply: Reply<()>, _ctx: &mut Context<Self>) {
        reply.send(());
    }

    fn exited(&mut self, who: ProcessRef, reason: ExitReason, _ctx: &mut Context<Self>) {
        let _ = self.exits.send((who, reason));
    }
}

#[tokio::test]
async fn a_link_made_in_started_reports_the_end() -> anyhow::Result<()> {
    let system = System::new();
    let target = system.spawn(Target);
    let (exits, mut heard) = mpsc::unbounded_channel();
    let watcher = system.spawn(EagerWatcher {
        target: target.clone(),
        exits,
    });
    // `started` has run once the first message is answered.
    watcher.ask(|reply| reply).await?;

    target.tell(TargetMsg::Stop).told()?;

    assert_eq!(target.wait().await, ExitReason::Normal);
    assert_eq!(
        heard.recv().await,
        Some((target.process_ref(), ExitReason::Normal))
    );
    Ok(())
}

/// Ends on its first message.
struct OneShot;

impl Process for OneShot {
    type Message = ();

    async fn handle(&mut self, (): (), ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// Once `wait()` returns, the linked process's notice is queued: a message sent to it afterwards
/// is handled after the notice. Worker threads make the race visible: before `finish` ran the
/// watchers ahead of the waiters, a few percent of rounds saw the notice arrive late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_notice_is_queued_before_wait_returns() -> anyhow::Result<()> {
    let system = System::new();
    let (watcher, _exits) = Watcher::new();
    let watcher = system.spawn(watcher);

    for round in 1..=500 {
        let target = system.spawn(OneShot);
        let linked = target.clone();
        watcher.dispatch(move |_, ctx| ctx.link(&linked)).await?;
        target.tell(()).told()?;
        assert_eq!(target.wait().await, ExitReason::Normal);

        assert_eq!(
            watcher.ask(WatcherMsg::Ping).await?,
            round,
            "round {round}: the notice arrived after the next message"
        );
    }
    Ok(())
}
