//! Mutual TLS on every Muster link: the cluster CA verifies both ends, each end's
//! certificate carries its role, and the material reloads without a restart.
//!
//! [`Tls`] holds the loaded material behind a swappable pointer: [`Tls::reload`] reads the
//! files again (the binaries call it on SIGHUP), and every handshake after that uses the new
//! certificate. [`incoming`] accepts TLS connections for a tonic server; [`Connector`]
//! makes them for a tonic client and reports the [`Peer`] it reached.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::codegen::http::Uri;

use crate::identity::{IdentityError, Peer, Role};
use crate::net::{self, BoxError, Connection, Listener, PlainConnector};

/// How long a peer has to finish its TLS handshake before the server drops the connection.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a node's TLS material lives: the cluster CA's certificate, and this node's
/// certificate and private key, all PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA certificate (`--tls-ca`, `MUSTER_CACERT`).
    pub ca: PathBuf,
    /// This node's certificate (`--tls-cert`, `MUSTER_CLIENT_CERT`).
    pub cert: PathBuf,
    /// Its private key (`--tls-key`, `MUSTER_CLIENT_KEY`).
    pub key: PathBuf,
}

/// Why TLS material could not be loaded or a TLS connection made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which file (`CA certificate`, `certificate`, `private key`).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the expected kind.
    #[error("{path} is not a PEM {what}: {reason}")]
    Pem {
        /// What it should hold.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the material (a key that does not match its certificate, say).
    #[error("the TLS material cannot be used: {0}")]
    Config(String),
    /// This node's own certificate carries no usable role.
    #[error("the certificate {path} cannot identify this node: {source}")]
    OwnIdentity {
        /// The certificate.
        path: PathBuf,
        /// Why.
        source: IdentityError,
    },
}

/// The material as loaded: configs ready for handshakes, and who this node is.
struct Loaded {
    server: Arc<ServerConfig>,
    /// For HTTP ports (API, UI, metrics): a client certificate is verified if presented but
    /// not required (browsers and scrapers authenticate with tokens), and HTTP/1.1 is offered
    /// beside HTTP/2.
    web: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    own: Peer,
}

/// A node's TLS material, reloadable. Cheap to clone; clones share the material.
#[derive(Clone)]
pub struct Tls {
    files: Arc<TlsFiles>,
    cluster: Arc<str>,
    loaded: Arc<RwLock<Arc<Loaded>>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .field("cluster", &self.cluster)
            .field("identity", &self.identity())
            .finish()
    }
}

impl Tls {
    /// Loads `files` for a node of `cluster`.
    ///
    /// # Errors
    /// [`TlsError`] naming the file and what is wrong with it.
    pub fn load(files: TlsFiles, cluster: &str) -> Result<Tls, TlsError> {
        let loaded = load(&files, cluster)?;
        Ok(Tls {
            files: Arc::new(files),
            cluster: Arc::from(cluster),
            loaded: Arc::new(RwLock::new(Arc::new(loaded))),
        })
    }

    /// Reads the files again; new handshakes use the new material. On error the old material
    /// stays in use.
    ///
    /// # Errors
    /// As [`load`](Tls::load).
    pub fn reload(&self) -> Result<(), TlsError> {
        let loaded = load(&self.files, &self.cluster)?;
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
        Ok(())
    }

    /// The files this material is read from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The cluster this node belongs to.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Who this node's own certificate says it is.
    pub fn identity(&self) -> Peer {
        self.current().own.clone()
    }

    fn current(&self) -> Arc<Loaded> {
        Arc::clone(&self.loaded.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The role and name of a peer from the certificate chain a server saw.
    ///
    /// # Errors
    /// [`IdentityError`] if there is no certificate or it names no role.
    pub fn peer_of(&self, chain: Option<&[CertificateDer<'_>]>) -> Result<Peer, IdentityError> {
        let leaf = chain
            .and_then(|c| c.first())
            .ok_or(IdentityError::NoCertificate)?;
        Peer::from_certificate(leaf, &self.cluster)
    }

    /// A connector for a tonic client that accepts servers of the `accepted` roles.
    pub fn connector(&self, accepted: &[Role]) -> Connector {
        Connector {
            tls: self.clone(),
            accepted: accepted.to_vec().into(),
            reached: Arc::new(Mutex::new(None)),
        }
    }

    /// A TLS handshake as a server on an accepted TCP connection.
    ///
    /// # Errors
    /// The handshake's error (including the client's certificate refused).
    pub async fn accept(
        &self,
        connection: Connection,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<Connection>> {
        let acceptor = TlsAcceptor::from(Arc::clone(&self.current().server));
        acceptor.accept(connection).await
    }

    /// A TLS handshake as an HTTP server (API, UI, metrics) on an accepted TCP connection:
    /// the server proves itself with this node's certificate; a client certificate is
    /// verified against the cluster CA if one is presented, and not required.
    ///
    /// # Errors
    /// The handshake's error.
    pub async fn accept_web(
        &self,
        connection: Connection,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<Connection>> {
        let acceptor = TlsAcceptor::from(Arc::clone(&self.current().web));
        acceptor.accept(connection).await
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let pem = read("private key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        what: "private key",
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load(files: &TlsFiles, cluster: &str) -> Result<Loaded, TlsError> {
    let ca = certificates("CA certificate", &files.ca)?;
    let chain = certificates("certificate", &files.cert)?;
    let key = private_key(&files.key)?;
    let own =
        Peer::from_certificate(&chain[0], cluster).map_err(|source| TlsError::OwnIdentity {
            path: files.cert.clone(),
            source,
        })?;
    let mut roots = RootCertStore::empty();
    for cert in ca {
        roots
            .add(cert)
            .map_err(|e| TlsError::Config(format!("CA certificate {}: {e}", files.ca.display())))?;
    }
    let roots = Arc::new(roots);
    let config = |e: rustls::Error| TlsError::Config(e.to_string());

    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config)?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(config)?;
    server.alpn_protocols = vec![b"h2".to_vec()];

    let optional_client =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut web = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config)?
        .with_client_cert_verifier(optional_client)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(config)?;
    web.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

    let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(RoleVerifier {
            inner: server_verifier,
            names: Role::ALL
                .iter()
                .filter_map(|r| ServerName::try_from(r.dns_name(cluster)).ok())
                .collect(),
        }))
        .with_client_auth_cert(chain, key)
        .map_err(config)?;
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Loaded {
        server: Arc::new(server),
        web: Arc::new(web),
        client: Arc::new(client),
        own,
    })
}

/// Verifies a server's chain against the cluster CA and that it is valid for one of the
/// cluster's role names, whatever address was dialled (the role, not the address, is what
/// a Muster certificate proves). Which role is checked after the handshake.
#[derive(Debug)]
struct RoleVerifier {
    inner: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for RoleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut last = rustls::Error::General("no role name to verify".into());
        for name in &self.names {
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
            {
                Ok(verified) => return Ok(verified),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// TLS connections accepted on `listener`, for `tonic`'s `serve_with_incoming`. Handshakes
/// run concurrently, each within [`HANDSHAKE_TIMEOUT`]; a client that fails its handshake
/// (plaintext, a certificate from another CA, expired) is dropped with a log line and the
/// server goes on serving the others.
pub fn incoming(
    listener: Listener,
    tls: Tls,
) -> impl futures_core::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<Connection>>>
+ Send
+ 'static {
    accept_all(listener, tls, false)
}

/// As [`incoming`], for an HTTP port: handshakes as [`Tls::accept_web`] makes them (no
/// client certificate required; HTTP/1.1 and HTTP/2).
pub fn incoming_web(
    listener: Listener,
    tls: Tls,
) -> impl futures_core::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<Connection>>>
+ Send
+ 'static {
    accept_all(listener, tls, true)
}

fn accept_all(
    mut listener: Listener,
    tls: Tls,
    web: bool,
) -> impl futures_core::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<Connection>>>
+ Send
+ 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let connection = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(connection) => connection,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little, keep serving.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = sender.closed() => return,
            };
            let from = connection
                .remote_addr()
                .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
            let tls = tls.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                let handshake = async {
                    if web {
                        tls.accept_web(connection).await
                    } else {
                        tls.accept(connection).await
                    }
                };
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(stream)) => {
                        let _ = sender.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(peer = %from, error = %e, "TLS handshake refused");
                    }
                    Err(_) => {
                        tracing::warn!(peer = %from, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// Makes TLS connections for a tonic client (`Endpoint::connect_with_connector`): verifies
/// the server's chain and that its role is one of those accepted, and presents this node's
/// certificate. [`reached`](Connector::reached) tells who the last connection reached.
#[derive(Clone, Debug)]
pub struct Connector {
    tls: Tls,
    accepted: Arc<[Role]>,
    reached: Arc<Mutex<Option<Peer>>>,
}

impl Connector {
    /// Who the last connection made by this connector (or a clone) reached.
    pub fn reached(&self) -> Option<Peer> {
        self.reached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

type ConnectFuture = Pin<
    Box<
        dyn Future<Output = Result<TokioIo<tokio_rustls::client::TlsStream<Connection>>, BoxError>>
            + Send,
    >,
>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<Connection>>;
    type Error = BoxError;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (host, port) = net::host_and_port(&uri)?;
            let tcp = net::connect(&host, port).await?;
            let loaded = this.tls.current();
            // The name only selects SNI; the verifier checks the role names.
            let name = ServerName::try_from(Role::Master.dns_name(this.tls.cluster()))?;
            let stream = TlsConnector::from(Arc::clone(&loaded.client))
                .connect(name, tcp)
                .await?;
            let peer = this
                .tls
                .peer_of(stream.get_ref().1.peer_certificates())?
                .expect(&this.accepted)?;
            *this.reached.lock().unwrap_or_else(|p| p.into_inner()) = Some(peer);
            Ok(TokioIo::new(stream))
        })
    }
}

/// Whether a node uses TLS: the one switch every listener and client reads.
#[derive(Clone, Debug)]
pub enum Security {
    /// Mutual TLS with the cluster CA, roles and (on the APIs) tokens.
    Tls(Tls),
    /// Plaintext, no roles, no tokens: only with `--insecure`, for local experiments.
    Insecure,
}

impl Security {
    /// The TLS material, unless insecure.
    pub fn tls(&self) -> Option<&Tls> {
        match self {
            Security::Tls(tls) => Some(tls),
            Security::Insecure => None,
        }
    }

    /// Whether this is `--insecure`.
    pub fn is_insecure(&self) -> bool {
        matches!(self, Security::Insecure)
    }

    /// A tonic channel to `endpoint` that accepts servers of the `accepted` roles,
    /// connecting on first use; plaintext when insecure.
    pub fn lazy_channel(
        &self,
        endpoint: tonic::transport::Endpoint,
        accepted: &[Role],
    ) -> tonic::transport::Channel {
        match self {
            Security::Tls(tls) => endpoint.connect_with_connector_lazy(tls.connector(accepted)),
            Security::Insecure => endpoint.connect_with_connector_lazy(PlainConnector),
        }
    }

    /// A tonic channel to `endpoint`, connected now, and who it reached (`None` when
    /// insecure).
    ///
    /// # Errors
    /// tonic's connection error: unreachable, refused handshake, wrong role.
    pub async fn channel(
        &self,
        endpoint: tonic::transport::Endpoint,
        accepted: &[Role],
    ) -> Result<(tonic::transport::Channel, Option<Peer>), tonic::transport::Error> {
        match self {
            Security::Tls(tls) => {
                let connector = tls.connector(accepted);
                let channel = endpoint.connect_with_connector(connector.clone()).await?;
                Ok((channel, connector.reached()))
            }
            Security::Insecure => {
                Ok((endpoint.connect_with_connector(PlainConnector).await?, None))
            }
        }
    }
}
