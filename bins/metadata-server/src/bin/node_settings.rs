//! `asterism-node-settings`: reads this node's settings from the one source its platform
//! keeps them in (fw_cfg, SMBIOS OEM strings, a file on the ESP, GCE, Azure or AWS
//! metadata), whole or not at all, and prints them for the image's init: shell assignments
//! (`--format shell`, the init's variable names) or the settings document (`--format
//! json`). The blobs (AK certificate, join-trust CA and measurements) are written as files
//! into `--write-files DIR`, never printed in shell form nor logged.
//!
//! Exit status: 0 settings read, 1 refused or unavailable (the log names the source and
//! the field), 2 usage error.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use asterism_binkit::logging::{self, LogFormat};
use asterism_metadata::node_settings::{
    self, Locations, NodeSettings, Source, document, fw_cfg, smbios,
};
use clap::{Parser, ValueEnum};

/// Reads this node's settings from its platform and prints them.
#[derive(Debug, Parser)]
#[command(name = "asterism-node-settings", version)]
struct Args {
    /// The source: auto (detected from fw_cfg and the DMI identity), fw-cfg, smbios, esp,
    /// gce, azure or aws.
    #[arg(long, value_name = "SOURCE", default_value = "auto")]
    source: String,

    /// fw_cfg's sysfs tree.
    #[arg(long, value_name = "DIR", default_value = fw_cfg::DEFAULT_FW_CFG_ROOT)]
    fw_cfg_root: PathBuf,

    /// The SMBIOS structures in sysfs.
    #[arg(long, value_name = "DIR", default_value = smbios::DEFAULT_DMI_ENTRIES)]
    dmi_entries: PathBuf,

    /// The DMI identity (`sys_vendor`, `product_name`) in sysfs, for `auto`.
    #[arg(long, value_name = "DIR", default_value = node_settings::DEFAULT_DMI_ID)]
    dmi_id: PathBuf,

    /// The settings file on the ESP.
    #[arg(long, value_name = "PATH", default_value = document::DEFAULT_ESP_FILE)]
    esp_file: PathBuf,

    /// The cloud's metadata service (plain http); default: the cloud's documented address.
    #[arg(long, value_name = "URL")]
    metadata_url: Option<String>,

    /// Deadline of each metadata call, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    timeout_ms: u64,

    /// Output: shell assignments or the settings document.
    #[arg(long, value_enum, default_value = "shell")]
    format: Format,

    /// Writes the blobs here (`ak-cert.der`, `join-platform-ca.pem`,
    /// `join-measurements.json`); with `--format shell`, needed when there are blobs.
    #[arg(long, value_name = "DIR")]
    write_files: Option<PathBuf>,

    /// Print the source `--source auto` would read (`fw-cfg`, `smbios`, …) and exit, reading
    /// no settings: the init brings up the network first when it is a cloud's. Exit status
    /// 1 when no source is detected.
    #[arg(long, conflicts_with_all = ["format", "write_files"])]
    detect: bool,

    /// More log output: -v for debug.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Shell,
    Json,
}

/// The files the blobs go to, as the init's bootstrapper arguments name them.
const AK_CERT_FILE: &str = "ak-cert.der";
const PLATFORM_CA_FILE: &str = "join-platform-ca.pem";
const MEASUREMENTS_FILE: &str = "join-measurements.json";

/// Where the sources are, from the arguments.
fn locations(args: &Args) -> Locations {
    Locations {
        fw_cfg_root: args.fw_cfg_root.clone(),
        dmi_entries: args.dmi_entries.clone(),
        dmi_id: args.dmi_id.clone(),
        esp_file: args.esp_file.clone(),
        metadata_url: args.metadata_url.clone(),
        timeout: Duration::from_millis(args.timeout_ms),
    }
}

async fn run(args: &Args) -> anyhow::Result<String> {
    let at = locations(args);
    if args.detect {
        let source = node_settings::detect(&at).ok_or(node_settings::SettingsError::NoSource)?;
        return Ok(format!("{}\n", source.as_str()));
    }
    let source = if args.source == "auto" {
        let source = node_settings::detect(&at).ok_or(node_settings::SettingsError::NoSource)?;
        tracing::info!(%source, "node settings source detected");
        source
    } else {
        args.source.parse::<Source>().map_err(anyhow::Error::msg)?
    };
    let settings = node_settings::read(source, &at).await?;
    // Everything is parsed; only now is anything written.
    let files = match &args.write_files {
        Some(dir) => write_files(dir, &settings)?,
        None => Vec::new(),
    };
    Ok(match args.format {
        Format::Json => {
            let mut doc = document::to_document(&settings);
            if let Some(o) = doc.as_object_mut() {
                o.insert("source".into(), source.as_str().into());
            }
            format!("{doc:#}\n")
        }
        Format::Shell => {
            let has_blobs = settings.join.is_some() || settings.ak_cert.is_some();
            if has_blobs && args.write_files.is_none() {
                anyhow::bail!("the settings carry files: --format shell needs --write-files DIR");
            }
            shell(source, &settings, &files)
        }
    })
}

/// Writes the blobs into `dir`; the shell variable and path of each.
fn write_files(
    dir: &Path,
    settings: &NodeSettings,
) -> anyhow::Result<Vec<(&'static str, PathBuf)>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut blobs: Vec<(&str, &str, &[u8])> = Vec::new();
    if let Some(cert) = &settings.ak_cert {
        blobs.push(("ak_cert_file", AK_CERT_FILE, cert));
    }
    if let Some(join) = &settings.join {
        blobs.push((
            "join_platform_ca_file",
            PLATFORM_CA_FILE,
            join.platform_ca.as_bytes(),
        ));
        blobs.push((
            "join_measurements_file",
            MEASUREMENTS_FILE,
            &join.measurements,
        ));
    }
    let mut written = Vec::new();
    for (var, name, bytes) in blobs {
        let path = dir.join(name);
        asterism_binkit::fs::write_atomic(&path, bytes, 0o644)?;
        written.push((var, path));
    }
    Ok(written)
}

/// Shell assignments with the init's variable names. Every value is of a type whose text
/// has no quote (addresses, host names, hex); paths are quoted all the same.
fn shell(source: Source, s: &NodeSettings, files: &[(&str, PathBuf)]) -> String {
    let mut vars: Vec<(&str, String)> = vec![("settings_source", source.as_str().into())];
    let mut put = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            vars.push((k, v));
        }
    };
    put("ip_addr", s.address.map(|a| a.to_string()));
    put("gw", s.gateway.map(|g| g.to_string()));
    put("node_ip", s.node_ip.map(|a| a.to_string()));
    put("hostname_", s.hostname.as_ref().map(ToString::to_string));
    put("cluster_id", s.join.as_ref().map(|j| j.cluster_id.to_hex()));
    put(
        "control_plane_key",
        s.join.as_ref().map(|j| j.control_plane_key.to_string()),
    );
    for (var, path) in files {
        vars.push((var, path.display().to_string()));
    }
    if s.init_flags.reference {
        vars.push(("reference", "1".into()));
    }
    if s.init_flags.keep_running {
        vars.push(("keep_running", "1".into()));
    }
    vars.iter()
        .map(|(k, v)| format!("{k}='{}'\n", v.replace('\'', r"'\''")))
        .collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let level = if args.verbose > 0 { "debug" } else { "info" };
    logging::init(
        LogFormat::Human,
        &logging::directives(&logging::crate_directives(
            level,
            &["asterism_metadata", "asterism_node_settings"],
        )),
    );
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            if stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(
                error = format!("{e:#}"),
                "node settings refused; nothing applied"
            );
            ExitCode::FAILURE
        }
    }
}
