//! Attested session keys (docs/atls.md §4b) over real sockets: one issuer call per refresh
//! interval, none for peers that do not ask, and every verifier check with an attack that
//! only that check stops.

use crate::common::{CLIENT_SEED, SERVER_SEED, issuer, validator_for};
use asterism_atls::attestation::{IssueError, ReportData};
use asterism_atls::session::{self, SessionKeyEvidence};
use asterism_atls::wire::{self, Hello};
use asterism_atls::{AtlsConfig, AtlsConnector, AtlsError, AtlsServer, Issuer, Role};
use ring::signature::{Ed25519KeyPair, KeyPair};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A real issuer that counts its calls.
struct Counting {
    inner: Arc<dyn Issuer>,
    calls: AtomicUsize,
}

impl Issuer for Counting {
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn issue(&self, rd: &ReportData) -> Result<Vec<u8>, IssueError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.issue(rd)
    }
    fn blocks(&self) -> bool {
        self.inner.blocks()
    }
}

fn counting(seed: [u8; 32]) -> Arc<Counting> {
    Arc::new(Counting {
        inner: issuer(seed),
        calls: AtomicUsize::new(0),
    })
}

/// Runs `server` on 127.0.0.1:0, accepting connections until the test ends.
async fn run(server: AtlsServer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = listener.accept().await.unwrap();
            let server = server.clone();
            tokio::spawn(async move {
                if let Ok(mut s) = server.accept(tcp, Some(peer)).await {
                    let mut sink = Vec::new();
                    let _ = s.read_to_end(&mut sink).await;
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn mutual_atls_with_a_session_key_quotes_once_for_many_connections() {
    let quotes = counting(SERVER_SEED);
    let addr = run(AtlsServer::new(
        AtlsConfig::verifying(validator_for(CLIENT_SEED)).with_session_key_issuer(quotes.clone()),
    )
    .unwrap())
    .await;
    let connector = AtlsConnector::new(
        AtlsConfig::attesting(issuer(CLIENT_SEED)).with_validator(validator_for(SERVER_SEED)),
    )
    .unwrap();
    for _ in 0..10 {
        let s = connector.connect_tcp(&addr).await.unwrap();
        let peer = s.peer().expect("the client verified the server");
        let want: String = issuer(SERVER_SEED)
            .public_key()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(peer.evidence().identity(), want);
    }
    assert_eq!(
        quotes.calls.load(Ordering::SeqCst),
        1,
        "one quote for ten connections"
    );
}

#[tokio::test]
async fn peers_that_do_not_ask_for_evidence_never_make_the_server_quote() {
    let quotes = counting(SERVER_SEED);
    let addr = run(AtlsServer::new(
        AtlsConfig::verifying(validator_for(CLIENT_SEED)).with_session_key_issuer(quotes.clone()),
    )
    .unwrap())
    .await;
    // Attesting clients that do not verify the server: they are served, never quoted to.
    let attesting = AtlsConnector::new(AtlsConfig::attesting(issuer(CLIENT_SEED))).unwrap();
    for _ in 0..20 {
        attesting.connect_tcp(&addr).await.unwrap();
    }
    // Unauthenticated clients that ask for evidence but not for a session key: refused
    // with CANNOT_ATTEST, no quote.
    for _ in 0..20 {
        let mut tls = raw_client(&addr).await;
        let mut out = Vec::new();
        wire::encode_hello(
            &mut out,
            Hello {
                version: wire::VERSION,
                flags: wire::FLAG_REQUIRES_EVIDENCE,
            },
        )
        .unwrap();
        tls.write_all(&out).await.unwrap();
        let mut rest = Vec::new();
        let _ = tls.read_to_end(&mut rest).await;
        assert_eq!(rest.get(7), Some(&wire::FRAME_VERDICT));
        assert_eq!(rest.get(12), Some(&(wire::VerdictCode::CannotAttest as u8)));
    }
    // Unauthenticated clients that send nothing after TLS.
    for _ in 0..20 {
        let tls = raw_client(&addr).await;
        drop(tls);
    }
    assert_eq!(
        quotes.calls.load(Ordering::SeqCst),
        0,
        "no peer asked: no quote"
    );
}

#[tokio::test]
async fn a_session_key_is_refreshed_after_its_interval() {
    let quotes = counting(SERVER_SEED);
    let key = Arc::new(asterism_atls::SessionKeyIssuer::new(
        quotes.clone(),
        Duration::from_millis(300),
    ));
    let addr = run(AtlsServer::new(
        AtlsConfig::verifying(validator_for(CLIENT_SEED)).with_session_key(key),
    )
    .unwrap())
    .await;
    let connector = AtlsConnector::new(
        AtlsConfig::attesting(issuer(CLIENT_SEED)).with_validator(validator_for(SERVER_SEED)),
    )
    .unwrap();
    connector.connect_tcp(&addr).await.unwrap();
    connector.connect_tcp(&addr).await.unwrap();
    assert_eq!(quotes.calls.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Due for refresh: this connection still gets the current key (it has 30 s of
    // validity left) while one background task quotes the next.
    connector.connect_tcp(&addr).await.unwrap();
    connector.connect_tcp(&addr).await.unwrap();
    for _ in 0..100 {
        if quotes.calls.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(quotes.calls.load(Ordering::SeqCst), 2);
}

async fn raw_client(addr: &str) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    asterism_testkit::tls::connect_h2(addr).await.unwrap()
}

/// What a forged or misused session-key evidence binds, piece by piece.
#[derive(Clone, Copy)]
struct Forge {
    /// Role in the per-connection signature.
    sig_role: Role,
    /// Sign another connection's exporter instead of this one's.
    other_connection: bool,
    /// Role in the quote's report data.
    quote_role: Role,
    /// Quote under the aTLS purpose instead of the session-key purpose.
    wrong_purpose: bool,
    /// `not_after` relative to now, in seconds.
    expires_in: i64,
}

const HONEST: Forge = Forge {
    sig_role: Role::Server,
    other_connection: false,
    quote_role: Role::Server,
    wrong_purpose: false,
    expires_in: 90,
};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn forge(f: Forge, exporter: &[u8; 32]) -> Vec<u8> {
    let key = Ed25519KeyPair::from_seed_unchecked(&[0x5e; 32]).unwrap();
    let mut public_key = [0u8; 32];
    public_key.copy_from_slice(key.public_key().as_ref());
    let not_after = (now() as i64 + f.expires_in) as u64;
    let signed_exporter = if f.other_connection {
        [0xee; 32]
    } else {
        *exporter
    };
    let mut signature = [0u8; 64];
    signature.copy_from_slice(
        key.sign(&session::connection_message(f.sig_role, &signed_exporter))
            .as_ref(),
    );
    // The inner evidence is real: the trusted server issuer signs the report data.
    let rd = if f.wrong_purpose {
        ReportData::atls(f.quote_role, &public_key)
    } else {
        ReportData::atls_session_key(f.quote_role, &public_key, not_after)
    };
    let inner_evidence = issuer(SERVER_SEED).issue(&rd).unwrap();
    SessionKeyEvidence {
        signature,
        public_key,
        not_after,
        inner_variant: asterism_atls::attestation::test_ed25519::VARIANT.into(),
        inner_evidence,
    }
    .encode()
}

/// A hand-written server that answers a verifying client with forged session-key
/// evidence; returns what the client's connector concluded.
async fn against_forged_server(f: Forge) -> Result<(), AtlsError> {
    let cfg = asterism_testkit::tls_server::self_signed_h2_config("x").unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        let hello = wire::read_hello(&mut tls).await.unwrap();
        assert!(hello.requires_evidence() && hello.accepts_session_key());
        let mut e = [0u8; 32];
        tls.get_ref()
            .1
            .export_keying_material(&mut e, asterism_atls::EXPORTER_LABEL, Some(&[]))
            .unwrap();
        let mut out = Vec::new();
        wire::encode_hello(
            &mut out,
            Hello {
                version: wire::VERSION,
                flags: wire::FLAG_SENDS_EVIDENCE,
            },
        )
        .unwrap();
        wire::encode_evidence(&mut out, session::VARIANT, &forge(f, &e)).unwrap();
        tls.write_all(&out).await.unwrap();
        tls.flush().await.unwrap();
        let mut sink = Vec::new();
        let _ = tls.read_to_end(&mut sink).await;
    });
    let connector = AtlsConnector::new(AtlsConfig::verifying(validator_for(SERVER_SEED))).unwrap();
    connector.connect_tcp(&addr.to_string()).await.map(|s| {
        assert!(s.peer().is_some());
    })
}

fn rejected(r: &Result<(), AtlsError>) -> Option<&asterism_atls::ValidationError> {
    match r {
        Err(AtlsError::Rejected(e)) => Some(e),
        _ => None,
    }
}

#[tokio::test]
async fn honest_session_key_evidence_is_accepted() {
    // The forging harness itself is sound: without a flaw, the client accepts.
    let r = against_forged_server(HONEST).await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn a_session_key_signature_relayed_from_another_connection_is_rejected() {
    let r = against_forged_server(Forge {
        other_connection: true,
        ..HONEST
    })
    .await;
    assert_eq!(
        rejected(&r),
        Some(&asterism_atls::ValidationError::BindingMismatch),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_session_key_signature_made_in_the_client_role_is_rejected() {
    // Reflection through the per-connection signature: the quote says "server", the
    // signature was made as a client on this very connection.
    let r = against_forged_server(Forge {
        sig_role: Role::Client,
        ..HONEST
    })
    .await;
    assert_eq!(
        rejected(&r),
        Some(&asterism_atls::ValidationError::BindingMismatch),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_session_key_quoted_for_the_client_role_is_rejected() {
    // Reflection through the quote: a client's session key, presented by a server.
    let r = against_forged_server(Forge {
        quote_role: Role::Client,
        ..HONEST
    })
    .await;
    assert_eq!(
        rejected(&r),
        Some(&asterism_atls::ValidationError::BindingMismatch),
        "{r:?}"
    );
}

#[tokio::test]
async fn an_expired_session_key_is_rejected() {
    let r = against_forged_server(Forge {
        expires_in: -1,
        ..HONEST
    })
    .await;
    assert!(
        matches!(rejected(&r), Some(asterism_atls::ValidationError::Policy(m)) if m.contains("expired")),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_session_key_valid_for_too_long_is_rejected() {
    let r = against_forged_server(Forge {
        expires_in: 3600,
        ..HONEST
    })
    .await;
    assert!(
        matches!(rejected(&r), Some(asterism_atls::ValidationError::Policy(m)) if m.contains("longer")),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_session_key_quoted_under_another_purpose_is_rejected() {
    let r = against_forged_server(Forge {
        wrong_purpose: true,
        ..HONEST
    })
    .await;
    assert_eq!(
        rejected(&r),
        Some(&asterism_atls::ValidationError::BindingMismatch),
        "{r:?}"
    );
}
