//! Muster's network seam, filled with turmoil's simulated TCP.
//!
//! turmoil listens only on the unspecified address, so a host binds `0.0.0.0:port` and its
//! listener reports the address the host asked for (its own simulated IP), which is what it
//! advertises to its peers.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use muster_security::net::{Accept, BoxFuture, Connection, Listener, Network};

/// turmoil's TCP, for every host of the simulation running on the calling thread.
#[derive(Debug)]
pub(crate) struct Simulated;

struct SimulatedAccept(turmoil::net::TcpListener);

impl Accept for SimulatedAccept {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Connection>> {
        Box::pin(async move {
            let (stream, remote) = self.0.accept().await?;
            let local = stream.local_addr().ok();
            Ok(Connection::new(stream, local, Some(remote)))
        })
    }
}

impl Network for Simulated {
    fn bind(&self, address: SocketAddr) -> BoxFuture<'static, io::Result<Listener>> {
        Box::pin(async move {
            let listener =
                turmoil::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, address.port())).await?;
            let port = listener.local_addr()?.port();
            let local = SocketAddr::new(address.ip(), port);
            Ok(Listener::new(local, SimulatedAccept(listener)))
        })
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<'static, io::Result<Connection>> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            let local = stream.local_addr().ok();
            let remote = stream.peer_addr().ok();
            Ok(Connection::new(stream, local, remote))
        })
    }
}
