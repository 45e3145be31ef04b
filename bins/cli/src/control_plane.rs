//! The workspace's record of the control plane: its public identity key
//! (`control-plane-key`) and, per control-plane node, the attestation key and the state
//! disk that belong together (`control-plane.json`).
//!
//! `asterism init` writes both, with the first node's AK (the one it verified) and disk
//! (the one the node named in its answer). Control-plane nodes that join later are added
//! by `asterism control-plane sync`, from the join service's list signed by the control
//! plane's identity key, which no worker holds. `asterism recover` sends keys only to an AK
//! recorded here, and only for the disk recorded with it; `asterism verify` checks a
//! node's AK against it when asked to.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use asterism_kms::{ChannelBinding, ControlPlaneKey, DiskUuid, Purpose};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The workspace file with the control plane's public key (64 hex digits and a newline),
/// what nodes are given as `--control-plane-key`.
pub const KEY_FILE: &str = "control-plane-key";
/// The workspace file with the control-plane members.
pub const RECORD_FILE: &str = "control-plane.json";
/// Largest signed list read (from a file or the join service).
const MAX_SIGNED_LEN: u64 = 1 << 20;

/// One control-plane node: its attestation key and its state disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The node's name, where known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its attestation key identity (SHA-256 of the AK's public area, hex).
    pub ak: String,
    /// Its state disk's LUKS UUID.
    pub disk: String,
}

/// `control-plane.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Format version, 1.
    pub version: u32,
    /// The control plane's public key, hex.
    #[serde(rename = "controlPlaneKey")]
    pub control_plane_key: String,
    /// The members, in the order they were recorded.
    pub members: Vec<Member>,
}

impl Record {
    /// A record of `key` with the first node.
    #[must_use]
    pub fn new(key: ControlPlaneKey, first: Member) -> Self {
        Self {
            version: 1,
            control_plane_key: key.to_string(),
            members: vec![first],
        }
    }

    /// Reads `control-plane.json` of `workspace`; `None` if it has none (a workspace made
    /// before it was recorded).
    pub fn load(workspace: &Path) -> Result<Option<Self>> {
        let path = workspace.join(RECORD_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let bytes = asterism_binkit::fs::read_capped(&path, MAX_SIGNED_LEN)
            .with_context(|| format!("reading {}", path.display()))?;
        let record: Self = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is no control-plane record", path.display()))?;
        if record.version != 1 {
            bail!(
                "{} has version {}, 1 expected",
                path.display(),
                record.version
            );
        }
        record.key()?;
        Ok(Some(record))
    }

    /// The control plane's public key.
    pub fn key(&self) -> Result<ControlPlaneKey> {
        self.control_plane_key
            .parse()
            .context("the control-plane record's key is not 64 hex digits")
    }

    /// The disk recorded for attestation key `ak`, if `ak` is a recorded member.
    pub fn disk_for(&self, ak: &str) -> Option<Result<DiskUuid>> {
        self.members.iter().find(|m| m.ak == ak).map(|m| {
            DiskUuid::parse(&m.disk)
                .with_context(|| format!("the disk recorded for attestation key {ak}"))
        })
    }

    /// Adds `members`; returns those that were new. One AK has one disk and one disk one
    /// AK: a member that contradicts the record is refused, and nothing is added.
    pub fn merge(&mut self, members: Vec<Member>) -> Result<Vec<Member>> {
        let mut added = Vec::new();
        for m in members {
            DiskUuid::parse(&m.disk).with_context(|| format!("the disk of {}", m.ak))?;
            if let Some(known) = self.members.iter().chain(&added).find(|k| k.ak == m.ak) {
                if known.disk != m.disk {
                    bail!(
                        "attestation key {} is recorded with disk {}, the list names disk {}: \
                         one attestation key has one disk; refusing the list",
                        m.ak,
                        known.disk,
                        m.disk
                    );
                }
                continue;
            }
            if let Some(known) = self.members.iter().chain(&added).find(|k| k.disk == m.disk) {
                bail!(
                    "disk {} is recorded for attestation key {}, the list names {}; refusing the list",
                    m.disk,
                    known.ak,
                    m.ak
                );
            }
            added.push(m);
        }
        self.members.extend(added.iter().cloned());
        Ok(added)
    }

    /// Writes the record into `workspace` (mode 0600), replacing the file atomically.
    pub fn save(&self, workspace: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self)?;
        let path = workspace.join(RECORD_FILE);
        let tmp = workspace.join(format!(".{RECORD_FILE}.partial-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        asterism_binkit::write_new(&tmp, &json, asterism_binkit::fs::PRIVATE_MODE)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))
    }
}

/// The files `asterism init` writes: `control-plane-key` and `control-plane.json`.
pub fn init_files(key: ControlPlaneKey, first: Member) -> Result<Vec<(String, Vec<u8>)>> {
    let record = Record::new(key, first);
    Ok(vec![
        (KEY_FILE.into(), format!("{key}\n").into_bytes()),
        (RECORD_FILE.into(), serde_json::to_vec_pretty(&record)?),
    ])
}

/// Reads the control plane's public key from a workspace's `control-plane-key`.
pub fn read_key(workspace: &Path) -> Result<ControlPlaneKey> {
    let path = workspace.join(KEY_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.parse()
        .with_context(|| format!("{} is not 64 hex digits", path.display()))
}

/// Checks a list signed by the control plane (the join service's `GET /v1/control-plane`)
/// against `key` and returns its members.
pub fn verify_signed(json: &[u8], key: &ControlPlaneKey) -> Result<Vec<Member>> {
    #[derive(Deserialize)]
    struct Envelope {
        version: u32,
        kind: String,
        payload: String,
        signature: String,
    }
    #[derive(Deserialize)]
    struct Payload {
        members: Vec<Member>,
    }
    let envelope: Envelope =
        serde_json::from_slice(json).context("the control-plane list is not its JSON form")?;
    if envelope.version != 1 || envelope.kind != "asterism-control-plane-members" {
        bail!(
            "not a control-plane list (version {}, kind {:?})",
            envelope.version,
            envelope.kind
        );
    }
    let payload = base64::engine::general_purpose::STANDARD
        .decode(envelope.payload.as_bytes())
        .context("the control-plane list's payload is not base64")?;
    let signature = hex::decode(&envelope.signature)
        .context("the control-plane list's signature is not hex")?;
    key.verify(
        Purpose::MemberList,
        &ChannelBinding::DOCUMENT,
        &payload,
        &signature,
    )
    .context("the control-plane list is not signed by this cluster's control plane")?;
    let payload: Payload =
        serde_json::from_slice(&payload).context("the signed control-plane list is malformed")?;
    Ok(payload.members)
}

/// Arguments of `asterism control-plane sync`.
#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    /// The cluster's workspace (control-plane-key and control-plane.json).
    #[arg(long, value_name = "DIR")]
    pub workspace: PathBuf,
    /// The join service's admin socket (its `--admin-socket`), asked for `/v1/control-plane`.
    #[arg(long, value_name = "PATH", required_unless_present = "from")]
    pub admin_socket: Option<PathBuf>,
    /// A saved copy of the signed list (`GET /v1/control-plane` of the join service's
    /// metrics listener or admin socket); it authenticates itself, so any channel will do.
    #[arg(long, value_name = "FILE", conflicts_with = "admin_socket")]
    pub from: Option<PathBuf>,
}

/// `asterism control-plane sync`: adds the control-plane members the join service signed
/// to the workspace; returns the ones that were new.
pub fn sync(args: &SyncArgs) -> Result<Vec<Member>> {
    let key = read_key(&args.workspace)?;
    let mut record = Record::load(&args.workspace)?.with_context(|| {
        format!(
            "{} has no {RECORD_FILE} (made before control-plane members were recorded)",
            args.workspace.display()
        )
    })?;
    if record.key()? != key {
        bail!("{KEY_FILE} and {RECORD_FILE} name different control-plane keys");
    }
    let json = match (&args.admin_socket, &args.from) {
        (_, Some(file)) => asterism_binkit::fs::read_capped(file, MAX_SIGNED_LEN)
            .with_context(|| format!("reading {}", file.display()))?,
        (Some(socket), None) => fetch(socket)?,
        (None, None) => bail!("give --admin-socket or --from"),
    };
    let members = verify_signed(&json, &key)?;
    let added = record.merge(members)?;
    record.save(&args.workspace)?;
    Ok(added)
}

/// `GET /v1/control-plane` over the join service's admin socket.
fn fetch(socket: &Path) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut s = std::os::unix::net::UnixStream::connect(socket).with_context(|| {
        format!(
            "connecting to the join service's admin socket {}",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    s.set_write_timeout(Some(std::time::Duration::from_secs(5)))?;
    write!(
        s,
        "GET /v1/control-plane HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )?;
    let answer = asterism_binkit::fs::read_capped_from(s, MAX_SIGNED_LEN)?
        .context("the join service's answer is larger than 1 MiB")?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("malformed answer from the join service")?;
    let (head, body) = answer.split_at(split);
    let status = String::from_utf8_lossy(head);
    let status = status.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        bail!("the join service refused: {status}");
    }
    Ok(body.get(4..).unwrap_or_default().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use asterism_kms::{ControlPlaneSeed, ControlPlaneSigner};

    fn member(ak: &str, disk: &str) -> Member {
        Member {
            name: String::new(),
            ak: ak.into(),
            disk: disk.into(),
        }
    }
    const D1: &str = "11111111-1111-1111-1111-111111111111";
    const D2: &str = "22222222-2222-2222-2222-222222222222";

    #[test]
    fn one_attestation_key_has_one_disk_and_one_disk_one_key() {
        let key = ControlPlaneSeed::from_bytes(vec![1; 32])
            .unwrap()
            .public_key()
            .unwrap();
        let mut r = Record::new(key, member("aa", D1));
        assert!(r.merge(vec![member("aa", D1)]).unwrap().is_empty());
        assert!(r.merge(vec![member("aa", D2)]).is_err());
        assert!(r.merge(vec![member("bb", D1)]).is_err());
        assert_eq!(r.merge(vec![member("bb", D2)]).unwrap().len(), 1);
        assert!(r.disk_for("cc").is_none());
        assert_eq!(r.disk_for("bb").unwrap().unwrap().as_str(), D2);
    }

    fn signed(signer: &ControlPlaneSigner, payload: &[u8]) -> Vec<u8> {
        let sig = signer.sign(Purpose::MemberList, &ChannelBinding::DOCUMENT, payload);
        serde_json::to_vec(&serde_json::json!({
            "version": 1,
            "kind": "asterism-control-plane-members",
            "payload": base64::engine::general_purpose::STANDARD.encode(payload),
            "signature": hex::encode(sig),
        }))
        .unwrap()
    }

    #[test]
    fn only_a_list_signed_by_the_control_plane_is_taken() {
        let cp =
            ControlPlaneSigner::new(&ControlPlaneSeed::from_bytes(vec![1; 32]).unwrap()).unwrap();
        let worker =
            ControlPlaneSigner::new(&ControlPlaneSeed::from_bytes(vec![2; 32]).unwrap()).unwrap();
        let payload = format!(r#"{{"members":[{{"name":"cp-1","ak":"aa","disk":"{D1}"}}]}}"#);
        let got = verify_signed(&signed(&cp, payload.as_bytes()), &cp.public_key()).unwrap();
        assert_eq!(got[0].disk, D1);
        assert!(verify_signed(&signed(&worker, payload.as_bytes()), &cp.public_key()).is_err());
    }
}
