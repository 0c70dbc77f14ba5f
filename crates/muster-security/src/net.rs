//! How a Muster process reaches the network: the one seam between its code and TCP.
//!
//! Every listener ([`bind`]) and every outgoing connection ([`connect`]) of the actor
//! transport, raft and the APIs goes through the process's [`Network`]. By default that is
//! [`Tcp`], the operating system's TCP with `TCP_NODELAY` (small request/response traffic
//! otherwise stalls on Nagle's algorithm). A deterministic simulation installs its own network
//! once, before anything connects ([`install`]), and the same code then runs over simulated
//! links that it can partition, delay and cut.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use futures_core::Stream;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::codegen::http::Uri;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A boxed future, as the [`Network`] trait returns them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A byte stream a [`Connection`] can carry.
pub trait Io: AsyncRead + AsyncWrite + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + 'static> Io for T {}

/// Where connections come from and go to.
pub trait Network: Send + Sync + fmt::Debug + 'static {
    /// Listens on `address` (port 0 picks a free one).
    fn bind(&self, address: SocketAddr) -> BoxFuture<'static, io::Result<Listener>>;

    /// Connects to `host:port`; `host` is a name or an IP address.
    fn connect(&self, host: String, port: u16) -> BoxFuture<'static, io::Result<Connection>>;
}

/// Accepts the connections of one [`Listener`].
pub trait Accept: Send + 'static {
    /// The next connection.
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Connection>>;
}

/// A bound listening socket of some [`Network`].
pub struct Listener {
    local: SocketAddr,
    accept: Box<dyn Accept>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .finish()
    }
}

impl Listener {
    /// A listener bound to `local` that hands out what `accept` accepts.
    pub fn new(local: SocketAddr, accept: impl Accept) -> Self {
        Listener {
            local,
            accept: Box::new(accept),
        }
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next connection.
    ///
    /// # Errors
    /// The network's accept error (out of file descriptors, a simulated host gone).
    pub async fn accept(&mut self) -> io::Result<Connection> {
        self.accept.accept().await
    }

    /// Every accepted connection, as tonic's `serve_with_incoming` takes them; an accept
    /// error is passed on (tonic logs it and goes on accepting).
    pub fn incoming(self) -> impl Stream<Item = io::Result<Connection>> + Send + 'static {
        futures_util::stream::unfold(self, |mut listener| async move {
            let next = listener.accept().await;
            Some((next, listener))
        })
    }
}

/// One established connection, with both ends' addresses (tonic hands them to services as
/// [`TcpConnectInfo`], and through TLS with the peer's certificates).
pub struct Connection {
    io: Pin<Box<dyn Io>>,
    info: TcpConnectInfo,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.info.local_addr)
            .field("remote", &self.info.remote_addr)
            .finish()
    }
}

impl Connection {
    /// A connection over `io` between `local` and `remote`.
    pub fn new(io: impl Io, local: Option<SocketAddr>, remote: Option<SocketAddr>) -> Self {
        Connection {
            io: Box::pin(io),
            info: TcpConnectInfo {
                local_addr: local,
                remote_addr: remote,
            },
        }
    }

    /// The other end's address.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.info.remote_addr
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

/// The operating system's TCP, with `TCP_NODELAY` on every connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tcp;

struct TcpAccept(tokio::net::TcpListener);

impl Accept for TcpAccept {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Connection>> {
        Box::pin(async move {
            let (stream, remote) = self.0.accept().await?;
            tcp_connection(stream, Some(remote))
        })
    }
}

fn tcp_connection(
    stream: tokio::net::TcpStream,
    remote: Option<SocketAddr>,
) -> io::Result<Connection> {
    stream.set_nodelay(true)?;
    let local = stream.local_addr().ok();
    let remote = remote.or_else(|| stream.peer_addr().ok());
    Ok(Connection::new(stream, local, remote))
}

impl Network for Tcp {
    fn bind(&self, address: SocketAddr) -> BoxFuture<'static, io::Result<Listener>> {
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind(address).await?;
            let local = listener.local_addr()?;
            Ok(Listener::new(local, TcpAccept(listener)))
        })
    }

    fn connect(&self, host: String, port: u16) -> BoxFuture<'static, io::Result<Connection>> {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp_connection(stream, None)
        })
    }
}

static NETWORK: OnceLock<Arc<dyn Network>> = OnceLock::new();

/// The network this process uses: [`Tcp`] unless [`install`] chose another.
pub fn network() -> &'static Arc<dyn Network> {
    NETWORK.get_or_init(|| Arc::new(Tcp))
}

/// Why [`install`] refused.
#[derive(Debug, thiserror::Error)]
#[error("the process's network is already chosen: install one before anything listens or connects")]
pub struct AlreadyChosen;

/// Makes `network` this process's network. Call it once, first thing: a simulation does,
/// before it starts its hosts.
///
/// # Errors
/// [`AlreadyChosen`] if a network was installed, or used, before.
pub fn install(network: Arc<dyn Network>) -> Result<(), AlreadyChosen> {
    NETWORK.set(network).map_err(|_| AlreadyChosen)
}

/// Listens on `address` on this process's network.
///
/// # Errors
/// The network's bind error (the port is in use, the address is not this host's).
pub async fn bind(address: SocketAddr) -> io::Result<Listener> {
    network().bind(address).await
}

/// Connects to `host:port` on this process's network.
///
/// # Errors
/// The network's connect error (refused, unreachable).
pub async fn connect(host: &str, port: u16) -> io::Result<Connection> {
    network().connect(host.to_owned(), port).await
}

/// Where a connector should connect for `uri`: its host (without IPv6 brackets) and port.
pub(crate) fn host_and_port(uri: &Uri) -> Result<(String, u16), BoxError> {
    let host = uri.host().ok_or("the address has no host")?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().ok_or("the address has no port")?;
    Ok((host, port))
}

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Makes plaintext connections on this process's network for a tonic client
/// (`Endpoint::connect_with_connector`): what `--insecure` uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainConnector;

impl tower_service::Service<Uri> for PlainConnector {
    type Response = TokioIo<Connection>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<TokioIo<Connection>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(async move {
            let (host, port) = host_and_port(&uri)?;
            Ok(TokioIo::new(connect(&host, port).await?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn tcp_connections_carry_bytes_and_both_addresses() -> io::Result<()> {
        let mut listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let local = listener.local_addr();
        assert_ne!(local.port(), 0, "port 0 picks a free port");
        let server = tokio::spawn(async move {
            let mut accepted = listener.accept().await?;
            let remote = accepted.remote_addr();
            let mut buf = [0u8; 5];
            accepted.read_exact(&mut buf).await?;
            accepted.write_all(&buf).await?;
            Ok::<_, io::Error>((remote, buf))
        });
        let mut client = connect("127.0.0.1", local.port()).await?;
        assert_eq!(client.connect_info().remote_addr, Some(local));
        client.write_all(b"hello").await?;
        let mut echoed = [0u8; 5];
        client.read_exact(&mut echoed).await?;
        let (remote, received) = server.await.map_err(io::Error::other)??;
        assert_eq!(&received, b"hello");
        assert_eq!(&echoed, b"hello");
        assert_eq!(remote, client.connect_info().local_addr);
        Ok(())
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_error() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0");
            listener
                .ok()
                .and_then(|l| l.local_addr().ok())
                .map(|a| a.port())
        };
        if let Some(port) = port {
            assert!(connect("127.0.0.1", port).await.is_err());
        }
    }

    #[test]
    fn a_network_cannot_be_installed_once_one_is_in_use() {
        let _ = network();
        assert!(install(Arc::new(Tcp)).is_err());
    }
}
