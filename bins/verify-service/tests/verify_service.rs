//! The verify service as a real process on a real swtpm: fresh, nonce-bound evidence.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use asterism_attestation::{
    ExpectedPcr, Measurements, PcrIndex, ReportData, TpmQuoteValidator, Validator,
};
use asterism_proto::verify::GetAttestationRequest;
use asterism_proto::verify::api_client::ApiClient;
use asterism_testkit::net::{closed_within, open_after, tcp_from};
use asterism_testkit::process::{Process, free_port};
use asterism_testkit::{Swtpm, pin};
use asterism_tpm::{AkConfig, PcrSelection, Tpm};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serves_evidence_bound_to_the_callers_nonce_and_refuses_bad_nonces() {
    let swtpm = Swtpm::start().unwrap();
    let (ak_public, pcr0) = {
        let mut tpm = Tpm::open(&swtpm.config()).unwrap();
        let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
        let pcr0 = tpm.read_pcrs(&PcrSelection::new([0]).unwrap()).unwrap()[0].1;
        (ak.public_area().to_vec(), pcr0)
    };
    let (child, addr) = start_verify_service(&swtpm, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let outcome = rt.block_on(async {
        let channel = channel_from("127.0.0.1", addr).await;
        let mut client = ApiClient::new(channel);
        let evidence = client
            .get_attestation(GetAttestationRequest {
                nonce: b"nonce-1".to_vec(),
            })
            .await
            .unwrap()
            .into_inner()
            .attestation;
        let empty = client
            .get_attestation(GetAttestationRequest { nonce: Vec::new() })
            .await
            .unwrap_err();
        let long = client
            .get_attestation(GetAttestationRequest { nonce: vec![0; 65] })
            .await
            .unwrap_err();
        (evidence, empty.code(), long.code())
    });
    drop(child);
    let (evidence, empty, long) = outcome;
    assert_eq!(empty, tonic::Code::InvalidArgument);
    assert_eq!(long, tonic::Code::InvalidArgument);

    let validator = TpmQuoteValidator::new(
        pin(&ak_public),
        Measurements::new([(PcrIndex::new(0).unwrap(), ExpectedPcr::enforce(pcr0))])
            .unwrap()
            .into_provider(),
    );
    validator
        .validate(&evidence, &ReportData::verify(b"nonce-1"))
        .unwrap();
    // Bound to the nonce and to the verify purpose: useless for another nonce or for aTLS.
    assert!(
        validator
            .validate(&evidence, &ReportData::verify(b"nonce-2"))
            .is_err()
    );
    assert!(
        validator
            .validate(
                &evidence,
                &ReportData::atls(asterism_attestation::Role::Client, &[0; 32])
            )
            .is_err()
    );
}

/// The verify-service program on `swtpm`, listening on a free loopback port, with `args`
/// besides (killed when dropped); and its address.
fn start_verify_service(swtpm: &Swtpm, args: &[&str]) -> (Process, std::net::SocketAddr) {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port("127.0.0.1"))
        .parse()
        .unwrap();
    let child = Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_asterism-verify-service"))
            .args(["--listen", &addr.to_string(), "--tpm", &swtpm.tcti()])
            .args(args)
            .stdout(Stdio::null()),
    );
    (child, addr)
}

/// A gRPC channel to `addr` from the local address `from`.
async fn channel_from(from: &str, addr: std::net::SocketAddr) -> tonic::transport::Channel {
    let from: std::net::IpAddr = from.parse().unwrap();
    let start = Instant::now();
    loop {
        let connected = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_with_connector(tower::service_fn(
                move |_: tonic::transport::Uri| async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tcp_from(from, addr).await?,
                    ))
                },
            ))
            .await;
        match connected {
            Ok(c) => return c,
            Err(_) if start.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("verify service did not come up: {e}"),
        }
    }
}

#[test]
fn quotes_are_held_to_a_rate_per_source_address() {
    let swtpm = Swtpm::start().unwrap();
    // Three at once, then one every 100 s: no refill during the test.
    let (child, addr) = start_verify_service(
        &swtpm,
        &["--rate-limit-burst", "3", "--rate-limit-per-second", "0.01"],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let outcome = rt.block_on(async {
        let ask = |channel: tonic::transport::Channel| async move {
            ApiClient::new(channel)
                .get_attestation(GetAttestationRequest {
                    nonce: b"nonce".to_vec(),
                })
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        };
        let flood = channel_from("127.0.0.1", addr).await;
        let mut codes = Vec::new();
        for _ in 0..10 {
            codes.push(ask(flood.clone()).await);
        }
        let other = ask(channel_from("127.0.0.2", addr).await).await;
        (codes, other)
    });
    drop(child);
    let (codes, other) = outcome;
    assert_eq!(codes.iter().filter(|c| c.is_ok()).count(), 3, "{codes:?}");
    assert!(
        codes
            .iter()
            .skip(3)
            .all(|c| *c == Err(tonic::Code::ResourceExhausted)),
        "{codes:?}"
    );
    assert_eq!(other, Ok(()), "another address is still served");
}

/// The owner's request for evidence over `channel`, which must succeed; the evidence.
async fn owner_asks(channel: tonic::transport::Channel) -> Vec<u8> {
    owner_tries(channel).await.unwrap()
}

/// The owner's request for evidence, and its answer: the evidence or the status code.
async fn owner_tries(channel: tonic::transport::Channel) -> Result<Vec<u8>, tonic::Code> {
    ApiClient::new(channel)
        .get_attestation(GetAttestationRequest {
            nonce: b"owner".to_vec(),
        })
        .await
        .map(|answer| answer.into_inner().attestation)
        .map_err(|status| status.code())
}

/// `connections` gRPC channels from each of `sources` addresses, `{prefix}.1` onwards.
async fn channels_from(
    prefix: &str,
    sources: usize,
    connections: usize,
    addr: std::net::SocketAddr,
) -> Vec<tonic::transport::Channel> {
    let mut channels = Vec::new();
    for s in 0..sources {
        for _ in 0..connections {
            channels.push(channel_from(&format!("{prefix}.{}", s + 1), addr).await);
        }
    }
    channels
}

/// Idle connections are bounded per source and in all, and shared fairly: a source's fifth
/// is closed at once; 40 sources holding 4 each (160, over the 128 in all) keep at most
/// 128 open, the oldest of the busiest being closed for the newcomers; and the owner,
/// connecting from a source of its own while they hold on, gets its evidence.
#[test]
fn idle_connections_are_bounded_per_source_and_in_all_and_do_not_keep_the_owner_out() {
    let swtpm = Swtpm::start().unwrap();
    let (child, addr) = start_verify_service(&swtpm, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Up and serving.
        drop(channel_from("127.0.0.1", addr).await);
        let connect =
            |from: String| async move { tcp_from(from.parse().unwrap(), addr).await.unwrap() };

        let mut one_source = Vec::new();
        for _ in 0..4 {
            one_source.push(connect("127.0.21.1".into()).await);
        }
        let mut fifth = connect("127.0.21.1".into()).await;
        assert!(
            closed_within(&mut fifth, Duration::from_secs(5)).await,
            "a fifth connection from one source is closed"
        );
        for tcp in &mut one_source {
            assert!(!closed_within(tcp, Duration::from_millis(50)).await);
        }
        drop(one_source);

        let mut held = Vec::new();
        for s in 0..40 {
            for _ in 0..4 {
                held.push(connect(format!("127.0.22.{}", s + 1)).await);
            }
        }
        let held = open_after(held, 128, Duration::from_secs(10)).await;
        let open = held.len();
        assert!(open <= 128, "{open} of 160 idle connections still open");
        assert!(open >= 100, "only {open} open: the cap is 128, not fewer");

        let evidence = owner_asks(channel_from("127.0.23.1", addr).await).await;
        assert!(!evidence.is_empty());
        drop(held);
    });
    drop(child);
}

/// Quotes take turns on the TPM, shared fairly between sources: 4 sources, each within its
/// rate (a burst of 16 here) and its connections (4, of 4 requests each), queue 64 quotes;
/// the owner, asking from a source of its own once they are queued, waits for each
/// flooding source's first quote and the answers already on their way, not for the whole
/// flood. Without the fair queue (every request to the TPM at once, or turns in arrival
/// order), the owner's quote is served among the last.
#[test]
fn a_flood_of_quotes_from_many_sources_does_not_put_the_owner_behind_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const SOURCES: usize = 4;
    const CONNECTIONS: usize = 4;
    const STREAMS: usize = 4;
    const FLOOD: usize = SOURCES * CONNECTIONS * STREAMS;
    let swtpm = Swtpm::start().unwrap();
    let (child, addr) = start_verify_service(&swtpm, &["--rate-limit-burst", "16"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (before_owner, served) = rt.block_on(async {
        let done = Arc::new(AtomicUsize::new(0));
        let channels = channels_from("127.0.24", SOURCES, CONNECTIONS, addr).await;
        let owner = channel_from("127.0.25.1", addr).await;
        let mut flood = Vec::new();
        for (c, channel) in channels.into_iter().enumerate() {
            for i in 0..STREAMS {
                let (channel, done) = (channel.clone(), done.clone());
                flood.push(tokio::spawn(async move {
                    let answer = ApiClient::new(channel)
                        .get_attestation(GetAttestationRequest {
                            nonce: format!("flood-{c}-{i}").into_bytes(),
                        })
                        .await;
                    if answer.is_ok() {
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    answer.map(drop).map_err(|s| s.code())
                }));
            }
        }
        // The flood is queued once the TPM has answered some of it.
        while done.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let sent = done.load(Ordering::SeqCst);
        let evidence = owner_asks(owner).await;
        let before_owner = done.load(Ordering::SeqCst) - sent;
        assert!(!evidence.is_empty());
        let mut served = 0;
        for f in flood {
            if f.await.unwrap().is_ok() {
                served += 1;
            }
        }
        (before_owner, served)
    });
    drop(child);
    assert_eq!(served, FLOOD, "the flood, within its rate, is served too");
    assert!(
        before_owner <= 24,
        "{before_owner} of {FLOOD} flood quotes were answered while the owner waited"
    );
}

/// A flood that keeps every place of the quote queue taken does not keep the owner out: 24
/// sources (4 connections of 4 requests each, 384 in all) hold the queue's 256 places, and
/// each request refused or answered asks again at once. The owner, asking from a source of
/// its own with nothing waiting, takes the newest place of the heaviest source and is
/// answered. With a full queue refusing every newcomer, the owner got `RESOURCE_EXHAUSTED`.
#[test]
fn a_flood_that_keeps_the_quote_queue_full_does_not_keep_the_owner_out() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const SOURCES: usize = 24;
    const CONNECTIONS: usize = 4;
    const STREAMS: usize = 4;
    let swtpm = Swtpm::start().unwrap();
    let (child, addr) = start_verify_service(
        &swtpm,
        &[
            "--rate-limit-burst",
            "1000000",
            "--rate-limit-per-second",
            "1000000",
        ],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let answer = rt.block_on(async {
        let refused = Arc::new(AtomicUsize::new(0));
        let channels = channels_from("127.0.26", SOURCES, CONNECTIONS, addr).await;
        let owner = channel_from("127.0.27.1", addr).await;
        let mut flood = Vec::new();
        for channel in channels {
            for _ in 0..STREAMS {
                let (channel, refused) = (channel.clone(), refused.clone());
                flood.push(tokio::spawn(async move {
                    loop {
                        let answer = ApiClient::new(channel.clone())
                            .get_attestation(GetAttestationRequest {
                                nonce: b"flood".to_vec(),
                            })
                            .await;
                        if answer.is_err_and(|s| s.code() == tonic::Code::ResourceExhausted) {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }));
            }
        }
        // Every place is taken once the service refuses some of the flood.
        while refused.load(Ordering::SeqCst) < 16 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let answer = owner_tries(owner).await;
        for f in &flood {
            f.abort();
        }
        answer
    });
    drop(child);
    let evidence = answer.expect("the owner was refused while the flood kept the queue full");
    assert!(!evidence.is_empty());
}
