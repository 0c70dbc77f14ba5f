//! Where the broker writes evaluation status changes: a [`RegistryWriter`], one call per
//! registry write, made for the leading master's registrar by [`registrar_writer`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use muster_actor::Pid;
use muster_registry::{Op, Registrar, RegistrarMsg, WriteError};

/// Where the broker writes evaluation status changes (cancellations, failures): one call is
/// one registry write. [`registrar_writer`] makes one for the leading master's registrar.
#[derive(Clone)]
pub struct RegistryWriter {
    write: Arc<dyn Fn(Op) -> WriteFuture + Send + Sync>,
}

/// The future a [`RegistryWriter`] returns: `Err` names why the write failed.
pub type WriteFuture = Pin<Box<dyn Future<Output = Result<(), WriteError>> + Send>>;

impl RegistryWriter {
    /// A writer calling `write` for each registry write.
    pub fn new(write: impl Fn(Op) -> WriteFuture + Send + Sync + 'static) -> Self {
        RegistryWriter {
            write: Arc::new(write),
        }
    }

    pub(super) fn write(&self, op: Op) -> WriteFuture {
        (self.write)(op)
    }
}

impl fmt::Debug for RegistryWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryWriter").finish_non_exhaustive()
    }
}

/// A [`RegistryWriter`] through `registrar`, so the writes share raft entries with the
/// master's other registry writes.
pub fn registrar_writer(registrar: Pid<Registrar>) -> RegistryWriter {
    RegistryWriter::new(move |op| {
        let registrar = registrar.clone();
        Box::pin(async move {
            match registrar.ask(|r| RegistrarMsg::Write(op, r)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(WriteError::Failed(format!("registrar unavailable: {e}"))),
            }
        })
    })
}
