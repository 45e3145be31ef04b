//! A failure after the point of no return, in a test binary of its own: the node's log
//! buffer is fed by a process-wide subscriber, which no other test may share.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod common;

use asterism_bootstrapper::Failure;
use common::init_helpers::*;
use common::*;
use std::sync::Arc;

#[tokio::test(flavor = "current_thread")]
async fn a_failure_after_the_lock_marks_the_disk_for_reset_ends_non_zero_and_streams_logs() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let logs = asterism_bootstrapper::LogBuffer::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(logs.layer(tracing::Level::INFO)),
    )
    .unwrap();
    let t = TestNode::new("127.0.11.4");
    let driver = Arc::new(GateDriver {
        gate: tokio::sync::Semaphore::new(1),
        fail: true,
    });
    let node = t.node_with_logs(metadata(&t), driver, 1, None, logs);
    let run = tokio::spawn(t.run(node, std::future::pending()));

    let responses = init(t.init_channel().await, request(INIT_SECRET))
        .await
        .unwrap();
    let failure = failure_of(&responses).expect("a failure");
    assert!(
        failure.contains("after the point of no return"),
        "{failure}"
    );
    assert!(failure.contains("kubeadm init failed"), "{failure}");
    let logs = logs_of(&responses);
    assert!(!logs.is_empty(), "an authenticated caller gets the logs");
    assert!(logs.iter().all(|c| c.len() <= 1024));
    let text = String::from_utf8(logs.concat()).unwrap();
    assert!(text.contains("re-keyed the state disk"), "{text}");
    assert!(text.contains("marking the state disk for reset"), "{text}");
    // No secret in the logs: neither the init secret nor the KMS URI's key.
    assert!(!text.contains("correct horse"));
    assert!(!text.contains("cluster-kms?key"));

    let failed = run.await.unwrap().unwrap_err();
    assert!(matches!(failed, Failure::AfterLock(_)), "{failed:?}");
    assert_eq!(failed.exit_code(), asterism_bootstrapper::EXIT_RESET);
    assert!(token0(&t.image()).contains("\"diskIsInitialized\":false"));
    assert!(!t.node_dir.node_state().exists());
}
