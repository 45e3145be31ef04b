//! Node settings from each cloud's metadata service, against loopback stand-ins that serve
//! the documented request and answer forms (cited at each) and refuse a request that lacks
//! what the real service requires: GCE's `Metadata-Flavor: Google`, Azure's
//! `Metadata: true`, AWS's IMDSv2 session token. Then hostile answers: oversized, slow,
//! malformed.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use asterism_metadata::node_settings::cloud::{CloudSettings, MAX_AWS_USER_DATA};
use asterism_metadata::node_settings::{Field, NodeSettings, SettingsError, Source};
use asterism_testkit::cloud::{self, Aws, GceInstance, Handler, aws, azure, serve};
use base64::Engine as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

const CLUSTER_ID: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const CP_KEY: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

/// Sends `request` as written and returns the answer's status line.
async fn raw_status(addr: SocketAddr, request: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = stream.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// What reading the settings from `origin`, served by `handler`, fails with.
async fn read_error(origin: Source, handler: Handler) -> SettingsError {
    let addr = serve(handler).await;
    client(origin, addr).read().await.unwrap_err()
}

fn client(origin: Source, addr: SocketAddr) -> CloudSettings {
    CloudSettings::new(origin, &format!("http://{addr}"))
        .unwrap()
        .with_timeout(Duration::from_secs(5))
}

fn document() -> serde_json::Value {
    serde_json::json!({
        "cluster-id": CLUSTER_ID, "control-plane-key": CP_KEY,
        "join-platform-ca": CA, "join-measurements": {"pcrs": {}},
    })
}

fn assert_joins(settings: &NodeSettings) {
    let join = settings.join.as_ref().expect("join settings");
    assert_eq!(join.cluster_id.to_hex(), CLUSTER_ID);
    assert_eq!(join.control_plane_key.to_string(), CP_KEY);
    assert_eq!(join.platform_ca, CA);
    assert_eq!(join.measurements, br#"{"pcrs":{}}"#);
}

// --- GCE --------------------------------------------------------------------------------

/// The GCE stand-in with `attributes`, as worker-7 at 10.128.0.7.
fn gce(attributes: serde_json::Value, flavor_in_answer: bool) -> Handler {
    cloud::gce(
        GceInstance {
            attributes,
            hostname: "worker-7.c.project.internal".into(),
            ip: "10.128.0.7".into(),
        },
        flavor_in_answer,
    )
}

fn gce_attributes() -> serde_json::Value {
    serde_json::json!({
        "ssh-keys": "someone:ssh-ed25519 AAAA",
        "asterism-cluster-id": CLUSTER_ID, "asterism-control-plane-key": CP_KEY,
        "asterism-join-platform-ca": CA, "asterism-join-measurements": r#"{"pcrs":{}}"#,
    })
}

#[tokio::test]
async fn gce_settings_come_from_instance_attributes_and_the_platforms_name_and_address() {
    let addr = serve(gce(gce_attributes(), true)).await;
    let settings = client(Source::Gce, addr).read().await.unwrap();
    assert_joins(&settings);
    assert_eq!(
        settings.hostname.unwrap().as_str(),
        "worker-7.c.project.internal"
    );
    assert_eq!(settings.node_ip.unwrap().to_string(), "10.128.0.7");
}

#[tokio::test]
async fn the_gce_stand_in_refuses_a_request_without_metadata_flavor() {
    let addr = serve(gce(gce_attributes(), true)).await;
    let status = raw_status(
        addr,
        "GET /computeMetadata/v1/instance/hostname HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert!(status.contains("403"), "{status}");
}

#[tokio::test]
async fn a_gce_answer_without_metadata_flavor_is_not_the_metadata_servers() {
    let err = read_error(Source::Gce, gce(gce_attributes(), false)).await;
    assert!(
        matches!(&err, SettingsError::Http { origin: Source::Gce, reason, .. } if reason.contains("Metadata-Flavor")),
        "{err}"
    );
}

#[tokio::test]
async fn gce_attributes_with_bad_hex_or_an_unknown_asterism_key_are_refused() {
    let mut bad_hex = gce_attributes();
    bad_hex["asterism-cluster-id"] = CLUSTER_ID.replace('a', "g").into();
    let err = read_error(Source::Gce, gce(bad_hex, true)).await;
    assert!(
        matches!(
            err,
            SettingsError::Invalid {
                origin: Source::Gce,
                field: Field::ClusterId,
                ..
            }
        ),
        "{err}"
    );

    let mut unknown = gce_attributes();
    unknown["asterism-args"] = "--insecure".into();
    let err = read_error(Source::Gce, gce(unknown, true)).await;
    assert!(
        matches!(
            err,
            SettingsError::UnknownKey {
                origin: Source::Gce,
                ..
            }
        ),
        "{err}"
    );

    let mut network = gce_attributes();
    network["asterism-node-ip"] = "10.9.9.9".into();
    let err = read_error(Source::Gce, gce(network, true)).await;
    assert!(
        matches!(
            err,
            SettingsError::Invalid {
                field: Field::NodeIp,
                ..
            }
        ),
        "{err}"
    );

    let mut partial = gce_attributes();
    partial
        .as_object_mut()
        .unwrap()
        .remove("asterism-join-measurements");
    let err = read_error(Source::Gce, gce(partial, true)).await;
    assert!(matches!(err, SettingsError::Incomplete { .. }), "{err}");
}

// --- Azure ------------------------------------------------------------------------------

fn azure_instance() -> serde_json::Value {
    cloud::azure_instance("worker-7", "10.1.0.7", 24)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn azure_settings_come_from_user_data_and_the_instance_document() {
    let addr = serve(azure(
        b64(document().to_string().as_bytes()),
        azure_instance(),
    ))
    .await;
    let settings = client(Source::Azure, addr).read().await.unwrap();
    assert_joins(&settings);
    assert_eq!(settings.hostname.unwrap().as_str(), "worker-7");
    assert_eq!(settings.node_ip.unwrap().to_string(), "10.1.0.7/24");
}

#[tokio::test]
async fn azure_without_user_data_gives_a_node_that_waits_for_init() {
    let addr = serve(azure(String::new(), azure_instance())).await;
    let settings = client(Source::Azure, addr).read().await.unwrap();
    assert!(settings.join.is_none());
    assert_eq!(settings.hostname.unwrap().as_str(), "worker-7");
}

#[tokio::test]
async fn the_azure_stand_in_refuses_a_request_without_metadata_true() {
    let addr = serve(azure(String::new(), azure_instance())).await;
    let status = raw_status(
        addr,
        "GET /metadata/instance?api-version=2021-02-01 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert!(status.contains("400"), "{status}");
}

#[tokio::test]
async fn azure_user_data_that_is_not_base64_or_not_a_document_is_refused() {
    let err = read_error(Source::Azure, azure("not base64!".into(), azure_instance())).await;
    assert!(
        matches!(
            err,
            SettingsError::Malformed {
                origin: Source::Azure,
                ..
            }
        ),
        "{err}"
    );

    let err = read_error(
        Source::Azure,
        azure(b64(b"#!/bin/sh\nreboot\n"), azure_instance()),
    )
    .await;
    assert!(
        matches!(
            err,
            SettingsError::Malformed {
                origin: Source::Azure,
                ..
            }
        ),
        "{err}"
    );

    let mut instance = azure_instance();
    instance["network"]["interface"] = serde_json::json!([]);
    let err = read_error(Source::Azure, azure(String::new(), instance)).await;
    assert!(matches!(err, SettingsError::Malformed { .. }), "{err}");

    let mut instance = azure_instance();
    instance["compute"]["name"] = "worker 7; reboot".into();
    let err = read_error(Source::Azure, azure(String::new(), instance)).await;
    assert!(
        matches!(
            err,
            SettingsError::Invalid {
                field: Field::Hostname,
                ..
            }
        ),
        "{err}"
    );
}

// --- AWS --------------------------------------------------------------------------------

fn aws_state(user_data: Option<Vec<u8>>) -> Arc<Aws> {
    Arc::new(Aws::new(
        user_data,
        "ip-172-31-5-7.eu-west-1.compute.internal",
        "172.31.5.7",
    ))
}

#[tokio::test]
async fn aws_settings_come_from_user_data_with_an_imdsv2_session_token() {
    let state = aws_state(Some(document().to_string().into_bytes()));
    let addr = serve(aws(state.clone())).await;
    let settings = client(Source::Aws, addr).read().await.unwrap();
    assert_joins(&settings);
    assert_eq!(
        settings.hostname.unwrap().as_str(),
        "ip-172-31-5-7.eu-west-1.compute.internal"
    );
    assert_eq!(settings.node_ip.unwrap().to_string(), "172.31.5.7");
    assert_eq!(*state.puts.lock().unwrap(), 1, "one session token");
}

#[tokio::test]
async fn aws_without_user_data_gives_a_node_that_waits_for_init() {
    let addr = serve(aws(aws_state(None))).await;
    let settings = client(Source::Aws, addr).read().await.unwrap();
    assert!(settings.join.is_none());
    assert!(settings.node_ip.is_some());
}

#[tokio::test]
async fn the_aws_stand_in_refuses_a_get_without_a_token_and_a_put_without_a_ttl() {
    let addr = serve(aws(aws_state(None))).await;
    let status = raw_status(
        addr,
        "GET /latest/meta-data/local-ipv4 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert!(status.contains("401"), "{status}");
    let status = raw_status(
        addr,
        "PUT /latest/api/token HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(status.contains("400"), "{status}");
}

#[tokio::test]
async fn aws_user_data_past_its_cap_or_with_an_unknown_key_is_refused() {
    let mut big = document();
    big["join-platform-ca"] = format!("{CA}{}", " ".repeat(MAX_AWS_USER_DATA)).into();
    let err = read_error(
        Source::Aws,
        aws(aws_state(Some(big.to_string().into_bytes()))),
    )
    .await;
    assert!(
        matches!(
            err,
            SettingsError::TooLarge {
                origin: Source::Aws,
                cap: MAX_AWS_USER_DATA,
                ..
            }
        ),
        "{err}"
    );

    let mut unknown = document();
    unknown["args"] = "--insecure-skip-join-service-verification".into();
    let err = read_error(
        Source::Aws,
        aws(aws_state(Some(unknown.to_string().into_bytes()))),
    )
    .await;
    assert!(
        matches!(
            err,
            SettingsError::UnknownKey {
                origin: Source::Aws,
                ..
            }
        ),
        "{err}"
    );

    let mut hostname = document();
    hostname["hostname"] = "elsewhere".into();
    let err = read_error(
        Source::Aws,
        aws(aws_state(Some(hostname.to_string().into_bytes()))),
    )
    .await;
    assert!(
        matches!(
            err,
            SettingsError::Invalid {
                field: Field::Hostname,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn an_aws_token_that_cannot_be_a_header_is_refused() {
    let state = Arc::new(Aws {
        token: "bad token",
        ..Aws::new(
            None,
            "ip-172-31-5-7.eu-west-1.compute.internal",
            "172.31.5.7",
        )
    });
    let err = read_error(Source::Aws, aws(state)).await;
    assert!(
        matches!(&err, SettingsError::Http { method: "PUT", reason, .. } if reason.contains("token")),
        "{err}"
    );
}

// --- Hostile transport ------------------------------------------------------------------

/// A server that answers every connection with `head` and `body`, then holds it open.
async fn raw_server(head: String, body: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let (head, body) = (head.clone(), body.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body).await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_body_slower_than_the_deadline_is_refused() {
    // The token answer declares 100 bytes and sends 10.
    let addr = raw_server(
        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n".into(),
        b"0123456789".to_vec(),
    )
    .await;
    let started = std::time::Instant::now();
    let err = CloudSettings::new(Source::Aws, &format!("http://{addr}"))
        .unwrap()
        .with_timeout(Duration::from_millis(300))
        .read()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SettingsError::Http { reason, .. } if reason.contains("within")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn an_oversized_answer_is_refused_declared_or_streamed() {
    let declared = raw_server(
        "HTTP/1.1 200 OK\r\nContent-Length: 999999\r\n\r\n".into(),
        Vec::new(),
    )
    .await;
    let chunk = vec![b'a'; 2048];
    let mut chunked = format!("{:x}\r\n", chunk.len()).into_bytes();
    chunked.extend_from_slice(&chunk);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let streamed = raw_server(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
        chunked,
    )
    .await;
    for addr in [declared, streamed] {
        let err = client(Source::Aws, addr).read().await.unwrap_err();
        assert!(
            matches!(
                err,
                SettingsError::TooLarge {
                    origin: Source::Aws,
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_service_that_does_not_answer_is_a_clear_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = client(Source::Gce, addr).read().await.unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("GCE metadata: GET http://"), "{text}");
}
