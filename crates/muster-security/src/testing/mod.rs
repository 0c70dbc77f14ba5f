//! The one test helper for TLS and tokens: a throwaway cluster CA per test process, and
//! certificates for any role and name, written as PEM files so that child processes can use
//! them too. And [`partitions`]: proxies between a test cluster's members that it can cut.

pub mod partitions;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Duration;

use crate::certs::{self, CertRequest, PemPair};
use crate::identity::{DEFAULT_CLUSTER, Role};
use crate::tls::{Security, Tls, TlsFiles};

/// A CA and the certificates it issued, in a directory that lives as long as the process (it
/// is removed when the process exits).
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
    ca: PemPair,
    issued: Mutex<HashMap<Issued, TlsFiles>>,
}

/// A certificate the test CA issued: its role, its name and the further hosts it names.
type Issued = (Role, String, Vec<String>);

impl TestPki {
    /// The test process's cluster CA (made on first use).
    ///
    /// # Panics
    /// If the temp dir cannot be written: a test cannot run then.
    pub fn shared() -> &'static TestPki {
        static SHARED: OnceLock<TestPki> = OnceLock::new();
        SHARED.get_or_init(|| TestPki::new("muster-test-pki"))
    }

    /// A second, unrelated CA: its certificates must be refused by the shared one's nodes.
    ///
    /// # Panics
    /// As [`shared`](TestPki::shared).
    pub fn foreign() -> &'static TestPki {
        static FOREIGN: OnceLock<TestPki> = OnceLock::new();
        FOREIGN.get_or_init(|| TestPki::new("muster-foreign-pki"))
    }

    fn new(prefix: &str) -> TestPki {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("a temp dir for test certificates")
            .keep();
        remove_at_exit(dir.clone());
        let ca = certs::create_ca(DEFAULT_CLUSTER, certs::DEFAULT_CA_VALIDITY).expect("a test CA");
        write(&dir.join("ca.pem"), &ca.cert);
        TestPki {
            dir,
            ca,
            issued: Mutex::new(HashMap::new()),
        }
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The CA itself (to issue odd certificates in a test).
    pub fn ca(&self) -> &PemPair {
        &self.ca
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Files for a certificate of `role` issued to `name` (made on first use), valid for
    /// `localhost` and `127.0.0.1`.
    ///
    /// # Panics
    /// If the certificate cannot be made or written.
    pub fn files(&self, role: Role, name: &str) -> TlsFiles {
        self.files_naming(role, name, &[])
    }

    /// As [`files`](Self::files), valid for `hosts` too (another loopback address an agent
    /// listens on: an agent registers only an address its certificate names).
    ///
    /// # Panics
    /// If the certificate cannot be made or written.
    pub fn files_naming(&self, role: Role, name: &str, hosts: &[String]) -> TlsFiles {
        let mut issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        issued
            .entry((role, name.to_owned(), hosts.to_vec()))
            .or_insert_with(|| {
                let pair = certs::issue(
                    &self.ca,
                    &CertRequest {
                        role,
                        name,
                        cluster: DEFAULT_CLUSTER,
                        extra_names: hosts,
                        validity: Duration::from_secs(24 * 3600),
                    },
                )
                .expect("a test certificate");
                let stem = std::iter::once(format!("{role}-{name}"))
                    .chain(hosts.iter().cloned())
                    .collect::<Vec<_>>()
                    .join("-");
                self.write_pair(&stem, &pair)
            })
            .clone()
    }

    /// Writes `pair` as `<stem>.pem` and `<stem>-key.pem`, with this CA.
    ///
    /// # Panics
    /// If the files cannot be written.
    pub fn write_pair(&self, stem: &str, pair: &PemPair) -> TlsFiles {
        let (cert, key) =
            certs::write_pair(&self.dir, stem, pair).expect("write a test certificate");
        TlsFiles {
            ca: self.ca_file(),
            cert,
            key,
        }
    }

    /// The flags that give a `muster-master`, `muster-agent` or example child process the
    /// certificate of `role` and `name`: `--tls-ca CA --tls-cert CERT --tls-key KEY`.
    pub fn args(&self, role: Role, name: &str) -> Vec<std::ffi::OsString> {
        self.args_naming(role, name, &[])
    }

    /// As [`args`](Self::args), for a certificate valid for `hosts` too
    /// ([`files_naming`](Self::files_naming)).
    pub fn args_naming(&self, role: Role, name: &str, hosts: &[String]) -> Vec<std::ffi::OsString> {
        let files = self.files_naming(role, name, hosts);
        vec![
            "--tls-ca".into(),
            files.ca.into_os_string(),
            "--tls-cert".into(),
            files.cert.into_os_string(),
            "--tls-key".into(),
            files.key.into_os_string(),
        ]
    }

    /// Loaded TLS for `role` and `name`.
    ///
    /// # Panics
    /// If the material does not load.
    pub fn tls(&self, role: Role, name: &str) -> Tls {
        Tls::load(self.files(role, name), DEFAULT_CLUSTER).expect("test TLS material loads")
    }

    /// [`Security::Tls`] for `role` and `name`.
    pub fn security(&self, role: Role, name: &str) -> Security {
        self.security_naming(role, name, &[])
    }

    /// [`Security::Tls`] for `role` and `name`, with a certificate valid for `hosts` too
    /// ([`files_naming`](Self::files_naming)).
    ///
    /// # Panics
    /// If the material does not load.
    pub fn security_naming(&self, role: Role, name: &str, hosts: &[String]) -> Security {
        Security::Tls(
            Tls::load(self.files_naming(role, name, hosts), DEFAULT_CLUSTER)
                .expect("test TLS material loads"),
        )
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write a test certificate");
}

/// The directories [`TestPki`]s made, removed when the process exits: a `static` is never
/// dropped, and a test run would otherwise leave one directory per test binary behind.
static REMOVE_AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes `dir` (and what is in it) when the process exits normally, as a test binary does
/// once its tests ran.
fn remove_at_exit(dir: PathBuf) {
    static REGISTERED: Once = Once::new();
    REMOVE_AT_EXIT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(dir);
    REGISTERED.call_once(|| {
        // SAFETY: `remove_registered` is a plain `extern "C"` function that neither unwinds
        // (it catches nothing that can panic: `remove_dir_all` answers errors) nor calls
        // `exit`; registering it has no other precondition.
        let _ = unsafe { libc::atexit(remove_registered) };
    });
}

/// Removes the directories registered with [`remove_at_exit`].
extern "C" fn remove_registered() {
    let dirs = std::mem::take(&mut *REMOVE_AT_EXIT.lock().unwrap_or_else(|p| p.into_inner()));
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}
