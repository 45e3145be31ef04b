//! Asterism's gRPC protocols: the .proto files under `proto/` and the prost/tonic code
//! generated from them.
//!
//! Packages, services, message names and field numbers are fixed: existing clients and
//! nodes speak these protocols, so a change must stay wire-compatible (a new field takes a
//! new number, which older peers skip). This crate holds no logic:
//! handlers convert these messages into domain types at the edge.
//!
//! Messages that carry secrets (keys, init secret, KMS URI) have a hand-written `Debug`
//! that redacts them.
#![forbid(unsafe_code)]
#![allow(missing_docs)] // generated code carries the .proto comments, not rustdoc on every item

use std::fmt;

/// Package `components`: downloadable Kubernetes components.
pub mod components {
    tonic::include_proto!("components");
}

/// Package `init`: first-node initialisation (`/init.API/Init`).
pub mod init {
    tonic::include_proto!("init");
}

/// Package `join`: join and rejoin tickets (`/join.API/IssueJoinTicket`, …).
pub mod join {
    tonic::include_proto!("join");
}

/// Package `kms`: the key service (`/kms.API/GetDataKey`).
pub mod kms {
    tonic::include_proto!("kms");
}

/// Package `recoverproto`: manual recovery (`/recoverproto.API/Recover`).
pub mod recover {
    tonic::include_proto!("recoverproto");
}

/// Package `verify`: fresh evidence for `asterism verify`.
pub mod verify {
    tonic::include_proto!("verify");
}

const REDACTED: &str = "<redacted>";

/// Prints a byte field as its length only.
struct Len(usize);

impl fmt::Debug for Len {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

impl fmt::Debug for init::InitRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitRequest")
            .field("kms_uri", &REDACTED)
            .field("storage_uri", &self.storage_uri)
            .field("measurement_salt", &Len(self.measurement_salt.len()))
            .field("kubernetes_version", &self.kubernetes_version)
            .field("conformance_mode", &self.conformance_mode)
            .field("kubernetes_components", &self.kubernetes_components)
            .field("init_secret", &REDACTED)
            .field("cluster_name", &self.cluster_name)
            .field("apiserver_cert_sans", &self.apiserver_cert_sans)
            .field("service_cidr", &self.service_cidr)
            .field(
                "hosted_services",
                &self
                    .hosted_services
                    .as_ref()
                    .map(|h| (Len(h.join_measurements.len()), Len(h.platform_ca.len()))),
            )
            .finish()
    }
}

impl fmt::Debug for join::IssueJoinTicketResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssueJoinTicketResponse")
            .field("state_disk_key", &REDACTED)
            .field("measurement_salt", &Len(self.measurement_salt.len()))
            .field("measurement_secret", &REDACTED)
            .field("kubelet_cert", &Len(self.kubelet_cert.len()))
            .field("api_server_endpoint", &self.api_server_endpoint)
            .field("token", &REDACTED)
            .field(
                "discovery_token_ca_cert_hash",
                &self.discovery_token_ca_cert_hash,
            )
            .field("control_plane_files", &self.control_plane_files)
            .field("kubernetes_version", &self.kubernetes_version)
            .field("kubernetes_components", &self.kubernetes_components)
            .field(
                "authorized_ca_public_key",
                &Len(self.authorized_ca_public_key.len()),
            )
            .field("host_certificate", &Len(self.host_certificate.len()))
            .field(
                "control_plane_signature",
                &Len(self.control_plane_signature.len()),
            )
            .finish()
    }
}

impl fmt::Debug for join::IssueRejoinTicketResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssueRejoinTicketResponse")
            .field("state_disk_key", &REDACTED)
            .field("measurement_secret", &REDACTED)
            .field(
                "control_plane_signature",
                &Len(self.control_plane_signature.len()),
            )
            .finish()
    }
}

impl fmt::Debug for join::ControlPlaneCertOrKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlPlaneCertOrKey")
            .field("name", &self.name)
            .field("data", &REDACTED)
            .finish()
    }
}

impl fmt::Debug for kms::GetDataKeyResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetDataKeyResponse")
            .field("data_key", &REDACTED)
            .finish()
    }
}

impl fmt::Debug for kms::GetControlPlaneIdentityResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetControlPlaneIdentityResponse")
            .field("seed", &REDACTED)
            .finish()
    }
}

impl fmt::Debug for recover::RecoverMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoverMessage")
            .field("kms_uri", &REDACTED)
            .field("storage_uri", &self.storage_uri)
            .field("disk_key", &REDACTED)
            .field("cluster_measurement_secret", &REDACTED)
            .field("disk_uuid", &self.disk_uuid)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn debug_of_secret_messages_is_redacted() {
        let resp = kms::GetDataKeyResponse {
            data_key: b"supersecretkeymaterial".to_vec(),
        };
        let shown = format!("{resp:?}");
        assert!(!shown.contains("115")); // 's' as a decimal byte
        assert!(shown.contains(REDACTED));

        let req = init::InitRequest {
            kms_uri: "kms://cluster-kms?key=SECRET".into(),
            init_secret: b"hunter2".to_vec(),
            ..Default::default()
        };
        let shown = format!("{req:?}");
        assert!(!shown.contains("SECRET"));
        assert!(!shown.contains("104, 117")); // "hu" as decimal bytes
    }

    /// Field numbers decide wire compatibility; pin a few by their encoded tags.
    #[test]
    fn field_numbers_match_the_original_protocol() {
        let req = kms::GetDataKeyRequest {
            data_key_id: "a".into(),
            length: 32,
        };
        // field 1, wire type 2 (0x0a), len 1, 'a'; field 2, varint (0x10), 32
        assert_eq!(req.encode_to_vec(), vec![0x0a, 0x01, b'a', 0x10, 32]);

        let req = init::InitRequest {
            init_secret: vec![7],
            cluster_name: "c".into(),
            service_cidr: "s".into(),
            ..Default::default()
        };
        // init_secret = 8 (0x42), cluster_name = 9 (0x4a), service_cidr = 11 (0x5a)
        assert_eq!(
            req.encode_to_vec(),
            vec![0x42, 1, 7, 0x4a, 1, b'c', 0x5a, 1, b's']
        );
        // hosted_services = 12 (0x62), not in the original: an addition that old peers skip.
        let req = init::InitRequest {
            hosted_services: Some(init::HostedServices {
                join_measurements: vec![1],
                platform_ca: vec![2],
            }),
            ..Default::default()
        };
        assert_eq!(req.encode_to_vec(), vec![0x62, 6, 0x0a, 1, 1, 0x12, 1, 2]);

        let resp = join::IssueJoinTicketResponse {
            host_certificate: vec![1],
            control_plane_files: vec![join::ControlPlaneCertOrKey {
                name: "n".into(),
                data: vec![],
            }],
            ..Default::default()
        };
        // control_plane_files = 8 (0x42) holding name = 1; host_certificate = 12 (0x62)
        assert_eq!(
            resp.encode_to_vec(),
            vec![0x42, 3, 0x0a, 1, b'n', 0x62, 1, 1]
        );

        let msg = recover::RecoverMessage {
            kms_uri: "k".into(),
            storage_uri: "s".into(),
            ..Default::default()
        };
        assert_eq!(msg.encode_to_vec(), vec![0x1a, 1, b'k', 0x22, 1, b's']);
        // Asterism's form: numbers the original never used (5, 6, 7).
        let msg = recover::RecoverMessage {
            disk_key: vec![1],
            cluster_measurement_secret: vec![2],
            disk_uuid: "u".into(),
            ..Default::default()
        };
        assert_eq!(
            msg.encode_to_vec(),
            vec![0x2a, 1, 1, 0x32, 1, 2, 0x3a, 1, b'u']
        );
        assert!(!format!("{msg:?}").contains("[1]"));

        let req = verify::GetAttestationRequest { nonce: vec![9] };
        assert_eq!(req.encode_to_vec(), vec![0x12, 1, 9]);
    }
}
