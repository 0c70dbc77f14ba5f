//! A panic ends the process that panicked and nothing else.

use muster_actor::{Context, ExitReason, Process, Reply, System};

use crate::support::Told;

struct Fragile {
    answers: u32,
}

enum FragileMsg {
    Panic,
    Ping(Reply<u32>),
}

impl Process for Fragile {
    type Message = FragileMsg;

    async fn handle(&mut self, msg: FragileMsg, _ctx: &mut Context<Self>) {
        match msg {
            FragileMsg::Panic => panic!("fragile gave up"),
            FragileMsg::Ping(reply) => {
                self.answers += 1;
                reply.send(self.answers);
            }
        }
    }
}

#[tokio::test]
async fn a_panic_in_one_process_leaves_an_unrelated_one_running() -> anyhow::Result<()> {
    let system = System::new();
    let doomed = system.spawn(Fragile { answers: 0 });
    let bystander = system.spawn(Fragile { answers: 0 });
    assert_eq!(bystander.ask(FragileMsg::Ping).await?, 1);
    assert_eq!(system.len(), 2);

    doomed.tell(FragileMsg::Panic).told()?;

    assert_eq!(
        doomed.wait().await,
        ExitReason::Panicked("fragile gave up".to_owned())
    );
    assert_eq!(bystander.ask(FragileMsg::Ping).await?, 2);
    assert!(bystander.is_alive());
    assert_eq!(system.len(), 1);
    Ok(())
}
