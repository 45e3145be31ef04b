//! Mutual aTLS with the join service attesting by an attested session key over a real
//! swtpm: nodes that verify the service get tickets, and however many connect, the
//! service's TPM quotes once; nodes that do not ask never make it quote.

use crate::common::*;
use asterism_atls::{
    AtlsConfig, AtlsConnector, AtlsServer, Issuer, SessionKeyIssuer, VerifiedPeer,
};
use asterism_attestation::{AkTrust, IssueError, ReportData, TpmQuoteValidator};
use asterism_join_service::{LIMITS, RedbState};
use asterism_proto::join::IssueJoinTicketRequest;
use asterism_proto::join::api_client::ApiClient;
use asterism_testkit::TpmNode;
use asterism_tpm::TpmIssuer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tonic::transport::Endpoint;

/// The real swtpm issuer, counting its quotes.
struct Counting {
    inner: Arc<TpmIssuer>,
    quotes: AtomicUsize,
}

impl Issuer for Counting {
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn issue(&self, rd: &ReportData) -> Result<Vec<u8>, IssueError> {
        self.quotes.fetch_add(1, Ordering::SeqCst);
        self.inner.issue(rd)
    }
}

/// Joins from `from` with a fresh connection; returns the service as the node verified
/// it (when `verify` is given) and whether a ticket came back.
async fn join_from(
    server: SocketAddr,
    from: &str,
    node: Arc<dyn Issuer>,
    verify: Option<Arc<TpmQuoteValidator>>,
    req: IssueJoinTicketRequest,
) -> Option<VerifiedPeer> {
    let mut cfg = AtlsConfig::attesting(node);
    if let Some(v) = verify {
        cfg = cfg.with_validator(v);
    }
    // A connector of its own: the peer it last verified is the one of this call.
    let connector = AtlsConnector::new(cfg)
        .unwrap()
        .from_address(from.parse().unwrap());
    let channel = Endpoint::from_shared(format!("http://{server}"))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect_with_connector(connector.clone())
        .await
        .unwrap();
    ApiClient::new(channel)
        .issue_join_ticket(req)
        .await
        .expect("a join ticket");
    connector.last_verified_peer()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_joins_verify_a_session_key_and_the_service_quotes_once() {
    let service_tpm = TpmNode::start().unwrap();
    let quotes = Arc::new(Counting {
        inner: service_tpm.issuer.clone(),
        quotes: AtomicUsize::new(0),
    });
    let (w0, w0_fp) = soft_node();
    let (w1, w1_fp) = soft_node();
    let cluster = Cluster::start().await;

    // The join service as `main` configures it with --tpm: verifying nodes, attesting
    // with a session key.
    let atls = AtlsServer::new(
        AtlsConfig::verifying(Arc::new(TpmQuoteValidator::new(
            AkTrust::pinned([w0_fp, w1_fp]),
            zero_measurements().into_provider(),
        )))
        .with_session_key(Arc::new(SessionKeyIssuer::new(
            quotes.clone(),
            Duration::from_secs(60),
        ))),
    )
    .unwrap();
    let service = join_service(
        &cluster,
        RedbState::open(&cluster.state_dir()).unwrap(),
        Options::pinning(Vec::new()),
    );
    let listener = tokio::net::TcpListener::bind(format!("{CP}:0"))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        asterism_join_service::serve(listener, atls, service, &LIMITS, std::future::pending())
            .await
            .unwrap();
    });

    // A node that does not verify the service is served and never makes it quote.
    let peer = join_from(
        addr,
        W0,
        w0,
        None,
        join_request("worker-0", W0, DISK_A, false),
    )
    .await;
    assert!(peer.is_none());
    assert_eq!(quotes.quotes.load(Ordering::SeqCst), 0);

    // A node that verifies the service (its pinned swtpm AK, PCRs 0–7) gets its ticket
    // over a session key; a second connection reuses the key.
    let service_validator = Arc::new(TpmQuoteValidator::new(
        service_tpm.ak_trust(),
        zero_measurements().into_provider(),
    ));
    for _ in 0..2 {
        let peer = join_from(
            addr,
            W1,
            w1.clone(),
            Some(service_validator.clone()),
            join_request("worker-1", W1, DISK_B, false),
        )
        .await
        .expect("the node verified the join service");
        assert_eq!(
            peer.evidence().identity(),
            service_tpm.fingerprint.to_string()
        );
    }
    assert_eq!(
        quotes.quotes.load(Ordering::SeqCst),
        1,
        "one quote, two connections"
    );
}
