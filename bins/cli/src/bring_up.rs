//! The bring-up after `asterism init`: with the new admin kubeconfig, the CLI creates
//! `join-config`, the key service's Secret, and the key, join and verify services with
//! their RBAC (asterism-kube-api builds the objects), then waits for the join service.
//!
//! The same objects go to the workspace's `manifests/` (the Secret without its data), so an
//! operator can read them or apply them again.

use anyhow::{Context, Result, bail};
use asterism_binkit::AkTrustArgs;
use asterism_kube_api::{
    ApiOptions, ClusterApi, Deployment, DeploymentSpec, Images, JOIN_SERVICE, JOIN_SERVICE_PORT,
    JoinServiceTrust, KeyServiceSecret, TRUST_DIR, WaitPolicy,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// Where the images are published by default (docs/kubernetes.md).
pub const DEFAULT_IMAGE_REPOSITORY: &str = "ghcr.io/asterism-project";
/// The images' default tag: this CLI's version.
pub const DEFAULT_IMAGE_TAG: &str = concat!("v", env!("CARGO_PKG_VERSION"));
/// The workspace's directory of manifests.
pub const MANIFESTS_DIR: &str = "manifests";

/// The largest trust file (platform CA, policy, collateral) put into the cluster: a
/// ConfigMap holds at most 1 MiB.
const MAX_TRUST_FILE: u64 = 256 * 1024;

/// Options of the bring-up after `asterism init`.
#[derive(clap::Args, Debug, Clone)]
// Flattened next to `init::Args` in one command: group ids must differ.
#[group(id = "bring_up")]
pub struct Args {
    /// Initialise the node only: deploy nothing into the cluster (no API server is reachable
    /// from here, or the node runs no Kubernetes, as with the bootstrapper's `none` driver).
    /// The manifests are written to the workspace all the same.
    #[arg(long)]
    pub skip_bring_up: bool,
    /// Where the service images are: `<repository>/{key,join,verify}-service:<tag>`.
    #[arg(long, value_name = "REPOSITORY", default_value = DEFAULT_IMAGE_REPOSITORY)]
    pub image_repository: String,
    /// The images' tag.
    #[arg(long, value_name = "TAG", default_value = DEFAULT_IMAGE_TAG)]
    pub image_tag: String,
    /// How long the bring-up may take (the API server, then the join service), in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub bring_up_timeout_secs: u64,
    /// Where the deployed join service learns which node an address is, and its role (its
    /// `--metadata-url`: `http://HOST:PORT`, `gce://PROJECT/CLUSTER` on GCE, or
    /// `file:ROSTER.json`, the owner's roster, which is deployed with the service). Needed for the bring-up; the manifests written with
    /// --skip-bring-up leave it out (the join service then assumes the local cluster's).
    #[arg(long, value_name = "URL")]
    pub metadata_url: Option<String>,
    /// Why a caller of the library skips the bring-up (no flag).
    #[arg(skip)]
    pub skip_reason: Option<String>,
}

impl Args {
    /// No bring-up, for `reason` (printed instead).
    pub fn skipped(reason: impl Into<String>) -> Self {
        Self {
            skip_bring_up: true,
            image_repository: DEFAULT_IMAGE_REPOSITORY.to_owned(),
            image_tag: DEFAULT_IMAGE_TAG.to_owned(),
            bring_up_timeout_secs: 300,
            metadata_url: None,
            skip_reason: Some(reason.into()),
        }
    }

    /// The deployed join service's metadata URL: required unless the bring-up is skipped.
    pub fn metadata_url(&self) -> anyhow::Result<Option<String>> {
        match (&self.metadata_url, self.skip()) {
            (Some(url), _) => {
                // What the join service takes (docs/metadata.md), checked by its own
                // parser: the metadata service over plain HTTP, or a GCE project's cluster;
                // or the owner's roster, a file here, which `deployed_metadata_url` ships.
                if !url.starts_with("file:") {
                    asterism_metadata::AnyMetadata::check_url(url).with_context(|| {
                        format!(
                            "--metadata-url {url:?}: neither the metadata service \
                             (http://HOST:PORT), a GCE cluster (gce://PROJECT/CLUSTER) nor a \
                             roster (file:PATH)"
                        )
                    })?;
                }
                Ok(Some(url.clone()))
            }
            (None, Some(_)) => Ok(None),
            (None, None) => anyhow::bail!(
                "the join service deployed into the cluster needs the metadata service it \
                 asks about nodes: give --metadata-url (or --skip-bring-up)"
            ),
        }
    }

    /// Why the bring-up is skipped, if it is.
    pub fn skip(&self) -> Option<String> {
        match (&self.skip_reason, self.skip_bring_up) {
            (Some(reason), _) => Some(reason.clone()),
            (None, true) => Some("--skip-bring-up".to_owned()),
            (None, false) => None,
        }
    }

    /// The images of the three services.
    pub fn images(&self) -> Images {
        Images::from_repository(&self.image_repository, &self.image_tag)
    }
}

/// The name of the owner's roster among the join service's trust files.
pub const ROSTER_FILE: &str = "roster.json";
/// Largest roster shipped: a ConfigMap holds at most 1 MiB in all.
const MAX_ROSTER: u64 = 512 * 1024;

/// The deployed join service's `--metadata-url` for `url`. A roster (`file:PATH`, a path
/// on this machine) is read, checked as the join service will check it, and shipped among
/// its trust files; the service then reads it from there. Other URLs go as they are.
pub fn deployed_metadata_url(
    url: Option<String>,
    trust: &mut JoinServiceTrust,
) -> Result<Option<String>> {
    let Some(path) = url.as_deref().and_then(|u| u.strip_prefix("file:")) else {
        return Ok(url);
    };
    let bytes = asterism_binkit::read_capped(Path::new(path), MAX_ROSTER)
        .with_context(|| format!("the roster {path}"))?;
    asterism_metadata::MetadataConfig::from_json(&bytes)
        .with_context(|| format!("the roster {path}"))?;
    let text =
        String::from_utf8(bytes).with_context(|| format!("the roster {path} is not text"))?;
    trust.files.insert(ROSTER_FILE.to_owned(), text);
    Ok(Some(format!("file:{TRUST_DIR}/{ROSTER_FILE}")))
}

/// The name of the platform CA's file among the join service's trust files.
pub const PLATFORM_CA_FILE: &str = "platform-ca.pem";

/// The join service's attestation-key trust: the same policy the CLI checked the first
/// node with, as flags of the join service and the files they name.
pub fn join_service_trust(ak: &AkTrustArgs) -> Result<JoinServiceTrust> {
    let mut trust = JoinServiceTrust::default();
    if !ak.cvm_crl.is_empty() {
        // Refused rather than dropped: the join service would run without the bundle.
        bail!(
            "--cvm-crl is not handed on to the join service this command deploys yet; \
             deploy the join service with --cvm-crl yourself"
        );
    }
    if !ak.cloud_ak_root.is_empty() {
        // Refused rather than dropped: the join service would start without an AK policy.
        bail!(
            "--cloud-ak-root is not handed on to the join service this command deploys yet; \
             deploy the join service with --cloud-ak-root yourself"
        );
    }
    let add_file = |trust: &mut JoinServiceTrust, flag: &str, name: String, path: &Path| {
        let bytes = asterism_binkit::read_capped(path, MAX_TRUST_FILE)?;
        let text =
            String::from_utf8(bytes).with_context(|| format!("{} is not text", path.display()))?;
        trust.args.push(format!("{flag}={TRUST_DIR}/{name}"));
        trust.files.insert(name, text);
        Ok::<_, anyhow::Error>(())
    };
    if let Some(ca) = &ak.platform_ca {
        add_file(&mut trust, "--platform-ca", PLATFORM_CA_FILE.into(), ca)?;
    }
    for pin in &ak.pinned_ak {
        trust.args.push(format!("--pinned-ak={pin}"));
    }
    if let Some(platform) = ak.confidential_vm {
        trust
            .args
            .push(format!("--confidential-vm={}", platform.name()));
    }
    if ak.insecure_no_launch_measurement {
        trust.args.push("--insecure-no-launch-measurement".into());
    }
    if let Some(policy) = &ak.cvm_policy {
        add_file(&mut trust, "--cvm-policy", "cvm-policy.json".into(), policy)?;
    }
    let mut collateral = Vec::new();
    for path in &ak.tdx_collateral {
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("reading {}", path.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            files.sort();
            collateral.extend(files);
        } else {
            collateral.push(path.clone());
        }
    }
    for (i, path) in collateral.iter().enumerate() {
        add_file(
            &mut trust,
            "--tdx-collateral",
            format!("tdx-collateral-{i}.json"),
            path,
        )?;
    }
    #[cfg(feature = "insecure-test-attestation")]
    if ak.insecure_any_ak {
        trust.args.push("--insecure-any-ak".to_owned());
    }
    if trust.args.is_empty() {
        bail!("no attestation-key trust policy to hand to the join service");
    }
    Ok(trust)
}

/// The workspace files of `deployment`: `manifests/<file>`, YAML.
pub fn manifest_files(deployment: &Deployment) -> Result<Vec<(String, Vec<u8>)>> {
    deployment
        .manifests
        .iter()
        .map(|m| {
            Ok((
                format!("{MANIFESTS_DIR}/{}", m.file),
                m.to_yaml()?.into_bytes(),
            ))
        })
        .collect()
}

/// What a bring-up creates: the spec and the objects built from it (no secret: the key
/// service's values are handed to [`run`] separately).
pub struct Plan {
    /// What the objects are built from.
    pub spec: DeploymentSpec,
    /// The objects.
    pub deployment: Deployment,
}

impl Plan {
    /// The deployment of `spec`.
    pub fn new(spec: DeploymentSpec) -> Result<Self> {
        let deployment = asterism_kube_api::deployment(&spec)?;
        Ok(Self { spec, deployment })
    }
}

/// Creates `plan`'s objects in the cluster of the admin kubeconfig `kubeconfig`, the key
/// service's Secret with `secret`, and waits for the join service; progress goes to `out`.
pub async fn run(
    args: &Args,
    kubeconfig: &Path,
    plan: &Plan,
    secret: &KeyServiceSecret,
    out: &mut (dyn Write + Send),
) -> Result<()> {
    let deadline = Duration::from_secs(args.bring_up_timeout_secs);
    let started = Instant::now();
    let remaining = || deadline.saturating_sub(started.elapsed());
    let api = ClusterApi::from_kubeconfig(kubeconfig, ApiOptions::default()).await?;
    writeln!(out, "▸ bring-up: waiting for the API server")?;
    api.wait_until_ready(WaitPolicy {
        interval: Duration::from_secs(2),
        deadline: remaining(),
    })
    .await
    .context(
        "the API server did not answer; if the node runs no Kubernetes (the `none` driver), \
         initialise with --skip-bring-up",
    )?;
    let applied = api
        .apply_deployment(&plan.spec, &plan.deployment, secret)
        .await?;
    for object in &applied {
        writeln!(out, "  applied {object}")?;
    }
    writeln!(out, "▸ bring-up: waiting for the join service's pods")?;
    let mut progress = |s: &asterism_kube_api::RolloutStatus| {
        let _ = writeln!(out, "  {JOIN_SERVICE}: {s}");
    };
    let status = api
        .wait_for_daemon_set(
            JOIN_SERVICE,
            WaitPolicy {
                interval: Duration::from_secs(2),
                deadline: remaining(),
            },
            &mut progress,
        )
        .await?;
    writeln!(
        out,
        "▸ the join service is ready on {} control-plane node(s): nodes can join (port {JOIN_SERVICE_PORT})",
        status.ready
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn the_join_service_trusts_what_the_cli_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let trust = join_service_trust(&AkTrustArgs::platform_ca(&ca)).unwrap();
        assert_eq!(trust.args, ["--platform-ca=/var/trust/platform-ca.pem"]);
        assert_eq!(trust.files.keys().collect::<Vec<_>>(), ["platform-ca.pem"]);

        let pinned = AkTrustArgs {
            platform_ca: None,
            pinned_ak: vec!["ab".repeat(32)],
            ..AkTrustArgs::platform_ca(&ca)
        };
        let trust = join_service_trust(&pinned).unwrap();
        assert_eq!(trust.args, [format!("--pinned-ak={}", "ab".repeat(32))]);
        assert!(trust.files.is_empty());
    }

    #[test]
    fn the_join_service_gets_the_launch_measurement_relaxation_the_cli_was_given() {
        let cvm = AkTrustArgs {
            confidential_vm: Some(asterism_attestation::tpm::CvmPlatform::AwsSevSnp),
            ..AkTrustArgs::default()
        };
        let trust = join_service_trust(&cvm).unwrap();
        assert_eq!(trust.args, ["--confidential-vm=aws-sev-snp"]);
        let insecure = AkTrustArgs {
            insecure_no_launch_measurement: true,
            ..cvm
        };
        let trust = join_service_trust(&insecure).unwrap();
        assert_eq!(
            trust.args,
            [
                "--confidential-vm=aws-sev-snp",
                "--insecure-no-launch-measurement"
            ]
        );
    }

    #[test]
    fn a_cloud_root_is_refused_rather_than_dropped() {
        let cloud = AkTrustArgs::cloud_ak(vec!["/root.cer".into()], Vec::new());
        let e = join_service_trust(&cloud).unwrap_err().to_string();
        assert!(e.contains("--cloud-ak-root"), "{e}");
    }

    #[test]
    fn skipping_says_why() {
        let a = Args::skipped("no Kubernetes");
        assert_eq!(a.skip().as_deref(), Some("no Kubernetes"));
        let mut b = Args::skipped("x");
        b.skip_reason = None;
        assert_eq!(b.skip().as_deref(), Some("--skip-bring-up"));
        b.skip_bring_up = false;
        assert_eq!(b.skip(), None);
    }

    #[test]
    fn a_roster_is_checked_then_shipped_with_the_join_service_and_other_urls_go_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roster.json");
        let good = r#"{"instances":[{"Name":"cp-0","Role":"ControlPlane","VPCIP":"10.0.0.2"}]}"#;
        std::fs::write(&path, good).unwrap();
        let mut trust = JoinServiceTrust::default();
        let url = deployed_metadata_url(Some(format!("file:{}", path.display())), &mut trust)
            .unwrap()
            .unwrap();
        assert_eq!(url, "file:/var/trust/roster.json");
        assert_eq!(trust.files[ROSTER_FILE], good);

        // Two instances at one address: refused here, before anything is deployed.
        std::fs::write(
            &path,
            r#"{"instances":[{"Name":"a","VPCIP":"10.0.0.2"},{"Name":"b","VPCIP":"10.0.0.2"}]}"#,
        )
        .unwrap();
        let mut trust = JoinServiceTrust::default();
        let err = deployed_metadata_url(Some(format!("file:{}", path.display())), &mut trust)
            .unwrap_err();
        assert!(format!("{err:#}").contains("10.0.0.2"), "{err:#}");
        assert!(trust.files.is_empty());

        let gce = Some("gce://p/c".to_owned());
        assert_eq!(deployed_metadata_url(gce.clone(), &mut trust).unwrap(), gce);
        assert!(trust.files.is_empty());
    }

    #[test]
    fn the_bring_up_needs_the_join_services_metadata_url() {
        let mut args = Args::skipped("test");
        assert_eq!(
            args.metadata_url().unwrap(),
            None,
            "not needed when skipped"
        );
        args.skip_reason = None;
        args.skip_bring_up = false;
        let err = args.metadata_url().unwrap_err().to_string();
        assert!(err.contains("--metadata-url"), "{err}");
        args.metadata_url = Some("10.0.0.254:8080".into());
        assert!(args.metadata_url().is_err(), "a URL, with its scheme");
        args.metadata_url = Some("https://10.0.0.254:8080".into());
        assert!(args.metadata_url().is_err(), "the service is plain HTTP");
        args.metadata_url = Some("gce://My-Project/prod".into());
        assert!(
            args.metadata_url().is_err(),
            "checked as the service checks it"
        );
        for url in [
            "http://10.0.0.254:8080",
            "gce://my-project/prod",
            "file:roster.json",
        ] {
            args.metadata_url = Some(url.into());
            assert_eq!(args.metadata_url().unwrap().as_deref(), Some(url));
        }
    }
}
