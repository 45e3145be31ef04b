//! End to end: the key-service binary releases a data key over attested TLS to a client
//! that attests with a real TPM quote (swtpm), and refuses it once an enforced PCR changed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use asterism_atls::{AtlsConfig, AtlsConnector};
use asterism_proto::kms::api_client::ApiClient;
use asterism_testkit::TpmNode;
use asterism_tpm::{PcrSelection, Tpm, TpmIssuer};
use tonic::transport::{Channel, Endpoint};

async fn attested_channel(
    addr: &str,
    issuer: Arc<TpmIssuer>,
) -> Result<Channel, tonic::transport::Error> {
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer)).unwrap();
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(connector)
        .await
}

#[test]
fn a_client_attesting_with_an_swtpm_quote_gets_its_key_until_its_pcrs_change() {
    let TpmNode {
        issuer,
        fingerprint,
        swtpm,
    } = TpmNode::start().unwrap();
    let pcrs = Tpm::open(&swtpm.config())
        .unwrap()
        .read_pcrs(&PcrSelection::all())
        .unwrap();
    // Expected measurements: PCRs 0..=7 and 15 as they are now, enforced.
    let entries: Vec<String> = pcrs
        .iter()
        .filter(|(i, _)| *i <= 7 || *i == 15)
        .map(|(i, v)| {
            format!(
                "\"{i}\": {{\"expected\": \"{}\", \"warnOnly\": false}}",
                hex::encode(v)
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let measurements = dir.path().join("measurements.json");
    std::fs::write(
        &measurements,
        format!("{{\"measurements\": {{{}}}}}", entries.join(", ")),
    )
    .unwrap();
    let secret = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, [0u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    };
    let (ms, salt) = (secret("mastersecret"), secret("salt"));

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_asterism-key-service"))
        .arg("--master-secret-file")
        .arg(&ms)
        .arg("--salt-file")
        .arg(&salt)
        .args(["--atls-listen", &addr, "--verify-clients", "tpm-quote"])
        .args(["--pinned-ak", &hex::encode(fingerprint.as_bytes())])
        .arg("--measurements")
        .arg(&measurements)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcome = runtime.block_on(async {
        let start = Instant::now();
        let channel = loop {
            match attested_channel(&addr, issuer.clone()).await {
                Ok(c) => break c,
                Err(_) if start.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(format!("no attested connection: {e:?}")),
            }
        };
        let key = get_key_hex(&mut ApiClient::new(channel), "measurementSecret").await;

        // The node's software changes: an enforced PCR moves.
        let mut tpm = Tpm::open(&swtpm.config()).unwrap();
        tpm.extend_pcr(4, &[0xab; 32]).unwrap();
        let refused = attested_channel(&addr, issuer.clone()).await.unwrap_err();
        Ok((key, format!("{refused:?}")))
    });
    let _ = child.kill();
    let _ = child.wait();
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    let (key, refused) = outcome.unwrap_or_else(|e| panic!("{e}\n{logs}"));
    assert_eq!(key, MEASUREMENT_SECRET_ZERO);
    assert!(
        refused.contains("index 4"),
        "the refusal names the PCR: {refused}"
    );
    assert!(logs.contains("measurement mismatch at index 4"), "{logs}");
    assert!(!logs.contains(&MEASUREMENT_SECRET_ZERO[..16]), "{logs}");
}
