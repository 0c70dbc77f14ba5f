//! `dispatch` runs a closure on the process's state, in mailbox order.

use muster_actor::{Context, Process, Reply, System};

use crate::support::Told;

#[derive(Default)]
struct Counter {
    total: u64,
    /// Every value added, in the order handled.
    log: Vec<u64>,
}

enum CounterMsg {
    Add(u64),
    Total(Reply<u64>),
}

impl Process for Counter {
    type Message = CounterMsg;

    async fn handle(&mut self, msg: CounterMsg, _ctx: &mut Context<Self>) {
        match msg {
            CounterMsg::Add(n) => {
                self.total += n;
                self.log.push(n);
            }
            CounterMsg::Total(reply) => reply.send(self.total),
        }
    }
}

#[tokio::test]
async fn dispatch_runs_a_closure_on_the_state_and_returns_its_result() -> anyhow::Result<()> {
    let system = System::new();
    let counter = system.spawn(Counter::default());
    let id = counter.id();

    let (seen_id, doubled) = counter
        .dispatch(|counter, ctx| {
            counter.total = 21;
            (ctx.id(), counter.total * 2)
        })
        .await?;

    assert_eq!(seen_id, id);
    assert_eq!(doubled, 42);
    // The closure changed the process's own state.
    assert_eq!(counter.ask(CounterMsg::Total).await?, 21);
    Ok(())
}

#[tokio::test]
async fn messages_told_before_a_dispatch_are_handled_before_it() -> anyhow::Result<()> {
    let system = System::new();
    let counter = system.spawn(Counter::default());
    for n in 1..=100 {
        counter.tell(CounterMsg::Add(n)).told()?;
    }

    let (total, log) = counter
        .dispatch(|counter, _| (counter.total, counter.log.clone()))
        .await?;

    assert_eq!(total, 5050);
    assert_eq!(log, (1..=100).collect::<Vec<_>>());
    Ok(())
}
