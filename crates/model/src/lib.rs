//! A model of Asterism's init, join, rejoin and recover flows against an insider, checked
//! with [`stateright`].
//!
//! The model is a [`Model`]: its states are what every party holds (each machine's phase,
//! disk key and PCR 15, the join service's disk bindings, and the insider's knowledge), its
//! actions are whole protocol exchanges (a node joining through the real join service, the
//! insider answering a fresh node in its place, the owner's `asterism recover` reaching a
//! node or the insider, …). The checker explores every interleaving and checks three
//! invariants ([`Protocol::properties`]):
//!
//! * **P1** no honest node's disk key reaches the insider;
//! * **P2** the master secret never reaches the insider;
//! * **P3** a fresh honest node joins only the owner's cluster: it never accepts a ticket
//!   that the real control plane did not issue to it.
//!
//! Two designs are modelled ([`Design`]): the one on `main` before issue 22 (where the
//! insider breaks P1 and P3 three ways) and the new one (where the checker finds no
//! violation within the bounds).
//!
//! The insider is one genuine, joined worker: its TPM (genuine evidence, PCR 15 it can reset
//! by rebooting and mark again, since it knows the measurement secret), its own disk key,
//! the measurement secret, and the whole network (it answers in place of any address and
//! captures what is sent to it). It never holds the master secret, another node's disk
//! key, or the control-plane identity key.
//!
//! What the model does **not** cover: cryptography is perfect (a key or a signature is an
//! atom, known or not; a TLS session's exporter is its pair of endpoints); init is the
//! initial state (it runs before the insider exists); one control-plane node, two fresh
//! workers (or one) and the insider, nothing more; Kubernetes, certificates, SSH, rate
//! limits, the metadata and denial of service are not modelled; `insecure_*` options are
//! off. What the
//! bounds and abstractions mean is in `docs/design/model.md`. This crate must never be
//! linked by a program: it describes the protocol, it does not run it.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use stateright::{Model, Property};

/// Which design of the protocol the model follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Design {
    /// `main` before issue 22: a node accepts any attested join service with the cluster's
    /// marker and any self-consistent ticket; `asterism recover` sends keys to any server with
    /// the right measurements for the disk it names; a member may bind a second disk.
    Old,
    /// Tickets signed by the control-plane identity key for the aTLS session; recover only to
    /// the control-plane AKs and disks the workspace records; one disk per member.
    New,
}

/// A machine: the two honest nodes and the insider. Each has one TPM (its AK is named after
/// the machine) and one state disk (its UUID is named after the machine too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Machine {
    /// The init node: the control plane, running the join service while it is up.
    ControlPlane,
    /// A fresh worker that has yet to join.
    Worker,
    /// A second fresh worker, when the model has one ([`Protocol::second_worker`]).
    SecondWorker,
    /// The insider: a genuine worker that joined before the model starts.
    Insider,
}

/// Every machine, each with its disk.
const MACHINES: [Machine; 4] = [
    Machine::ControlPlane,
    Machine::Worker,
    Machine::SecondWorker,
    Machine::Insider,
];

/// One end of an aTLS session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Party {
    /// The owner's CLI (`asterism recover`).
    Owner,
    /// A machine.
    Machine(Machine),
}

/// An aTLS session. Its exporter, to which evidence and (in the new design) tickets are
/// bound, is modelled as the pair of its endpoints: a man in the middle holds two sessions,
/// each with a pair of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Session {
    /// The side that opened the connection.
    pub client: Party,
    /// The side that accepted it.
    pub server: Party,
}

impl Session {
    fn new(client: Party, server: Party) -> Self {
        Self { client, server }
    }
}

/// Which side of a session evidence was made for (aTLS hashes the role in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The side that opened the connection.
    Client,
    /// The side that accepted it.
    Server,
}

/// PCR 15: zero after a TPM reset, the cluster's marker after the node lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pcr15 {
    /// Fresh in this boot.
    Zero,
    /// Marked with the owner's cluster ID.
    Marker,
}

/// A secret, as an atom: whoever knows it can use it, nobody can guess it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Secret {
    /// The cluster's root secret: every other cluster secret derives from it.
    MasterSecret,
    /// The control-plane identity key (new design): derived from the master secret.
    ControlPlaneIdentityKey,
    /// `key-measurementSecret`: with the salt, derives the cluster ID.
    MeasurementSecret,
    /// `key-<uuid>`, the cluster's key for a machine's disk.
    DiskKey(Machine),
    /// The random key a disk is formatted with at first boot, known only to its machine.
    FirstBootKey(Machine),
    /// A key the insider made up.
    InsiderKey,
}

/// Attestation evidence, perfect: only the TPM of `ak` can make it, and it says the PCR 15
/// that TPM held, the session and the role it was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Evidence {
    /// Whose TPM made it.
    pub ak: Machine,
    /// PCR 15 when it was made (PCRs 0–14 are always the genuine image's).
    pub pcr15: Pcr15,
    /// The session it is bound to.
    pub session: Session,
    /// The role it was made for.
    pub role: Role,
}

/// What a joining node receives: a join ticket, as far as its keys and its authenticity go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    /// The disk key it carries, which the node re-keys its disk with.
    pub disk_key: Secret,
    /// Its measurement secret and salt derive the owner's cluster ID.
    pub cluster_consistent: bool,
    /// Signed by the control-plane identity key for this session (new design).
    pub signed_for: Option<Session>,
    /// Ghost: the machine the real control plane issued it to; `None` if it was forged.
    pub issued_to: Option<Machine>,
}

/// Where an honest node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Booted with a new disk, waiting for a join ticket.
    Fresh,
    /// Bootstrapped in this boot: PCR 15 marked, disk open.
    Joined,
    /// Rebooted with an initialised disk: rejoin client and recovery server running.
    Rebooted,
}

/// An honest node's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// Where it is.
    pub phase: Phase,
    /// The key its disk is encrypted with now.
    pub disk_key: Secret,
    /// Ghost: it accepted a ticket the real control plane did not issue to it.
    pub accepted_foreign_ticket: bool,
}

impl Node {
    fn pcr15(&self) -> Pcr15 {
        match self.phase {
            Phase::Joined => Pcr15::Marker,
            Phase::Fresh | Phase::Rebooted => Pcr15::Zero,
        }
    }
}

/// The insider's state: its TPM's PCR 15 and everything it has learned or captured.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Insider {
    /// Its PCR 15 (it reboots to zero it and marks it again at will).
    pub pcr15: Pcr15,
    /// The secrets it knows.
    pub knows: BTreeSet<Secret>,
    /// Evidence of other machines it captured, to relay.
    pub evidence: BTreeSet<Evidence>,
    /// Tickets it received from the real join service, to relay.
    pub tickets: BTreeSet<Ticket>,
}

impl Insider {
    /// Learns a secret and everything derivable from it.
    fn learn(&mut self, secret: Secret) {
        self.knows.insert(secret);
        if secret == Secret::MasterSecret {
            self.knows.insert(Secret::ControlPlaneIdentityKey);
            self.knows.insert(Secret::MeasurementSecret);
            for machine in MACHINES {
                self.knows.insert(Secret::DiskKey(machine));
            }
        }
    }

    /// Whether it knows a secret.
    pub fn knows(&self, secret: Secret) -> bool {
        self.knows.contains(&secret)
    }
}

/// The whole system's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The honest nodes: the init node (running the join service while it is
    /// [`Phase::Joined`]) and the fresh workers.
    pub nodes: BTreeMap<Machine, Node>,
    /// The join service's disk bindings: disk (named by its machine) → AK.
    pub bindings: BTreeMap<Machine, Machine>,
    /// The insider.
    pub insider: Insider,
    /// Ghost: the owner's recover brought the control plane back at least once.
    pub control_plane_recovered: bool,
    /// Ghost: a worker rejoined through the join service at least once.
    pub worker_rejoined: bool,
}

impl State {
    /// An honest node's state.
    pub fn node(&self, machine: Machine) -> Option<&Node> {
        self.nodes.get(&machine)
    }

    fn node_mut(&mut self, machine: Machine) -> Option<&mut Node> {
        self.nodes.get_mut(&machine)
    }

    fn join_service_up(&self) -> bool {
        self.node(Machine::ControlPlane)
            .is_some_and(|node| node.phase == Phase::Joined)
    }

    /// Every disk in the model: the honest nodes' and the insider's.
    fn disks(&self) -> impl Iterator<Item = Machine> + '_ {
        self.nodes
            .keys()
            .copied()
            .chain(std::iter::once(Machine::Insider))
    }
}

/// What the insider presents as its evidence in a session it accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Presented {
    /// Its own TPM's evidence, made for this session.
    Own,
    /// Evidence it captured from another machine (a relay).
    Relayed(Evidence),
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A fresh node reaches the real join service and asks for a join ticket.
    Join(Machine),
    /// A node reboots (a TPM reset). The control plane's join service goes down with it.
    Reboot(Machine),
    /// A rebooted node reaches the real join service and asks for a rejoin ticket.
    Rejoin(Machine),
    /// The owner's `asterism recover` reaches a rebooted node's recovery server.
    OwnerRecovers(Machine),
    /// The insider answers a fresh node's join connection in place of the join service.
    InsiderPosesAsJoinService {
        /// The fresh node.
        node: Machine,
        /// The evidence the insider presents.
        evidence: Presented,
        /// The ticket it answers with.
        ticket: Ticket,
    },
    /// The insider answers the owner's `asterism recover` in place of a rebooted node.
    InsiderPosesAsRecoveryServer {
        /// The evidence the insider presents.
        evidence: Presented,
        /// The disk UUID it names in `Describe`.
        names_disk: Machine,
    },
    /// The insider reboots (PCR 15 zero) or marks PCR 15 with the cluster ID again.
    InsiderSetsPcr15(Pcr15),
    /// The insider asks the real join service for a join ticket naming a disk.
    InsiderRequestsJoinTicket(Machine),
    /// The insider asks the real join service for a rejoin ticket naming a disk.
    InsiderRequestsRejoinTicket(Machine),
    /// The insider connects to a rebooted node's recovery server and keeps its evidence.
    InsiderProbesRecoveryServer(Machine),
}

/// What the insider may do, beyond holding what it holds. Each attack can be checked alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// Answer fresh nodes' join connections ([`Action::InsiderPosesAsJoinService`]).
    pub pose_as_join_service: bool,
    /// Answer the owner's recover connections ([`Action::InsiderPosesAsRecoveryServer`]).
    pub pose_as_recovery_server: bool,
    /// Ask the real join service for tickets naming any disk.
    pub request_tickets: bool,
    /// Reboot and mark its own PCR 15.
    pub reset_pcr15: bool,
    /// Connect to rebooted nodes' recovery servers and capture their evidence.
    pub probe_recovery_servers: bool,
}

impl Capabilities {
    /// Everything the insider can do.
    pub const ALL: Self = Self {
        pose_as_join_service: true,
        pose_as_recovery_server: true,
        request_tickets: true,
        reset_pcr15: true,
        probe_recovery_servers: true,
    };

    /// Nothing: the insider only holds what it holds.
    pub const NONE: Self = Self {
        pose_as_join_service: false,
        pose_as_recovery_server: false,
        request_tickets: false,
        reset_pcr15: false,
        probe_recovery_servers: false,
    };
}

/// A check the protocol makes, to be left out one at a time: each must be needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    /// Verifiers require evidence bound to their own session (both designs).
    SessionBinding,
    /// A joining node requires a ticket signed by the control-plane identity key (new).
    TicketSignature,
    /// `asterism recover` sends keys only to recorded control-plane AKs and disks (new).
    RecoverAllowList,
    /// An AK bound to a disk cannot bind another (new).
    OneDiskPerMember,
}

/// The model: a design and what the insider may do.
#[derive(Clone, Copy, Debug)]
pub struct Protocol {
    /// The design checked.
    pub design: Design,
    /// The insider's moves.
    pub insider: Capabilities,
    /// A check left out of the design, to show that it is needed; `None` for the design as it is.
    pub without: Option<Check>,
    /// A second fresh worker besides the first.
    pub second_worker: bool,
}

/// The name of property P1.
pub const P1: &str = "P1: no honest node's disk key reaches the insider";
/// The name of property P2.
pub const P2: &str = "P2: the master secret never reaches the insider";
/// The name of property P3.
pub const P3: &str = "P3: a fresh node joins only the owner's cluster";
/// A reachability check: a fresh worker can join.
pub const CAN_JOIN: &str = "a fresh worker can join";
/// A reachability check: the control plane can be recovered after an outage.
pub const CAN_RECOVER: &str = "the control plane can be recovered";
/// A reachability check: a worker can rejoin after a reboot.
pub const CAN_REJOIN: &str = "a rebooted worker can rejoin";

impl Protocol {
    /// The checked model of `design` with an insider that may do everything.
    pub fn new(design: Design) -> Self {
        Self {
            design,
            insider: Capabilities::ALL,
            without: None,
            second_worker: true,
        }
    }

    /// Whether the design makes `check`.
    pub fn makes(&self, check: Check) -> bool {
        let in_design = match check {
            Check::SessionBinding => true,
            Check::TicketSignature | Check::RecoverAllowList | Check::OneDiskPerMember => {
                self.design == Design::New
            }
        };
        in_design && self.without != Some(check)
    }

    /// Whether evidence passes a verifier's check in `session`, for a peer in `role`, with PCR
    /// 15 required to be `pcr15`. Returns the attested AK. PCRs 0–14 are always genuine here,
    /// and every AK chains to the platform CA: the insider's TPM is genuine.
    fn verify(
        &self,
        evidence: &Evidence,
        session: Session,
        role: Role,
        pcr15: Pcr15,
    ) -> Option<Machine> {
        let bound = !self.makes(Check::SessionBinding) || evidence.session == session;
        (bound && evidence.role == role && evidence.pcr15 == pcr15).then_some(evidence.ak)
    }

    /// The join service's decision on a join ticket for `disk` to `ak`; binds on success.
    fn admit_join(
        &self,
        bindings: &mut BTreeMap<Machine, Machine>,
        ak: Machine,
        disk: Machine,
    ) -> bool {
        match bindings.get(&disk) {
            Some(bound) if *bound != ak => return false,
            Some(_) => return true,
            None => {}
        }
        if self.makes(Check::OneDiskPerMember) && bindings.values().any(|bound| *bound == ak) {
            // A member's first disk binding is its only one.
            return false;
        }
        bindings.insert(disk, ak);
        true
    }

    /// A ticket the real join service issues to `ak` in `session`.
    fn real_ticket(&self, ak: Machine, disk: Machine, session: Session) -> Ticket {
        Ticket {
            disk_key: Secret::DiskKey(disk),
            cluster_consistent: true,
            signed_for: (self.design == Design::New).then_some(session),
            issued_to: Some(ak),
        }
    }

    /// Whether a joining node accepts `ticket` received in `session`.
    fn node_accepts(&self, ticket: &Ticket, session: Session) -> bool {
        if !ticket.cluster_consistent {
            return false;
        }
        if !self.makes(Check::TicketSignature) {
            return true;
        }
        match ticket.signed_for {
            None => false,
            Some(signed_for) => !self.makes(Check::SessionBinding) || signed_for == session,
        }
    }

    /// Whether `asterism recover` sends keys to `ak` for `disk` (after its evidence verified
    /// with PCR 15 zero). The workspace records the init node's AK and disk.
    fn owner_sends_keys(&self, ak: Machine, disk: Machine) -> bool {
        !self.makes(Check::RecoverAllowList)
            || (ak == Machine::ControlPlane && disk == Machine::ControlPlane)
    }

    /// What the insider can present as its evidence: its own, or what it captured.
    fn presentable(state: &State) -> Vec<Presented> {
        let mut out = vec![Presented::Own];
        out.extend(
            state
                .insider
                .evidence
                .iter()
                .copied()
                .map(Presented::Relayed),
        );
        out
    }

    fn presented(state: &State, presented: Presented, session: Session, role: Role) -> Evidence {
        match presented {
            Presented::Own => Evidence {
                ak: Machine::Insider,
                pcr15: state.insider.pcr15,
                session,
                role,
            },
            Presented::Relayed(evidence) => evidence,
        }
    }

    /// Tickets the insider can answer with: forged from what it knows, or relayed.
    fn forgeable_tickets(state: &State, session: Session) -> Vec<Ticket> {
        let insider = &state.insider;
        let cluster_consistent = insider.knows(Secret::MeasurementSecret);
        let signed_for = insider
            .knows(Secret::ControlPlaneIdentityKey)
            .then_some(session);
        let mut out: Vec<Ticket> = insider
            .knows
            .iter()
            .filter(|secret| {
                matches!(
                    secret,
                    Secret::DiskKey(_) | Secret::FirstBootKey(_) | Secret::InsiderKey
                )
            })
            .map(|secret| Ticket {
                disk_key: *secret,
                cluster_consistent,
                signed_for,
                issued_to: None,
            })
            .collect();
        out.extend(insider.tickets.iter().copied());
        out
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // After init and after the insider's own join: the init node's disk is bound to its
        // AK (its record), the insider's to the insider's.
        let mut knows = BTreeSet::new();
        knows.insert(Secret::DiskKey(Machine::Insider));
        knows.insert(Secret::MeasurementSecret);
        knows.insert(Secret::InsiderKey);
        let bindings = BTreeMap::from([
            (Machine::ControlPlane, Machine::ControlPlane),
            (Machine::Insider, Machine::Insider),
        ]);
        let fresh = |machine| Node {
            phase: Phase::Fresh,
            disk_key: Secret::FirstBootKey(machine),
            accepted_foreign_ticket: false,
        };
        let mut nodes = BTreeMap::from([
            (
                Machine::ControlPlane,
                Node {
                    phase: Phase::Joined,
                    disk_key: Secret::DiskKey(Machine::ControlPlane),
                    accepted_foreign_ticket: false,
                },
            ),
            (Machine::Worker, fresh(Machine::Worker)),
        ]);
        if self.second_worker {
            nodes.insert(Machine::SecondWorker, fresh(Machine::SecondWorker));
        }
        vec![State {
            nodes,
            bindings,
            insider: Insider {
                pcr15: Pcr15::Marker,
                knows,
                evidence: BTreeSet::new(),
                tickets: BTreeSet::new(),
            },
            control_plane_recovered: false,
            worker_rejoined: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (&machine, node) in &state.nodes {
            match node.phase {
                Phase::Fresh => {
                    actions.push(Action::Join(machine));
                    if self.insider.pose_as_join_service {
                        let session =
                            Session::new(Party::Machine(machine), Party::Machine(Machine::Insider));
                        for evidence in Self::presentable(state) {
                            for ticket in Self::forgeable_tickets(state, session) {
                                actions.push(Action::InsiderPosesAsJoinService {
                                    node: machine,
                                    evidence,
                                    ticket,
                                });
                            }
                        }
                    }
                }
                Phase::Joined => actions.push(Action::Reboot(machine)),
                Phase::Rebooted => {
                    actions.push(Action::Rejoin(machine));
                    actions.push(Action::OwnerRecovers(machine));
                    if self.insider.probe_recovery_servers {
                        actions.push(Action::InsiderProbesRecoveryServer(machine));
                    }
                }
            }
        }
        if self.insider.pose_as_recovery_server {
            for evidence in Self::presentable(state) {
                for names_disk in state.disks() {
                    actions.push(Action::InsiderPosesAsRecoveryServer {
                        evidence,
                        names_disk,
                    });
                }
            }
        }
        if self.insider.reset_pcr15 {
            actions.push(Action::InsiderSetsPcr15(Pcr15::Zero));
            actions.push(Action::InsiderSetsPcr15(Pcr15::Marker));
        }
        if self.insider.request_tickets {
            for disk in state.disks() {
                actions.push(Action::InsiderRequestsJoinTicket(disk));
                actions.push(Action::InsiderRequestsRejoinTicket(disk));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Join(machine) => {
                if !state.join_service_up() {
                    return None;
                }
                let session = Session::new(
                    Party::Machine(machine),
                    Party::Machine(Machine::ControlPlane),
                );
                // Each side verifies the other: the node is fresh, the service is marked.
                if !self.admit_join(&mut state.bindings, machine, machine) {
                    return None;
                }
                let ticket = self.real_ticket(machine, machine, session);
                if !self.node_accepts(&ticket, session) {
                    return None;
                }
                let node = state.node_mut(machine)?;
                if node.phase != Phase::Fresh {
                    return None;
                }
                node.phase = Phase::Joined;
                node.disk_key = ticket.disk_key;
            }
            Action::Reboot(machine) => {
                let node = state.node_mut(machine)?;
                if node.phase != Phase::Joined {
                    return None;
                }
                node.phase = Phase::Rebooted;
            }
            Action::Rejoin(machine) => {
                if !state.join_service_up() || state.bindings.get(&machine) != Some(&machine) {
                    return None;
                }
                let node = state.node_mut(machine)?;
                // The key opens the disk: the node is back.
                if node.phase != Phase::Rebooted || node.disk_key != Secret::DiskKey(machine) {
                    return None;
                }
                node.phase = Phase::Joined;
                if machine != Machine::ControlPlane {
                    state.worker_rejoined = true;
                }
            }
            Action::OwnerRecovers(machine) => {
                let node = state.node_mut(machine)?;
                if node.phase != Phase::Rebooted || !self.owner_sends_keys(machine, machine) {
                    return None;
                }
                if node.disk_key != Secret::DiskKey(machine) {
                    return None;
                }
                node.phase = Phase::Joined;
                if machine == Machine::ControlPlane {
                    state.control_plane_recovered = true;
                }
            }
            Action::InsiderPosesAsJoinService {
                node: machine,
                evidence,
                ticket,
            } => {
                let session =
                    Session::new(Party::Machine(machine), Party::Machine(Machine::Insider));
                let evidence = Self::presented(&state, evidence, session, Role::Server);
                // The node verifies the join service: genuine, and PCR 15 = the marker.
                self.verify(&evidence, session, Role::Server, Pcr15::Marker)?;
                if !self.node_accepts(&ticket, session) {
                    return None;
                }
                let node = state.node_mut(machine)?;
                if node.phase != Phase::Fresh {
                    return None;
                }
                node.phase = Phase::Joined;
                node.disk_key = ticket.disk_key;
                if ticket.issued_to != Some(machine) {
                    node.accepted_foreign_ticket = true;
                }
            }
            Action::InsiderPosesAsRecoveryServer {
                evidence,
                names_disk,
            } => {
                let session = Session::new(Party::Owner, Party::Machine(Machine::Insider));
                let evidence = Self::presented(&state, evidence, session, Role::Server);
                let ak = self.verify(&evidence, session, Role::Server, Pcr15::Zero)?;
                if !self.owner_sends_keys(ak, names_disk) {
                    return None;
                }
                state.insider.learn(Secret::DiskKey(names_disk));
                state.insider.learn(Secret::MeasurementSecret);
            }
            Action::InsiderSetsPcr15(pcr15) => {
                if pcr15 == Pcr15::Marker && !state.insider.knows(Secret::MeasurementSecret) {
                    return None;
                }
                state.insider.pcr15 = pcr15;
            }
            Action::InsiderRequestsJoinTicket(disk) | Action::InsiderRequestsRejoinTicket(disk) => {
                if !state.join_service_up() {
                    return None;
                }
                let session = Session::new(
                    Party::Machine(Machine::Insider),
                    Party::Machine(Machine::ControlPlane),
                );
                // Mutual aTLS: the insider keeps the join service's evidence, whatever follows.
                state.insider.evidence.insert(Evidence {
                    ak: Machine::ControlPlane,
                    pcr15: Pcr15::Marker,
                    session,
                    role: Role::Server,
                });
                let own = Self::presented(&state, Presented::Own, session, Role::Client);
                // The join service requires a node fresh in this boot.
                let Some(ak) = self.verify(&own, session, Role::Client, Pcr15::Zero) else {
                    return (state != *last).then_some(state);
                };
                let admitted = match action {
                    Action::InsiderRequestsJoinTicket(_) => {
                        self.admit_join(&mut state.bindings, ak, disk)
                    }
                    _ => state.bindings.get(&disk) == Some(&ak),
                };
                if admitted {
                    let ticket = self.real_ticket(ak, disk, session);
                    state.insider.learn(ticket.disk_key);
                    state.insider.learn(Secret::MeasurementSecret);
                    state.insider.tickets.insert(ticket);
                }
            }
            Action::InsiderProbesRecoveryServer(machine) => {
                let node = state.node(machine)?;
                if node.phase != Phase::Rebooted {
                    return None;
                }
                let session =
                    Session::new(Party::Machine(Machine::Insider), Party::Machine(machine));
                state.insider.evidence.insert(Evidence {
                    ak: machine,
                    pcr15: node.pcr15(),
                    session,
                    role: Role::Server,
                });
            }
        }
        (state != *last).then_some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(P1, |_, state: &State| {
                state.nodes.iter().all(|(machine, node)| {
                    !state.insider.knows(Secret::DiskKey(*machine))
                        && !state.insider.knows(node.disk_key)
                })
            }),
            Property::always(P2, |_, state: &State| {
                !state.insider.knows(Secret::MasterSecret)
            }),
            Property::always(P3, |_, state: &State| {
                state
                    .nodes
                    .values()
                    .all(|node| !node.accepted_foreign_ticket)
            }),
            Property::sometimes(CAN_JOIN, |_, state: &State| {
                state.nodes.iter().any(|(machine, node)| {
                    *machine != Machine::ControlPlane
                        && node.phase == Phase::Joined
                        && !node.accepted_foreign_ticket
                })
            }),
            Property::sometimes(CAN_RECOVER, |_, state: &State| {
                state.control_plane_recovered
            }),
            Property::sometimes(CAN_REJOIN, |_, state: &State| state.worker_rejoined),
        ]
    }
}
