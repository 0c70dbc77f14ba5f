//! `tell` moves the message into the mailbox: no `Clone` bound, no encoding, no copy.

use muster_actor::{Context, Process, System};
use tokio::sync::oneshot;

use crate::support::Told;

struct Sink;

enum SinkMsg {
    /// Reports where the buffer's bytes live, and how many there are.
    Bytes(Vec<u8>, oneshot::Sender<(usize, usize)>),
    /// Carries a value that cannot be cloned; the handler uses it.
    Callback(oneshot::Sender<u32>),
}

impl Process for Sink {
    type Message = SinkMsg;

    async fn handle(&mut self, msg: SinkMsg, _ctx: &mut Context<Self>) {
        match msg {
            SinkMsg::Bytes(buf, report) => {
                let _ = report.send((buf.as_ptr() as usize, buf.len()));
            }
            SinkMsg::Callback(callback) => {
                let _ = callback.send(42);
            }
        }
    }
}

#[tokio::test]
async fn tell_moves_a_large_buffer_without_copying_it() -> anyhow::Result<()> {
    let system = System::new();
    let sink = system.spawn(Sink);
    let buf = vec![7u8; 1 << 20];
    let sent_from = buf.as_ptr() as usize;
    let (report, arrived) = oneshot::channel();

    sink.tell(SinkMsg::Bytes(buf, report)).told()?;

    let (arrived_at, len) = arrived.await?;
    assert_eq!(
        arrived_at, sent_from,
        "the handler got a copy, not the sent buffer"
    );
    assert_eq!(len, 1 << 20);
    Ok(())
}

#[tokio::test]
async fn tell_delivers_a_message_that_cannot_be_cloned() -> anyhow::Result<()> {
    let system = System::new();
    let sink = system.spawn(Sink);
    let (callback, answer) = oneshot::channel::<u32>();

    sink.tell(SinkMsg::Callback(callback)).told()?;

    assert_eq!(answer.await?, 42);
    Ok(())
}

#[tokio::test]
async fn global_spawn_runs_in_the_global_system() -> anyhow::Result<()> {
    let sink = muster_actor::spawn(Sink);
    let (callback, answer) = oneshot::channel::<u32>();
    sink.tell(SinkMsg::Callback(callback)).told()?;
    assert_eq!(answer.await?, 42);

    // The global system outlives this test's runtime: end the process here.
    sink.terminate();
    assert_eq!(sink.wait().await, muster_actor::ExitReason::Terminated);
    Ok(())
}
