//! End to end: the key-service binary releases a data key over attested TLS to a client
//! that attests with a real TPM quote (swtpm), and refuses it once an enforced PCR changed.

use std::time::Duration;

use crate::common::*;
use asterism_proto::kms::api_client::ApiClient;
use asterism_testkit::TpmNode;
use asterism_tpm::{PcrSelection, Tpm};

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
    let secrets = secrets();
    let measurements = secrets.dir.path().join("measurements.json");
    std::fs::write(
        &measurements,
        format!("{{\"measurements\": {{{}}}}}", entries.join(", ")),
    )
    .unwrap();
    let pinned = hex::encode(fingerprint.as_bytes());
    let (mut child, addr) = start_atls_key_service(
        &secrets,
        &[
            "--verify-clients",
            "tpm-quote",
            "--pinned-ak",
            &pinned,
            "--measurements",
            measurements.to_str().unwrap(),
        ],
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcome = runtime.block_on(async {
        let channel = attested_channel_once_up(&addr, issuer.clone()).await?;
        let key = get_key_hex(&mut ApiClient::new(channel), "measurementSecret").await;

        // The node's software changes: an enforced PCR moves.
        let mut tpm = Tpm::open(&swtpm.config()).unwrap();
        tpm.extend_pcr(4, &[0xab; 32]).unwrap();
        let refused = attested_channel(&addr, issuer.clone()).await.unwrap_err();
        Ok::<_, String>((key, format!("{refused:?}")))
    });
    let (_, logs) = child.stop(Duration::from_secs(30));
    let (key, refused) = outcome.unwrap_or_else(|e| panic!("{e}\n{logs}"));
    assert_eq!(key, MEASUREMENT_SECRET_ZERO);
    assert!(
        refused.contains("index 4"),
        "the refusal names the PCR: {refused}"
    );
    assert!(logs.contains("measurement mismatch at index 4"), "{logs}");
    assert!(!logs.contains(&MEASUREMENT_SECRET_ZERO[..16]), "{logs}");
}
