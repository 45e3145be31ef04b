//! The model checked: the old design's three attacks are found, each with its trace; the new
//! design's bounded state space has no violation.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use asterism_model::{
    Action, CAN_JOIN, CAN_RECOVER, CAN_REJOIN, Capabilities, Check, Design, Evidence, Machine, P1,
    P2, P3, Party, Pcr15, Presented, Protocol, Role, Secret, Session, State, Ticket,
};
use stateright::{Checker, Expectation, Model, Path};

/// The first path, in the checker's visiting order, that ends in a discovery of each property.
/// (The checker's own `discoveries` keeps the last one it visited, not the first.)
type FirstDiscoveries = Arc<Mutex<BTreeMap<&'static str, Vec<Action>>>>;

/// A finished check.
struct Checked {
    first: BTreeMap<&'static str, Vec<Action>>,
    unique_states: usize,
    done: bool,
}

impl Checked {
    /// The shortest path to a discovery of `property` (a counterexample of an `always`
    /// property, an example of a `sometimes` one), printed.
    fn trace(&self, property: &'static str) -> Option<Vec<Action>> {
        let actions = self.first.get(property)?;
        eprintln!("{property}:");
        for action in actions {
            eprintln!("  {action:?}");
        }
        Some(actions.clone())
    }
}

/// Runs a breadth-first check of the whole reachable state space on one thread, so that
/// the first discoveries are the shortest and always the same.
fn check(model: Protocol) -> Checked {
    let first: FirstDiscoveries = Arc::default();
    let properties = model.properties();
    let recorder = {
        let first = Arc::clone(&first);
        move |path: Path<State, Action>| {
            let mut first = first.lock().unwrap();
            for property in &properties {
                let discovered = match property.expectation {
                    Expectation::Always => !(property.condition)(&model, path.last_state()),
                    Expectation::Sometimes => (property.condition)(&model, path.last_state()),
                    Expectation::Eventually => false,
                };
                if discovered && !first.contains_key(property.name) {
                    first.insert(property.name, path.clone().into_actions());
                }
            }
        }
    };
    let start = Instant::now();
    let checker = model.checker().visitor(recorder).spawn_bfs().join();
    let elapsed = start.elapsed();
    eprintln!(
        "{:?} without {:?}, second worker {}, {:?}: {} unique states ({} generated), max depth {}, {:.2?}",
        model.design,
        model.without,
        model.second_worker,
        model.insider,
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        elapsed
    );
    let first = first.lock().unwrap().clone();
    Checked {
        first,
        unique_states: checker.unique_state_count(),
        done: checker.is_done(),
    }
}

/// The old design with one fresh worker: each attack needs only one, and with the second
/// the old design's state space (every key the insider learns is one more ticket it can
/// forge) grows past 200,000 states.
fn old(insider: Capabilities) -> Protocol {
    Protocol {
        design: Design::Old,
        insider,
        without: None,
        second_worker: false,
    }
}

#[test]
fn old_design_lets_an_insider_pose_as_the_join_service_and_hand_a_fresh_node_its_own_disk_key() {
    let checked = check(old(Capabilities {
        pose_as_join_service: true,
        ..Capabilities::NONE
    }));
    // One exchange: the insider answers the fresh worker's join connection with its own
    // evidence (genuine, PCR 15 marked) and a self-consistent ticket carrying a key it knows.
    let expected = vec![Action::InsiderPosesAsJoinService {
        node: Machine::Worker,
        evidence: Presented::Own,
        ticket: Ticket {
            disk_key: Secret::DiskKey(Machine::Insider),
            cluster_consistent: true,
            signed_for: None,
            issued_to: None,
        },
    }];
    assert_eq!(checked.trace(P3), Some(expected.clone()));
    assert_eq!(checked.trace(P1), Some(expected));
    assert_eq!(checked.trace(P2), None);
}

#[test]
fn old_design_lets_an_insider_pose_as_a_recovery_server_and_receive_the_control_plane_disk_key() {
    let checked = check(old(Capabilities {
        pose_as_recovery_server: true,
        reset_pcr15: true,
        ..Capabilities::NONE
    }));
    // The insider reboots (PCR 15 zero, measurements genuine), answers the owner's
    // `asterism recover` and names the control plane's disk in `Describe`.
    let expected = vec![
        Action::InsiderSetsPcr15(Pcr15::Zero),
        Action::InsiderPosesAsRecoveryServer {
            evidence: Presented::Own,
            names_disk: Machine::ControlPlane,
        },
    ];
    assert_eq!(checked.trace(P1), Some(expected));
    assert_eq!(checked.trace(P2), None);
    assert_eq!(checked.trace(P3), None);
}

#[test]
fn old_design_lets_an_insider_squat_a_fresh_nodes_disk_and_receive_its_key() {
    let checked = check(old(Capabilities {
        request_tickets: true,
        reset_pcr15: true,
        ..Capabilities::NONE
    }));
    // The insider reboots, then asks the real join service for a join ticket naming the
    // fresh worker's disk UUID (read from its plaintext LUKS2 header): the disk is bound to
    // the insider's AK on first use and its key is released.
    let expected = vec![
        Action::InsiderSetsPcr15(Pcr15::Zero),
        Action::InsiderRequestsJoinTicket(Machine::Worker),
    ];
    assert_eq!(checked.trace(P1), Some(expected));
    assert_eq!(checked.trace(P2), None);
    assert_eq!(checked.trace(P3), None);
}

#[test]
fn old_design_with_every_insider_move_breaks_p1_and_p3_but_not_p2() {
    let checked = check(old(Capabilities::ALL));
    assert!(checked.trace(P1).is_some());
    assert!(checked.trace(P3).is_some());
    assert_eq!(checked.trace(P2), None);
}

/// A floor under the new design's state count: a model whose honest flows or insider moves
/// stopped doing anything would explore far fewer states and fail here.
const NEW_DESIGN_MIN_STATES: usize = 1_000;

#[test]
fn new_design_has_no_violation_in_its_whole_bounded_state_space() {
    let checked = check(Protocol::new(Design::New));
    assert!(checked.done);
    for property in [P1, P2, P3] {
        assert_eq!(checked.trace(property), None, "{property} violated");
    }
    // The honest flows still work: a worker joins and rejoins, the control plane recovers.
    for example in [CAN_JOIN, CAN_REJOIN, CAN_RECOVER] {
        assert!(checked.trace(example).is_some(), "no example of: {example}");
    }
    assert!(
        checked.unique_states > NEW_DESIGN_MIN_STATES,
        "only {} states",
        checked.unique_states
    );
}

#[test]
fn new_design_has_no_violation_with_any_single_insider_move() {
    let single = [
        Capabilities {
            pose_as_join_service: true,
            ..Capabilities::NONE
        },
        Capabilities {
            pose_as_recovery_server: true,
            reset_pcr15: true,
            probe_recovery_servers: true,
            ..Capabilities::NONE
        },
        Capabilities {
            request_tickets: true,
            reset_pcr15: true,
            ..Capabilities::NONE
        },
    ];
    for insider in single {
        let checked = check(Protocol {
            design: Design::New,
            insider,
            without: None,
            second_worker: true,
        });
        for property in [P1, P2, P3] {
            assert_eq!(checked.trace(property), None, "{property} with {insider:?}");
        }
    }
}

#[test]
fn new_design_needs_each_of_its_checks() {
    // Each check left out, the insider takes an honest disk key again (and, for the two a
    // joining node makes, its join): none of them is dead weight. The last step of the
    // shortest P1 counterexample says how.
    let cases = [
        // The control plane's evidence, captured from its recovery server, relayed to the
        // owner's recover.
        (
            Check::SessionBinding,
            true,
            Action::InsiderPosesAsRecoveryServer {
                evidence: Presented::Relayed(Evidence {
                    ak: Machine::ControlPlane,
                    pcr15: Pcr15::Zero,
                    session: Session {
                        client: Party::Machine(Machine::Insider),
                        server: Party::Machine(Machine::ControlPlane),
                    },
                    role: Role::Server,
                }),
                names_disk: Machine::ControlPlane,
            },
        ),
        // A forged, unsigned ticket, as in the old design.
        (
            Check::TicketSignature,
            true,
            Action::InsiderPosesAsJoinService {
                node: Machine::Worker,
                evidence: Presented::Own,
                ticket: Ticket {
                    disk_key: Secret::DiskKey(Machine::Insider),
                    cluster_consistent: true,
                    signed_for: None,
                    issued_to: None,
                },
            },
        ),
        (
            Check::RecoverAllowList,
            false,
            Action::InsiderPosesAsRecoveryServer {
                evidence: Presented::Own,
                names_disk: Machine::ControlPlane,
            },
        ),
        (
            Check::OneDiskPerMember,
            false,
            Action::InsiderRequestsJoinTicket(Machine::Worker),
        ),
    ];
    for (without, breaks_p3, last) in cases {
        // One fresh worker, as for the old design: the attacks need no more.
        let checked = check(Protocol {
            without: Some(without),
            second_worker: false,
            ..Protocol::new(Design::New)
        });
        let p1 = checked.trace(P1).unwrap_or_default();
        assert_eq!(p1.last(), Some(&last), "without {without:?}");
        assert_eq!(
            checked.trace(P3).is_some(),
            breaks_p3,
            "without {without:?}"
        );
        assert_eq!(checked.trace(P2), None);
    }
}
