//! `asterism verify`: fetch fresh evidence from a node and print every measured PCR with
//! pass or fail, and on a confidential VM every checked field of its hardware report.
//!
//! The fetched evidence can be saved with the nonce it is bound to (`--save-evidence`) and
//! verified again later, offline (`--evidence`). The file is JSON:
//! `{"version":1,"nonce":"<64 hex digits>","evidence":"<standard base64>"}`, at most
//! [`MAX_EVIDENCE_FILE`] bytes. Saved evidence proves what the node was when it was
//! fetched, not that it is so now.

use crate::trust::TrustArgs;
use anyhow::{Context, Result, bail};
use asterism_attestation::explain::Check;
use asterism_attestation::{
    ExpectedPcr, Measurement, MeasurementMode, Measurements, PcrIndex, ReportData,
    TpmQuoteValidator,
};
use asterism_proto::verify::GetAttestationRequest;
use asterism_proto::verify::api_client::ApiClient;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::rand::SecureRandom;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `asterism verify`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node's verify service, HOST:PORT.
    #[arg(
        long,
        required_unless_present = "evidence",
        conflicts_with = "evidence"
    )]
    endpoint: Option<String>,
    /// Verify evidence saved by `--save-evidence` instead of fetching it (offline: it shows
    /// what the node was when it was fetched, not what it is now).
    #[arg(long, value_name = "FILE")]
    evidence: Option<PathBuf>,
    /// Also save the fetched evidence and its nonce to FILE, for `--evidence`.
    #[arg(long, value_name = "FILE", conflicts_with = "evidence")]
    save_evidence: Option<PathBuf>,
    /// Also write the quote, its signature, the PCR values and the AK into DIR in the
    /// formats `tpm2_checkquote` reads, and print its command line (written before the
    /// evidence is checked, so that refused evidence can be examined too).
    #[arg(long, value_name = "DIR")]
    export_tpm2: Option<PathBuf>,
    /// The cluster's workspace (for the cluster ID, which a bootstrapped node's PCR 15
    /// must show). Without it, PCR 15 is expected as in the measurements file.
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// The node must be one of the workspace's control-plane nodes: its attestation key
    /// must be recorded in control-plane.json (`asterism init`, `asterism control-plane
    /// sync`). Without it, the report says whether it is one.
    #[arg(long, requires = "workspace")]
    control_plane: bool,
    #[command(flatten)]
    trust: TrustArgs,
}

impl Args {
    /// Arguments to verify the node at `endpoint` of the cluster whose workspace is
    /// `workspace`, trusting AKs of `platform_ca` and expecting `measurements`.
    pub fn for_node(
        endpoint: &str,
        workspace: &std::path::Path,
        platform_ca: &std::path::Path,
        measurements: &std::path::Path,
    ) -> Self {
        Self {
            endpoint: Some(endpoint.to_string()),
            evidence: None,
            save_evidence: None,
            export_tpm2: None,
            workspace: Some(workspace.to_path_buf()),
            control_plane: false,
            trust: TrustArgs::platform_ca(platform_ca, measurements),
        }
    }
}

/// `SHA-256(0^32 || SHA-256(cluster ID))`: PCR 15 of a node marked with `cluster_id`.
fn marker(cluster_id: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([0u8; 32]);
    h.update(Sha256::digest(cluster_id));
    h.finalize().into()
}

fn cluster_id(workspace: &std::path::Path) -> Result<Vec<u8>> {
    let path = workspace.join("cluster-id");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let id = hex::decode(text.trim()).with_context(|| format!("{} is not hex", path.display()))?;
    if id.len() != 32 {
        bail!("{} holds {} bytes, want 32", path.display(), id.len());
    }
    Ok(id)
}

/// Runs the command; fails when an enforced PCR does not match.
pub async fn run(args: Args) -> Result<()> {
    let loaded = args.trust.load_measurements()?;
    let mut expected: Vec<(PcrIndex, ExpectedPcr)> = loaded.iter().map(|(i, e)| (i, *e)).collect();
    let pcr15 = PcrIndex::new(15).context("PCR 15")?;
    if let Some(ws) = &args.workspace {
        let want = ExpectedPcr::enforce(marker(&cluster_id(ws)?));
        expected.retain(|(i, _)| *i != pcr15);
        expected.push((pcr15, want));
        expected.sort_by_key(|(i, _)| *i);
    }
    // The validator gates on every enforced PCR; on a refusal by the measurements alone it
    // still returns the proven PCR values, so the table below shows them all.
    let measurements = Measurements::new(expected.iter().copied())?.with_cvm(loaded.cvm().clone());
    let trust = args.trust.ak.ak_trust_for(&measurements)?;
    let validator = TpmQuoteValidator::new(trust, measurements.into_provider());

    let (saved, source) = match (&args.evidence, &args.endpoint) {
        (Some(path), _) => (
            SavedEvidence::load(path)?,
            format!(
                "saved evidence {} (offline: this shows what the node was when the evidence \
                 was fetched, not that it is so now)",
                path.display()
            ),
        ),
        (None, Some(endpoint)) => {
            let saved = fetch(endpoint).await?;
            if let Some(path) = &args.save_evidence {
                saved.save(path)?;
            }
            (
                saved,
                format!("node {endpoint} (fresh: bound to this call's nonce)"),
            )
        }
        (None, None) => bail!("give --endpoint or --evidence"),
    };
    if let Some(dir) = &args.export_tpm2 {
        writeln!(std::io::stdout().lock(), "{}", export_tpm2(dir, &saved)?)?;
    }
    let ak = report(
        &mut std::io::stdout().lock(),
        &validator,
        &expected,
        &saved,
        &source,
    )?;
    let record = match &args.workspace {
        Some(ws) => crate::control_plane::Record::load(ws)?,
        None => None,
    };
    check_control_plane(
        &mut std::io::stdout().lock(),
        record.as_ref(),
        &ak,
        args.control_plane,
    )
}

/// Says whether the node's attestation key `ak` is a control-plane node the workspace
/// records (`record`), and fails when `required` and it is not.
fn check_control_plane(
    out: &mut impl Write,
    record: Option<&crate::control_plane::Record>,
    ak: &str,
    required: bool,
) -> Result<()> {
    match record.map(|r| r.members.iter().find(|m| m.ak == ak)) {
        Some(Some(m)) => {
            writeln!(
                out,
                "attestation key {ak}: a control-plane node of the workspace (disk {})",
                m.disk
            )?;
            Ok(())
        }
        Some(None) if required => bail!(
            "attestation key {ak} is no control-plane node of the workspace ({})",
            crate::control_plane::RECORD_FILE
        ),
        Some(None) => {
            writeln!(
                out,
                "attestation key {ak}: not a control-plane node of the workspace"
            )?;
            Ok(())
        }
        None if required => bail!(
            "the workspace records no control-plane nodes ({}), so it cannot check the node's attestation key",
            crate::control_plane::RECORD_FILE
        ),
        None => Ok(()),
    }
}

/// Fetches evidence bound to a fresh random nonce from the verify service at `endpoint`.
async fn fetch(endpoint: &str) -> Result<SavedEvidence> {
    let mut nonce = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .with_context(|| format!("invalid endpoint {endpoint:?}"))?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("connecting to the verify service at {endpoint}"))?;
    let evidence = ApiClient::new(channel)
        .max_decoding_message_size(128 * 1024)
        .get_attestation(GetAttestationRequest {
            nonce: nonce.to_vec(),
        })
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "the verify service refused: {:?}: {}",
                s.code(),
                s.message()
            )
        })?
        .into_inner()
        .attestation;
    Ok(SavedEvidence { nonce, evidence })
}

/// Validates `saved` and prints the PCR table and the hardware-report checks; fails when
/// the evidence is refused or an enforced PCR differs. The table is printed only from a
/// quote whose AK, signature and nonce binding were verified. Returns the verified
/// attestation key's identity.
fn report(
    out: &mut impl Write,
    validator: &TpmQuoteValidator,
    expected: &[(PcrIndex, ExpectedPcr)],
    saved: &SavedEvidence,
    source: &str,
) -> Result<String> {
    let explained =
        validator.validate_with_pcrs(&saved.evidence, &ReportData::verify(&saved.nonce));
    let mut ak = String::new();
    let observed = match (&explained.result, &explained.pcrs) {
        (Ok(verified), _) => {
            ak = verified.identity().to_owned();
            writeln!(
                out,
                "{source}: {} evidence, attestation key {}",
                verified.variant(),
                verified.identity()
            )?;
            verified.measurements()
        }
        // Refused by the measurements only: the values themselves are proven.
        (Err(_), Some(pcrs)) => {
            writeln!(out, "{source}: tpm-quote evidence")?;
            pcrs.as_slice()
        }
        (Err(e), None) => {
            print_checks(out, &explained.checks)?;
            return Err(rejected(e));
        }
    };
    let failed = print_pcrs(out, expected, observed)?;
    print_checks(out, &explained.checks)?;
    if let Err(e) = &explained.result {
        return Err(rejected(e));
    }
    if failed > 0 {
        bail!("{failed} enforced PCR(s) differ from the expected measurements");
    }
    Ok(ak)
}

/// The refusal, kept as the validator's error so that callers can tell why.
fn rejected(e: &asterism_attestation::ValidationError) -> anyhow::Error {
    anyhow::Error::new(e.clone()).context("the node's evidence was rejected")
}

/// Prints one row per expected PCR (pass, warn or FAIL); returns how many enforced ones
/// failed.
fn print_pcrs(
    out: &mut impl Write,
    expected: &[(PcrIndex, ExpectedPcr)],
    observed: &[Measurement],
) -> Result<usize> {
    writeln!(
        out,
        "{:>4}  {:<6}  {:<64}  EXPECTED",
        "PCR", "RESULT", "OBSERVED"
    )?;
    let mut failed = 0;
    for (index, want) in expected {
        let observed = observed
            .iter()
            .find(|m| m.index == u32::from(index.get()))
            .map(|m| hex::encode(&m.value))
            .unwrap_or_else(|| "(absent)".into());
        let wanted = hex::encode(want.expected);
        let result = if observed == wanted {
            "pass"
        } else if want.mode == MeasurementMode::WarnOnly {
            "warn"
        } else {
            failed += 1;
            "FAIL"
        };
        let shown = if observed == wanted {
            String::from("=")
        } else {
            wanted
        };
        writeln!(
            out,
            "{:>4}  {result:<6}  {observed:<64}  {shown}",
            index.get()
        )?;
    }
    Ok(failed)
}

/// Writes the parts of `saved` that `tpm2_checkquote` checks into `dir`: `quote.msg` (the
/// `TPMS_ATTEST`), `quote.sig` (the `TPMT_SIGNATURE`), `quote.pcrs` (the PCR values, as
/// [`serialized_pcrs`]), `ak.pub` (the AK as `TPM2B_PUBLIC`) and `qualification` (the
/// expected qualifying data, hex). Returns the `tpm2_checkquote` command line.
fn export_tpm2(dir: &Path, saved: &SavedEvidence) -> Result<String> {
    use asterism_attestation::tpm::{MAX_EVIDENCE_SIZE, TpmQuoteEvidence};
    if saved.evidence.len() > MAX_EVIDENCE_SIZE {
        bail!("the evidence is larger than {MAX_EVIDENCE_SIZE} bytes");
    }
    let ev = <TpmQuoteEvidence as prost::Message>::decode(saved.evidence.as_slice())
        .context("the evidence is not tpm-quote evidence")?;
    let ak_len = u16::try_from(ev.ak_public.len()).context("the AK public area is too long")?;
    let ak = [ak_len.to_be_bytes().as_slice(), &ev.ak_public].concat();
    let pcrs = serialized_pcrs(&ev.pcrs)?;
    let qualification = hex::encode(ReportData::verify(&saved.nonce).as_bytes());
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files: [(&str, &[u8]); 5] = [
        ("quote.msg", &ev.attest),
        ("quote.sig", &ev.signature),
        ("quote.pcrs", &pcrs),
        ("ak.pub", &ak),
        ("qualification", qualification.as_bytes()),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        asterism_binkit::fs::write_atomic(&path, bytes, 0o644)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let d = dir.display();
    Ok(format!(
        "tpm2_checkquote -u {d}/ak.pub -m {d}/quote.msg -s {d}/quote.sig -f {d}/quote.pcrs \
         -g sha256 -q {qualification}"
    ))
}

/// The PCR values in the file format `tpm2_quote -o` writes and `tpm2_checkquote -f` reads
/// (tpm2-tools' "serialized" format: the C structures' memory layout, little-endian): a
/// `TPML_PCR_SELECTION` of one SHA-256 bank (4-byte count, 16 entries of 8 bytes: hash,
/// size of select, 4 bytes of bitmap, 1 byte of padding), a 4-byte count of `TPML_DIGEST`s,
/// then the `TPML_DIGEST`s of at most 8 values each (4-byte count, 8 entries of a 2-byte
/// size and a 64-byte buffer), ascending by index.
fn serialized_pcrs(pcrs: &[asterism_attestation::tpm::PcrValue]) -> Result<Vec<u8>> {
    const SHA256: u16 = 0x000b;
    let mut bitmap = [0u8; 4];
    for p in pcrs {
        let i = usize::try_from(p.index)?;
        *bitmap
            .get_mut(i / 8)
            .filter(|_| i < 24 && p.value.len() == 32)
            .context("a PCR index above 23 or a value that is not 32 bytes")? |= 1 << (i % 8);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&1u32.to_le_bytes());
    for bank in 0..16 {
        let mut entry = [0u8; 8];
        if bank == 0 {
            entry[..2].copy_from_slice(&SHA256.to_le_bytes());
            entry[2] = 3;
            entry[3..7].copy_from_slice(&bitmap);
        }
        out.extend_from_slice(&entry);
    }
    let chunks = pcrs.chunks(8);
    out.extend_from_slice(&u32::try_from(chunks.len())?.to_le_bytes());
    for chunk in chunks {
        out.extend_from_slice(&u32::try_from(chunk.len())?.to_le_bytes());
        for slot in 0..8 {
            let mut digest = [0u8; 66];
            if let Some(p) = chunk.get(slot) {
                digest[..2].copy_from_slice(&32u16.to_le_bytes());
                digest[2..34].copy_from_slice(&p.value);
            }
            out.extend_from_slice(&digest);
        }
    }
    Ok(out)
}

/// The largest evidence file read: the evidence's own cap, base64-encoded, plus room for
/// the nonce and the JSON around them.
pub const MAX_EVIDENCE_FILE: u64 = 128 * 1024;

/// Evidence as fetched, with the nonce it is bound to.
#[derive(Debug, PartialEq, Eq)]
struct SavedEvidence {
    nonce: [u8; 32],
    evidence: Vec<u8>,
}

/// The file format of saved evidence (module documentation).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EvidenceFile {
    version: u32,
    nonce: String,
    evidence: String,
}

impl SavedEvidence {
    fn to_json(&self) -> String {
        let file = EvidenceFile {
            version: 1,
            nonce: hex::encode(self.nonce),
            evidence: BASE64.encode(&self.evidence),
        };
        serde_json::to_string(&file).unwrap_or_default() + "\n"
    }

    fn from_json(bytes: &[u8]) -> Result<Self> {
        let file: EvidenceFile =
            serde_json::from_slice(bytes).context("not a saved-evidence file")?;
        if file.version != 1 {
            bail!(
                "saved-evidence version {} is not supported (want 1)",
                file.version
            );
        }
        let nonce = hex::decode(&file.nonce)
            .ok()
            .and_then(|n| <[u8; 32]>::try_from(n).ok())
            .context("the nonce is not 32 bytes of hex")?;
        let evidence = BASE64
            .decode(&file.evidence)
            .context("the evidence is not base64")?;
        Ok(Self { nonce, evidence })
    }

    /// Writes the file atomically (0644: evidence is not secret).
    fn save(&self, path: &Path) -> Result<()> {
        asterism_binkit::fs::write_atomic(path, self.to_json().as_bytes(), 0o644)
            .with_context(|| format!("saving the evidence to {}", path.display()))
    }

    fn load(path: &Path) -> Result<Self> {
        let read = || -> Result<Self> {
            let file = std::fs::File::open(path)?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(file, MAX_EVIDENCE_FILE + 1),
                &mut bytes,
            )?;
            if bytes.len() as u64 > MAX_EVIDENCE_FILE {
                bail!("larger than {MAX_EVIDENCE_FILE} bytes");
            }
            Self::from_json(&bytes)
        };
        read().with_context(|| format!("reading saved evidence {}", path.display()))
    }
}

/// Prints every checked field of a confidential VM's hardware report (nothing for other
/// nodes): the report's fields, certificates and binding, each with pass, warn or FAIL.
fn print_checks(out: &mut impl Write, checks: &[Check]) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    writeln!(out, "confidential-VM hardware report:")?;
    writeln!(
        out,
        "{:<6}  {:<32}  {:<40}  EXPECTED",
        "RESULT", "FIELD", "OBSERVED"
    )?;
    for c in checks {
        writeln!(
            out,
            "{:<6}  {:<32}  {:<40}  {}",
            c.outcome.to_string(),
            c.field,
            c.observed,
            c.expected
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_node_is_a_control_plane_node_only_if_the_workspace_records_its_attestation_key() {
        let key = asterism_kms::ControlPlaneSeed::from_bytes(vec![1; 32])
            .unwrap()
            .public_key()
            .unwrap();
        let record = crate::control_plane::Record::new(
            key,
            crate::control_plane::Member {
                name: "cp-0".into(),
                ak: "aa".into(),
                disk: "11111111-1111-1111-1111-111111111111".into(),
            },
        );
        let mut out = Vec::new();
        check_control_plane(&mut out, Some(&record), "aa", true).unwrap();
        assert!(String::from_utf8_lossy(&out).contains("a control-plane node"));
        assert!(check_control_plane(&mut out, Some(&record), "bb", true).is_err());
        check_control_plane(&mut out, Some(&record), "bb", false).unwrap();
        assert!(String::from_utf8_lossy(&out).contains("not a control-plane node"));
        assert!(check_control_plane(&mut out, None, "aa", true).is_err());
    }
    use asterism_attestation::explain::Outcome;

    #[test]
    fn every_checked_field_is_printed_with_its_outcome() {
        let checks = [
            Check::new(
                "measurement",
                "ab".repeat(48),
                "cd".repeat(48),
                Outcome::Fail,
            ),
            Check::new("reported_tcb.snp", ">= 8", "22", Outcome::Pass),
            Check::new("policy.smt", "allowed", "allowed", Outcome::Warn),
        ];
        let mut out = Vec::new();
        print_checks(&mut out, &checks).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + checks.len(), "{text}");
        assert!(lines[2].starts_with("FAIL") && lines[2].contains(&"cd".repeat(48)));
        assert!(lines[3].starts_with("pass") && lines[3].contains("reported_tcb.snp"));
        assert!(lines[4].starts_with("warn"));

        let mut none = Vec::new();
        print_checks(&mut none, &[]).unwrap();
        assert!(
            none.is_empty(),
            "nodes without a hardware report print nothing extra"
        );
    }

    #[test]
    fn saved_evidence_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evidence.json");
        let saved = SavedEvidence {
            nonce: [7; 32],
            evidence: b"some evidence bytes".to_vec(),
        };
        saved.save(&path).unwrap();
        assert_eq!(SavedEvidence::load(&path).unwrap(), saved);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(r#"{"version":1,"nonce":"0707"#), "{text}");
    }

    fn refusal(bytes: &[u8]) -> String {
        format!("{:#}", SavedEvidence::from_json(bytes).unwrap_err())
    }

    #[test]
    fn malformed_evidence_files_are_refused_saying_why() {
        let nonce = "07".repeat(32);
        let ok = format!(r#"{{"version":1,"nonce":"{nonce}","evidence":"AAE="}}"#);
        assert!(SavedEvidence::from_json(ok.as_bytes()).is_ok());
        let v2 = ok.replace(r#""version":1"#, r#""version":2"#);
        assert!(refusal(v2.as_bytes()).contains("version 2 is not supported"));
        let short = ok.replace(&nonce, &"07".repeat(31));
        assert!(refusal(short.as_bytes()).contains("nonce is not 32 bytes"));
        let not_hex = ok.replace(&nonce, &"zz".repeat(32));
        assert!(refusal(not_hex.as_bytes()).contains("nonce is not 32 bytes"));
        let bad64 = ok.replace("AAE=", "A*E=");
        assert!(refusal(bad64.as_bytes()).contains("not base64"));
        let extra = ok.replace('}', r#","note":"x"}"#);
        assert!(refusal(extra.as_bytes()).contains("not a saved-evidence file"));
        assert!(refusal(b"\x00\x01").contains("not a saved-evidence file"));
    }

    #[test]
    fn an_oversized_evidence_file_is_refused_before_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.json");
        let size = usize::try_from(MAX_EVIDENCE_FILE).unwrap() + 1;
        std::fs::write(&path, vec![b' '; size]).unwrap();
        let err = format!("{:#}", SavedEvidence::load(&path).unwrap_err());
        assert!(err.contains("larger than 131072 bytes"), "{err}");
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let base = [
            "verify",
            "--measurements",
            "m.json",
            "--platform-ca",
            "ca.pem",
        ];
        let all: Vec<&str> = base.iter().chain(extra).copied().collect();
        <Cli as clap::Parser>::try_parse_from(all).map(|c| c.args)
    }

    #[test]
    fn exactly_one_of_endpoint_and_evidence() {
        assert!(parse(&["--endpoint", "h:1"]).is_ok());
        assert!(parse(&["--evidence", "e.json"]).is_ok());
        assert!(parse(&[]).is_err(), "neither");
        assert!(parse(&["--endpoint", "h:1", "--evidence", "e.json"]).is_err());
        assert!(
            parse(&["--evidence", "e.json", "--save-evidence", "f.json"]).is_err(),
            "saving needs fetched evidence"
        );
    }

    /// Real signed evidence from the software TPM (`asterism-soft-tpm`).
    mod signed {
        use super::*;
        use asterism_attestation::tpm::TpmQuoteEvidence;
        use asterism_attestation::{AkTrust, Issuer, ValidationError};
        use asterism_soft_tpm::{SoftAk, SoftTpm};

        fn idx(i: u8) -> PcrIndex {
            PcrIndex::new(i).unwrap()
        }

        /// A TPM, a validator pinning its AK, and the expectations it enforces (as `run`
        /// builds them): PCR 4, 9 and 15 at the TPM's values.
        fn setup() -> (SoftTpm, TpmQuoteValidator, Vec<(PcrIndex, ExpectedPcr)>) {
            let mut tpm = SoftTpm::new(SoftAk::generate_ecdsa_p256().unwrap());
            tpm.extend_pcr(idx(4), &[4; 32]);
            tpm.extend_pcr(idx(9), &[9; 32]);
            let mut expected: Vec<_> = [4u8, 9, 15]
                .map(|i| (idx(i), ExpectedPcr::enforce(tpm.pcr(idx(i)))))
                .to_vec();
            expected.push((idx(8), ExpectedPcr::warn_only([8; 32])));
            expected.sort_by_key(|(i, _)| *i);
            let validator = validator(&tpm, &expected);
            (tpm, validator, expected)
        }

        fn validator(tpm: &SoftTpm, expected: &[(PcrIndex, ExpectedPcr)]) -> TpmQuoteValidator {
            TpmQuoteValidator::new(
                AkTrust::pinned([tpm.ak().fingerprint()]),
                Measurements::new(expected.iter().copied())
                    .unwrap()
                    .into_provider(),
            )
        }

        fn saved(tpm: &SoftTpm) -> SavedEvidence {
            let nonce = [0x5a; 32];
            SavedEvidence {
                nonce,
                evidence: tpm.issue(&ReportData::verify(&nonce)).unwrap(),
            }
        }

        fn why(err: &anyhow::Error) -> &ValidationError {
            err.downcast_ref::<ValidationError>().unwrap()
        }

        #[test]
        fn saved_evidence_verifies_offline_against_its_nonce() {
            let (tpm, validator, expected) = setup();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("evidence.json");
            saved(&tpm).save(&path).unwrap();
            let loaded = SavedEvidence::load(&path).unwrap();
            let mut out = Vec::new();
            report(&mut out, &validator, &expected, &loaded, "saved").unwrap();
            let text = String::from_utf8(out).unwrap();
            assert_eq!(text.matches("  pass  ").count(), 3, "{text}");
            assert_eq!(
                text.matches("  warn  ").count(),
                1,
                "PCR 8, warn-only: {text}"
            );
        }

        #[test]
        fn an_edited_nonce_is_refused_as_another_binding() {
            let (tpm, validator, expected) = setup();
            let mut edited = saved(&tpm);
            edited.nonce[0] ^= 1;
            let mut out = Vec::new();
            let err = report(&mut out, &validator, &expected, &edited, "saved").unwrap_err();
            assert_eq!(why(&err), &ValidationError::BindingMismatch);
            assert!(out.is_empty(), "no table from an unbound quote");
        }

        #[test]
        fn edited_evidence_is_refused_by_its_signature() {
            let (tpm, validator, expected) = setup();
            let mut edited = saved(&tpm);
            let mut wire =
                <TpmQuoteEvidence as prost::Message>::decode(edited.evidence.as_slice()).unwrap();
            let last = wire.signature.len() - 1;
            wire.signature[last] ^= 1;
            edited.evidence = prost::Message::encode_to_vec(&wire);
            let mut out = Vec::new();
            let err = report(&mut out, &validator, &expected, &edited, "saved").unwrap_err();
            assert!(
                matches!(why(&err), ValidationError::BadSignature(_)),
                "{err:#}"
            );
            assert!(out.is_empty(), "no table from an unverified quote");
        }

        /// The exported files are what `tpm2_checkquote` (tpm2-tools) reads: it accepts
        /// them with the printed command line, and refuses another qualifying data.
        #[test]
        fn exported_files_pass_tpm2_checkquote() {
            let (tpm, _, _) = setup();
            let dir = tempfile::tempdir().unwrap();
            let saved = saved(&tpm);
            let line = export_tpm2(dir.path(), &saved).unwrap();
            let ak = std::fs::read(dir.path().join("ak.pub")).unwrap();
            assert_eq!(&ak[2..], tpm.ak().public_area_bytes());
            let pcrs = std::fs::read(dir.path().join("quote.pcrs")).unwrap();
            assert_eq!(
                pcrs.len(),
                132 + 4 + 3 * 532,
                "as tpm2_quote writes 24 PCRs"
            );
            let nine = 132 + 4 + 532 + 4 + 66 + 2;
            assert_eq!(&pcrs[nine..nine + 32], tpm.pcr(idx(9)).as_slice());
            let args: Vec<&str> = line.split_whitespace().skip(1).collect();
            let run = |args: &[&str]| {
                asterism_children::output(std::process::Command::new("tpm2_checkquote").args(args))
            };
            let Ok(ok) = run(&args) else {
                eprintln!("tpm2_checkquote is not installed; only the files were checked");
                return;
            };
            assert!(
                ok.status.success(),
                "{line}: {}",
                String::from_utf8_lossy(&ok.stderr)
            );
            let other = hex::encode(ReportData::verify(&[0x5b; 32]).as_bytes());
            let mut wrong = args.clone();
            *wrong.last_mut().unwrap() = &other;
            assert!(
                !run(&wrong).unwrap().status.success(),
                "another nonce is refused"
            );
        }

        #[test]
        fn an_enforced_mismatch_prints_the_whole_table_then_fails() {
            let (mut tpm, validator, expected) = setup();
            // PCR 9 and PCR 15 differ; the validator names the lowest, the table shows both.
            tpm.extend_pcr(idx(15), &[15; 32]);
            tpm.extend_pcr(idx(9), &[0xee; 32]);
            let mut out = Vec::new();
            let err = report(&mut out, &validator, &expected, &saved(&tpm), "saved").unwrap_err();
            assert!(matches!(
                why(&err),
                ValidationError::Measurement { index: 9, .. }
            ));
            let text = String::from_utf8(out).unwrap();
            let rows: Vec<&str> = text.lines().skip(2).collect();
            assert_eq!(rows.len(), 4, "{text}");
            assert!(rows[0].contains("   4  pass"), "{text}");
            assert!(rows[1].contains("   8  warn"), "{text}");
            assert!(rows[2].contains("   9  FAIL"), "{text}");
            assert!(rows[3].contains("  15  FAIL"), "{text}");
            assert!(rows[3].contains(&hex::encode(tpm.pcr(idx(15)))), "{text}");
        }
    }
}
