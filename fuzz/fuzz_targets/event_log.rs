//! The TCG event-log parser on arbitrary bytes: must never panic; a log that parses carries
//! exactly the declared algorithms in every event, within the limits, and replays (or says
//! it has no SHA-256 bank) and describes each event without panicking.
#![no_main]

use asterism_attestation::tpm::eventlog::{
    EventLog, EventLogError, MAX_EVENT_DATA, MAX_EVENTS, MAX_EVENT_LOG_SIZE,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(log) = EventLog::parse(data) else {
        return;
    };
    assert!(data.len() <= MAX_EVENT_LOG_SIZE);
    assert!(log.events().len() <= MAX_EVENTS);
    let declared = &log.spec_id().algorithms;
    for e in log.events() {
        assert!(e.data.len() <= MAX_EVENT_DATA);
        assert_eq!(e.digests.len(), declared.len());
        for a in declared {
            assert_eq!(e.digest(a.alg).map(<[u8]>::len), Some(usize::from(a.size)));
        }
        let _ = e.label();
    }
    match log.replay_sha256() {
        Ok(pcrs) => assert!(pcrs.keys().all(|i| log.extended(*i).next().is_some())),
        Err(e) => assert!(matches!(e, EventLogError::NoSha256(_)), "{e}"),
    }
});
