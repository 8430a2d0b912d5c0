//! `rediss://` connections (feature `tls`) against a local `redis-server`
//! listening with TLS on a certificate this test makes itself.
#![cfg(feature = "tls")]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use redwheel::{ErrorKind, Redwheel, RedwheelOptions};
use support::{RedisServer, ScratchDir, within};

const HANG: Duration = Duration::from_secs(60);

/// A CA and a server certificate for `localhost` and `127.0.0.1` signed by
/// it, written as PEM files into `dir`; returns the CA's PEM.
fn make_certificates(dir: &Path) -> String {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "redwheel test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();

    let key = KeyPair::generate().unwrap();
    let mut leaf =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "redwheel test server");
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();

    std::fs::write(dir.join("server.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    ca_cert.pem()
}

/// A server with its plain port (for the test's own checks) and a TLS
/// port on a fresh certificate; returns it, its TLS port, the CA PEM and
/// the certificates' directory (removed when dropped).
fn tls_server() -> (RedisServer, u16, String, ScratchDir) {
    let certs = RedisServer::scratch_dir("tls");
    let ca = make_certificates(&certs);
    let file = |name: &str| certs.join(name).display().to_string();
    let server = RedisServer::with_args(&[
        "--tls-port",
        "{port2}",
        "--tls-cert-file",
        &file("server.crt"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let tls_port = server.port2();
    (server, tls_port, ca, certs)
}

#[test]
fn a_queue_works_over_tls_with_a_trusted_certificate() {
    let (server, tls_port, ca, _certs) = tls_server();
    let rw = Redwheel::connect_with(
        &format!("rediss://127.0.0.1:{tls_port}/"),
        RedwheelOptions::default().tls_root_certificate(ca.into_bytes()),
    )
    .unwrap();
    let q = rw.queue::<String>("tls").unwrap();
    let id = q
        .offer(&"secret".to_string(), Duration::from_millis(20))
        .unwrap();
    let m = within(HANG, move || q.take().unwrap());
    assert_eq!(m.id(), &id);
    assert_eq!(m.payload(), "secret");
    // It really went over the TLS port.
    let clients = server.cmd(&["CLIENT", "LIST"]);
    assert!(
        clients.contains(&format!("laddr=127.0.0.1:{tls_port}")),
        "{clients}"
    );
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn an_untrusted_certificate_is_a_clear_non_transient_error_not_a_retry_loop() {
    let (_server, tls_port, _ca, _certs) = tls_server();
    // Trust another CA than the one that signed the server's certificate.
    let other = RedisServer::scratch_dir("other-ca");
    let other_ca = make_certificates(&other);
    let started = Instant::now();
    let err = Redwheel::connect_with(
        &format!("rediss://127.0.0.1:{tls_port}/"),
        RedwheelOptions::default().tls_root_certificate(other_ca.into_bytes()),
    )
    .unwrap_err();
    eprintln!("refused after {:?}: {err}", started.elapsed());
    assert_eq!(err.kind(), ErrorKind::Tls, "{err:?}");
    assert!(!err.is_transient());
    assert!(
        err.to_string()
            .contains("TLS handshake with redis at 127.0.0.1"),
        "{err}"
    );
}

#[test]
fn plain_redis_on_a_tls_port_and_tls_on_a_plain_port_fail_cleanly() {
    let (server, tls_port, ca, _certs) = tls_server();
    // TLS to a plain port: the server never answers the handshake, which
    // looks like a slow server (so it stays transient), but the message
    // names the likely cause.
    let err = Redwheel::connect_with(
        &format!("rediss://127.0.0.1:{}/", server.port()),
        RedwheelOptions::default()
            .tls_root_certificate(ca.into_bytes())
            .connect_timeout(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(
        err.to_string().contains("does the port serve TLS?"),
        "{err}"
    );
    // Plain text to a TLS port: the server drops the connection.
    let err = Redwheel::connect_with(
        &format!("redis://127.0.0.1:{tls_port}/"),
        RedwheelOptions::default().connect_timeout(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Protocol),
        "{err:?}"
    );
}
