//! `asterism init`: initialise the first control-plane node.
//!
//! The node's evidence is verified against the expected measurements during the attested
//! TLS exchange, before the request (which carries the master secret) is sent. On success
//! the cluster's secrets and credentials go into a new workspace directory, with the
//! manifests of the post-init bring-up ([`crate::bring_up`]), which then stands up the
//! join service in the new cluster unless it is skipped.

use crate::bring_up::{self, MANIFESTS_DIR, Plan};
use crate::trust::TrustArgs;
use anyhow::{Context, Result, bail};
use asterism_atls::{AtlsConfig, AtlsConnector};
use asterism_kms::{ControlPlaneSeed, DiskUuid, KmsUri, MasterSecret, Salt};
use asterism_kube_api::{DeploymentSpec, JoinServiceTrust, KeyServiceSecret, MEASUREMENT_SALT_LEN};
pub use asterism_kubernetes_versions::{DEFAULT_REQUEST, VersionRequest};
use asterism_kubernetes_versions::{Release, VersionSyntaxError, VersionTable};
use asterism_proto::init::api_client::ApiClient;
use asterism_proto::init::{HostedServices, InitRequest, init_response};
use asterism_recovery_shares::{Custodian, Split, Threshold};
use base64::Engine as _;
use ring::rand::SecureRandom;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zeroize::Zeroizing;

/// Arguments of `asterism init`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The first node's InitServer, HOST:PORT.
    #[arg(long)]
    pub endpoint: String,
    /// File holding the init secret (its bcrypt hash is in the node's metadata).
    #[arg(long, value_name = "PATH")]
    pub init_secret_file: PathBuf,
    /// Directory to create for the cluster's secrets and credentials. Must not exist.
    #[arg(long, value_name = "DIR")]
    pub workspace: PathBuf,
    /// Cluster name.
    #[arg(long, default_value = "asterism")]
    pub cluster_name: String,
    /// Kubernetes version to install: `v1.31` (the latest supported patch of that minor) or
    /// an exact `v1.31.13`. The node is sent that patch version and its components.
    #[arg(long, value_name = "VERSION", default_value_t = DEFAULT_REQUEST,
          value_parser = parse_kubernetes_version)]
    pub kubernetes_version: VersionRequest,
    /// Extra subject alternative names for the API server certificate. Repeatable.
    #[arg(long = "apiserver-cert-san", value_name = "SAN")]
    pub apiserver_cert_sans: Vec<String>,
    /// Deadline for the whole initialisation, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Which nodes to trust.
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Also split the master secret into N shares, any M of which give it back (for
    /// example `3-of-5`), each encrypted to one custodian (`--recovery-recipient`).
    #[arg(long, value_name = "M-of-N")]
    pub recovery_shares: Option<Threshold>,
    /// A custodian's public key file: one age recipient (age1…) or one SSH Ed25519 public
    /// key (ssh-ed25519 …). Give it N times, in share order.
    #[arg(long = "recovery-recipient", value_name = "FILE")]
    pub recovery_recipients: Vec<PathBuf>,
    /// Keep no master-secret.json in the workspace: only the custodians' shares can bring
    /// the secret back. Requires --recovery-shares.
    #[arg(long)]
    pub no_master_secret_file: bool,
    /// The node hosts the cluster's key and join services itself, outside Kubernetes (a
    /// local VM cluster, `asterism mini up --vm`; the node runs with
    /// `--host-cluster-services`): send it, inside the init request, what its join service
    /// must trust, the measurements and platform CA this init verifies it with.
    #[arg(long, requires = "platform_ca")]
    pub host_cluster_services: bool,
}

/// What the node's own join service trusts, when it hosts the services
/// (`--host-cluster-services`): what the bring-up would give a join service in Kubernetes,
/// the measurements this init verifies the node with (`attestation_config`) and the
/// platform CA of `trust`, so that joining nodes are held to what the first node was held
/// to.
fn hosted_services(
    args: &Args,
    attestation_config: &str,
    trust: &JoinServiceTrust,
) -> Result<Option<HostedServices>> {
    if !args.host_cluster_services {
        return Ok(None);
    }
    let Some(ca) = trust.files.get(bring_up::PLATFORM_CA_FILE) else {
        bail!(
            "--host-cluster-services needs --platform-ca: the node's join service trusts a platform CA"
        );
    };
    Ok(Some(HostedServices {
        join_measurements: attestation_config.as_bytes().to_vec(),
        platform_ca: ca.as_bytes().to_vec(),
    }))
}

/// Checks `--kubernetes-version` against the built-in versions table, so an unsupported
/// version is refused while the arguments are parsed, with the supported ones listed.
fn parse_kubernetes_version(text: &str) -> Result<VersionRequest, String> {
    let table = VersionTable::builtin().map_err(|e| format!("{:#}", anyhow::Error::new(e)))?;
    table.select(text).map_err(|e| e.to_string())?;
    text.parse().map_err(|e: VersionSyntaxError| e.to_string())
}

/// The init request: the owner's secrets and the chosen Kubernetes release, its exact
/// patch version and its components (the node installs those, checking each hash).
fn init_request(
    args: &Args,
    release: &Release,
    kms_uri: String,
    measurement_salt: &[u8],
    init_secret: &[u8],
    hosted_services: Option<HostedServices>,
) -> InitRequest {
    InitRequest {
        kms_uri,
        storage_uri: "storage://no-store".into(),
        measurement_salt: measurement_salt.to_vec(),
        kubernetes_version: release.version().to_string(),
        conformance_mode: false,
        kubernetes_components: release
            .components()
            .iter()
            .cloned()
            .map(Into::into)
            .collect(),
        init_secret: init_secret.to_vec(),
        cluster_name: args.cluster_name.clone(),
        apiserver_cert_sans: args.apiserver_cert_sans.clone(),
        service_cidr: String::new(),
        hosted_services,
    }
}

/// Checks the recovery-share flags together and reads the custodians' keys, before anything
/// is generated or sent.
fn recovery_plan(args: &Args) -> Result<Option<(Threshold, Vec<Custodian>)>> {
    let Some(threshold) = args.recovery_shares else {
        if args.no_master_secret_file {
            bail!(
                "--no-master-secret-file without --recovery-shares would lose the master \
                 secret: nothing else could bring it back"
            );
        }
        if !args.recovery_recipients.is_empty() {
            bail!("--recovery-recipient needs --recovery-shares M-of-N");
        }
        return Ok(None);
    };
    if args.recovery_recipients.len() != usize::from(threshold.total()) {
        bail!(
            "--recovery-shares {threshold} needs {} --recovery-recipient files, one per \
             custodian; {} given",
            threshold.total(),
            args.recovery_recipients.len()
        );
    }
    let custodians = crate::recovery_share::read_custodians(&args.recovery_recipients)?;
    Ok(Some((threshold, custodians)))
}

/// What a successful init produced (for `mini`, which drives init in process).
#[derive(Debug, Clone)]
pub struct Initialised {
    /// The cluster ID, hex.
    pub cluster_id: String,
    /// Where the workspace was written.
    pub workspace: PathBuf,
}

fn random32() -> Result<Zeroizing<Vec<u8>>> {
    let mut bytes = Zeroizing::new(vec![0u8; 32]);
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    Ok(bytes)
}

fn read_init_secret(path: &Path) -> Result<Zeroizing<Vec<u8>>> {
    let bytes = Zeroizing::new(
        std::fs::read(path)
            .with_context(|| format!("reading the init secret {}", path.display()))?,
    );
    let trimmed = bytes.trim_ascii_end();
    if trimmed.is_empty() {
        bail!("the init secret file {} is empty", path.display());
    }
    Ok(Zeroizing::new(trimmed.to_vec()))
}

/// Runs `asterism init` without the bring-up, printing progress to stderr: what
/// `asterism mini` runs, whose nodes have no Kubernetes (the bootstrapper's `none` driver)
/// and whose services run as processes. The manifests are written to the workspace all
/// the same.
pub async fn run(args: Args) -> Result<Initialised> {
    let skipped = bring_up::Args::skipped(
        "the caller runs the services itself (no Kubernetes API: the `none` driver)",
    );
    run_with(args, &skipped).await
}

/// What the bring-up after `asterism init` deploys: the join service checks joining nodes
/// against what the first node was checked against (`measurements`, in their file format,
/// and the AK trust of `args`), with `measurement_salt`, and asks the metadata service of
/// `after`. The one place this is decided: `run_with` deploys it, and the end-to-end test
/// of the deployed services runs it.
pub fn deployment_spec(
    args: &Args,
    after: &bring_up::Args,
    measurements: &asterism_attestation::Measurements,
    measurement_salt: &[u8],
) -> Result<DeploymentSpec> {
    let mut trust = bring_up::join_service_trust(&args.trust.ak)?;
    let metadata_url = bring_up::deployed_metadata_url(after.metadata_url()?, &mut trust)?;
    Ok(DeploymentSpec {
        images: after.images(),
        attestation_config: measurements.to_json(),
        measurement_salt: <[u8; MEASUREMENT_SALT_LEN]>::try_from(measurement_salt)
            .context("the measurement salt")?,
        trust,
        metadata_url,
    })
}

/// Runs `asterism init` and then the bring-up of `after` (unless it is skipped), printing
/// progress to stderr.
pub async fn run_with(args: Args, after: &bring_up::Args) -> Result<Initialised> {
    if args.workspace.exists() {
        bail!(
            "the workspace {} already exists; refusing to overwrite a cluster's secrets \
             (choose another --workspace or move the old one away)",
            args.workspace.display()
        );
    }
    let measurements = args.trust.load_measurements()?;
    let measurement_salt = random32()?;
    let plan = Plan::new(deployment_spec(
        &args,
        after,
        &measurements,
        &measurement_salt,
    )?)?;
    let validator = args.trust.validator(measurements)?;
    let init_secret = read_init_secret(&args.init_secret_file)?;
    let recovery = recovery_plan(&args)?;
    let hosted_services = hosted_services(&args, &plan.spec.attestation_config, &plan.spec.trust)?;
    let release = VersionTable::builtin()
        .context("the built-in Kubernetes versions table")?
        .resolve(args.kubernetes_version)?;

    let master_secret = random32()?;
    let salt = random32()?;
    let manifests = bring_up::manifest_files(&plan.deployment)?;
    // Split before anything is sent: a failure here leaves no cluster without its shares.
    let split = match &recovery {
        Some((threshold, custodians)) => Some(asterism_recovery_shares::split(
            &MasterSecret::new(master_secret.to_vec())?,
            &Salt::new(salt.to_vec())?,
            *threshold,
            custodians,
        )?),
        None => None,
    };
    let kms_uri = KmsUri::cluster(
        MasterSecret::new(master_secret.to_vec())?,
        Salt::new(salt.to_vec())?,
    )
    .to_uri_string();

    let deadline = Duration::from_secs(args.timeout_secs);
    let give_up = tokio::time::Instant::now() + deadline;
    eprintln!(
        "▸ connecting to {} and verifying the node's evidence",
        args.endpoint
    );
    let connector = AtlsConnector::new(
        AtlsConfig::verifying(validator)
            .with_handshake_timeout(Duration::from_secs(30))
            .with_exchange_timeout(Duration::from_secs(30)),
    )?;
    // A busy node (its handshake slots or secret checks taken, by other callers or a
    // flood) answers UNAVAILABLE or RESOURCE_EXHAUSTED, or closes the connection: all
    // before it checked anything, so trying again is safe. Everything else ends the run.
    let mut backoff = crate::retry::Backoff::new(Duration::from_secs(5));
    let (mut stream, init_ak) = loop {
        let request = init_request(
            &args,
            &release,
            kms_uri.to_string(),
            &measurement_salt,
            &init_secret,
            hosted_services.clone(),
        );
        let left = give_up.saturating_duration_since(tokio::time::Instant::now());
        let tried = tokio::time::timeout(
            left,
            start_init(&args.endpoint, &connector, request, &release),
        )
        .await
        .unwrap_or_else(|_| Err(InitAttempt::Retry(format!("no answer within {deadline:?}"))));
        match tried {
            Ok(started) => break started,
            Err(InitAttempt::Fatal(e)) => return Err(e),
            Err(InitAttempt::Retry(why)) => {
                let wait = backoff.next_wait();
                if tokio::time::Instant::now() + wait >= give_up {
                    bail!(
                        "the node at {} did not take the init request within {deadline:?} \
                         ({} attempts; the last: {why})",
                        args.endpoint,
                        backoff.attempts
                    );
                }
                eprintln!(
                    "▸ attempt {} failed: {why}; retrying in {:.1} s",
                    backoff.attempts,
                    wait.as_secs_f64()
                );
                tokio::time::sleep(wait).await;
            }
        }
    };
    // The control plane's identity: derived from the master secret, as the key service
    // derives it for the join service. Nodes are given its public form.
    let control_plane_key = ControlPlaneSeed::derive(
        &MasterSecret::new(master_secret.to_vec())?,
        &Salt::new(salt.to_vec())?,
    )?
    .public_key()?;
    let left = give_up.saturating_duration_since(tokio::time::Instant::now());
    let outcome = tokio::time::timeout(left, async {
        let mut success = None;
        let mut failure = None;
        let mut logs = Vec::new();
        while let Some(msg) = stream.message().await.map_err(|s| status_error(&s))? {
            match msg.kind {
                Some(init_response::Kind::InitSuccess(s)) => success = Some(s),
                Some(init_response::Kind::InitFailure(f)) => failure = Some(f.error),
                // Bounded: the node sends its own bounded log buffer; cap it here too.
                Some(init_response::Kind::Log(l)) if logs.len() < 4 << 20 => {
                    logs.extend_from_slice(&l.log);
                }
                Some(init_response::Kind::Log(_)) => {}
                None => {}
            }
        }
        Ok::<_, anyhow::Error>((success, failure, logs))
    })
    .await
    .with_context(|| format!("initialisation did not finish within {deadline:?}"))??;

    let (success, failure, logs) = outcome;
    if let Some(error) = failure {
        if !logs.is_empty() {
            eprintln!("── log of the node ──────────────────────────────");
            eprintln!("{}", String::from_utf8_lossy(&logs));
            eprintln!("─────────────────────────────────────────────────");
        }
        bail!("the node reported a failure: {error}");
    }
    let success = success.context("the node closed the stream without a result")?;
    let cluster_id = hex::encode(&success.cluster_id);
    if success.cluster_id.len() != 32 {
        bail!(
            "the node returned a cluster ID of {} bytes, want 32",
            success.cluster_id.len()
        );
    }
    // The node's disk: recorded with the AK verified above, so that `asterism recover`
    // sends this node's key only to this AK.
    let init_disk = DiskUuid::parse(&success.disk_uuid)
        .context("the node named no usable disk UUID in its answer")?;
    let control_plane = crate::control_plane::init_files(
        control_plane_key,
        crate::control_plane::Member {
            name: String::new(),
            ak: init_ak,
            disk: init_disk.as_str().to_owned(),
        },
    )?;
    write_workspace(
        &args.workspace,
        &Workspace {
            kubeconfig: &success.kubeconfig,
            control_plane: &control_plane,
            cluster_id: &cluster_id,
            master_secret: &master_secret,
            salt: &salt,
            measurement_salt: &measurement_salt,
            endpoint: &args.endpoint,
            recovery: split.as_ref(),
            keep_master_secret: !args.no_master_secret_file,
            manifests: &manifests,
        },
    )?;
    eprintln!("▸ cluster initialised; cluster ID {cluster_id}");
    eprintln!("  control-plane key {control_plane_key} (give nodes --control-plane-key)");
    eprintln!("  workspace: {}", args.workspace.display());
    if let Some(split) = &split {
        eprintln!(
            "  recovery: {} shares in {}; hand each to its custodian",
            split.record.threshold(),
            args.workspace.join(SHARES_DIR).display()
        );
    }
    let manifests_dir = args.workspace.join(MANIFESTS_DIR);
    match after.skip() {
        Some(reason) => eprintln!(
            "▸ post-init bring-up skipped ({reason}): nothing was deployed into the cluster; \
             the manifests are in {}",
            manifests_dir.display()
        ),
        None => {
            let secret = KeyServiceSecret::new(&master_secret, &salt)?;
            bring_up::run(
                after,
                &args.workspace.join("admin.conf"),
                &plan,
                &secret,
                &mut std::io::stderr(),
            )
            .await
            .with_context(|| {
                format!(
                    "the cluster is initialised (workspace {}), but its bring-up failed; \
                     the manifests are in {} (the Secret's values are in master-secret.json)",
                    args.workspace.display(),
                    manifests_dir.display()
                )
            })?;
        }
    }
    Ok(Initialised {
        cluster_id,
        workspace: args.workspace.clone(),
    })
}

/// Why one attempt to start the Init call failed.
enum InitAttempt {
    /// The node was busy or unreachable before it checked anything: try again.
    Retry(String),
    /// The node was refused (its evidence) or refused the request: the end.
    Fatal(anyhow::Error),
}

/// One attempt: an attested connection to `endpoint`, then the Init call up to its
/// response headers.
/// A started init: the node's answer stream and the attestation key its evidence named.
async fn start_init(
    endpoint: &str,
    connector: &AtlsConnector,
    request: InitRequest,
    release: &Release,
) -> std::result::Result<(tonic::Streaming<asterism_proto::init::InitResponse>, String), InitAttempt>
{
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .map_err(|e| InitAttempt::Fatal(anyhow::anyhow!("invalid endpoint {endpoint:?}: {e}")))?
        .connect_timeout(Duration::from_secs(30))
        .connect_with_connector(connector.clone())
        .await
        .map_err(|e| classify_connect_error(endpoint, &e))?;
    let init_ak = match connector.last_verified_peer() {
        Some(peer) => {
            eprintln!(
                "▸ node verified: {} evidence, attestation key {}",
                peer.evidence().variant(),
                peer.evidence().identity()
            );
            peer.evidence().identity().to_owned()
        }
        None => {
            return Err(InitAttempt::Fatal(anyhow::anyhow!(
                "the connection to the node carried no verified evidence"
            )));
        }
    };
    eprintln!(
        "▸ sending the init request; the node is setting up Kubernetes {} ({} components)",
        release.version(),
        release.components().len()
    );
    match ApiClient::new(channel).init(request).await {
        Ok(response) => Ok((response.into_inner(), init_ak)),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::ResourceExhausted
            ) =>
        {
            Err(InitAttempt::Retry(format!(
                "the node is busy ({:?}: {})",
                s.code(),
                s.message()
            )))
        }
        Err(s) => Err(InitAttempt::Fatal(status_error(&s))),
    }
}

/// A failed connection: fatal when the node's evidence was refused (nothing secret was
/// sent, and trying again changes nothing), to be retried otherwise (nothing listens yet,
/// the node closed the connection while busy, a deadline).
fn classify_connect_error(endpoint: &str, e: &tonic::transport::Error) -> InitAttempt {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(atls) = c.downcast_ref::<asterism_atls::AtlsError>() {
            if matches!(
                atls,
                asterism_atls::AtlsError::Rejected(_)
                    | asterism_atls::AtlsError::UnknownVariant(_)
                    | asterism_atls::AtlsError::UnsupportedVersion(_)
                    | asterism_atls::AtlsError::Config(_)
            ) {
                return InitAttempt::Fatal(explain_connect_error(endpoint, e));
            }
            break;
        }
        cause = c.source();
    }
    InitAttempt::Retry(format!("{:#}", explain_connect_error(endpoint, e)))
}

fn status_error(s: &tonic::Status) -> anyhow::Error {
    match s.code() {
        tonic::Code::FailedPrecondition => anyhow::anyhow!(
            "the node refused: {} (it is already initialised or joining a cluster)",
            s.message()
        ),
        tonic::Code::Unavailable => anyhow::anyhow!(
            "the node is unavailable: {} (is its bootstrapper running?)",
            s.message()
        ),
        _ => anyhow::anyhow!("the node refused: {:?}: {}", s.code(), s.message()),
    }
}

fn explain_connect_error(endpoint: &str, e: &tonic::transport::Error) -> anyhow::Error {
    let text = format!("{e:?}");
    if text.contains("measurement mismatch") {
        anyhow::anyhow!(
            "the node at {endpoint} runs other software than expected (its measurements \
             differ); nothing secret was sent. Details: {text}"
        )
    } else if text.contains("untrusted attestation key") || text.contains("certificate") {
        anyhow::anyhow!(
            "the node at {endpoint} presented an attestation key the platform CA does not \
             vouch for; nothing secret was sent. Details: {text}"
        )
    } else if text.contains("Connection refused") {
        anyhow::anyhow!("nothing listens at {endpoint}: is the node's bootstrapper running?")
    } else {
        anyhow::anyhow!("could not open an attested connection to {endpoint}: {text}")
    }
}

struct Workspace<'a> {
    kubeconfig: &'a [u8],
    /// `control-plane-key` and `control-plane.json`.
    control_plane: &'a [(String, Vec<u8>)],
    cluster_id: &'a str,
    master_secret: &'a [u8],
    salt: &'a [u8],
    measurement_salt: &'a [u8],
    endpoint: &'a str,
    /// The shares and their record, when the secret was split.
    recovery: Option<&'a Split>,
    /// Whether `master-secret.json` is written (not with `--no-master-secret-file`).
    keep_master_secret: bool,
    /// The bring-up's manifests (`manifests/<file>`, no secret in them).
    manifests: &'a [(String, Vec<u8>)],
}

/// The workspace's folder of encrypted shares, one per custodian.
const SHARES_DIR: &str = "recovery-shares";

/// Writes the workspace into a fresh temporary directory beside `dir` and renames it into
/// place, so that a crash leaves either nothing or a complete workspace.
fn write_workspace(dir: &Path, ws: &Workspace<'_>) -> Result<()> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = dir
        .file_name()
        .context("the workspace path has no final component")?
        .to_string_lossy();
    let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let master = Zeroizing::new(format!(
        "{{\n  \"key\": \"{}\",\n  \"salt\": \"{}\"\n}}\n",
        b64.encode(ws.master_secret),
        b64.encode(ws.salt)
    ));
    let cluster = format!(
        "{{\n  \"clusterID\": \"{}\",\n  \"measurementSalt\": \"{}\",\n  \"initEndpoint\": \"{}\"\n}}\n",
        ws.cluster_id,
        hex::encode(ws.measurement_salt),
        ws.endpoint
    );
    let cluster_id_line = format!("{}\n", ws.cluster_id);
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("admin.conf".into(), ws.kubeconfig.to_vec()),
        ("cluster-id".into(), cluster_id_line.into_bytes()),
        ("cluster.json".into(), cluster.into_bytes()),
    ];
    if let Some(split) = ws.recovery {
        files.push(("recovery.json".into(), split.record.to_json()));
        for share in &split.shares {
            files.push((
                format!("{SHARES_DIR}/{}", share.file_name()),
                share.to_json(),
            ));
        }
    }
    files.extend(ws.control_plane.iter().cloned());
    files.extend(ws.manifests.iter().cloned());
    let result = (|| {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(tmp.join(MANIFESTS_DIR))
            .with_context(|| format!("creating {}", tmp.join(MANIFESTS_DIR).display()))?;
        if ws.recovery.is_some() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(tmp.join(SHARES_DIR))
                .with_context(|| format!("creating {}", tmp.join(SHARES_DIR).display()))?;
        }
        if ws.keep_master_secret {
            asterism_binkit::write_new(
                &tmp.join("master-secret.json"),
                master.as_bytes(),
                asterism_binkit::fs::PRIVATE_MODE,
            )?;
        }
        for (file, contents) in &files {
            asterism_binkit::write_new(
                &tmp.join(file),
                contents,
                asterism_binkit::fs::PRIVATE_MODE,
            )?;
        }
        Ok::<_, anyhow::Error>(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
        bail!(
            "the workspace {} appeared while initialising; not overwriting it",
            dir.display()
        );
    }
    std::fs::rename(&tmp, dir)
        .with_context(|| format!("moving the workspace into {}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use age::secrecy::ExposeSecret as _;
    use asterism_recovery_shares::{
        CustodianIdentity, DecryptedShareFile, EncryptedShareFile, RecoveryRecord,
    };
    use std::os::unix::fs::PermissionsExt as _;

    /// A 2-of-3 split of `master` to fresh age keys, and the custodians' private keys.
    fn split_2_of_3(master: &[u8], salt: &[u8]) -> (Split, Vec<String>) {
        let keys: Vec<age::x25519::Identity> =
            (0..3).map(|_| age::x25519::Identity::generate()).collect();
        let custodians: Vec<Custodian> = keys
            .iter()
            .map(|k| Custodian::parse(&k.to_public().to_string(), "c.pub").unwrap())
            .collect();
        let split = asterism_recovery_shares::split(
            &MasterSecret::new(master.to_vec()).unwrap(),
            &Salt::new(salt.to_vec()).unwrap(),
            "2-of-3".parse().unwrap(),
            &custodians,
        )
        .unwrap();
        let private = keys
            .iter()
            .map(|k| k.to_string().expose_secret().to_owned())
            .collect();
        (split, private)
    }

    fn workspace<'a>(split: Option<&'a Split>, keep: bool, secret: &'a [u8]) -> Workspace<'a> {
        Workspace {
            kubeconfig: b"kubeconfig",
            control_plane: &[],
            cluster_id: "00",
            master_secret: secret,
            salt: secret,
            measurement_salt: secret,
            endpoint: "127.0.0.1:9000",
            recovery: split,
            keep_master_secret: keep,
            manifests: &[],
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn without_the_master_secret_file_only_shares_and_their_record_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let secret = [9u8; 32];
        let (split, keys) = split_2_of_3(&secret, &[8; 32]);
        write_workspace(&ws, &workspace(Some(&split), false, &secret)).unwrap();

        assert!(!ws.join("master-secret.json").exists());
        // No file of the workspace holds the secret's bytes in any encoding.
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        for entry in walk(&ws) {
            let text = String::from_utf8_lossy(&std::fs::read(&entry).unwrap()).into_owned();
            assert!(!text.contains(&b64), "{} holds the secret", entry.display());
            assert_eq!(mode(&entry), 0o600, "{}", entry.display());
        }
        assert_eq!(mode(&ws), 0o700);
        assert_eq!(mode(&ws.join(SHARES_DIR)), 0o700);

        // Two custodians' shares and the record give the secret back.
        let record =
            RecoveryRecord::from_json(&std::fs::read(ws.join("recovery.json")).unwrap(), "r")
                .unwrap();
        let shares: Vec<DecryptedShareFile> = [1usize, 3]
            .iter()
            .map(|&i| {
                let path = ws.join(SHARES_DIR).join(format!("share-{i}-of-3.json"));
                let file =
                    EncryptedShareFile::from_json(&std::fs::read(&path).unwrap(), "s").unwrap();
                let key = CustodianIdentity::from_bytes(keys[i - 1].as_bytes(), "k").unwrap();
                asterism_recovery_shares::decrypt_share(&file, &key).unwrap()
            })
            .collect();
        let back = asterism_recovery_shares::reconstruct(&shares, &record).unwrap();
        assert_eq!(back.expose_secret(), secret);
    }

    #[test]
    fn with_shares_the_master_secret_file_is_kept_unless_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let secret = [9u8; 32];
        let (split, _) = split_2_of_3(&secret, &[8; 32]);
        write_workspace(&ws, &workspace(Some(&split), true, &secret)).unwrap();
        assert_eq!(mode(&ws.join("master-secret.json")), 0o600);
        assert_eq!(mode(&ws.join("recovery.json")), 0o600);
        assert_eq!(std::fs::read_dir(ws.join(SHARES_DIR)).unwrap().count(), 3);
    }

    #[test]
    fn the_manifests_are_written_private_and_hold_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let secret = [9u8; 32];
        let plan = Plan::new(DeploymentSpec {
            images: bring_up::Args::skipped("test").images(),
            attestation_config: r#"{"measurements":{}}"#.into(),
            measurement_salt: [7; 32],
            trust: asterism_kube_api::JoinServiceTrust {
                args: vec!["--pinned-ak=00".into()],
                files: Default::default(),
            },
            metadata_url: None,
        })
        .unwrap();
        let manifests = bring_up::manifest_files(&plan.deployment).unwrap();
        let mut files = workspace(None, true, &secret);
        files.manifests = &manifests;
        write_workspace(&ws, &files).unwrap();

        assert_eq!(mode(&ws.join(MANIFESTS_DIR)), 0o700);
        let written = walk(&ws.join(MANIFESTS_DIR));
        assert_eq!(written.len(), 5);
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        for path in written {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains(&b64), "{} holds the secret", path.display());
            assert!(!text.contains(&hex::encode(secret)), "{}", path.display());
        }
        let secret_manifest =
            std::fs::read_to_string(ws.join(MANIFESTS_DIR).join("key-service-secret.yaml"))
                .unwrap();
        assert!(secret_manifest.contains("kind: Secret"));
        assert!(
            !secret_manifest
                .lines()
                .any(|l| l.starts_with("data:") || l.starts_with("stringData:")),
            "{secret_manifest}"
        );
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else {
                files.push(path);
            }
        }
        files
    }

    fn args(extra: &[&str]) -> Args {
        try_args(extra).unwrap()
    }

    fn try_args(extra: &[&str]) -> Result<Args, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut argv = vec![
            "init",
            "--endpoint",
            "127.0.0.1:9000",
            "--init-secret-file",
            "s",
            "--workspace",
            "w",
            "--platform-ca",
            "ca.pem",
            "--measurements",
            "m.json",
        ];
        argv.extend_from_slice(extra);
        <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.args)
    }

    fn release(args: &Args) -> Release {
        VersionTable::builtin()
            .unwrap()
            .resolve(args.kubernetes_version)
            .unwrap()
    }

    #[test]
    fn kubernetes_version_defaults_to_the_latest_v1_31() {
        let a = args(&[]);
        assert_eq!(a.kubernetes_version.to_string(), "v1.31");
        assert_eq!(release(&a).version().to_string(), "v1.31.13");
        assert_eq!(
            release(&args(&["--kubernetes-version", "v1.31"])).version(),
            release(&a).version()
        );
    }

    #[test]
    fn an_exact_kubernetes_version_is_kept() {
        let a = args(&["--kubernetes-version", "v1.30.14"]);
        assert_eq!(release(&a).version().to_string(), "v1.30.14");
    }

    #[test]
    fn unsupported_kubernetes_versions_are_refused_while_parsing_arguments() {
        for bad in ["v1.29", "v1.31.99", "1.31", "garbage"] {
            let err = try_args(&["--kubernetes-version", bad]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            let text = err.to_string();
            assert!(
                text.contains("supported: v1.30.14, v1.31.13 (default), v1.32.9"),
                "{bad}: {text}"
            );
        }
    }

    #[test]
    fn the_init_request_carries_the_exact_version_and_its_components() {
        let a = args(&["--kubernetes-version", "v1.32"]);
        let r = release(&a);
        let req = init_request(&a, &r, "kms://x".into(), &[7; 32], b"secret", None);
        assert_eq!(req.kubernetes_version, "v1.32.9");
        assert_eq!(req.kubernetes_components.len(), 9);
        for (sent, c) in req.kubernetes_components.iter().zip(r.components()) {
            assert_eq!(
                (&sent.url, &sent.hash, &sent.install_path, sent.extract),
                (&c.url, &c.hash, &c.install_path, c.extract)
            );
            // Every component is sent with a hash, data: ones included.
            assert!(
                asterism_kubernetes_versions::Sha256Hash::parse(&sent.hash).is_ok(),
                "{}",
                sent.install_path
            );
        }
        assert!(
            req.kubernetes_components
                .iter()
                .any(|c| c.url == "https://dl.k8s.io/v1.32.9/bin/linux/amd64/kubeadm")
        );
        assert_eq!(
            req.kubernetes_components
                .iter()
                .filter(|c| c.url.starts_with("data:"))
                .count(),
            4
        );
        assert_eq!(req.cluster_name, "asterism");
    }

    #[test]
    fn hosted_services_carry_the_files_this_init_verifies_with_and_need_a_platform_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, b"platform CA").unwrap();
        let mut a = args(&[]);
        a.trust.ak.platform_ca = Some(ca.clone());
        let trust = bring_up::join_service_trust(&a.trust.ak).unwrap();
        assert!(
            hosted_services(&a, "measurements", &trust)
                .unwrap()
                .is_none(),
            "not asked for"
        );
        a.host_cluster_services = true;
        // A pinned AK instead of a platform CA: the hosted join service cannot use it.
        a.trust.ak.platform_ca = None;
        a.trust.ak.pinned_ak = vec!["ab".repeat(32)];
        let no_ca = bring_up::join_service_trust(&a.trust.ak).unwrap();
        let err = hosted_services(&a, "measurements", &no_ca)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs --platform-ca"), "{err}");
        let h = hosted_services(&a, "measurements", &trust)
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.join_measurements.as_slice(), h.platform_ca.as_slice()),
            (&b"measurements"[..], &b"platform CA"[..])
        );
    }

    #[test]
    fn no_master_secret_file_is_refused_without_shares() {
        let err = recovery_plan(&args(&["--no-master-secret-file"])).unwrap_err();
        assert!(
            err.to_string().contains("would lose the master secret"),
            "{err}"
        );
    }

    #[test]
    fn the_number_of_recipients_must_be_n() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("c.pub");
        std::fs::write(
            &key,
            age::x25519::Identity::generate().to_public().to_string(),
        )
        .unwrap();
        let key = key.to_str().unwrap();
        let err = recovery_plan(&args(&[
            "--recovery-shares",
            "2-of-3",
            "--recovery-recipient",
            key,
            "--recovery-recipient",
            key,
        ]))
        .unwrap_err();
        assert!(
            err.to_string().contains("needs 3 --recovery-recipient"),
            "{err}"
        );
        let plan = recovery_plan(&args(&[
            "--recovery-shares",
            "2-of-2",
            "--recovery-recipient",
            key,
            "--recovery-recipient",
            key,
        ]))
        .unwrap();
        assert_eq!(plan.map(|(t, c)| (t.needed(), c.len())), Some((2, 2)));
    }
}
