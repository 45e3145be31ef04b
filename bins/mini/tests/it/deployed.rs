//! What `asterism init` deploys runs as it is deployed: every container of every DaemonSet
//! the bring-up applies is started as a local process of the workspace's own program, with
//! its exact command line, environment and mounted files; then a worker that verifies the
//! join service (the default) joins through the deployed join service.
//!
//! The objects are the bring-up's own. The CLI decides the deployment of a real `asterism
//! init` (`asterism::init::deployment_spec`), the bring-up's apply
//! (`ClusterApi::apply_deployment`) sends it to the recording API server, and the harness
//! reads every object back from the requests that server received: the DaemonSets, the
//! ConfigMaps, the ServiceAccounts and the key service's Secret with its data.
//!
//! Each volume becomes a directory: a ConfigMap or a Secret its keys as files (with the
//! volume's mode), an emptyDir a new directory, a hostPath the node's directory (below). An
//! absolute path in a command, an argument, an environment value or an exec probe must lie
//! under a mount of the container (it is rewritten to the volume's directory) or be the
//! image's own (`/bin/sh`, and the one program the service's Containerfile copies into
//! `/usr/local/bin`, its `ENTRYPOINT`); any other path fails the test before anything
//! starts. The environment's values from ConfigMaps and Secrets (`configMapKeyRef`,
//! `secretKeyRef`, `envFrom`) are the deployment's own. `$(VAR)` is expanded as the kubelet
//! expands it. A container is up when its readiness probe passes; a program that exits
//! first (a flag it refuses, a file it cannot read) fails the test with its output.
//!
//! What cannot be the real thing here, and what stands for it (nothing else is changed):
//!
//! | in the manifests | here | why |
//! | --- | --- | --- |
//! | the TPM `device:/dev/tpmrm0` | the node's swtpm (its TCTI) | no TPM device here |
//! | the host network: `0.0.0.0`, `127.0.0.1`, `status.hostIP` | the node's address `127.0.<net>.1` | a local cluster's node is one loopback address |
//! | hostPath `/run/…` | the node's directory | the bootstrapper's node directory is `/run` on a node booted from the image (`scripts/node-image/args`; a test holds the two together) |
//! | hostPath `/etc/kubernetes/pki` | the node directory's `state/kubernetes/pki` | kubeadm's directory; the `none` driver keeps the cluster CA there |
//! | the service account's token (kube-rs reads it at the fixed `/var/run/secrets/kubernetes.io/serviceaccount`) and `KUBERNETES_SERVICE_HOST`/`_PORT` | `--kubeconfig` naming the recording API server, added for a pod whose service account mounts a token | no API server here, and no process can be given that fixed path without a mount namespace |
//! | the image's `/bin/sh` and `PATH` | the host's `/bin/sh`; `PATH` a directory holding only the image's program, then the host's `/usr/sbin:/usr/bin:/sbin:/bin` | no container runtime here |

use crate::common::{Teardown, bins, cryptsetup_opens};
use asterism::bring_up::{self, Plan};
use asterism_cluster::NodeDir;
use asterism_kube_api::{DeploymentSpec, Images, JoinServiceTrust, KeyServiceSecret};
use asterism_mini::{LocalCluster, Node};
use asterism_testkit::kube_api::paths::{CONFIG_MAPS, SECRETS};
use asterism_testkit::kube_api::{RecordingServer, Reply};
use asterism_testkit::process::Process;
use base64::Engine as _;
use serde_json::Value;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// This module's loopback network, `127.0.47.0/24` (no other test uses it).
const NET: u8 = 47;
/// How long a container may take to pass its readiness probe.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// The TPM the manifests name: the node's device.
const TPM_DEVICE: &str = "device:/dev/tpmrm0";
/// The bootstrapper's node directory on a node booted from the image, which the manifests'
/// host paths assume (`scripts/node-image/args`).
const NODE_DIR_ON_A_NODE: &str = "/run";

/// The node the pods run on, as this machine provides it.
struct Host {
    /// Its address (the host network's `0.0.0.0`, `127.0.0.1`, `status.hostIP`).
    ip: String,
    /// Its TPM (for `device:/dev/tpmrm0`).
    tcti: String,
    /// Host path → the directory that stands for it, longest first.
    dirs: Vec<(String, PathBuf)>,
    /// The service account's credentials: a kubeconfig of the recording API server.
    kubeconfig: PathBuf,
    /// Where the workspace's programs are.
    bins: PathBuf,
    /// Where volumes, images and working directories are made.
    scratch: PathBuf,
}

impl Host {
    fn new(ip: &str, tcti: &str, node_dir: &Path, kubeconfig: &Path, scratch: &Path) -> Self {
        Self {
            ip: ip.to_owned(),
            tcti: tcti.to_owned(),
            dirs: vec![
                (
                    "/etc/kubernetes/pki".to_owned(),
                    NodeDir::new(node_dir).kubernetes_pki(),
                ),
                (NODE_DIR_ON_A_NODE.to_owned(), node_dir.to_path_buf()),
            ],
            kubeconfig: kubeconfig.to_path_buf(),
            bins: bins(),
            scratch: scratch.to_path_buf(),
        }
    }

    /// The directory that stands for the node's `path`.
    fn dir(&self, path: &str) -> Result<PathBuf, String> {
        self.dirs
            .iter()
            .find_map(|(host, local)| under(path, host).map(|rest| local.join(rest)))
            .ok_or_else(|| format!("no directory of this node stands for hostPath {path}"))
    }
}

/// `path` relative to `dir` if it is `dir` or lies below it.
fn under<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(dir.trim_end_matches('/'))?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

/// A service's image, from its Containerfile: its entry point and its one program.
struct Image {
    entrypoint: Vec<String>,
    /// `/usr/local/bin/<program>`.
    program: String,
    /// A directory holding only that program (the image's `/usr/local/bin`).
    bin_dir: PathBuf,
}

impl Image {
    /// The image `reference` (`<repository>/<service>:<tag>`) as its Containerfile builds it.
    fn of(reference: &str, host: &Host) -> Result<Self, String> {
        let service = reference
            .rsplit('/')
            .next()
            .and_then(|s| s.split(':').next())
            .ok_or_else(|| format!("image {reference}: no service name"))?;
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/containers")
            .join(service)
            .join("Containerfile");
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("image {reference}: {}: {e}", file.display()))?;
        let entrypoint: Vec<String> = text
            .lines()
            .find_map(|l| l.strip_prefix("ENTRYPOINT "))
            .and_then(|e| serde_json::from_str(e).ok())
            .ok_or_else(|| format!("{}: no ENTRYPOINT [..]", file.display()))?;
        let program = text
            .lines()
            .filter(|l| l.starts_with("COPY "))
            .filter_map(|l| l.split_whitespace().last())
            .find(|dest| dest.starts_with("/usr/local/bin/"))
            .ok_or_else(|| format!("{}: copies no program to /usr/local/bin", file.display()))?
            .to_owned();
        let name = program.trim_start_matches("/usr/local/bin/");
        let bin_dir = host.scratch.join("images").join(service);
        if !bin_dir.exists() {
            std::fs::create_dir_all(&bin_dir).unwrap();
            let built = host.bins.join(name);
            if !built.is_file() {
                return Err(format!(
                    "{} is missing: build the workspace's programs first (cargo build --workspace)",
                    built.display()
                ));
            }
            std::os::unix::fs::symlink(&built, bin_dir.join(name)).unwrap();
        }
        Ok(Self {
            entrypoint,
            program,
            bin_dir,
        })
    }

    fn path_var(&self) -> String {
        format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.bin_dir.display())
    }
}

/// The objects the API server received, in order.
struct Applied(Vec<Value>);

impl Applied {
    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.0
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    fn daemon_sets(&self) -> impl Iterator<Item = &Value> {
        self.0.iter().filter(|o| o["kind"] == "DaemonSet")
    }

    fn daemon_set_mut(&mut self, name: &str) -> &mut Value {
        self.0
            .iter_mut()
            .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == name)
            .unwrap()
    }
}

/// Applies `plan` with `secret` to `server` as the bring-up does, and returns every object
/// as the server received it.
async fn apply(
    server: &RecordingServer,
    plan: &Plan,
    secret: &KeyServiceSecret,
    dir: &Path,
) -> Applied {
    server.route_new_join_config();
    for object in plan.deployment.objects() {
        server.echo("PATCH", &object.api_path());
    }
    let api = server.api(dir).await;
    api.apply_deployment(&plan.spec, &plan.deployment, secret)
        .await
        .unwrap();
    Applied(server.writes().into_iter().map(|w| w.body).collect())
}

/// A volume's key → file contents of a ConfigMap's or Secret's `data` (base64 for a
/// Secret) and `binaryData`.
fn files_of(object: &Value, data_is_base64: bool) -> Result<Vec<(String, Vec<u8>)>, String> {
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .map_err(|e| format!("undecodable data: {e}"))
    };
    let mut files = Vec::new();
    for (key, value) in object["data"].as_object().into_iter().flatten() {
        let bytes = if data_is_base64 {
            b64(value)?
        } else {
            value.as_str().unwrap_or_default().as_bytes().to_vec()
        };
        files.push((key.clone(), bytes));
    }
    for (key, value) in object["binaryData"].as_object().into_iter().flatten() {
        files.push((key.clone(), b64(value)?));
    }
    Ok(files)
}

/// Makes the directory of volume `volume` of pod `pod`.
fn volume_dir(
    volume: &Value,
    pod: &str,
    applied: &Applied,
    host: &Host,
) -> Result<PathBuf, String> {
    let name = volume["name"].as_str().unwrap_or_default();
    let made = host
        .scratch
        .join("pods")
        .join(pod)
        .join("volumes")
        .join(name);
    let write_files = |files: Vec<(String, Vec<u8>)>, mode: u32| {
        std::fs::create_dir_all(&made).unwrap();
        for (key, bytes) in files {
            let path = made.join(&key);
            // A file of an earlier run of the same pod may be read-only.
            let _ = std::fs::remove_file(&path);
            std::fs::write(&path, bytes).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    };
    let mode = |source: &Value| {
        source["defaultMode"]
            .as_u64()
            .map_or(0o644, |m| u32::try_from(m).unwrap())
    };
    if let Some(source) = volume.get("hostPath") {
        let path = source["path"].as_str().unwrap_or_default();
        let dir = host.dir(path)?;
        match source["type"].as_str().unwrap_or_default() {
            "DirectoryOrCreate" => std::fs::create_dir_all(&dir).unwrap(),
            "Directory" if dir.is_dir() => {}
            "Directory" => {
                return Err(format!(
                    "{pod}: volume {name}: hostPath {path} of type Directory does not exist on the node"
                ));
            }
            other => return Err(format!("{pod}: volume {name}: hostPath type {other:?}")),
        }
        Ok(dir)
    } else if let Some(source) = volume.get("configMap") {
        let cm = source["name"].as_str().unwrap_or_default();
        let object = applied.find("ConfigMap", cm).ok_or_else(|| {
            format!("{pod}: volume {name}: the deployment creates no ConfigMap {cm}")
        })?;
        if source.get("items").is_some() {
            return Err(format!("{pod}: volume {name}: items are not mapped here"));
        }
        write_files(files_of(object, false)?, mode(source));
        Ok(made)
    } else if let Some(source) = volume.get("secret") {
        let secret = source["secretName"].as_str().unwrap_or_default();
        let object = applied.find("Secret", secret).ok_or_else(|| {
            format!("{pod}: volume {name}: the deployment creates no Secret {secret}")
        })?;
        if source.get("items").is_some() {
            return Err(format!("{pod}: volume {name}: items are not mapped here"));
        }
        write_files(files_of(object, true)?, mode(source));
        Ok(made)
    } else if volume.get("emptyDir").is_some() {
        std::fs::create_dir_all(&made).unwrap();
        Ok(made)
    } else {
        Err(format!(
            "{pod}: volume {name}: a kind of volume not mapped here: {volume}"
        ))
    }
}

/// A variable of a container's environment, as the manifest gives it.
struct EnvVar {
    name: String,
    value: String,
    /// Whether it comes from a Secret (handed on as it is, never printed).
    secret: bool,
}

impl EnvVar {
    fn new(name: String, value: String, secret: bool) -> Self {
        Self {
            name,
            value,
            secret,
        }
    }
}

/// Sets `var` in `env`, replacing a variable of the same name.
fn set_var(env: &mut Vec<EnvVar>, var: EnvVar) {
    env.retain(|v| v.name != var.name);
    env.push(var);
}

fn pairs(env: &[EnvVar]) -> Vec<(String, String)> {
    env.iter()
        .map(|v| (v.name.clone(), v.value.clone()))
        .collect()
}

/// The keys and values (as text) of the ConfigMap or Secret `reference` names.
fn data_of(
    applied: &Applied,
    kind: &str,
    reference: &Value,
    container: &str,
) -> Result<Vec<(String, String)>, String> {
    let name = reference["name"].as_str().unwrap_or_default();
    let object = applied
        .find(kind, name)
        .ok_or_else(|| format!("{container}: the deployment creates no {kind} {name}"))?;
    files_of(object, kind == "Secret")?
        .into_iter()
        .map(|(key, bytes)| {
            String::from_utf8(bytes)
                .map(|text| (key.clone(), text))
                .map_err(|_| format!("{container}: {kind} {name}: {key} is not text"))
        })
        .collect()
}

/// Expands `$(VAR)` with `env` as the kubelet does: a defined variable is replaced, `$$`
/// is one `$`, anything else stays as written.
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
            && let Some((_, value)) = env.iter().find(|(k, _)| k == &inner[..close])
        {
            out.push_str(value);
            rest = &inner[close + 1..];
            continue;
        }
        out.push('$');
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The rewriting of one container's strings: its mounts, its image, the node.
struct Rewrite<'a> {
    container: &'a str,
    /// Mount path → the volume's directory, longest first.
    mounts: Vec<(String, PathBuf)>,
    image: &'a Image,
    host: &'a Host,
}

impl Rewrite<'_> {
    /// `s` with the node's TPM, the node's address and every path mapped, in one pass over
    /// the manifest's text (so a substitution is never substituted again).
    fn apply(&self, what: &str, s: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut i = 0;
        while i < s.len() {
            let rest = &s[i..];
            let prev = s[..i].chars().next_back();
            if let Some(tail) = rest.strip_prefix(TPM_DEVICE) {
                out.push_str(&self.host.tcti);
                i = s.len() - tail.len();
                continue;
            }
            let addr_char = |c: char| c.is_ascii_digit() || c == '.';
            if let Some(ip) = ["0.0.0.0", "127.0.0.1"].into_iter().find(|ip| {
                rest.starts_with(ip)
                    && !prev.is_some_and(addr_char)
                    && !rest[ip.len()..].starts_with(addr_char)
            }) {
                out.push_str(&self.host.ip);
                i += ip.len();
                continue;
            }
            if rest.starts_with('/')
                && !rest[1..].starts_with('/')
                && prev.is_none_or(|c| " =:\"',".contains(c))
            {
                let end = rest
                    .find(|c: char| " ;\"',)\n".contains(c))
                    .unwrap_or(rest.len());
                out.push_str(&self.path(what, &rest[..end])?);
                i += end;
                continue;
            }
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
        Ok(out)
    }

    /// Where `path` of the container is here: under a mount, or the image's own.
    fn path(&self, what: &str, path: &str) -> Result<String, String> {
        if let Some(local) = self
            .mounts
            .iter()
            .find_map(|(mount, dir)| under(path, mount).map(|rest| dir.join(rest)))
        {
            return Ok(local.display().to_string());
        }
        if path == "/bin/sh" {
            return Ok(path.to_owned());
        }
        if path == self.image.program {
            let name = path.trim_start_matches("/usr/local/bin/");
            return Ok(self.image.bin_dir.join(name).display().to_string());
        }
        let mounts: Vec<&str> = self.mounts.iter().map(|(m, _)| m.as_str()).collect();
        Err(format!(
            "{}: {what} names {path}, which no volume provides (mounts: {mounts:?}) and the image does not hold",
            self.container
        ))
    }
}

/// A container started as a process.
struct Pod {
    name: String,
    process: Process,
}

/// What one container runs: its program, arguments, environment, working directory and
/// readiness probe, all rewritten. Fails on anything not mapped, before anything starts.
struct Prepared {
    name: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    workdir: PathBuf,
    probe: Option<Probe>,
}

enum Probe {
    Exec(Vec<String>),
    Http { addr: String, path: String },
    Tcp(String),
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Prepares every container of DaemonSet `ds`.
fn prepare(ds: &Value, applied: &Applied, host: &Host) -> Result<Vec<Prepared>, String> {
    let pod_name = ds["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let pod = &ds["spec"]["template"]["spec"];
    if pod["hostNetwork"] != true {
        return Err(format!(
            "{pod_name}: not on the host network; the node's address stands only for the host's"
        ));
    }
    let mut volumes = Vec::new();
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let name = volume["name"].as_str().unwrap_or_default().to_owned();
        volumes.push((name, volume_dir(volume, &pod_name, applied, host)?));
    }
    // The service account's token, if the pod gets one.
    let account = pod["serviceAccountName"].as_str().unwrap_or("default");
    let token = pod["automountServiceAccountToken"] != false
        && applied
            .find("ServiceAccount", account)
            .is_none_or(|sa| sa["automountServiceAccountToken"] != false);
    let mut prepared = Vec::new();
    for container in pod["containers"].as_array().into_iter().flatten() {
        let name = container["name"].as_str().unwrap_or_default().to_owned();
        let image = Image::of(container["image"].as_str().unwrap_or_default(), host)?;
        let mut mounts = Vec::new();
        for m in container["volumeMounts"].as_array().into_iter().flatten() {
            if m.get("subPath").is_some() {
                return Err(format!("{name}: subPath mounts are not mapped here"));
            }
            let volume = m["name"].as_str().unwrap_or_default();
            let dir = volumes
                .iter()
                .find(|(n, _)| n == volume)
                .map(|(_, d)| d.clone())
                .ok_or_else(|| format!("{name}: mount of an undeclared volume {volume}"))?;
            mounts.push((m["mountPath"].as_str().unwrap_or_default().to_owned(), dir));
        }
        mounts.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
        let rewrite = Rewrite {
            container: &name,
            mounts,
            image: &image,
            host,
        };
        // The environment as the manifest gives it (envFrom, then env, each later name
        // replacing an earlier one), then as the process gets it. A value from a Secret is
        // handed on as it is: it is data, not the manifest's text, and never printed.
        let mut raw_env: Vec<EnvVar> = Vec::new();
        for source in container["envFrom"].as_array().into_iter().flatten() {
            let (kind, reference) = if let Some(r) = source.get("configMapRef") {
                ("ConfigMap", r)
            } else if let Some(r) = source.get("secretRef") {
                ("Secret", r)
            } else {
                return Err(format!(
                    "{name}: envFrom: a source not mapped here: {source}"
                ));
            };
            let prefix = source["prefix"].as_str().unwrap_or_default();
            for (key, value) in data_of(applied, kind, reference, &name)? {
                let var = EnvVar::new(format!("{prefix}{key}"), value, kind == "Secret");
                set_var(&mut raw_env, var);
            }
        }
        for var in container["env"].as_array().into_iter().flatten() {
            let key = var["name"].as_str().unwrap_or_default().to_owned();
            let from = &var["valueFrom"];
            let value = if let Some(v) = var["value"].as_str() {
                EnvVar::new(key.clone(), expand(v, &pairs(&raw_env)), false)
            } else if let Some(field) = from["fieldRef"]["fieldPath"].as_str() {
                match field {
                    "status.hostIP" | "status.podIP" => {
                        EnvVar::new(key.clone(), host.ip.clone(), false)
                    }
                    _ => {
                        return Err(format!(
                            "{name}: env {key}: field {field} is not mapped here"
                        ));
                    }
                }
            } else if let Some((kind, r)) = from
                .get("configMapKeyRef")
                .map(|r| ("ConfigMap", r))
                .or_else(|| from.get("secretKeyRef").map(|r| ("Secret", r)))
            {
                let wanted = r["key"].as_str().unwrap_or_default();
                let value = data_of(applied, kind, r, &name)?
                    .into_iter()
                    .find_map(|(k, v)| (k == wanted).then_some(v))
                    .ok_or_else(|| {
                        format!(
                            "{name}: env {key}: {kind} {} has no key {wanted}",
                            r["name"]
                        )
                    })?;
                EnvVar::new(key.clone(), value, kind == "Secret")
            } else {
                return Err(format!("{name}: env {key}: a source not mapped here"));
            };
            set_var(&mut raw_env, value);
        }
        let mut env = vec![("PATH".to_owned(), image.path_var())];
        for var in &raw_env {
            let value = if var.secret {
                var.value.clone()
            } else {
                rewrite.apply(&format!("env {}", var.name), &var.value)?
            };
            env.push((var.name.clone(), value));
        }
        let raw_env = pairs(&raw_env);
        // command replaces the image's ENTRYPOINT; args follow either.
        let mut raw = match container.get("command") {
            Some(c) => strings(c),
            None => image.entrypoint.clone(),
        };
        raw.extend(strings(&container["args"]));
        let mut argv = Vec::new();
        for arg in &raw {
            argv.push(rewrite.apply(&format!("`{arg}`"), &expand(arg, &raw_env))?);
        }
        if token {
            argv.push(format!("--kubeconfig={}", host.kubeconfig.display()));
        }
        let probe = &container["readinessProbe"];
        let probe = if let Some(exec) = probe.get("exec") {
            let mut command = Vec::new();
            for arg in strings(&exec["command"]) {
                command.push(rewrite.apply(&format!("probe `{arg}`"), &arg)?);
            }
            Some(Probe::Exec(command))
        } else if let Some(http) = probe.get("httpGet") {
            let ip = rewrite.apply("probe host", http["host"].as_str().unwrap_or("0.0.0.0"))?;
            Some(Probe::Http {
                addr: format!("{ip}:{}", http["port"]),
                path: http["path"].as_str().unwrap_or("/").to_owned(),
            })
        } else {
            probe
                .get("tcpSocket")
                .map(|tcp| Probe::Tcp(format!("{}:{}", host.ip, tcp["port"])))
        };
        let workdir = host.scratch.join("pods").join(&pod_name).join("root");
        std::fs::create_dir_all(&workdir).unwrap();
        prepared.push(Prepared {
            name,
            argv,
            env,
            workdir,
            probe,
        });
    }
    Ok(prepared)
}

/// Whether `probe` passes now.
fn probe_passes(probe: &Probe, env: &[(String, String)], workdir: &Path) -> bool {
    match probe {
        Probe::Exec(command) => asterism_children::status(
            Command::new(&command[0])
                .args(&command[1..])
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .current_dir(workdir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .is_ok_and(|s| s.success()),
        Probe::Http { addr, path } => {
            http_status(addr, path).is_some_and(|s| (200..400).contains(&s))
        }
        Probe::Tcp(addr) => addr
            .parse()
            .ok()
            .and_then(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).ok())
            .is_some(),
    }
}

fn http_status(addr: &str, path: &str) -> Option<u16> {
    let addr = addr.parse().ok()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Starts every container of DaemonSet `ds` and waits until each passes its readiness
/// probe. A container that exits first fails the run, with its output.
fn start(ds: &Value, applied: &Applied, host: &Host) -> Result<Vec<Pod>, String> {
    let mut pods = Vec::new();
    for p in prepare(ds, applied, host)? {
        let mut command = Command::new(&p.argv[0]);
        command
            .args(&p.argv[1..])
            .env_clear()
            .envs(p.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&p.workdir)
            .stdout(Stdio::null());
        let mut process = Process::spawn(&mut command);
        let started = Instant::now();
        loop {
            if process.has_exited() {
                let (status, output) = process.wait(Duration::from_secs(5));
                return Err(format!(
                    "{}: exited ({status}) before it was ready; its output:\n{output}",
                    p.name
                ));
            }
            if p.probe
                .as_ref()
                .is_none_or(|probe| probe_passes(probe, &p.env, &p.workdir))
            {
                break;
            }
            if started.elapsed() > READY_WITHIN {
                return Err(format!(
                    "{}: not ready within {READY_WITHIN:?}; its output:\n{}",
                    p.name,
                    process.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        pods.push(Pod {
            name: p.name,
            process,
        });
    }
    Ok(pods)
}

/// Starts every DaemonSet's containers, in apply order.
fn start_all(applied: &Applied, host: &Host) -> Result<Vec<Pod>, String> {
    let mut pods = Vec::new();
    for ds in applied.daemon_sets() {
        pods.extend(start(ds, applied, host)?);
    }
    Ok(pods)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The workspace's measurement salt (`cluster.json`).
fn measurement_salt(workspace: &Path) -> Vec<u8> {
    let cluster: Value =
        serde_json::from_slice(&std::fs::read(workspace.join("cluster.json")).unwrap()).unwrap();
    hex::decode(cluster["measurementSalt"].as_str().unwrap()).unwrap()
}

/// The cluster state the join service keeps on the API: nothing stored yet, and what it
/// creates is created (the API server's answer to a create is the object).
fn empty_cluster_state(server: &RecordingServer) {
    server
        .on(
            "GET",
            "/api/v1/namespaces",
            [Reply::recorded(200, "namespace-list.json")],
        )
        .on(
            "GET",
            SECRETS,
            [Reply::recorded(200, "secret-list-empty.json")],
        )
        .on(
            "GET",
            CONFIG_MAPS,
            [Reply::recorded(200, "configmap-list-empty.json")],
        )
        .echo("POST", SECRETS)
        .echo("POST", CONFIG_MAPS);
}

#[test]
fn the_node_image_runs_its_bootstrapper_in_the_node_directory_the_manifests_assume() {
    // The host paths mapped here stand for the image's node directory; an image whose
    // bootstrapper keeps its files elsewhere would give the pods empty host directories.
    let args = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/node-image/args"),
    )
    .unwrap();
    let node_dirs: Vec<&str> = args
        .lines()
        .filter_map(|l| l.trim().strip_prefix("--node-dir="))
        .collect();
    assert_eq!(node_dirs, [NODE_DIR_ON_A_NODE]);
}

#[test]
fn the_deployed_services_run_as_deployed_and_admit_a_worker_that_verifies_the_join_service() {
    deployed_services_admit_a_worker(NET, |cluster| format!("http://{}", cluster.metadata_addr));
}

/// With the owner's roster (`asterism init --metadata-url file:…`), the join service reads
/// who a node is and its role from the roster deployed with it, not from the network.
#[test]
fn with_the_owners_roster_the_deployed_join_service_reads_roles_from_it() {
    // A network of its own: the two tests may run at once.
    let applied = deployed_services_admit_a_worker(48, |cluster| {
        format!("file:{}", cluster.dir.join("metadata.json").display())
    });
    let join = applied.find("DaemonSet", "join-service").unwrap();
    let args = strings(&join["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        args.contains(&"--metadata-url=file:/var/trust/roster.json".to_owned()),
        "{args:?}"
    );
    let trust = applied.find("ConfigMap", "join-service-trust").unwrap();
    assert!(
        trust["data"]["roster.json"]
            .as_str()
            .unwrap()
            .contains("worker-0")
    );
}

/// Deploys what `asterism init --metadata-url URL` deploys (URL from the cluster) into a
/// recording API server, runs its containers as processes, and joins a worker through
/// them. Returns what was applied.
fn deployed_services_admit_a_worker(
    net: u8,
    metadata_url: impl FnOnce(&LocalCluster) -> String,
) -> Applied {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let cluster = LocalCluster::create(&tmp.path().join("c"), 1, net, bins()).unwrap();
    let _down = Teardown(&cluster);
    let (_, (_, exit)) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(exit, "ok", "the control plane is initialised");
    let cp: &Node = &cluster.nodes[0];

    // What `asterism init --metadata-url …` deploys, as the API server receives it.
    let mut after = bring_up::Args::skipped("");
    after.skip_reason = None;
    after.skip_bring_up = false;
    after.metadata_url = Some(metadata_url(&cluster));
    let init = cluster.init_args();
    let spec = asterism::init::deployment_spec(
        &init,
        &after,
        &init.trust.load_measurements().unwrap(),
        &measurement_salt(&cluster.workspace),
    )
    .unwrap();
    let plan = Plan::new(spec).unwrap();
    let kms = asterism::recover::read_master_secret(&cluster.workspace.join("master-secret.json"))
        .unwrap();
    let secret = KeyServiceSecret::new(
        kms.master_secret().expose_secret(),
        kms.salt().expose_secret(),
    )
    .unwrap();
    let server = rt.block_on(RecordingServer::start());
    let api_dir = tmp.path().join("api");
    std::fs::create_dir_all(&api_dir).unwrap();
    let applied = rt.block_on(apply(&server, &plan, &secret, &api_dir));
    let names: Vec<&str> = applied
        .daemon_sets()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["key-service", "join-service", "verify-service"]);

    server.clear_requests();
    empty_cluster_state(&server);
    let host = Host::new(
        &cp.ip,
        &cp.tcti,
        &cp.dir,
        &api_dir.join("admin.conf"),
        &tmp.path().join("pods"),
    );
    let mut pods = start_all(&applied, &host).unwrap_or_else(|e| panic!("{e}"));
    let running: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(running, ["key-service", "join-service", "verify-service"]);

    // A worker that verifies the join service (its measurements, the platform CA, this
    // cluster's marker in PCR 15, tickets signed by the control plane) joins through it.
    let worker = &cluster.nodes[1];
    let booting = cluster.start_bootstrapper(worker).unwrap();
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, worker))
        .unwrap();
    let join_log = pods[1].process.stderr();
    assert_eq!(
        exit, "ok",
        "the worker joins; the join service's log:\n{join_log}"
    );
    let log = std::fs::read_to_string(worker.dir.join("log/bootstrapper.log")).unwrap();
    assert!(
        log.contains("the join service must attest as a member of this cluster"),
        "{log}"
    );
    // It checked the deployed join service's evidence (quoted by the control plane's TPM
    // through `--tpm` and `--ak-cert` as deployed) before it asked for anything.
    assert!(
        log.lines().any(|l| l.contains("peer evidence verified")
            && l.contains(&format!("peer=Some({}:30090)", cp.ip))),
        "{log}"
    );
    assert!(
        log.lines().any(
            |l| l.contains("received a join ticket") && l.contains(&format!("{}:30090", cp.ip))
        ),
        "the ticket came from the deployed join service: {log}"
    );
    // `--api-server-host=$(HOST_IP)`: the ticket names the node's API server.
    assert!(log.contains(&format!("{}:6443", cp.ip)), "{log}");

    // Admitted: the join service recorded the worker in the cluster state and minted its
    // bootstrap token, and the worker's disk opens with the key derived for it.
    let writes = server.writes();
    let member = writes
        .iter()
        .find(|w| w.path == CONFIG_MAPS && w.body["metadata"]["name"] == "asterism-member-worker-0")
        .unwrap_or_else(|| panic!("no member record: {writes:?}"));
    assert_eq!(member.body["data"]["role"], "Worker");
    assert!(
        writes
            .iter()
            .any(|w| w.path == SECRETS && w.body["type"] == "bootstrap.kubernetes.io/token")
    );
    let key = cluster.derived_disk_key(worker).unwrap();
    assert!(cryptsetup_opens(worker, key.expose_secret()));
    for pod in &mut pods {
        assert!(!pod.process.has_exited(), "{} still runs", pod.name);
    }
    applied
}

/// The deployment of a spec like the golden files', as the API server receives it, and a
/// node of plain directories (those the DaemonSets need to exist), with no TPM behind it.
fn bare(tmp: &Path, rt: &tokio::runtime::Runtime) -> (Applied, Host) {
    let spec = DeploymentSpec {
        images: Images::from_repository("registry.example/asterism", "v0.1.0"),
        attestation_config: r#"{"measurements":{}}"#.into(),
        measurement_salt: [7; 32],
        trust: JoinServiceTrust {
            args: vec!["--platform-ca=/var/trust/platform-ca.pem".into()],
            files: [(
                "platform-ca.pem".to_owned(),
                "-----BEGIN CERTIFICATE-----\n".to_owned(),
            )]
            .into(),
        },
        metadata_url: Some(format!("http://127.0.{NET}.254:8080")),
    };
    let plan = Plan::new(spec).unwrap();
    let secret = KeyServiceSecret::new(&[1; 32], &[2; 32]).unwrap();
    let server = rt.block_on(RecordingServer::start());
    let applied = rt.block_on(apply(&server, &plan, &secret, tmp));
    let node = tmp.join("node");
    std::fs::create_dir_all(NodeDir::new(&node).kubernetes_pki()).unwrap();
    std::fs::create_dir_all(node.join("attestation")).unwrap();
    let host = Host::new(
        &format!("127.0.{NET}.200"),
        "swtpm:host=127.0.0.1,port=1",
        &node,
        &tmp.join("admin.conf"),
        &tmp.join("pods"),
    );
    (applied, host)
}

fn args_of(ds: &mut Value) -> &mut Vec<Value> {
    ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .unwrap()
}

#[test]
fn a_flag_a_program_does_not_accept_fails_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let (applied, host) = bare(tmp.path(), &rt);
    for name in ["key-service", "join-service", "verify-service"] {
        let mut changed = Applied(applied.0.clone());
        let ds = changed.daemon_set_mut(name);
        args_of(ds).push("--no-such-flag".into());
        let ds = ds.clone();
        let err = match start(&ds, &changed, &host) {
            Ok(_) => panic!("{name} ran with a flag it does not know"),
            Err(e) => e,
        };
        assert!(err.contains(&format!("{name}: exited")), "{err}");
        assert!(
            err.contains("unexpected argument '--no-such-flag'"),
            "the program itself refused the flag: {err}"
        );
    }
}

#[test]
fn a_path_no_volume_provides_fails_the_run_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let (applied, host) = bare(tmp.path(), &rt);

    // The join service without the mount of kubeadm's directory: --pki-dir names a path
    // nothing provides.
    let mut changed = Applied(applied.0.clone());
    let ds = changed.daemon_set_mut("join-service");
    let mounts = ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap();
    mounts.retain(|m| m["name"] != "pki");
    let ds = ds.clone();
    let err = prepare(&ds, &changed, &host).err().unwrap();
    assert!(
        err.contains(
            "`--pki-dir=/etc/kubernetes/pki` names /etc/kubernetes/pki, which no volume provides"
        ),
        "{err}"
    );

    // An argument naming a file outside every volume, in each service.
    for name in ["key-service", "join-service", "verify-service"] {
        let mut changed = Applied(applied.0.clone());
        let ds = changed.daemon_set_mut(name);
        args_of(ds).push("--log-file=/var/log/asterism.log".into());
        let ds = ds.clone();
        let err = prepare(&ds, &changed, &host).err().unwrap();
        assert!(
            err.contains(&format!(
                "{name}: `--log-file=/var/log/asterism.log` names /var/log/asterism.log, which no volume provides"
            )),
            "{err}"
        );
    }
    // Nothing was started: `prepare` runs no program, and the same containers as given
    // prepare without error.
    for ds in applied.daemon_sets() {
        prepare(ds, &applied, &host).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn the_environment_comes_from_the_deployments_own_objects_and_its_paths_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime();
    let (applied, host) = bare(tmp.path(), &rt);
    let with_env = |env: Value, env_from: Value| {
        let mut changed = Applied(applied.0.clone());
        let ds = changed.daemon_set_mut("join-service");
        let container = &mut ds["spec"]["template"]["spec"]["containers"][0];
        container["env"]
            .as_array_mut()
            .unwrap()
            .extend(env.as_array().unwrap().iter().cloned());
        container["envFrom"] = env_from;
        let ds = ds.clone();
        prepare(&ds, &changed, &host)
    };
    let prepared = with_env(
        serde_json::json!([
            {"name": "SALT", "valueFrom": {"secretKeyRef": {"name": "asterism-mastersecret", "key": "salt"}}},
            {"name": "MEASUREMENTS", "valueFrom": {"configMapKeyRef": {"name": "join-config", "key": "attestationConfig"}}},
            {"name": "ENDPOINT", "value": "$(HOST_IP):6443"},
            {"name": "CONFIG", "value": "/var/config/attestationConfig"},
        ]),
        serde_json::json!([{"configMapRef": {"name": "join-service-trust"}, "prefix": "TRUST_"}]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let env = &prepared[0].env;
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {k}"))
    };
    assert_eq!(get("SALT").as_bytes(), [2; 32], "the Secret's value, whole");
    assert_eq!(get("MEASUREMENTS"), r#"{"measurements":{}}"#);
    assert_eq!(get("ENDPOINT"), format!("127.0.{NET}.200:6443"));
    assert!(get("CONFIG").ends_with("/volumes/join-config/attestationConfig"));
    assert!(get("TRUST_platform-ca.pem").starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(get("KUBERNETES_SERVICE_HOST"), format!("127.0.{NET}.200"));

    // A key the object lacks, an object the deployment does not create, and a path in a
    // value that no volume provides each fail.
    let err = with_env(
        serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "asterism-mastersecret", "key": "nothing"}}}]),
        Value::Null,
    )
    .err()
    .unwrap();
    assert!(err.contains("has no key nothing"), "{err}");
    let err = with_env(
        Value::Array(Vec::new()),
        serde_json::json!([{"secretRef": {"name": "elsewhere"}}]),
    )
    .err()
    .unwrap();
    assert!(
        err.contains("the deployment creates no Secret elsewhere"),
        "{err}"
    );
    let err = with_env(
        serde_json::json!([{"name": "LOG", "value": "/var/log/asterism.log"}]),
        Value::Null,
    )
    .err()
    .unwrap();
    assert!(
        err.contains("env LOG names /var/log/asterism.log, which no volume provides"),
        "{err}"
    );
}
