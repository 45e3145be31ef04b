//! A join ticket as the node receives it: the protobuf decoder, then the checks the
//! JoinClient makes before it takes the node lock. Must never panic, and whatever passes must
//! hold what the node relies on afterwards (key lengths, control-plane file names that stay
//! inside their directory, well-formed component hashes and absolute install paths).
#![no_main]

use asterism_bootstrapper::check_join_ticket;
use asterism_proto::join::IssueJoinTicketResponse;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(ticket) = IssueJoinTicketResponse::decode(data) else {
        return;
    };
    let copy = ticket.clone();
    if check_join_ticket(ticket).is_err() {
        return;
    }
    assert_eq!(copy.state_disk_key.len(), 32);
    assert_eq!(copy.measurement_secret.len(), 32);
    assert_eq!(copy.measurement_salt.len(), 32);
    for file in &copy.control_plane_files {
        let name = &file.name;
        assert!(!name.is_empty() && !name.starts_with('/'), "{name:?}");
        assert!(
            name.split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."),
            "{name:?}"
        );
        assert!(!name.contains('\0') && !name.contains('\\'), "{name:?}");
    }
    for c in &copy.kubernetes_components {
        let hex = c.hash.strip_prefix("sha256:").unwrap_or_default();
        assert!(hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        assert!(c.install_path.starts_with('/'), "{:?}", c.install_path);
    }
});
