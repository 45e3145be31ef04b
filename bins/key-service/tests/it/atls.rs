//! The key service behind attested TLS: clients must attest before any request is read,
//! and the handler refuses requests that did not arrive on an attested connection.
//! Real TLS 1.3 and gRPC on loopback, real Ed25519 signatures (the insecure test variant).

#![cfg(feature = "insecure-test-attestation")]

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use asterism_atls::attestation::test_ed25519::{InsecureTestIssuer, InsecureTestValidator};
use asterism_atls::{AtlsConfig, AtlsServer};
use asterism_key_service::{KeyService, LIMITS, serve_with_limits};
use asterism_kms::{ClusterKms, MasterSecret, Salt};
use asterism_proto::kms::api_client::ApiClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;

const CLIENT_SEED: [u8; 32] = [7; 32];

fn zero_kms() -> ClusterKms {
    ClusterKms::new(
        MasterSecret::new(vec![0; 32]).unwrap(),
        Salt::new(vec![0; 32]).unwrap(),
    )
}

fn client_issuer(seed: [u8; 32]) -> Arc<InsecureTestIssuer> {
    Arc::new(InsecureTestIssuer::from_seed(&seed).unwrap())
}

async fn atls_channel(addr: &str, seed: [u8; 32]) -> Result<Channel, tonic::transport::Error> {
    attested_channel(addr, client_issuer(seed)).await
}

async fn start_attested(service: KeyService) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let trusted = InsecureTestValidator::new([client_issuer(CLIENT_SEED).public_key()]);
    let server = AtlsServer::new(AtlsConfig::verifying(Arc::new(trusted))).unwrap();
    tokio::spawn(async move {
        serve_with_limits(
            server.incoming(listener),
            service,
            &LIMITS,
            std::future::pending(),
        )
        .await
    });
    addr
}

#[tokio::test]
async fn an_attested_client_gets_the_measurement_secret_and_no_disk_key() {
    let addr = start_attested(KeyService::attested_only(zero_kms())).await;
    let mut client = ApiClient::new(atls_channel(&addr, CLIENT_SEED).await.unwrap());
    assert_eq!(
        get_key_hex(&mut client, "measurementSecret").await,
        MEASUREMENT_SECRET_ZERO
    );
    // Any attested node (a joined worker among them) would otherwise get the control
    // plane's disk key, or the SSH CA's seed.
    for id in [ZERO_UUID, "ca_emergency_ssh", "some-other-key"] {
        let refused = get_key(&mut client, id, 32).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::PermissionDenied,
            "{id}: {refused:?}"
        );
    }
}

#[tokio::test]
async fn a_client_with_an_untrusted_key_gets_nothing() {
    let addr = start_attested(KeyService::attested_only(zero_kms())).await;
    let err = atls_channel(&addr, [8; 32]).await.unwrap_err();
    assert!(format!("{err:?}").contains("untrusted"), "{err:?}");
}

#[tokio::test]
async fn the_attested_only_handler_refuses_an_unattested_connection() {
    // Served over plain TCP by mistake: the handler itself must still refuse.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        serve_with_limits(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            KeyService::attested_only(zero_kms()),
            &LIMITS,
            std::future::pending(),
        )
        .await
    });
    let mut client = ApiClient::new(tcp_channel(addr, Duration::from_secs(5)).await);
    let status = get_key(&mut client, "measurementSecret", 32)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
}

/// The key-service program on attested TLS, trusting the test client's key (the insecure
/// test variant); and its address.
fn start_trusting_the_client(secrets: &Secrets) -> (asterism_testkit::process::Process, String) {
    let trusted = hex::encode(client_issuer(CLIENT_SEED).public_key());
    start_atls_key_service(
        secrets,
        &[
            "--verify-clients",
            "insecure-test-ed25519",
            "--insecure-test-trusted-key",
            &trusted,
        ],
    )
}

#[test]
fn the_binary_serves_attested_clients_end_to_end() {
    let secrets = secrets();
    let (mut child, addr) = start_trusting_the_client(&secrets);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let result = runtime.block_on(async {
        let channel = attested_channel_once_up(&addr, client_issuer(CLIENT_SEED)).await?;
        let mut client = ApiClient::new(channel);
        let key = get_key_hex(&mut client, "measurementSecret").await;
        let refused = atls_channel(&addr, [9; 32]).await.is_err();
        Ok::<_, String>((key, refused))
    });
    let (_, logs) = child.stop(Duration::from_secs(30));
    let (key, refused) = result.unwrap_or_else(|e| panic!("{e}\n{logs}"));
    assert_eq!(key, MEASUREMENT_SECRET_ZERO);
    assert!(refused, "an untrusted client is refused");
    assert!(logs.contains("attested TLS"), "{logs}");
    assert!(
        logs.contains("INSECURE"),
        "the insecure variant warns: {logs}"
    );
    assert!(!logs.contains(&MEASUREMENT_SECRET_ZERO[..16]), "{logs}");
}

/// Verified connections are shared fairly between sources: a ninth from one source is
/// closed, and a joined node, attesting as well as any other, that holds 8 verified
/// connections idle from each of 33 sources (264, over the 256 in all) does not keep
/// another node out. With a plain cap, the other node's connection waited behind the held ones.
#[test]
fn a_joined_node_holding_every_connection_does_not_keep_another_node_out() {
    use asterism_atls::AtlsConnector;
    use asterism_key_service::ATLS_CONNECTIONS;
    use asterism_testkit::net::{closed_within, tcp_from};
    let secrets = secrets();
    let (mut child, addr) = start_trusting_the_client(&secrets);
    let server: std::net::SocketAddr = addr.parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let result = runtime.block_on(async {
        drop(attested_channel_once_up(&addr, client_issuer(CLIENT_SEED)).await?);
        let connector = AtlsConnector::new(AtlsConfig::attesting(client_issuer(CLIENT_SEED)))
            .map_err(|e| e.to_string())?;
        let connect_from = move |from: String| {
            let connector = connector.clone();
            async move {
                let tcp = tcp_from(from.parse().unwrap(), server).await?;
                connector
                    .connect(tcp, Some(server))
                    .await
                    .map_err(std::io::Error::other)
            }
        };
        // One source: its share is held, and one more verified connection is closed at once.
        let mut one_source = Vec::new();
        for _ in 0..ATLS_CONNECTIONS.per_source {
            one_source.push(connect_from("127.0.30.1".into()).await.unwrap());
        }
        let ninth = match connect_from("127.0.30.1".into()).await {
            Ok(mut stream) => closed_within(&mut stream, Duration::from_secs(5)).await,
            Err(_) => true,
        };
        let share_kept = !closed_within(&mut one_source[0], Duration::from_millis(100)).await;
        drop(one_source);

        let sources = ATLS_CONNECTIONS.max / ATLS_CONNECTIONS.per_source + 1;
        let mut holders = Vec::new();
        for s in 0..sources {
            let connect_from = connect_from.clone();
            holders.push(tokio::spawn(async move {
                let mut held = Vec::new();
                for _ in 0..ATLS_CONNECTIONS.per_source {
                    held.push(connect_from(format!("127.0.31.{}", s + 1)).await?);
                }
                Ok::<_, std::io::Error>(held)
            }));
        }
        let mut held = Vec::new();
        for h in holders {
            held.extend(h.await.unwrap().map_err(|e| e.to_string())?);
        }
        // Another node, from a source of its own, is served while they are held.
        let key = tokio::time::timeout(Duration::from_secs(20), async {
            let channel = atls_channel(&addr, CLIENT_SEED)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(get_key_hex(&mut ApiClient::new(channel), "measurementSecret").await)
        })
        .await
        .map_err(|_| "the other node was not served within 20 s".to_owned())??;
        drop(held);
        Ok::<_, String>((ninth, share_kept, key))
    });
    let (_, logs) = child.stop(Duration::from_secs(30));
    let (ninth, share_kept, key) = result.unwrap_or_else(|e| panic!("{e}\n{logs}"));
    assert!(share_kept, "a source's share stays open");
    assert!(
        ninth,
        "a ninth verified connection from one source is closed"
    );
    assert_eq!(key, MEASUREMENT_SECRET_ZERO);
}

/// A joined worker attests exactly as the control plane does; the identity seed would let it
/// sign tickets and control-plane lists as the control plane, so the attested listener
/// never releases it.
#[tokio::test]
async fn an_attested_client_gets_no_control_plane_identity() {
    let addr = start_attested(KeyService::attested_only(zero_kms())).await;
    let mut client = ApiClient::new(atls_channel(&addr, CLIENT_SEED).await.unwrap());
    let refused = client
        .get_control_plane_identity(asterism_proto::kms::GetControlPlaneIdentityRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
}
