//! The kubeadm runner: the command sequences of `kubeadm init` and
//! `kubeadm join`, and starting the kubelet on an already-bootstrapped node.
//!
//! Programs run through the narrow [`Commands`] trait; [`ProcessCommands`] runs real
//! processes with a deadline and bounded output capture. Output goes to the log with
//! bootstrap tokens and certificate keys redacted ([`redact`]); a failure becomes a
//! [`KubeadmError`] carrying the exit code and the tail of the output. The standard output of
//! `kubeadm kubeconfig user` (the admin kubeconfig, a secret) is never logged.

use asterism_basics::PathError;
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use asterism_kubernetes_versions::KubernetesVersion;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tracing::{info, warn};
use zeroize::Zeroizing;

/// kubeadm's verbosity: enough to tell from the log which phase failed.
pub const VERBOSITY: &str = "-v=5";
/// The phases `kubeadm init` skips: run before (preflight, certs) or not wanted (CoreDNS
/// comes later from the cluster's own charts).
pub const INIT_SKIP_PHASES: &str = "preflight,certs,addon/coredns";
/// How much of a command's output an error carries.
pub const ERROR_TAIL_BYTES: usize = 4096;

/// A program to run.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The standard output is a secret (never logged, wiped after use).
    pub secret_stdout: bool,
}

impl CommandSpec {
    fn new(program: &Path, args: &[&str]) -> Self {
        Self {
            program: program.to_path_buf(),
            args: args.iter().map(OsString::from).collect(),
            secret_stdout: false,
        }
    }

    fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    /// `program arg…` for logs.
    #[must_use]
    pub fn display(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

impl fmt::Debug for CommandSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display())
    }
}

/// What a finished program left.
pub struct CommandOutput {
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// The standard output (the last `max_output` bytes).
    pub stdout: Zeroizing<Vec<u8>>,
    /// The standard error (the last `max_output` bytes).
    pub stderr: Vec<u8>,
    /// Whether either stream was cut.
    pub truncated: bool,
}

impl fmt::Debug for CommandOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandOutput")
            .field("code", &self.code)
            .field("stdout_len", &self.stdout.len())
            .field("stderr_len", &self.stderr.len())
            .field("truncated", &self.truncated)
            .finish()
    }
}

impl CommandOutput {
    /// Whether the program exited with 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs programs. Production uses [`ProcessCommands`]; the tests use it too, with a
/// recording stand-in program in place of kubeadm and systemctl.
pub trait Commands: Send + Sync {
    /// Runs `cmd` to its end and returns its output.
    fn run<'a>(&'a self, cmd: &'a CommandSpec) -> BoxFuture<'a, io::Result<CommandOutput>>;
}

/// Runs real processes: no standard input, stdout and stderr captured (bounded), killed at
/// the deadline.
#[derive(Debug, Clone)]
pub struct ProcessCommands {
    /// The deadline of one program.
    pub timeout: Duration,
    /// How many bytes of each stream are kept (the last ones).
    pub max_output: usize,
}

impl Default for ProcessCommands {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(15 * 60),
            max_output: 1 << 20,
        }
    }
}

/// Reads a stream to its end, keeping the last `max` bytes.
async fn read_tail<R: AsyncRead + Unpin>(mut r: R, max: usize) -> io::Result<(Vec<u8>, bool)> {
    let mut kept: Vec<u8> = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, truncated));
        }
        kept.extend_from_slice(buf.get(..n).unwrap_or_default());
        if kept.len() > max {
            let cut = kept.len() - max;
            kept.drain(..cut);
            truncated = true;
        }
    }
}

impl Commands for ProcessCommands {
    fn run<'a>(&'a self, cmd: &'a CommandSpec) -> BoxFuture<'a, io::Result<CommandOutput>> {
        Box::pin(async move {
            let mut command = std::process::Command::new(&cmd.program);
            command
                .args(&cmd.args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            asterism_children::inherit_only_stdio(&mut command);
            let mut command = tokio::process::Command::from(command);
            command.kill_on_drop(true);
            // The child inherits only its standard streams: set up above.
            #[allow(clippy::disallowed_methods)]
            let mut child = command.spawn()?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| io::Error::other("no stdout pipe"))?;
            let stderr = child
                .stderr
                .take()
                .ok_or_else(|| io::Error::other("no stderr pipe"))?;
            let max = self.max_output;
            let all = async {
                let (out, err, status) =
                    tokio::join!(read_tail(stdout, max), read_tail(stderr, max), child.wait());
                Ok::<_, io::Error>((out?, err?, status?))
            };
            let ((stdout, t1), (stderr, t2), status) =
                match tokio::time::timeout(self.timeout, all).await {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "{} did not finish within {:?}",
                                cmd.program.display(),
                                self.timeout
                            ),
                        ));
                    }
                };
            Ok(CommandOutput {
                code: status.code(),
                stdout: Zeroizing::new(stdout),
                stderr,
                truncated: t1 || t2,
            })
        })
    }
}

impl<C: Commands + ?Sized> Commands for std::sync::Arc<C> {
    fn run<'a>(&'a self, cmd: &'a CommandSpec) -> BoxFuture<'a, io::Result<CommandOutput>> {
        (**self).run(cmd)
    }
}

/// Replaces bootstrap tokens (`[a-z0-9]{6}.[a-z0-9]{16}`) and the value after
/// `--certificate-key` by `<redacted>`, so kubeadm's output can go to the log (kubeadm init
/// prints a join command with a token).
#[must_use]
pub fn redact(text: &str) -> String {
    let bytes = text.as_bytes();
    let is_tok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut last = 0;
    while i < bytes.len() {
        // A token: 6 token chars, '.', 16 token chars, not inside a longer run.
        let boundary_before = i == 0 || bytes.get(i - 1).is_none_or(|b| !is_tok(*b) && *b != b'.');
        if boundary_before {
            let window = bytes.get(i..i + 23);
            if let Some(w) = window {
                let shape = w
                    .iter()
                    .enumerate()
                    .all(|(k, b)| if k == 6 { *b == b'.' } else { is_tok(*b) });
                let boundary_after = bytes.get(i + 23).is_none_or(|b| !is_tok(*b) && *b != b'.');
                if shape && boundary_after {
                    out.push_str(text.get(last..i).unwrap_or_default());
                    out.push_str("<redacted>");
                    i += 23;
                    last = i;
                    continue;
                }
            }
        }
        i += 1;
    }
    out.push_str(text.get(last..).unwrap_or_default());
    // `--certificate-key <hex>` / `--certificate-key=<hex>`.
    let mut result = String::with_capacity(out.len());
    let mut rest = out.as_str();
    const FLAG: &str = "--certificate-key";
    while let Some(pos) = rest.find(FLAG) {
        let (head, tail) = rest.split_at(pos + FLAG.len());
        result.push_str(head);
        let sep_len = tail.len() - tail.trim_start_matches([' ', '=']).len();
        let (sep, value) = tail.split_at(sep_len);
        result.push_str(sep);
        let end = value
            .find(|c: char| c.is_whitespace())
            .unwrap_or(value.len());
        if end > 0 {
            result.push_str("<redacted>");
        }
        rest = value.get(end..).unwrap_or_default();
    }
    result.push_str(rest);
    result
}

/// The last `max` bytes of `bytes` as (lossy) text, starting at a line when possible.
fn tail(bytes: &[u8], max: usize) -> String {
    let start = bytes.len().saturating_sub(max);
    let mut t = String::from_utf8_lossy(bytes.get(start..).unwrap_or_default()).into_owned();
    if start > 0
        && let Some(nl) = t.find('\n')
    {
        t.drain(..=nl);
    }
    t
}

/// A kubeadm (or systemctl) step failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeadmError {
    /// The program could not be started or did not finish in time.
    #[error("cannot run {command}")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The program exited non-zero (or was killed).
    #[error("{command} failed with exit code {code}: {output_tail}", code = code.map_or_else(|| "none (killed)".to_owned(), |c| c.to_string()))]
    Failed {
        /// The command line.
        command: String,
        /// The exit code; `None` when killed by a signal.
        code: Option<i32>,
        /// The last bytes of its output (secrets redacted).
        output_tail: String,
    },
    /// `kubeadm version -o short` printed something that is not a version.
    #[error("kubeadm printed an unusable version {0:?}")]
    Version(String),
    /// `kubeadm kubeconfig user` printed no kubeconfig, or one too long to keep.
    #[error("kubeadm printed no usable admin kubeconfig")]
    Kubeconfig,
    /// The node's kubelet certificate could not be made.
    #[error("making the node's kubelet certificate")]
    KubeletCert(#[source] asterism_pki::x509::X509Error),
    /// A file step (manifests directory, kubelet certificate) failed.
    #[error(transparent)]
    Io(#[from] PathError),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> KubeadmError + 'a {
    move |source| PathError::at(what, path)(source).into()
}

/// The node's own kubelet certificate, made on the init node from the cluster CA that
/// `kubeadm init phase certs all` created.
#[derive(Debug, Clone)]
pub struct LocalKubeletCert {
    /// The node name (`CN=system:node:<name>`).
    pub node_name: String,
    /// The IP SANs.
    pub ips: Vec<IpAddr>,
    /// Where the certificate goes (0644).
    pub cert_path: PathBuf,
    /// Where the key goes (0600, written first).
    pub key_path: PathBuf,
}

/// What `kubeadm init` needs besides the configuration file.
#[derive(Debug, Clone)]
pub struct InitRun<'a> {
    /// The rendered init configuration.
    pub config: &'a Path,
    /// The cluster name: the admin's client name is `<cluster name>-admin`.
    pub cluster_name: &'a str,
    /// Keep kube-proxy (conformance mode); otherwise its addon phase is skipped.
    pub conformance_mode: bool,
    /// kubeadm's certificate directory (`/etc/kubernetes/pki`), where the CA is.
    pub certificates_dir: &'a Path,
    /// The static pod manifests directory, emptied before init.
    pub manifests_dir: &'a Path,
    /// The node's kubelet certificate.
    pub kubelet: &'a LocalKubeletCert,
}

/// Runs kubeadm.
#[derive(Debug, Clone)]
pub struct Kubeadm<C> {
    binary: PathBuf,
    commands: C,
}

impl<C: Commands> Kubeadm<C> {
    /// kubeadm at `binary` (`/run/state/bin/kubeadm` on a node), run through `commands`.
    pub fn new(binary: impl Into<PathBuf>, commands: C) -> Self {
        Self {
            binary: binary.into(),
            commands,
        }
    }

    /// The kubeadm binary.
    #[must_use]
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The command runner.
    pub fn commands(&self) -> &C {
        &self.commands
    }

    /// Runs `cmd`, logs its (redacted) output, maps a failure to [`KubeadmError::Failed`].
    pub async fn run(&self, cmd: &CommandSpec) -> Result<CommandOutput, KubeadmError> {
        let command = cmd.display();
        info!(command = %command, "running");
        let out = self
            .commands
            .run(cmd)
            .await
            .map_err(|source| KubeadmError::Spawn {
                command: command.clone(),
                source,
            })?;
        let stdout_text = if cmd.secret_stdout {
            format!("<{} bytes, not logged>", out.stdout.len())
        } else {
            redact(&tail(&out.stdout, ERROR_TAIL_BYTES * 4))
        };
        let stderr_text = redact(&tail(&out.stderr, ERROR_TAIL_BYTES * 4));
        if out.success() {
            info!(command = %command, stdout = %stdout_text, stderr = %stderr_text, truncated = out.truncated, "finished");
            Ok(out)
        } else {
            warn!(command = %command, code = ?out.code, stdout = %stdout_text, stderr = %stderr_text, "failed");
            let mut combined = Vec::new();
            if !cmd.secret_stdout {
                combined.extend_from_slice(&out.stdout);
            }
            combined.extend_from_slice(&out.stderr);
            Err(KubeadmError::Failed {
                command,
                code: out.code,
                output_tail: redact(&tail(&combined, ERROR_TAIL_BYTES)),
            })
        }
    }

    /// `kubeadm version -o short`: the installed kubeadm's version (it chooses the join
    /// configuration's API version), a pre-release read as the release it leads to
    /// ([`KubernetesVersion::parse_reported`]).
    pub async fn version(&self) -> Result<KubernetesVersion, KubeadmError> {
        let out = self
            .run(&CommandSpec::new(&self.binary, &["version", "-o", "short"]))
            .await?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        KubernetesVersion::parse_reported(&text).map_err(|_| KubeadmError::Version(text))
    }

    /// The init sequence: preflight, certs, the node's kubelet
    /// certificate, an empty manifests directory, `kubeadm init` without those phases, and
    /// `kubeadm kubeconfig user` whose output is the returned admin kubeconfig.
    pub async fn init(&self, run: &InitRun<'_>) -> Result<Zeroizing<Vec<u8>>, KubeadmError> {
        let config = run.config.as_os_str();
        self.run(
            &CommandSpec::new(
                &self.binary,
                &["init", "phase", "preflight", VERBOSITY, "--config"],
            )
            .arg(config),
        )
        .await?;
        self.run(
            &CommandSpec::new(
                &self.binary,
                &["init", "phase", "certs", "all", VERBOSITY, "--config"],
            )
            .arg(config),
        )
        .await?;
        write_local_kubelet_cert(run.certificates_dir, run.kubelet, SystemTime::now())?;
        reset_manifests(run.manifests_dir)?;
        let mut skip = INIT_SKIP_PHASES.to_owned();
        if !run.conformance_mode {
            skip.push_str(",addon/kube-proxy");
        }
        self.run(
            &CommandSpec::new(&self.binary, &["init", VERBOSITY])
                .arg(format!("--skip-phases={skip}"))
                .arg("--config")
                .arg(config),
        )
        .await?;
        let mut user = CommandSpec::new(&self.binary, &["kubeconfig", "user", "--client-name"])
            .arg(format!("{}-admin", run.cluster_name))
            .arg("--config")
            .arg(config)
            .arg("--org")
            .arg("system:masters");
        user.secret_stdout = true;
        let mut out = self.run(&user).await?;
        if out.truncated || out.stdout.is_empty() {
            return Err(KubeadmError::Kubeconfig);
        }
        info!(
            cluster = run.cluster_name,
            "kubeadm init finished; got the admin kubeconfig"
        );
        Ok(std::mem::take(&mut out.stdout))
    }

    /// The join sequence: an empty manifests directory, then
    /// `kubeadm join -v=5 --config <file>`.
    pub async fn join(&self, config: &Path, manifests_dir: &Path) -> Result<(), KubeadmError> {
        reset_manifests(manifests_dir)?;
        self.run(&CommandSpec::new(&self.binary, &["join", VERBOSITY, "--config"]).arg(config))
            .await?;
        info!("kubeadm join finished");
        Ok(())
    }
}

/// systemd through `systemctl`: enabling and starting the kubelet before
/// kubeadm runs on init and join, and on a reboot of a bootstrapped node.
#[derive(Debug, Clone)]
pub struct Systemd<C> {
    systemctl: PathBuf,
    commands: C,
}

/// The kubelet's unit.
pub const KUBELET_UNIT: &str = "kubelet.service";

impl<C: Commands> Systemd<C> {
    /// `systemctl` at `systemctl`, run through `commands`.
    pub fn new(systemctl: impl Into<PathBuf>, commands: C) -> Self {
        Self {
            systemctl: systemctl.into(),
            commands,
        }
    }

    async fn systemctl(&self, args: &[&str]) -> Result<(), KubeadmError> {
        Kubeadm::new(self.systemctl.clone(), &self.commands)
            .run(&CommandSpec::new(&self.systemctl, args))
            .await
            .map(drop)
    }

    /// `systemctl enable --runtime --force kubelet.service`: until the next boot only, so
    /// after a reboot the kubelet does not start before the bootstrapper has set the node
    /// up again (and enabled it again).
    pub async fn enable_kubelet(&self) -> Result<(), KubeadmError> {
        self.systemctl(&["enable", "--runtime", "--force", KUBELET_UNIT])
            .await
    }

    /// Enables the kubelet and starts it, waiting for the start job.
    pub async fn start_kubelet(&self) -> Result<(), KubeadmError> {
        self.enable_kubelet().await?;
        self.systemctl(&["start", KUBELET_UNIT]).await?;
        info!("started the kubelet");
        Ok(())
    }
}

/// Where the node image's kubelet supervisor (`scripts/node-image/kubelet-service`) looks
/// for the bootstrapper's go-ahead.
pub const SUPERVISOR_ENABLE_FILE: &str = "/run/asterism/kubelet/enabled";

/// How the kubelet runs: systemd's `kubelet.service`, or, on the node image, which has no
/// systemd, the image's own supervisor. The supervisor waits for the file
/// [`KubeletService::Supervisor`] names, then runs the kubelet as kubeadm's unit would
/// (kubeadm's settings files, restarted when it exits or when kubeadm rewrites them).
#[derive(Debug, Clone)]
pub enum KubeletService {
    /// `systemctl` at this path.
    Systemd {
        /// The systemctl program.
        systemctl: PathBuf,
    },
    /// The image's supervisor, enabled by writing this file.
    Supervisor {
        /// The go-ahead file ([`SUPERVISOR_ENABLE_FILE`]).
        enable_file: PathBuf,
    },
}

impl Default for KubeletService {
    fn default() -> Self {
        Self::Systemd {
            systemctl: "systemctl".into(),
        }
    }
}

/// The kubelet's service, with the means to run `systemctl`.
#[derive(Debug, Clone)]
pub enum Kubelet<C> {
    /// systemd's unit.
    Systemd(Systemd<C>),
    /// The image's supervisor: its go-ahead file.
    Supervisor(PathBuf),
}

impl<C: Commands> Kubelet<C> {
    /// The kubelet as `service` says, running `systemctl` (if any) through `commands`.
    pub fn new(service: &KubeletService, commands: C) -> Self {
        match service {
            KubeletService::Systemd { systemctl } => {
                Self::Systemd(Systemd::new(systemctl.clone(), commands))
            }
            KubeletService::Supervisor { enable_file } => Self::Supervisor(enable_file.clone()),
        }
    }

    /// Lets the kubelet run for this boot: systemd's unit is enabled (kubeadm starts it);
    /// the supervisor gets its go-ahead and starts the kubelet once kubeadm has written its
    /// settings, as kubeadm's own start would.
    pub async fn enable(&self) -> Result<(), KubeadmError> {
        match self {
            Self::Systemd(systemd) => systemd.enable_kubelet().await,
            Self::Supervisor(file) => enable_supervisor(file),
        }
    }

    /// Enables the kubelet and starts it (a reboot of a bootstrapped node, whose settings are
    /// there already).
    pub async fn start(&self) -> Result<(), KubeadmError> {
        match self {
            Self::Systemd(systemd) => systemd.start_kubelet().await,
            // The settings are there: the go-ahead is all the supervisor waits for.
            Self::Supervisor(file) => enable_supervisor(file),
        }
    }
}

/// Writes the supervisor's go-ahead file (atomically; it holds nothing secret).
fn enable_supervisor(file: &Path) -> Result<(), KubeadmError> {
    write_atomic(file, b"enabled\n", 0o644)?;
    info!(file = %file.display(), "enabled the kubelet for the image's supervisor");
    Ok(())
}

impl<C: Commands + ?Sized> Commands for &C {
    fn run<'a>(&'a self, cmd: &'a CommandSpec) -> BoxFuture<'a, io::Result<CommandOutput>> {
        (**self).run(cmd)
    }
}

/// `rm -rf <dir> && mkdir -p <dir>` in-process.
fn reset_manifests(dir: &Path) -> Result<(), KubeadmError> {
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("cannot remove", dir)(e)),
    }
    fs::create_dir_all(dir).map_err(io_err("cannot create directory", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
        .map_err(io_err("cannot set the mode of", dir))
}

/// Makes the node's kubelet key and certificate with the CA in `certificates_dir`
/// (`ca.crt`, `ca.key`): the same subject and template the join service uses
/// (`asterism_pki::ClusterCa::sign_kubelet`). The key is written first (0600), then the certificate (0644), each atomically.
pub fn write_local_kubelet_cert(
    certificates_dir: &Path,
    kubelet: &LocalKubeletCert,
    now: SystemTime,
) -> Result<(), KubeadmError> {
    use asterism_pki::x509::{ClusterCa, KubeletCsr, kubelet_key_and_csr};
    let ca_crt = certificates_dir.join("ca.crt");
    let ca_key = certificates_dir.join("ca.key");
    let cert_pem = fs::read_to_string(&ca_crt).map_err(io_err("cannot read", &ca_crt))?;
    let key_pem =
        Zeroizing::new(fs::read_to_string(&ca_key).map_err(io_err("cannot read", &ca_key))?);
    let ca = ClusterCa::from_pem(&cert_pem, &key_pem).map_err(KubeadmError::KubeletCert)?;
    let pair =
        kubelet_key_and_csr(&kubelet.node_name, &kubelet.ips).map_err(KubeadmError::KubeletCert)?;
    let csr = KubeletCsr::parse(&pair.csr_der).map_err(|e| {
        KubeadmError::KubeletCert(asterism_pki::x509::X509Error::Pem {
            what: "kubelet CSR",
            reason: e.to_string(),
        })
    })?;
    let cert = ca
        .sign_kubelet(&csr, now)
        .map_err(KubeadmError::KubeletCert)?;
    write_atomic(
        &kubelet.key_path,
        pair.key_pem.expose_secret().as_bytes(),
        0o600,
    )?;
    write_atomic(&kubelet.cert_path, cert.as_bytes(), 0o644)?;
    info!(node = %kubelet.node_name, cert = %kubelet.cert_path.display(), "wrote the node's kubelet certificate");
    Ok(())
}

/// Writes `bytes` to `path` atomically (temporary file in the same directory, fsync,
/// rename, fsync of the directory) with `mode`; parents are created 0755.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), KubeadmError> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io_err("cannot create directory", dir))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".asterism-")
        .permissions(fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
        .map_err(io_err("cannot create a temporary file in", dir))?;
    tmp.write_all(bytes)
        .and_then(|()| {
            tmp.as_file()
                .set_permissions(fs::Permissions::from_mode(mode))
        })
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(io_err("cannot write", path))?;
    tmp.persist(path)
        .map_err(|e| PathError::at("cannot rename into place", path)(e.error))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("cannot sync", dir))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn redacts_bootstrap_tokens_and_certificate_keys() {
        let text = "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef \\\n --discovery-token-ca-cert-hash sha256:00ff --certificate-key 0a1b2c3d\nnot a token: abcdef.0123456789abcdefg v1.31.0";
        let r = redact(text);
        assert!(!r.contains("abcdef.0123456789abcdef "), "{r}");
        assert!(r.contains("--token <redacted>"), "{r}");
        assert!(r.contains("--certificate-key <redacted>"), "{r}");
        assert!(!r.contains("0a1b2c3d"), "{r}");
        assert!(r.contains("sha256:00ff"), "{r}");
        // A longer run is not a token.
        assert!(r.contains("abcdef.0123456789abcdefg"), "{r}");
        assert_eq!(redact("token=abcdef.0123456789abcdef"), "token=<redacted>");
        assert_eq!(
            redact("--certificate-key=ff00"),
            "--certificate-key=<redacted>"
        );
    }

    #[tokio::test]
    async fn a_command_inherits_no_descriptor_that_a_c_library_left_open() {
        use std::os::fd::AsRawFd as _;
        let (read, _write) = asterism_children::testing::pipe_without_close_on_exec().unwrap();
        let check = asterism_children::testing::is_open(read.as_raw_fd());
        let spec = CommandSpec::new(Path::new("sh"), &["-c", &check]);
        let out = ProcessCommands::default().run(&spec).await.unwrap();
        assert_eq!(out.code, Some(1), "the command inherited the descriptor");
    }

    #[test]
    fn tails_start_at_a_line() {
        assert_eq!(tail(b"one\ntwo\nthree", 7), "three");
        assert_eq!(tail(b"short", 100), "short");
    }
}
