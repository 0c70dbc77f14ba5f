//! Who is on the other end of a Muster connection, and what they may do.
//!
//! - [`identity`]: the role a certificate carries (`master.<cluster>.muster`,
//!   `agent.<cluster>.muster`, `client.<cluster>.muster`) and the name of the node it was
//!   issued to.
//! - [`tls`]: mutual TLS for every listener and client (rustls with the ring provider),
//!   reloadable without a restart; [`Security`] is the one switch between it and `--insecure`.
//! - [`net`]: the process's network (TCP, or a simulation's), under every listener and
//!   client.
//! - [`certs`]: a cluster CA and role certificates, as `muster tls` writes them.
//! - [`acl`]: ACL tokens; [`policy`]: the policies they carry, rules per namespace, agents,
//!   registry and scheduling, resolved into an [`Acl`]; [`guard`]: the tonic layer that checks
//!   a caller's certificate role and token against a table declared where a service is
//!   installed.
//! - `testing` (feature `testing`): one throwaway CA and its certificates for tests.

pub mod acl;
pub mod certs;
pub mod guard;
pub mod identity;
pub mod net;
pub mod policy;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use acl::{AclToken, Caller, Permission, TokenSecret, TokenTable, TokenType};
pub use guard::{Guarded, Requirement, Rules, TokenSource, token_caller};
pub use identity::{DEFAULT_CLUSTER, IdentityError, Peer, Role};
pub use policy::{Access, Acl, Capability, Policy, PolicyError};
pub use tls::{Security, Tls, TlsError, TlsFiles};
