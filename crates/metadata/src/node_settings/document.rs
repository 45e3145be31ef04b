//! The settings document: one JSON object whose keys are the settings' keys, as a file on
//! the EFI system partition (bare metal) or as a cloud's user data (Azure, AWS).
//!
//! ```json
//! {"node-ip": "10.0.3.7/24", "hostname": "worker-7",
//!  "cluster-id": "<64 hex>", "control-plane-key": "<64 hex>",
//!  "join-platform-ca": "-----BEGIN CERTIFICATE-----\n…", "join-measurements": {…},
//!  "ak-cert": "<base64 DER>"}
//! ```
//!
//! Every value is a string but `join-measurements`, which is the measurements object itself.
//! Unknown keys are refused.

use super::{MAX_BLOB_LEN, NodeSettings, Raw, SettingsError, Source, Value};
use std::path::Path;

/// Largest settings document: the three blobs at their cap, in base64 or JSON, and the rest.
pub const MAX_DOCUMENT_LEN: usize = 4 * MAX_BLOB_LEN;
/// Where the ESP settings file is looked for by default.
pub const DEFAULT_ESP_FILE: &str = "/boot/efi/asterism/node-settings.json";

/// Parses a settings document that `origin` delivered (`what` names it in errors: a path,
/// a URL).
pub fn parse(origin: Source, what: &str, bytes: &[u8]) -> Result<NodeSettings, SettingsError> {
    if bytes.len() > MAX_DOCUMENT_LEN {
        return Err(SettingsError::TooLarge {
            origin,
            what: what.to_owned(),
            cap: MAX_DOCUMENT_LEN,
        });
    }
    let malformed = |reason: String| SettingsError::Malformed {
        origin,
        what: what.to_owned(),
        reason,
    };
    let Pairs(object) =
        serde_json::from_slice(bytes).map_err(|e| malformed(format!("not a JSON object: {e}")))?;
    let mut raw = Raw::new(origin);
    for (key, value) in object {
        let text = match value {
            serde_json::Value::String(text) => text,
            object @ serde_json::Value::Object(_) if key == "join-measurements" => {
                object.to_string()
            }
            _ => {
                return Err(match super::Field::from_key(&key) {
                    Some(field) => SettingsError::Invalid {
                        origin,
                        field,
                        reason: "not a JSON string".into(),
                    },
                    None => super::unknown_key(origin, &key),
                });
            }
        };
        raw.set_key(&key, Value::Text(text))?;
    }
    raw.into_settings()
}

/// A JSON object's members in document order, a repeated key included (a map would keep
/// one of them silently; the settings refuse it).
pub(crate) struct Pairs(pub(crate) Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Pairs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Pairs;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Pairs, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, serde_json::Value>()? {
                    members.push(member);
                }
                Ok(Pairs(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// Reads the ESP settings file at `path` (at most [`MAX_DOCUMENT_LEN`] bytes).
pub fn read_esp(path: &Path) -> Result<NodeSettings, SettingsError> {
    let origin = Source::Esp;
    let bytes = super::fw_cfg::read_file(origin, path, MAX_DOCUMENT_LEN)?.ok_or_else(|| {
        SettingsError::Absent {
            origin,
            what: path.display().to_string(),
        }
    })?;
    parse(origin, &path.display().to_string(), &bytes)
}

/// The document that gives `settings` (the ESP file's form): blobs included.
pub fn to_document(settings: &NodeSettings) -> serde_json::Value {
    use base64::Engine as _;
    let mut o = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        o.insert(k.to_owned(), v);
    };
    if let Some(a) = &settings.address {
        put("ip", a.to_string().into());
    }
    if let Some(g) = &settings.gateway {
        put("gw", g.to_string().into());
    }
    if let Some(a) = &settings.node_ip {
        put("node-ip", a.to_string().into());
    }
    if let Some(h) = &settings.hostname {
        put("hostname", h.as_str().into());
    }
    if let Some(j) = &settings.join {
        put("cluster-id", j.cluster_id.to_hex().into());
        put("control-plane-key", j.control_plane_key.to_string().into());
        put("join-platform-ca", j.platform_ca.clone().into());
        let m = serde_json::from_slice(&j.measurements).unwrap_or(serde_json::Value::Null);
        put("join-measurements", m);
    }
    if let Some(c) = &settings.ak_cert {
        put(
            "ak-cert",
            base64::engine::general_purpose::STANDARD.encode(c).into(),
        );
    }
    serde_json::Value::Object(o)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::super::tests::{CA, CLUSTER_ID, CP_KEY};
    use super::super::{Field, Source};
    use super::*;

    pub(crate) fn document() -> serde_json::Value {
        serde_json::json!({
            "ip": "10.0.2.15/24", "gw": "10.0.2.2", "node-ip": "10.0.3.7/24",
            "hostname": "worker-7", "cluster-id": CLUSTER_ID, "control-plane-key": CP_KEY,
            "join-platform-ca": CA, "join-measurements": {"pcrs": {}}, "ak-cert": "MAMCAQc=",
        })
    }

    #[test]
    fn an_esp_file_gives_every_setting_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node-settings.json");
        std::fs::write(&path, document().to_string()).unwrap();
        let s = read_esp(&path).unwrap();
        assert_eq!(s.hostname.as_ref().unwrap().as_str(), "worker-7");
        assert_eq!(s.join.as_ref().unwrap().measurements, br#"{"pcrs":{}}"#);
        assert_eq!(to_document(&s), document());
    }

    #[test]
    fn a_missing_oversized_or_malformed_esp_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node-settings.json");
        assert!(matches!(read_esp(&path), Err(SettingsError::Absent { .. })));
        std::fs::write(&path, vec![b' '; MAX_DOCUMENT_LEN + 1]).unwrap();
        assert!(matches!(
            read_esp(&path),
            Err(SettingsError::TooLarge { .. })
        ));
        std::fs::write(&path, b"[]").unwrap();
        assert!(matches!(
            read_esp(&path),
            Err(SettingsError::Malformed { .. })
        ));
    }

    #[test]
    fn a_key_repeated_in_the_document_is_refused() {
        let text = format!(r#"{{"cluster-id": "{CLUSTER_ID}", "cluster-id": "{CP_KEY}"}}"#);
        let err = parse(Source::Esp, "f", text.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                SettingsError::Duplicate {
                    field: Field::ClusterId,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_and_values_of_the_wrong_type_are_refused() {
        let mut d = document();
        d["shell"] = "1".into();
        let err = parse(Source::Esp, "f", d.to_string().as_bytes()).unwrap_err();
        assert!(matches!(err, SettingsError::UnknownKey { .. }), "{err}");
        let mut d = document();
        d["hostname"] = 7.into();
        let err = parse(Source::Esp, "f", d.to_string().as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                SettingsError::Invalid {
                    field: Field::Hostname,
                    ..
                }
            ),
            "{err}"
        );
    }
}
