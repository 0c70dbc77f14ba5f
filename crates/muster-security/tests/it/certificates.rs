//! Certificates made by `certs` carry the role and name `identity` reads, and load as TLS
//! material only with a key that matches.

use std::time::Duration;

use muster_security::certs::{self, CertRequest};
use muster_security::testing::TestPki;
use muster_security::{DEFAULT_CLUSTER, IdentityError, Peer, Role, Tls, TlsError};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

fn leaf(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate")
}

#[test]
fn an_issued_certificate_names_its_role_and_node() {
    let pki = TestPki::shared();
    for role in Role::ALL {
        let pair = certs::issue(
            pki.ca(),
            &CertRequest {
                role,
                name: "node-7",
                cluster: DEFAULT_CLUSTER,
                extra_names: &["10.1.2.3".to_owned(), "node-7.example".to_owned()],
                validity: Duration::from_secs(3600),
            },
        )
        .expect("issued");
        let peer = Peer::from_certificate(&leaf(&pair.cert), DEFAULT_CLUSTER).expect("identity");
        assert_eq!((peer.role, peer.name.as_str()), (role, "node-7"));
        for host in [
            "10.1.2.3",
            "node-7.example",
            "NODE-7.example",
            "127.0.0.1",
            "localhost",
        ] {
            assert!(peer.proves_host(host), "{host} in {:?}", peer.hosts);
        }
        for host in ["10.1.2.4", "node-8.example", "", "::1"] {
            assert!(!peer.proves_host(host), "{host} in {:?}", peer.hosts);
        }
        assert!(matches!(
            Peer::from_certificate(&leaf(&pair.cert), "other"),
            Err(IdentityError::NoRole { .. })
        ));
    }
}

#[test]
fn a_role_outside_the_accepted_ones_is_named_in_the_error() {
    let peer = Peer::named(Role::Agent, "a");
    let error = peer.expect(&[Role::Master]).expect_err("wrong role");
    assert_eq!(
        error.to_string(),
        "a certificate of role agent cannot be used here (expected master)"
    );
}

#[test]
fn material_with_a_key_of_another_certificate_is_refused() {
    let pki = TestPki::shared();
    let master = pki.files(Role::Master, "m1");
    let agent = pki.files(Role::Agent, "a1");
    let mixed = muster_security::TlsFiles {
        key: agent.key,
        ..master.clone()
    };
    assert!(matches!(
        Tls::load(mixed, DEFAULT_CLUSTER),
        Err(TlsError::Config(_))
    ));
    let missing = muster_security::TlsFiles {
        ca: pki.dir().join("no-such-ca.pem"),
        ..master.clone()
    };
    let error = Tls::load(missing, DEFAULT_CLUSTER).expect_err("no CA file");
    assert!(error.to_string().contains("no-such-ca.pem"), "{error}");
    let tls = Tls::load(master, DEFAULT_CLUSTER).expect("loads");
    assert_eq!(tls.identity().role, Role::Master);
    tls.reload().expect("reloads");
}
