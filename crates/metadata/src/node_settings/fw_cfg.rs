//! QEMU's fw_cfg, as the `qemu_fw_cfg` kernel module shows it in sysfs
//! (`/sys/firmware/qemu_fw_cfg/by_name/<name>/raw`): the node image's layout.
//!
//! * `opt/asterism/params`: space-separated `asterism.<key>=<value>` words, for `ip`,
//!   `gw`, `node-ip`, `hostname`, `cluster-id` and `control-plane-key`; and the init's own
//!   flags `asterism.reference=1` and `asterism.keep-running=1` ([`super::InitFlags`]).
//!   Any other word is refused.
//! * `opt/asterism/ak-cert`: the AK certificate, DER.
//! * `opt/asterism/join-trust/platform-ca` (PEM) and `opt/asterism/join-trust/measurements`
//!   (JSON).
//!
//! QEMU sets them with `-fw_cfg name=opt/asterism/params,string=…` and
//! `-fw_cfg name=opt/asterism/ak-cert,file=…` (QEMU's `docs/specs/fw_cfg.rst`: names under
//! `opt/` are free for users).

use super::{Field, MAX_BLOB_LEN, NodeSettings, Raw, SettingsError, Source, Value};
use std::path::{Path, PathBuf};

/// The sysfs directory of fw_cfg on a Linux guest.
pub const DEFAULT_FW_CFG_ROOT: &str = "/sys/firmware/qemu_fw_cfg";
/// Largest `opt/asterism/params` accepted.
pub const MAX_PARAMS_LEN: usize = 4096;

fn entry(root: &Path, name: &str) -> PathBuf {
    root.join("by_name").join(name).join("raw")
}

/// Reads the node settings from the fw_cfg sysfs tree at `root`
/// ([`DEFAULT_FW_CFG_ROOT`] in a guest). Entries that are not there give no settings; a
/// `root` without `by_name/` is [`SettingsError::Absent`].
pub fn read(root: &Path) -> Result<NodeSettings, SettingsError> {
    let origin = Source::FwCfg;
    if !root.join("by_name").is_dir() {
        return Err(SettingsError::Absent {
            origin,
            what: root.join("by_name").display().to_string(),
        });
    }
    let mut raw = Raw::new(origin);
    let params_path = entry(root, "opt/asterism/params");
    if let Some(params) = read_file(origin, &params_path, MAX_PARAMS_LEN)? {
        let params = String::from_utf8(params).map_err(|_| SettingsError::Malformed {
            origin,
            what: params_path.display().to_string(),
            reason: "not UTF-8 text".into(),
        })?;
        parse_params(&mut raw, &params)?;
    }
    for (name, field) in [
        ("opt/asterism/ak-cert", Field::AkCert),
        ("opt/asterism/join-trust/platform-ca", Field::JoinPlatformCa),
        (
            "opt/asterism/join-trust/measurements",
            Field::JoinMeasurements,
        ),
    ] {
        if let Some(bytes) = read_file(origin, &entry(root, name), MAX_BLOB_LEN)? {
            raw.set(field, Value::Bytes(bytes))?;
        }
    }
    raw.into_settings()
}

/// The words of `opt/asterism/params`.
fn parse_params(raw: &mut Raw, params: &str) -> Result<(), SettingsError> {
    for word in params.split_ascii_whitespace() {
        let Some((key, value)) = word
            .strip_prefix("asterism.")
            .and_then(|kv| kv.split_once('='))
        else {
            return Err(super::unknown_key(Source::FwCfg, word));
        };
        if raw.init_flags.set(Source::FwCfg, key, value)? {
            continue;
        }
        // Only the per-node values travel here; the blobs are files of their own.
        match Field::from_key(key) {
            Some(
                field @ (Field::Ip
                | Field::Gateway
                | Field::NodeIp
                | Field::Hostname
                | Field::ClusterId
                | Field::ControlPlaneKey),
            ) => raw.set(field, Value::Text(value.to_owned()))?,
            _ => return Err(super::unknown_key(Source::FwCfg, key)),
        }
    }
    Ok(())
}

/// Reads `path` whole if it holds at most `cap` bytes: `None` if it does not exist; a
/// larger file is [`SettingsError::TooLarge`], never truncated.
pub(crate) fn read_file(
    origin: Source,
    path: &Path,
    cap: usize,
) -> Result<Option<Vec<u8>>, SettingsError> {
    let read_error = |source| SettingsError::Read {
        origin,
        path: path.to_owned(),
        source,
    };
    let read = match asterism_basics::read_file_capped(path, u64::try_from(cap).unwrap_or(u64::MAX))
    {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_error(e)),
    };
    read.map(Some).ok_or_else(|| SettingsError::TooLarge {
        origin,
        what: path.display().to_string(),
        cap,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::super::tests::{AK_CERT, CA, CLUSTER_ID, CP_KEY, MEASUREMENTS};
    use super::*;
    use std::fs;

    fn put(root: &Path, name: &str, bytes: &[u8]) {
        let path = entry(root, name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    fn full(root: &Path) {
        let params = format!(
            "asterism.ip=10.0.2.15/24 asterism.gw=10.0.2.2 asterism.node-ip=10.0.3.7/24 \
             asterism.hostname=worker-7 asterism.keep-running=1 \
             asterism.cluster-id={CLUSTER_ID} asterism.control-plane-key={CP_KEY}\n"
        );
        put(root, "opt/asterism/params", params.as_bytes());
        put(root, "opt/asterism/ak-cert", AK_CERT);
        put(root, "opt/asterism/join-trust/platform-ca", CA.as_bytes());
        put(
            root,
            "opt/asterism/join-trust/measurements",
            MEASUREMENTS.as_bytes(),
        );
    }

    #[test]
    fn todays_fw_cfg_layout_gives_every_setting() {
        let dir = tempfile::tempdir().unwrap();
        full(dir.path());
        let s = read(dir.path()).unwrap();
        assert_eq!(s.address.unwrap().to_string(), "10.0.2.15/24");
        assert_eq!(s.gateway.unwrap().to_string(), "10.0.2.2");
        assert_eq!(s.node_ip.unwrap().to_string(), "10.0.3.7/24");
        assert_eq!(s.hostname.unwrap().as_str(), "worker-7");
        assert_eq!(s.ak_cert.unwrap(), AK_CERT);
        let join = s.join.unwrap();
        assert_eq!(join.cluster_id.to_hex(), CLUSTER_ID);
        assert_eq!(join.platform_ca, CA);
        assert_eq!(join.measurements, MEASUREMENTS.as_bytes());
        assert_eq!(
            s.init_flags,
            super::super::InitFlags {
                reference: false,
                keep_running: true
            }
        );
    }

    #[test]
    fn an_init_flag_takes_the_value_1_only() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), "opt/asterism/params", b"asterism.reference=1");
        assert!(read(dir.path()).unwrap().init_flags.reference);
        for params in ["asterism.reference=yes", "asterism.keep-running=0"] {
            let dir = tempfile::tempdir().unwrap();
            put(dir.path(), "opt/asterism/params", params.as_bytes());
            let err = read(dir.path()).unwrap_err();
            assert!(
                matches!(err, SettingsError::Malformed { .. }),
                "{params}: {err}"
            );
        }
    }

    #[test]
    fn no_entries_give_empty_settings_and_no_fw_cfg_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            read(dir.path()),
            Err(SettingsError::Absent { .. })
        ));
        fs::create_dir(dir.path().join("by_name")).unwrap();
        assert_eq!(read(dir.path()).unwrap(), NodeSettings::default());
    }

    #[test]
    fn an_unknown_or_repeated_parameter_is_refused() {
        for params in [
            "asterism.shell=1",
            "asterism.args=--insecure",
            "console=ttyS0",
            "asterism.hostname=a asterism.hostname=b",
            "asterism.ak-cert=MAMCAQc=",
        ] {
            let dir = tempfile::tempdir().unwrap();
            put(dir.path(), "opt/asterism/params", params.as_bytes());
            let err = read(dir.path()).unwrap_err();
            assert!(
                matches!(
                    err,
                    SettingsError::UnknownKey { .. } | SettingsError::Duplicate { .. }
                ),
                "{params}: {err}"
            );
        }
    }

    #[test]
    fn an_oversized_blob_is_refused_and_nothing_is_returned() {
        let dir = tempfile::tempdir().unwrap();
        full(dir.path());
        put(
            dir.path(),
            "opt/asterism/join-trust/measurements",
            &vec![b' '; MAX_BLOB_LEN + 1],
        );
        let err = read(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                SettingsError::TooLarge {
                    cap: MAX_BLOB_LEN,
                    ..
                }
            ),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        put(
            dir.path(),
            "opt/asterism/params",
            &vec![b' '; MAX_PARAMS_LEN + 1],
        );
        assert!(matches!(
            read(dir.path()),
            Err(SettingsError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_cluster_id_without_its_join_trust_files_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        full(dir.path());
        fs::remove_file(entry(dir.path(), "opt/asterism/join-trust/platform-ca")).unwrap();
        let err = read(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                SettingsError::Incomplete {
                    missing: Field::JoinPlatformCa,
                    ..
                }
            ),
            "{err}"
        );
    }
}
