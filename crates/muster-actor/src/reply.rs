//! [`Reply`]: the answering half of an ask, carried inside the request message, and how a
//! process's local answers are held until it yields.
//!
//! Answering a local asker wakes its task; when that task's thread is parked, the wake is a
//! system call. A process working through a backlog of asks from a parked asker would pay
//! one per answer. So while a process works through a batch of messages with more of it
//! queued, its local answers are held, and sent together when it reaches the batch's last
//! message, when its task yields (the budget ran out, or a handler awaits), or once the first
//! has been held for [`HOLD_AT_MOST`]: one wake for many answers, an answer is never held
//! past the moment its process stops running, and a lone ask is answered at once.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Answers one request. Put it in your message enum (`Get(Reply<u64>)`); the handler calls
/// [`send`](Reply::send) once. Dropping it unanswered makes the asker's call fail with
/// [`AskError::NoReply`](crate::AskError::NoReply).
pub struct Reply<T> {
    to: ReplyTo<T>,
}

enum ReplyTo<T> {
    Local(oneshot::Sender<T>),
    Remote(Box<dyn RemoteResponder<T>>),
}

/// Sends an answer back over a transport; dropping it unanswered should tell the asker that
/// no answer comes ([`Reply::remote`] wraps one).
pub trait RemoteResponder<T>: Send {
    /// Sends `value` to the asker.
    fn respond(self: Box<Self>, value: T);
}

impl<T> Reply<T> {
    pub(crate) fn local() -> (Self, oneshot::Receiver<T>) {
        let (tx, rx) = oneshot::channel();
        (
            Reply {
                to: ReplyTo::Local(tx),
            },
            rx,
        )
    }

    /// A reply that answers through `responder`: how a transport hands a local process an ask
    /// that came from another node.
    pub fn remote(responder: Box<dyn RemoteResponder<T>>) -> Self {
        Reply {
            to: ReplyTo::Remote(responder),
        }
    }

    /// Sends the answer. If the asker has given up (timed out or gone), the value is dropped.
    ///
    /// From a process's handler with more messages queued behind this one, a local answer is
    /// held until the process reaches the last of them or yields, for at most 500 µs: a
    /// process working through a backlog wakes its askers once for many answers.
    pub fn send(self, value: T)
    where
        T: 'static,
    {
        match self.to {
            ReplyTo::Local(tx) => hold_or_send(move || {
                let _ = tx.send(value);
            }),
            ReplyTo::Remote(responder) => responder.respond(value),
        }
    }

    /// True if the asker has already given up, so the work to answer can be skipped.
    /// Always false for a remote asker.
    pub fn is_closed(&self) -> bool {
        match &self.to {
            ReplyTo::Local(tx) => tx.is_closed(),
            ReplyTo::Remote(_) => false,
        }
    }
}

impl<T> fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let to = match self.to {
            ReplyTo::Local(_) => "local",
            ReplyTo::Remote(_) => "remote",
        };
        f.debug_struct("Reply").field("to", &to).finish()
    }
}

/// The longest a process holds a local answer while it goes on handling messages.
pub(crate) const HOLD_AT_MOST: Duration = Duration::from_micros(500);

thread_local! {
    /// Polls of process tasks under way on this thread (one, unless a poll nests another).
    static POLLS: Cell<usize> = const { Cell::new(0) };
    /// Whether the message being handled has more queued behind it.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
    /// Local answers held on this thread, in order.
    static HELD: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
    /// When the first of `HELD` was held; `None` while nothing is.
    static SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// [`HOLD_AT_MOST`], but in tests of the bound.
    static LIMIT: Cell<Duration> = const { Cell::new(HOLD_AT_MOST) };
}

/// Runs `send` now, or holds it if a process task on this thread is handling a message with
/// more queued behind it.
fn hold_or_send(send: impl FnOnce() + 'static) {
    if !HOLDING.get() {
        send();
        return;
    }
    if SINCE.get().is_none() {
        SINCE.set(Some(Instant::now()));
    }
    HELD.with_borrow_mut(|held| held.push(Box::new(send)));
}

/// Before a process handles its next envelope: holds its answers if `more_queued`, else
/// sends what is held now (the batch's last message may take long).
pub(crate) fn hold_answers(more_queued: bool) {
    HOLDING.set(more_queued);
    if !more_queued {
        send_held();
    }
}

/// Sends what is held on this thread, if the first of it was held [`HOLD_AT_MOST`] ago.
pub(crate) fn send_held_if_due() {
    if SINCE
        .get()
        .is_some_and(|since| since.elapsed() >= LIMIT.get())
    {
        send_held();
    }
}

/// Sends what is held on this thread, in the order it was held.
fn send_held() {
    if SINCE.take().is_none() {
        return;
    }
    // Taken out first: a wake may run code that answers in turn.
    let sends = HELD.with_borrow_mut(std::mem::take);
    for send in sends {
        send();
    }
}

/// Marks a poll of a process task on this thread; when the outermost ends (even by a panic),
/// what was held is sent.
pub(crate) struct HoldingAnswers(());

impl HoldingAnswers {
    /// Starts a poll of a process task.
    pub(crate) fn begin() -> Self {
        POLLS.set(POLLS.get() + 1);
        HoldingAnswers(())
    }
}

impl Drop for HoldingAnswers {
    fn drop(&mut self) {
        let polls = POLLS.get() - 1;
        POLLS.set(polls);
        HOLDING.set(false);
        if polls == 0 {
            send_held();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use tokio::sync::oneshot;

    use super::{LIMIT, Reply};
    use crate::{Context, Process};

    /// Sets how long answers may be held on this thread.
    fn hold_at_most_on_this_thread(limit: Duration) {
        LIMIT.set(limit);
    }

    type Answer = Arc<Mutex<oneshot::Receiver<usize>>>;

    /// Answers asks, and notes whether the answer before each had reached its asker by then.
    #[derive(Default)]
    struct Answerer {
        answered: usize,
        earlier_delivered: Vec<bool>,
    }

    enum Msg {
        Answer(Reply<usize>, Option<Answer>),
        /// Works (on the thread, as a slow handler would) for this long.
        Work(Duration),
        AnswerThenWait(Reply<usize>, oneshot::Receiver<()>),
        Report(Reply<Vec<bool>>),
    }

    impl Process for Answerer {
        type Message = Msg;
        async fn handle(&mut self, msg: Msg, _ctx: &mut Context<Self>) {
            match msg {
                Msg::Answer(reply, earlier) => {
                    if let Some(earlier) = earlier {
                        let delivered = earlier.lock().expect("lock").try_recv().is_ok();
                        self.earlier_delivered.push(delivered);
                    }
                    reply.send(self.answered);
                    self.answered += 1;
                }
                Msg::Work(how_long) => {
                    let started = Instant::now();
                    while started.elapsed() < how_long {
                        std::hint::spin_loop();
                    }
                }
                Msg::AnswerThenWait(reply, go_on) => {
                    reply.send(self.answered);
                    let _ = go_on.await;
                }
                Msg::Report(reply) => reply.send(std::mem::take(&mut self.earlier_delivered)),
            }
        }
    }

    /// Queues an ask for an answer; returns where the answer arrives.
    fn ask_answer(pid: &crate::Pid<Answerer>, earlier: Option<&Answer>) -> Answer {
        let (reply, answer) = Reply::local();
        let queued = pid.tell(Msg::Answer(reply, earlier.cloned()));
        assert!(queued.is_ok(), "the answerer runs");
        Arc::new(Mutex::new(answer))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn answers_to_a_backlog_of_asks_reach_their_askers_together_once_it_is_worked_through() {
        hold_at_most_on_this_thread(Duration::from_secs(3600));
        let pid = crate::spawn(Answerer::default());
        // Queued before the process first runs: one backlog, worked through in one poll.
        let mut answers: Vec<Answer> = Vec::new();
        for _ in 0..10 {
            let answer = ask_answer(&pid, answers.last());
            answers.push(answer);
        }
        let delivered_while_working = pid.ask(Msg::Report).await.expect("report");
        assert_eq!(delivered_while_working, vec![false; 9]);
        for (n, answer) in answers.iter().enumerate() {
            assert_eq!(answer.lock().expect("lock").try_recv(), Ok(n));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_held_for_its_limit_is_sent_while_the_process_works_on() {
        let limit = Duration::from_millis(1);
        hold_at_most_on_this_thread(limit);
        let pid = crate::spawn(Answerer::default());
        let first = ask_answer(&pid, None);
        assert!(pid.tell(Msg::Work(2 * limit)).is_ok());
        ask_answer(&pid, Some(&first));
        let delivered = pid.ask(Msg::Report).await.expect("report");
        assert_eq!(delivered, vec![true]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_handler_that_awaits_after_answering_has_sent_its_answer() {
        hold_at_most_on_this_thread(Duration::from_secs(3600));
        let pid = crate::spawn(Answerer::default());
        let (reply, answer) = Reply::local();
        let (go_on, wait) = oneshot::channel();
        assert!(pid.tell(Msg::AnswerThenWait(reply, wait)).is_ok());
        // Queued behind it, so that its answer is held.
        let after = ask_answer(&pid, None);
        // The handler waits for this very answer to be read: held past its poll, it never is.
        let answer = tokio::time::timeout(Duration::from_secs(30), answer)
            .await
            .expect("the answer arrives while its handler awaits");
        assert_eq!(answer, Ok(0));
        assert!(go_on.send(()).is_ok());
        assert_eq!(
            pid.ask(Msg::Report).await.expect("report"),
            Vec::<bool>::new()
        );
        assert_eq!(after.lock().expect("lock").try_recv(), Ok(0));
    }
}
