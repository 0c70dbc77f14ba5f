//! Network partitions for tests: a TCP proxy for each ordered pair of a test cluster's
//! members, which the test cuts and heals.
//!
//! Member `from` is told to reach member `to` at the address of the link
//! [`Partitions::link`] returns; the link forwards to `to`'s real address. A cut pair is a
//! black hole, as a real partition is: connections stay open and carry nothing, new ones are
//! accepted and hear nothing, so each end notices only by its own timeouts and keepalives. At
//! the heal, every connection that lived through the cut is closed (its bytes are lost
//! mid-stream), and new ones carry traffic again.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A member of the test cluster, by the number the test gives it.
pub type Member = u64;

/// The cuts in force: pairs of members, smaller first, that cannot reach each other.
type Cuts = BTreeSet<(Member, Member)>;

fn pair(a: Member, b: Member) -> (Member, Member) {
    (a.min(b), a.max(b))
}

/// The links of one test cluster, and which of them are cut.
#[derive(Clone, Debug)]
pub struct Partitions {
    cuts: Arc<watch::Sender<Cuts>>,
    /// Connections held silent by a cut right now.
    held: Arc<watch::Sender<usize>>,
}

impl Default for Partitions {
    fn default() -> Self {
        Self::new()
    }
}

impl Partitions {
    /// No links yet, nothing cut.
    pub fn new() -> Self {
        Partitions {
            cuts: Arc::new(watch::Sender::new(Cuts::new())),
            held: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Starts the link that carries `from`'s connections to `to`, listening on a free port
    /// of `host` (a loopback address) and forwarding to `target`; its address (`host:port`).
    /// It runs until the test process ends.
    ///
    /// # Errors
    /// The error binding `host`.
    pub async fn link(
        &self,
        from: Member,
        to: Member,
        host: &str,
        target: String,
    ) -> io::Result<String> {
        let listener = TcpListener::bind((host, 0)).await?;
        let address = listener.local_addr()?.to_string();
        let cuts = self.cuts.subscribe();
        let held = Arc::clone(&self.held);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let link = pair(from, to);
                let carried = carry(client, target.clone(), link, cuts.clone(), held.clone());
                tokio::spawn(carried);
            }
        });
        Ok(address)
    }

    /// Cuts `a` and `b` apart, both ways.
    pub fn cut(&self, a: Member, b: Member) {
        self.cuts.send_modify(|cuts| {
            cuts.insert(pair(a, b));
        });
    }

    /// Cuts `member` from every one of `others`.
    pub fn isolate(&self, member: Member, others: impl IntoIterator<Item = Member>) {
        for other in others {
            if other != member {
                self.cut(member, other);
            }
        }
    }

    /// Ends every cut.
    pub fn heal(&self) {
        self.cuts.send_modify(Cuts::clear);
    }

    /// Waits until at least `count` connections are held silent by cuts: the test's sign that
    /// a cut has taken hold of the connections it expects.
    pub async fn held_at_least(&self, count: usize) {
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|held| *held >= count).await;
    }
}

/// Counts a connection held silent while it lives.
struct Held(Arc<watch::Sender<usize>>);

impl Held {
    fn new(held: Arc<watch::Sender<usize>>) -> Self {
        held.send_modify(|n| *n += 1);
        Held(held)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Carries one connection of `link` until it closes, or, if the link is cut, holds it silent
/// until the heal and then closes it.
async fn carry(
    mut client: TcpStream,
    target: String,
    link: (Member, Member),
    mut cuts: watch::Receiver<Cuts>,
    held: Arc<watch::Sender<usize>>,
) {
    let is_cut = move |cuts: &Cuts| cuts.contains(&link);
    if !is_cut(&cuts.borrow_and_update()) {
        let Ok(mut server) = TcpStream::connect(&target).await else {
            return;
        };
        let _ = server.set_nodelay(true);
        let _ = client.set_nodelay(true);
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
            _ = cuts.wait_for(|c| is_cut(c)) => {}
        }
        // Cut while carrying: `server` is held silent with `client`, and closed at the heal.
        let _held = Held::new(held);
        let _ = cuts.wait_for(|c| !is_cut(c)).await;
        drop(server);
        return;
    }
    let _held = Held::new(held);
    let _ = cuts.wait_for(|c| !is_cut(c)).await;
    drop(client);
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_cut_link_carries_nothing_and_a_healed_one_carries_new_connections() -> io::Result<()>
    {
        let echo = TcpListener::bind("127.0.0.1:0").await?;
        let target = echo.local_addr()?.to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        let partitions = Partitions::new();
        let link = partitions.link(1, 2, "127.0.0.1", target).await?;
        let mut before = TcpStream::connect(&link).await?;
        let mut byte = [0u8; 1];
        before.write_all(b"a").await?;
        before.read_exact(&mut byte).await?;
        assert_eq!(&byte, b"a");

        partitions.cut(2, 1);
        // The old connection and a new one both hear nothing while the cut lasts: the echo of
        // a byte sent now is not there by the time a later, healed connection's echo is.
        before.write_all(b"b").await?;
        let mut during = TcpStream::connect(&link).await?;
        during.write_all(b"c").await?;
        partitions.held_at_least(2).await;
        partitions.heal();
        let mut after = TcpStream::connect(&link).await?;
        after.write_all(b"d").await?;
        after.read_exact(&mut byte).await?;
        assert_eq!(&byte, b"d");
        // Both connections that lived through the cut are closed (reset, if the bytes sent
        // during the cut were never read), their bytes unanswered.
        for (name, stream) in [("before", &mut before), ("during", &mut during)] {
            let read = stream.read(&mut byte).await;
            assert!(
                matches!(read, Ok(0)) || read.is_err(),
                "{name}: {read:?} {byte:?}"
            );
        }
        Ok(())
    }
}
