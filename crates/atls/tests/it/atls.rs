//! aTLS over real sockets on loopback: real TLS 1.3, real gRPC, real Ed25519 signatures.

use crate::common::{CLIENT_SEED, SERVER_SEED, issuer, validator_for};
use asterism_atls::attestation::test_ed25519::{InsecureTestIssuer, InsecureTestValidator};
use asterism_atls::attestation::{IssueError, ReportData};
use asterism_atls::wire::{self, Hello};
use asterism_atls::{
    AtlsConfig, AtlsConnector, AtlsError, AtlsServer, Issuer, Validator, verified_peer,
};
use asterism_proto::kms::api_client::ApiClient;
use asterism_proto::kms::api_server::{Api, ApiServer};
use asterism_proto::kms::{GetDataKeyRequest, GetDataKeyResponse};
use asterism_testkit::net::{closed_within, tcp_from};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Endpoint;

/// A handler that answers with the identity of the verified peer (or "none") and counts
/// its calls.
#[derive(Clone, Default)]
struct Echo {
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Api for Echo {
    async fn get_data_key(
        &self,
        request: tonic::Request<GetDataKeyRequest>,
    ) -> Result<tonic::Response<GetDataKeyResponse>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let who = match verified_peer(&request) {
            Ok(p) => p.evidence().identity().to_string(),
            Err(_) => "none".into(),
        };
        Ok(tonic::Response::new(GetDataKeyResponse {
            data_key: who.into_bytes(),
        }))
    }

    async fn get_control_plane_identity(
        &self,
        _request: tonic::Request<asterism_proto::kms::GetControlPlaneIdentityRequest>,
    ) -> Result<tonic::Response<asterism_proto::kms::GetControlPlaneIdentityResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented("data keys only"))
    }
}

/// Starts a gRPC server behind aTLS on 127.0.0.1:0.
async fn serve(cfg: AtlsConfig) -> (String, Echo) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = AtlsServer::new(cfg).unwrap();
    let echo = Echo::default();
    let svc = ApiServer::new(echo.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(server.incoming(listener))
            .await
            .unwrap();
    });
    (format!("http://{addr}"), echo)
}

async fn call(uri: &str, connector: AtlsConnector) -> Result<String, tonic::Status> {
    let channel = Endpoint::from_shared(uri.to_string())
        .unwrap()
        .connect_with_connector(connector)
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{e:?}")))?;
    let resp = ApiClient::new(channel)
        .get_data_key(GetDataKeyRequest {
            data_key_id: "x".into(),
            length: 32,
        })
        .await?;
    Ok(String::from_utf8(resp.into_inner().data_key).unwrap())
}

fn hex_key(seed: [u8; 32]) -> String {
    issuer(seed)
        .public_key()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn grpc_call_over_one_way_atls_where_the_client_attests() {
    let (uri, echo) = serve(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED))).unwrap();
    let who = call(&uri, connector.clone()).await.unwrap();
    assert_eq!(
        who,
        hex_key(CLIENT_SEED),
        "handler sees the verified client"
    );
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
    assert!(connector.last_verified_peer().is_none());
}

#[tokio::test]
async fn grpc_call_over_one_way_atls_where_the_server_attests() {
    let (uri, _) = serve(AtlsConfig::attesting(issuer(SERVER_SEED))).await;
    let connector = AtlsConnector::new(AtlsConfig::verifying(validator_for(SERVER_SEED))).unwrap();
    let who = call(&uri, connector.clone()).await.unwrap();
    assert_eq!(who, "none", "server does not verify clients in this mode");
    let peer = connector
        .last_verified_peer()
        .expect("client verified the server");
    assert_eq!(peer.evidence().identity(), hex_key(SERVER_SEED));
}

#[tokio::test]
async fn grpc_call_over_mutual_atls() {
    let (uri, echo) = serve(
        AtlsConfig::attesting(issuer(SERVER_SEED)).with_validator(validator_for(CLIENT_SEED)),
    )
    .await;
    let connector = AtlsConnector::new(
        AtlsConfig::attesting(issuer(CLIENT_SEED)).with_validator(validator_for(SERVER_SEED)),
    )
    .unwrap();
    assert_eq!(
        call(&uri, connector.clone()).await.unwrap(),
        hex_key(CLIENT_SEED)
    );
    assert_eq!(
        connector
            .last_verified_peer()
            .unwrap()
            .evidence()
            .identity(),
        hex_key(SERVER_SEED)
    );
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn failed_validation_fails_the_rpc_and_the_handler_never_runs() {
    let (uri, echo) = serve(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    // Signed by a key the server does not trust.
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer([0x99; 32]))).unwrap();
    let err = call(&uri, connector).await.unwrap_err();
    assert!(
        matches!(
            err.code(),
            tonic::Code::Unavailable | tonic::Code::PermissionDenied
        ),
        "{err:?}"
    );
    // The client learns why from the server's verdict.
    let direct = AtlsConnector::new(AtlsConfig::attesting(issuer([0x99; 32]))).unwrap();
    let e = direct
        .connect_tcp(uri.trim_start_matches("http://"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, AtlsError::RefusedByPeer { code: wire::VerdictCode::Rejected, ref reason } if reason.contains("untrusted")),
        "{e:?}"
    );
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_client_that_does_not_attest_is_refused_by_a_verifying_server() {
    let (uri, echo) = serve(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    // This client only verifies; it has nothing to present.
    let connector = AtlsConnector::new(AtlsConfig::verifying(validator_for(SERVER_SEED))).unwrap();
    let e = connector
        .connect_tcp(uri.trim_start_matches("http://"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, AtlsError::NoIssuer | AtlsError::Closed),
        "{e:?}"
    );
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
}

/// Wraps the real issuer and keeps a copy of every piece of evidence it produced.
struct Recording {
    inner: Arc<InsecureTestIssuer>,
    seen: Mutex<Vec<Vec<u8>>>,
}

impl Issuer for Recording {
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn issue(&self, rd: &ReportData) -> Result<Vec<u8>, IssueError> {
        let ev = self.inner.issue(rd)?;
        self.seen.lock().unwrap().push(ev.clone());
        Ok(ev)
    }
}

/// Ignores the report data and presents evidence captured earlier.
struct Replaying(Vec<u8>);

impl Issuer for Replaying {
    fn variant(&self) -> &'static str {
        asterism_atls::attestation::test_ed25519::VARIANT
    }
    fn issue(&self, _rd: &ReportData) -> Result<Vec<u8>, IssueError> {
        Ok(self.0.clone())
    }
}

#[tokio::test]
async fn evidence_replayed_on_another_connection_is_rejected() {
    let (uri, echo) = serve(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let recording = Arc::new(Recording {
        inner: issuer(CLIENT_SEED),
        seen: Mutex::new(Vec::new()),
    });
    let honest = AtlsConnector::new(AtlsConfig::attesting(recording.clone())).unwrap();
    call(&uri, honest).await.unwrap();
    let captured = recording.seen.lock().unwrap().pop().unwrap();

    let replayer =
        AtlsConnector::new(AtlsConfig::attesting(Arc::new(Replaying(captured)))).unwrap();
    let e = replayer
        .connect_tcp(uri.trim_start_matches("http://"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, AtlsError::RefusedByPeer { code: wire::VerdictCode::Rejected, ref reason } if reason.contains("bound to other report data")),
        "{e:?}"
    );
    assert_eq!(
        echo.calls.load(Ordering::SeqCst),
        1,
        "only the honest call ran"
    );
}

/// A raw TLS 1.3 server speaking the aTLS frames by hand, for attacks the real server
/// would never make.
async fn raw_tls_server() -> (std::net::SocketAddr, tokio_rustls::TlsAcceptor, TcpListener) {
    let cfg = asterism_testkit::tls_server::self_signed_h2_config("x").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    (
        listener.local_addr().unwrap(),
        tokio_rustls::TlsAcceptor::from(Arc::new(cfg)),
        listener,
    )
}

#[tokio::test]
async fn client_evidence_reflected_by_the_server_is_rejected() {
    // The client trusts its own key too, so only the role label can stop the reflection.
    let (addr, acceptor, listener) = raw_tls_server().await;
    let attacker = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        let hello = wire::read_hello(&mut tls).await.unwrap();
        assert!(hello.sends_evidence());
        let frame = wire::read_evidence(&mut tls, 1 << 16).await.unwrap();
        let mut out = hello_frame(wire::VERSION, wire::FLAG_SENDS_EVIDENCE);
        wire::encode_evidence(&mut out, &frame.variant, &frame.evidence).unwrap();
        tls.write_all(&out).await.unwrap();
        tls.flush().await.unwrap();
        // Hold the connection until the client gives up.
        let mut sink = Vec::new();
        let _ = tls.read_to_end(&mut sink).await;
        sink
    });
    let trusted = Arc::new(InsecureTestValidator::new([
        issuer(CLIENT_SEED).public_key()
    ]));
    let connector =
        AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED)).with_validator(trusted))
            .unwrap();
    let e = connector.connect_tcp(&addr.to_string()).await.unwrap_err();
    assert!(
        matches!(
            e,
            AtlsError::Rejected(asterism_atls::ValidationError::BindingMismatch)
        ),
        "{e:?}"
    );
    // The client told the attacker why, in a REJECTED verdict, and sent no application data.
    let rest = attacker.await.unwrap();
    assert_eq!(rest.first(), Some(&wire::FRAME_VERDICT));
    assert_eq!(rest.get(5), Some(&(wire::VerdictCode::Rejected as u8)));
    let frame_len = 5 + u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
    assert_eq!(rest.len(), frame_len, "nothing follows the verdict");
}

/// An encoded HELLO frame, for the tests that speak the wire protocol by hand.
fn hello_frame(version: u8, flags: u8) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_hello(&mut out, Hello { version, flags }).unwrap();
    out
}

/// A raw TLS 1.3 client for attacks the real connector would never make.
async fn raw_tls_client(
    addr: std::net::SocketAddr,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
    raw_tls_client_alpn(addr, versions, vec![b"h2".to_vec()]).await
}

/// [`raw_tls_client`] offering `alpn` instead of `h2`.
async fn raw_tls_client_alpn(
    addr: std::net::SocketAddr,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: Vec<Vec<u8>>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
    let tcp = TcpStream::connect(addr).await?;
    asterism_testkit::tls::connect_over(tcp, versions, alpn).await
}

async fn single_accept(
    cfg: AtlsConfig,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<Result<(), AtlsError>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = AtlsServer::new(cfg).unwrap();
    let task = tokio::spawn(async move {
        let (tcp, peer) = listener.accept().await.unwrap();
        server.accept(tcp, Some(peer)).await.map(|_| ())
    });
    (addr, task)
}

#[tokio::test]
async fn an_oversized_frame_closes_the_connection_without_allocating_it() {
    let (addr, server) = single_accept(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let mut out = hello_frame(wire::VERSION, wire::FLAG_SENDS_EVIDENCE);
    // An EVIDENCE header claiming 3 GiB, with no payload behind it. A server that
    // allocated and waited for the payload would sit here until its deadline instead.
    out.extend_from_slice(&[wire::FRAME_EVIDENCE, 0xc0, 0, 0, 0]);
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();

    let result = server.await.unwrap();
    assert!(
        matches!(
            result,
            Err(AtlsError::FrameTooLarge {
                claimed: 0xc000_0000,
                cap: asterism_atls::DEFAULT_MAX_FRAME_LEN
            })
        ),
        "{result:?}"
    );
    // The server answered with a protocol-error verdict and closed.
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert_eq!(rest.first(), Some(&wire::FRAME_HELLO));
    let verdict = &rest[7..];
    assert_eq!(verdict.first(), Some(&wire::FRAME_VERDICT));
    assert_eq!(
        verdict.get(5),
        Some(&(wire::VerdictCode::ProtocolError as u8))
    );
}

#[tokio::test]
async fn a_configured_frame_cap_is_enforced() {
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED)).with_max_frame_len(1024);
    let (addr, server) = single_accept(cfg).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let mut out = hello_frame(wire::VERSION, wire::FLAG_SENDS_EVIDENCE);
    wire::encode_evidence(&mut out, "insecure-test-ed25519", &[0u8; 1100]).unwrap();
    tls.write_all(&out).await.unwrap();
    let result = server.await.unwrap();
    assert!(
        matches!(result, Err(AtlsError::FrameTooLarge { cap: 1024, .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_peer_that_never_sends_evidence_is_cut_off_at_the_deadline() {
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_exchange_timeout(Duration::from_millis(300));
    let (addr, server) = single_accept(cfg).await;
    // Completes the TLS handshake, then stays silent.
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let result = server.await.unwrap();
    assert!(
        matches!(
            result,
            Err(AtlsError::Timeout {
                stage: "attestation exchange",
                ..
            })
        ),
        "{result:?}"
    );
    // The server speaks only after the client's HELLO: the silent client got nothing but
    // the end of the connection.
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn a_silent_peer_during_the_tls_handshake_is_cut_off_too() {
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_handshake_timeout(Duration::from_millis(300));
    let (addr, server) = single_accept(cfg).await;
    let _tcp = TcpStream::connect(addr).await.unwrap();
    let result = server.await.unwrap();
    assert!(
        matches!(
            result,
            Err(AtlsError::Timeout {
                stage: "TLS handshake",
                ..
            })
        ),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_tls12_only_client_is_refused() {
    let (addr, server) = single_accept(AtlsConfig::attesting(issuer(SERVER_SEED))).await;
    let client = raw_tls_client(addr, &[&rustls::version::TLS12]).await;
    assert!(client.is_err(), "TLS 1.2 handshake must fail");
    let result = server.await.unwrap();
    assert!(
        matches!(
            result,
            Err(AtlsError::Tls(rustls::Error::PeerIncompatible(_)))
        ),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_peer_speaking_another_version_is_refused() {
    let (addr, server) = single_accept(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let out = hello_frame(0, 0);
    tls.write_all(&out).await.unwrap();
    let result = server.await.unwrap();
    assert!(
        matches!(result, Err(AtlsError::UnsupportedVersion(0))),
        "{result:?}"
    );
    // The refusal is a VERDICT in place of the server's HELLO.
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert_eq!(rest.first(), Some(&wire::FRAME_VERDICT), "{rest:?}");
    assert_eq!(
        rest.get(5),
        Some(&(wire::VerdictCode::UnsupportedVersion as u8))
    );
}

#[tokio::test]
async fn a_newer_client_is_answered_with_version_1() {
    // A client that names version 2 (and a flag version 1 does not know) and then waits
    // for the server's choice, as the negotiation rule says.
    let (addr, server) = single_accept(AtlsConfig::attesting(issuer(SERVER_SEED))).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let out = hello_frame(2, wire::FLAG_REQUIRES_EVIDENCE | 0x80);
    tls.write_all(&out).await.unwrap();
    let hello = wire::read_hello(&mut tls).await.unwrap();
    assert_eq!(hello.version, 1);
    assert!(hello.sends_evidence());
    // Under version 1 the exchange continues: the server's evidence, then it waits for
    // the client's verdict.
    let ev = wire::read_evidence(&mut tls, 1 << 16).await.unwrap();
    let verified = validator_for(SERVER_SEED).validate(
        &ev.evidence,
        &ReportData::atls(asterism_atls::Role::Server, &exporter_of(tls.get_ref().1)),
    );
    assert!(verified.is_ok(), "{verified:?}");
    let mut out = Vec::new();
    wire::encode_verdict(&mut out, wire::VerdictCode::Accepted, "").unwrap();
    tls.write_all(&out).await.unwrap();
    assert!(server.await.unwrap().is_ok());
}

fn exporter_of(conn: &rustls::ClientConnection) -> [u8; 32] {
    let mut e = [0u8; 32];
    conn.export_keying_material(&mut e, asterism_atls::EXPORTER_LABEL, Some(&[]))
        .unwrap();
    e
}

#[tokio::test]
async fn a_side_with_neither_issuer_nor_validator_is_a_configuration_error() {
    assert!(matches!(
        AtlsServer::new(AtlsConfig::default()),
        Err(AtlsError::Config(_))
    ));
    assert!(matches!(
        AtlsConnector::new(AtlsConfig::default()),
        Err(AtlsError::Config(_))
    ));
}

/// Sends HELLO(SENDS_EVIDENCE) and one EVIDENCE frame of exactly `payload_len` payload
/// bytes to a verifying server; returns the server's result and the verdict code it sent.
async fn send_evidence_of_payload_len(payload_len: usize) -> (Result<(), AtlsError>, Option<u8>) {
    let (addr, server) = single_accept(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let variant = asterism_atls::attestation::test_ed25519::VARIANT;
    let mut out = hello_frame(wire::VERSION, wire::FLAG_SENDS_EVIDENCE);
    let evidence = vec![0u8; payload_len - 1 - variant.len()];
    wire::encode_evidence(&mut out, variant, &evidence).unwrap();
    assert_eq!(out.len(), 7 + 5 + payload_len);
    // The server may close before reading all of an oversized frame; ignore write errors.
    let _ = tls.write_all(&out).await;
    let _ = tls.flush().await;
    let result = server.await.unwrap();
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    // Skip the server's HELLO (7 bytes); the next frame is its VERDICT.
    let code = match rest.get(7) {
        Some(&wire::FRAME_VERDICT) => rest.get(12).copied(),
        _ => None,
    };
    (result, code)
}

#[tokio::test]
async fn an_evidence_frame_of_exactly_the_cap_is_read_and_one_byte_more_is_refused() {
    let cap = asterism_atls::DEFAULT_MAX_FRAME_LEN;
    // Session-key evidence is the longest form: its variant, its 105-byte prefix, the
    // longest inner variant and the largest inner evidence.
    assert_eq!(
        cap,
        1 + asterism_atls::session::VARIANT.len()
            + asterism_atls::session::PREFIX_LEN
            + wire::MAX_VARIANT_LEN
            + asterism_atls::attestation::tpm::MAX_EVIDENCE_SIZE
    );
    assert_eq!(cap, 65_722);
    // At the cap: the frame is read whole and handed to the validator, which rejects the
    // zero bytes as malformed evidence (REJECTED, not PROTOCOL_ERROR).
    let (result, code) = send_evidence_of_payload_len(cap).await;
    assert!(
        matches!(
            result,
            Err(AtlsError::Rejected(
                asterism_atls::ValidationError::Malformed(_)
            ))
        ),
        "{result:?}"
    );
    assert_eq!(code, Some(wire::VerdictCode::Rejected as u8));
    // One byte over: refused on the header, PROTOCOL_ERROR.
    let (result, code) = send_evidence_of_payload_len(cap + 1).await;
    assert!(
        matches!(result, Err(AtlsError::FrameTooLarge { claimed, cap: c }) if claimed == cap + 1 && c == cap),
        "{result:?}"
    );
    assert_eq!(code, Some(wire::VerdictCode::ProtocolError as u8));
}

#[test]
fn a_frame_cap_above_what_evidence_needs_is_a_configuration_error() {
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_max_frame_len(asterism_atls::MAX_EVIDENCE_FRAME_LEN + 1);
    assert!(matches!(AtlsServer::new(cfg), Err(AtlsError::Config(_))));
}

/// A connector made [`AtlsConnector::from_address`] dials from that address, by itself and
/// as tonic's connector; a local address of the other family is an error, not a dial from
/// another address.
#[tokio::test]
async fn a_connector_from_an_address_dials_from_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let local: std::net::IpAddr = "127.0.0.7".parse().unwrap();
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED)))
        .unwrap()
        .from_address(local);
    assert!(
        format!("{connector:?}").contains("127.0.0.7"),
        "{connector:?}"
    );
    let accept = || tokio::time::timeout(Duration::from_secs(10), listener.accept());

    let direct = {
        let connector = connector.clone();
        tokio::spawn(async move { connector.connect_tcp(&addr.to_string()).await.map(|_| ()) })
    };
    let (_direct, peer) = accept().await.expect("a connection").unwrap();
    assert_eq!(peer.ip(), local);
    direct.abort();

    let through_tonic =
        tokio::spawn(async move { call(&format!("http://{addr}"), connector).await });
    let (_tonic, peer) = accept().await.expect("a connection").unwrap();
    assert_eq!(peer.ip(), local);
    through_tonic.abort();

    let v6 = AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED)))
        .unwrap()
        .from_address("::1".parse().unwrap());
    match v6.connect_tcp(&addr.to_string()).await {
        Err(AtlsError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}"),
        other => panic!("{other:?}"),
    }
}

/// An honest attesting client that dials from `local` (a loopback address other than the
/// attacker's, so that the per-source limit tells them apart).
async fn honest_connect_from(local: &str, server: &str) -> Result<(), AtlsError> {
    let tcp = tcp_from(local.parse().unwrap(), server.parse().unwrap())
        .await
        .unwrap();
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED))).unwrap();
    connector.connect(tcp, None).await.map(|_| ())
}

#[tokio::test]
async fn idle_connections_from_one_source_do_not_stall_an_honest_handshake() {
    // 16 global slots and a silence deadline far beyond the test: only the per-source
    // limit (default 8) keeps the 40 silent connections from taking every slot.
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_max_pending_handshakes(16)
        .with_idle_timeout(Duration::from_secs(600));
    let (uri, echo) = serve(cfg).await;
    let addr = uri.trim_start_matches("http://").to_string();
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(&addr).await.unwrap());
    }
    // Liveness bound, not a performance target: without the per-source limit this
    // handshake waits for the 600 s silence deadline.
    let honest = tokio::time::timeout(
        Duration::from_secs(20),
        honest_connect_from("127.0.0.2", &addr),
    )
    .await
    .expect("the honest handshake was stalled by idle connections");
    honest.unwrap();
    // Connections beyond the per-source limit were closed at once.
    let mut closed = 0;
    for tcp in &mut idle {
        let mut b = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(200), tcp.read(&mut b)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 40 - asterism_atls::DEFAULT_MAX_PENDING_PER_SOURCE);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peers_of_32_sources_holding_every_slot_cannot_starve_a_33rd() {
    // 64 slots, 2 per source, and silence deadlines far beyond the test: only the fair
    // sharing of the slots lets the honest client in while 32 sources hold 2 each.
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_max_pending_handshakes(64)
        .with_max_pending_per_source(2)
        .with_idle_timeout(Duration::from_secs(600))
        .with_hello_timeout(Duration::from_secs(600));
    let (uri, echo) = serve(cfg).await;
    let addr: std::net::SocketAddr = uri.trim_start_matches("http://").parse().unwrap();
    let mut silent = Vec::new();
    for source in 1..=32u8 {
        for _ in 0..2 {
            let tcp = tcp_from([127, 0, 40, source].into(), addr).await.unwrap();
            // TLS completes, then nothing: no HELLO.
            silent.push(
                asterism_testkit::tls::connect_over(
                    tcp,
                    &[&rustls::version::TLS13],
                    vec![b"h2".to_vec()],
                )
                .await
                .unwrap(),
            );
        }
    }
    // Liveness bound, not a performance target: without the fair sharing this handshake
    // waits in the listen backlog for the 600 s deadlines.
    tokio::time::timeout(
        Duration::from_secs(20),
        honest_connect_from("127.0.41.1", &addr.to_string()),
    )
    .await
    .expect("the honest handshake was starved by 32 sources' silent connections")
    .unwrap();
    // Exactly one silent connection lost its slot, and was closed.
    let mut closed = 0;
    for tls in &mut silent {
        if closed_within(tls, Duration::from_millis(100)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 1);
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_peer_silent_after_the_tls_handshake_is_dropped_at_the_hello_deadline() {
    // The exchange deadline stays at its 30 s default: only the HELLO deadline can end
    // this connection within the test's bound.
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_hello_timeout(Duration::from_millis(300));
    let (uri, _) = serve(cfg).await;
    let mut tls = raw_tls_client(
        uri.trim_start_matches("http://").parse().unwrap(),
        &[&rustls::version::TLS13],
    )
    .await
    .unwrap();
    assert!(
        closed_within(&mut tls, Duration::from_secs(10)).await,
        "a peer that sent no HELLO was not dropped"
    );
}

#[tokio::test]
async fn a_peer_that_sends_nothing_is_dropped_at_the_idle_deadline() {
    // The TLS handshake deadline stays at its 30 s default: only the idle deadline can
    // end this connection within the test's bound.
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_idle_timeout(Duration::from_millis(300));
    let (uri, _) = serve(cfg).await;
    let mut tcp = TcpStream::connect(uri.trim_start_matches("http://"))
        .await
        .unwrap();
    let mut b = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut b))
        .await
        .expect("the silent peer was not dropped");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

#[tokio::test]
async fn a_client_without_sends_evidence_is_refused_by_the_server_itself() {
    // A raw client announcing no evidence (and not requiring any), so only the server's
    // own "evidence required" check can stop it.
    let (addr, server) = single_accept(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let out = hello_frame(wire::VERSION, 0);
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    let result = server.await.unwrap();
    assert!(
        matches!(result, Err(AtlsError::EvidenceRequired)),
        "{result:?}"
    );
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    // The server's HELLO (7 bytes), then its VERDICT.
    assert_eq!(rest.get(7), Some(&wire::FRAME_VERDICT), "{rest:?}");
    let verdict = rest.get(12);
    assert_eq!(
        verdict,
        Some(&(wire::VerdictCode::EvidenceRequired as u8)),
        "{rest:?}"
    );
}

#[tokio::test]
async fn a_verified_connection_ends_at_its_lifetime() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = AtlsServer::new(
        AtlsConfig::verifying(validator_for(CLIENT_SEED))
            .with_max_connection_lifetime(Duration::from_millis(500)),
    )
    .unwrap();
    let accepted = tokio::spawn(async move {
        let (tcp, peer) = listener.accept().await.unwrap();
        let mut stream = server.accept(tcp, Some(peer)).await.unwrap();
        assert!(stream.peer().is_some());
        // Nothing ever arrives: only the lifetime can end this read.
        let mut b = [0u8; 1];
        let n = stream.read(&mut b).await.unwrap();
        let write = stream.write_all(b"late").await;
        (n, write.is_err())
    });
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED))).unwrap();
    let mut client = connector.connect_tcp(&addr.to_string()).await.unwrap();
    let (n, write_failed) = tokio::time::timeout(Duration::from_secs(10), accepted)
        .await
        .expect("the verified connection outlived its lifetime")
        .unwrap();
    assert_eq!(n, 0, "end of stream at the lifetime");
    assert!(write_failed, "no writes after the lifetime");
    // The client sees the connection end too.
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut b))
        .await
        .unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
}

#[tokio::test]
async fn a_client_without_alpn_h2_is_refused() {
    // No ALPN at all: rustls would accept it, aTLS must not.
    let (addr, server) = single_accept(AtlsConfig::attesting(issuer(SERVER_SEED))).await;
    let _tls = raw_tls_client_alpn(addr, &[&rustls::version::TLS13], Vec::new())
        .await
        .unwrap();
    let result = server.await.unwrap();
    assert!(
        matches!(result, Err(AtlsError::Protocol(ref m)) if m.contains("ALPN")),
        "{result:?}"
    );
    // ALPN without h2: refused during the TLS handshake.
    let (addr, server) = single_accept(AtlsConfig::attesting(issuer(SERVER_SEED))).await;
    let client =
        raw_tls_client_alpn(addr, &[&rustls::version::TLS13], vec![b"http/1.1".to_vec()]).await;
    assert!(client.is_err());
    assert!(matches!(
        server.await.unwrap(),
        Err(AtlsError::Tls(rustls::Error::NoApplicationProtocol))
    ));
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[tokio::test]
async fn a_client_may_pipeline_its_http2_preface_behind_its_evidence() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = AtlsServer::new(AtlsConfig::verifying(validator_for(CLIENT_SEED))).unwrap();
    let accepted = tokio::spawn(async move {
        let (tcp, peer) = listener.accept().await.unwrap();
        let mut stream = server.accept(tcp, Some(peer)).await.unwrap();
        let mut got = vec![0u8; H2_PREFACE.len()];
        stream.read_exact(&mut got).await.unwrap();
        got
    });
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let e = exporter_of(tls.get_ref().1);
    let evidence = issuer(CLIENT_SEED)
        .issue(&ReportData::atls(asterism_atls::Role::Client, &e))
        .unwrap();
    let mut out = hello_frame(wire::VERSION, wire::FLAG_SENDS_EVIDENCE);
    wire::encode_evidence(
        &mut out,
        asterism_atls::attestation::test_ed25519::VARIANT,
        &evidence,
    )
    .unwrap();
    // Everything in one write, before the server's VERDICT arrives.
    out.extend_from_slice(H2_PREFACE);
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    // The server read its frames exactly; the preface is intact for HTTP/2.
    assert_eq!(accepted.await.unwrap(), H2_PREFACE);
    let hello = wire::read_hello(&mut tls).await.unwrap();
    assert!(hello.requires_evidence());
    let verdict = wire::read_verdict(&mut tls).await.unwrap();
    assert_eq!(verdict.code, wire::VerdictCode::Accepted);
}

#[tokio::test]
async fn a_server_that_cannot_attest_says_cannot_attest() {
    // The server only verifies; the client requires the server's evidence.
    let (addr, server) = single_accept(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let out = hello_frame(
        wire::VERSION,
        wire::FLAG_SENDS_EVIDENCE | wire::FLAG_REQUIRES_EVIDENCE,
    );
    tls.write_all(&out).await.unwrap();
    let result = server.await.unwrap();
    assert!(matches!(result, Err(AtlsError::NoIssuer)), "{result:?}");
    let hello = wire::read_hello(&mut tls).await.unwrap();
    assert!(!hello.sends_evidence(), "its HELLO announces no evidence");
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert_eq!(rest.first(), Some(&wire::FRAME_VERDICT), "{rest:?}");
    assert_eq!(rest.get(5), Some(&(wire::VerdictCode::CannotAttest as u8)));
}

#[tokio::test]
async fn a_peer_that_closes_mid_exchange_gets_no_verdict() {
    let (addr, server) = single_accept(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let out = hello_frame(wire::VERSION, wire::FLAG_SENDS_EVIDENCE);
    tls.write_all(&out).await.unwrap();
    // Announces evidence, then closes its sending side instead.
    tls.shutdown().await.unwrap();
    let result = server.await.unwrap();
    assert!(matches!(result, Err(AtlsError::Closed)), "{result:?}");
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert_eq!(rest.len(), 7, "only the server's HELLO: {rest:?}");
    assert_eq!(rest.first(), Some(&wire::FRAME_HELLO));
}

#[tokio::test]
async fn a_grpc_caller_sees_unavailable_when_the_exchange_fails() {
    let (uri, echo) = serve(AtlsConfig::verifying(validator_for(CLIENT_SEED))).await;
    // Signed by a key the server does not trust.
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer([0x99; 32]))).unwrap();
    let channel = Endpoint::from_shared(uri)
        .unwrap()
        .connect_with_connector_lazy(connector);
    let err = ApiClient::new(channel)
        .get_data_key(GetDataKeyRequest {
            data_key_id: "x".into(),
            length: 32,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_listener_reports_each_refusal_with_its_reason() {
    let seen: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let record = seen.clone();
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_idle_timeout(Duration::from_millis(300))
        .with_refusal_observer(Arc::new(move |reason| record.lock().unwrap().push(reason)));
    let (uri, _) = serve(cfg).await;
    let addr: std::net::SocketAddr = uri.trim_start_matches("http://").parse().unwrap();

    // A peer that sends nothing, then one that announces no evidence.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 1];
    let _ = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut b)).await;
    let mut tls = raw_tls_client(addr, &[&rustls::version::TLS13])
        .await
        .unwrap();
    let out = hello_frame(wire::VERSION, 0);
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;

    // The listener's task reports after it closed the connection: poll briefly.
    for _ in 0..100 {
        if seen.lock().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*seen.lock().unwrap(), ["silent_peer", "evidence_required"]);
}

/// A server application that reads before it writes: the exchange's last frames (the
/// server's HELLO and VERDICT, held to leave with the application's first bytes) go out
/// with its first read. The client waits for that VERDICT before it sends anything, so a
/// server that held them until its first write would never hear from it.
#[tokio::test]
async fn a_server_that_reads_first_still_sends_its_verdict() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = AtlsServer::new(AtlsConfig::verifying(validator_for(CLIENT_SEED))).unwrap();
    let task = tokio::spawn(async move {
        let (tcp, peer) = listener.accept().await.unwrap();
        let mut stream = server.accept(tcp, Some(peer)).await.unwrap();
        let mut ping = [0u8; 4];
        stream.read_exact(&mut ping).await.unwrap();
        stream.write_all(b"pong").await.unwrap();
        stream.flush().await.unwrap();
        ping
    });
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED))).unwrap();
    let within = |f| tokio::time::timeout(Duration::from_secs(10), f);
    let mut client = within(connector.connect_tcp(&addr.to_string()))
        .await
        .expect("the client's exchange ends: the server's VERDICT arrived")
        .unwrap();
    client.write_all(b"ping").await.unwrap();
    client.flush().await.unwrap();
    let mut pong = [0u8; 4];
    client.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"pong");
    assert_eq!(&task.await.unwrap(), b"ping");
}

/// An issuer that takes its time, as a real TPM's quote does.
struct Slow(Arc<InsecureTestIssuer>, Duration);

impl Issuer for Slow {
    fn variant(&self) -> &'static str {
        self.0.variant()
    }
    fn issue(&self, rd: &ReportData) -> Result<Vec<u8>, IssueError> {
        std::thread::sleep(self.1);
        self.0.issue(rd)
    }
}

/// The client sends its HELLO at once and its evidence when its issuer is done, without
/// waiting for the server's HELLO; a server that sends no evidence holds its HELLO until
/// its VERDICT. Evidence slower than the server's HELLO deadline still gets through: that
/// deadline is for the client's HELLO alone.
#[tokio::test]
async fn evidence_slower_than_the_hello_deadline_is_still_accepted() {
    let cfg = AtlsConfig::verifying(validator_for(CLIENT_SEED))
        .with_hello_timeout(Duration::from_millis(200));
    let (uri, echo) = serve(cfg).await;
    let slow = Arc::new(Slow(issuer(CLIENT_SEED), Duration::from_millis(600)));
    let connector = AtlsConnector::new(AtlsConfig::attesting(slow)).unwrap();
    call(&uri, connector).await.unwrap();
    assert_eq!(echo.calls.load(Ordering::SeqCst), 1);
}
