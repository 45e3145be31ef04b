//! The TPM 2.0 device for Asterism: attestation key, quotes, PCR read/extend/event and EK
//! certificates, on a hardware TPM (`/dev/tpmrm0`) or an swtpm.
//!
//! * [`TpmConfig`] names the TPM (`device:/dev/tpmrm0`, `swtpm:host=…,port=…`).
//! * [`Tpm::open`] connects; [`Tpm::load_attestation_key`] finds or creates the persistent AK
//!   ([`ak`] documents the templates and handles); [`Tpm::load_nv_template_ak`] makes a
//!   cloud's AK from the template the cloud keeps in NV ([`Tpm::load_gce_ak`] on GCE).
//! * [`Tpm::quote`] returns a [`Quote`]: the TPMS_ATTEST and TPMT_SIGNATURE exactly as the TPM
//!   produced them, plus the quoted SHA-256 PCR values.
//! * [`Tpm::read_pcrs`], [`Tpm::extend_pcr`], [`Tpm::pcr_event`],
//!   [`Tpm::read_ek_certificate`], [`Tpm::read_ek_certificate_chain`], [`Tpm::read_ek_public`]
//!   and [`Tpm::read_nv_index`] do what they say;
//!   [`Tpm::read_hcl_report`] reads an Azure confidential VM's HCL report from its vTPM.
//! * [`Tpm::activate_credential`] answers an enrolment challenge: `TPM2_ActivateCredential`
//!   with the AK and the EK (under the EK's standard policy), proving both are in this TPM.
//! * [`TpmIssuer`] turns quotes into `tpm-quote` evidence for attested TLS.
//! * [`marker`] is the node marker in PCR 15. Running swtpm processes (local clusters,
//!   tests) is the separate `asterism-swtpm` crate, which links no TSS; open one here with
//!   the TCTI string it gives.
//!
//! Busy TPMs and exhausted transient-object slots are retried with a bounded back-off
//! ([`retry`]); errors carry the operation and the decoded response code ([`ResponseCode`]).
//!
//! This is the only crate that links the TSS C libraries. It issues evidence but never
//! verifies it (that is pure Rust, elsewhere), keeps no secret (the one it returns, an activated
//! enrolment credential, is an [`ActivatedCredential`] that zeroizes itself and prints as
//! redacted) and reads no environment.
//! It spawns no processes. It is blocking by design: callers in async code run it on a
//! blocking thread.
#![forbid(unsafe_code)]

pub mod ak;
mod config;
mod device;
pub mod ek;
mod error;
mod issuer;
pub mod marker;
pub mod pcr;
pub mod retry;

pub use ak::{AkAlgorithm, AkConfig, AkLocation, AttestationKey, NvTemplateAk, PersistentHandle};
pub use config::{ConfigError, DEFAULT_DEVICE, DEFAULT_SWTPM_HOST, DEFAULT_SWTPM_PORT, TpmConfig};
pub use device::{
    ActivatedCredential, MAX_EVENT_DATA, MAX_NV_READ, MAX_QUALIFYING_DATA, Quote, Tpm,
};
pub use ek::EkCertSlot;
pub use error::{Layer, ResponseCode, TpmError};
pub use issuer::TpmIssuer;
pub use pcr::{PcrSelection, PcrValue};
pub use retry::RetryPolicy;
