//! The open TPM: every command this crate sends.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use asterism_attestation::hcl::HCL_REPORT_NV_INDEX;
use asterism_attestation::tpm::ek::{EK_CHAIN_NV_FIRST, EK_CHAIN_NV_LAST};
use sha1::Sha1;
use sha2::{Digest as _, Sha256, Sha384, Sha512};
use tracing::{debug, info, warn};
use tss_esapi::Context;
use tss_esapi::abstraction::ek as tss_ek;
use tss_esapi::abstraction::nv;
use tss_esapi::abstraction::{AsymmetricAlgorithmSelection, DefaultKey};
use tss_esapi::constants::CapabilityType;
use tss_esapi::constants::SessionType;
use tss_esapi::handles::{
    AuthHandle, KeyHandle, NvIndexTpmHandle, ObjectHandle, PcrHandle, PersistentTpmHandle,
    SessionHandle, TpmHandle,
};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::dynamic_handles::Persistent;
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::interface_types::resource_handles::{Hierarchy, NvAuth, Provision};
use tss_esapi::interface_types::session_handles::{AuthSession, PolicySession};
use tss_esapi::structures::{
    AttestInfo, CapabilityData, Data, Digest, DigestValues, EncryptedSecret, IdObject,
    PcrSelectionList, PcrSlot, SignatureScheme, SymmetricDefinition,
};
use tss_esapi::tcti_ldr::{DeviceConfig, NetworkTPMConfig, TctiNameConf};
use tss_esapi::traits::{Marshall, UnMarshall};
use zeroize::Zeroizing;

use crate::ak::{
    self, AkAlgorithm, AkConfig, AkLocation, AttestationKey, MAX_AK_TEMPLATE, NvTemplateAk,
    PersistentHandle,
};
use crate::config::TpmConfig;
use crate::ek::EkCertSlot;
use crate::error::{ResponseCode, TPM_RC_HANDLE, TpmError};
use crate::pcr::{self, PcrSelection, PcrValue};
use crate::retry::{RetryAction, RetryPolicy, classify};

/// The most qualifying data (nonce) [`Tpm::quote`] accepts: 32 bytes, one SHA-256 digest.
///
/// The TPM's own limit is `sizeof(TPMT_HA)` for its largest hash (34 to 66 bytes depending on
/// the TPM), and some cloud vTPMs reject anything above 32. Callers hash
/// their binding to 32 bytes, so 32 is portable and sufficient.
pub const MAX_QUALIFYING_DATA: usize = 32;

/// The most event data [`Tpm::pcr_event`] accepts: the capacity of a TPM2B_EVENT.
pub const MAX_EVENT_DATA: usize = 1024;

/// The most bytes [`Tpm::read_nv_index`] reads. An NV index's size is a u16, and TPMs cap
/// it lower (swtpm at 2 KiB, Azure's HCL report index is larger); this keeps one read bounded.
pub const MAX_NV_READ: usize = 16 * 1024;

/// TPM2_PCR_Read returns at most this many digests per call (TPML_DIGEST holds 8).
const PCR_READ_BATCH: usize = 8;

/// How often a multi-call PCR read is restarted when the PCRs change under it.
const PCR_READ_ROUNDS: u32 = 4;

/// How many quotes [`Tpm::quote`] takes when the PCRs change between quote and read-back.
const QUOTE_ATTEMPTS: u32 = 2;

/// First transient object handle (TPM_HT_TRANSIENT << 24).
const TRANSIENT_FIRST: u32 = 0x8000_0000;

/// A TPM quote and the PCR values it covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quote {
    /// The marshalled TPMS_ATTEST: the content of the TPM2B_ATTEST the TPM returned, without
    /// its size prefix. This is the exact byte string the signature covers.
    pub attest: Vec<u8>,
    /// The marshalled TPMT_SIGNATURE (`sigAlg`, `hash`, then the scheme's fields).
    pub signature: Vec<u8>,
    /// The quoted PCR indices of the SHA-256 bank, ascending.
    pub selection: Vec<u32>,
    /// The SHA-256 values of those PCRs, ascending by index, read right after the quote and
    /// checked against the quote's `pcrDigest`.
    pub pcrs: Vec<(u32, PcrValue)>,
}

/// The credential `TPM2_ActivateCredential` recovered ([`Tpm::activate_credential`]): a
/// secret that proves possession of the EK and the AK to whoever made the challenge. Zeroized
/// when dropped, never printed, not `Clone`.
pub struct ActivatedCredential(Zeroizing<Vec<u8>>);

impl ActivatedCredential {
    /// The credential's bytes. Use them (e.g. as an HMAC key), do not log or send them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ActivatedCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ActivatedCredential(<redacted>)")
    }
}

/// An open TPM.
///
/// One value owns one TSS context (one connection). It is `Send`, so it can be kept in a
/// `Mutex` and used from a blocking thread; every method takes `&mut self`, which serialises
/// commands. There is nothing asynchronous here: a TPM command blocks for milliseconds (a
/// quote) up to seconds (creating an RSA key).
///
/// Every command goes through the same retry loop: busy codes are retried after a bounded
/// exponential back-off and transient-object exhaustion first flushes the transient objects
/// this connection sees (see [`crate::retry`]).
pub struct Tpm {
    ctx: Context,
    tcti: String,
    retry: RetryPolicy,
    /// ESAPI handles and marshalled public areas of the persistent AKs already looked up on
    /// this connection, by persistent handle.
    aks: HashMap<u32, (KeyHandle, Vec<u8>)>,
    /// ESAPI handles and marshalled public areas of the transient AKs made from NV
    /// templates on this connection, by template NV index. The binding flushes the objects
    /// it created when the connection is dropped, these among them.
    template_aks: HashMap<u32, (KeyHandle, Vec<u8>)>,
}

// The TPM handle must be `Send` so it can live in a `Mutex` shared by a server.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Tpm>();
};

impl fmt::Debug for Tpm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tpm")
            .field("tcti", &self.tcti)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl Tpm {
    /// Opens the TPM named by `config` with the default [`RetryPolicy`].
    pub fn open(config: &TpmConfig) -> Result<Self, TpmError> {
        let tcti = config.to_string();
        let name_conf = tcti_name_conf(config)?;
        // The TSS connects to swtpm (and opens a device) without close-on-exec: children
        // start through `asterism_children`, which keeps them from inheriting either.
        let ctx = Context::new(name_conf).map_err(|error| match error {
            tss_esapi::Error::Tss2Error(rc) => TpmError::Open {
                tcti: tcti.clone(),
                code: raw_code(rc),
            },
            tss_esapi::Error::WrapperError(kind) => TpmError::Binding {
                operation: "open TPM",
                detail: kind.to_string(),
            },
        })?;
        debug!(%tcti, "opened TPM");
        Ok(Tpm {
            ctx,
            tcti,
            retry: RetryPolicy::default(),
            aks: HashMap::new(),
            template_aks: HashMap::new(),
        })
    }

    /// Replaces the retry policy.
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The configuration this TPM was opened with, as text.
    pub fn tcti(&self) -> &str {
        &self.tcti
    }

    /// Loads the attestation key: uses the persistent object at `config.handle` when it
    /// was made from the AK template, otherwise creates the key (a primary in the owner
    /// hierarchy, see [`crate::ak`]) and persists it there, evicting whatever object of
    /// another template occupied the handle.
    pub fn load_attestation_key(&mut self, config: &AkConfig) -> Result<AttestationKey, TpmError> {
        if config.provisioned {
            return self.load_provisioned_key(config);
        }
        let template = binding("AK template", ak::template(config.algorithm))?;
        if let Some((handle, public)) = self.read_persistent(config.handle)? {
            match ak::template_mismatch(&template, &public) {
                None => {
                    debug!(
                        handle = format_args!("{:#010x}", config.handle.raw()),
                        "using persistent AK"
                    );
                    let public = binding("marshal TPMT_PUBLIC", public.marshall())?;
                    self.remember_ak(config.handle, handle, public.clone());
                    return Ok(AttestationKey {
                        algorithm: config.algorithm,
                        location: AkLocation::Persistent(config.handle),
                        public,
                        created: false,
                    });
                }
                Some(mismatch) => {
                    warn!(
                        handle = format_args!("{:#010x}", config.handle.raw()),
                        %mismatch,
                        "persistent object at the AK handle was not made from the AK template; replacing it"
                    );
                    self.evict(handle, config.handle)?;
                }
            }
        }
        self.create_persistent_ak(config, template)
    }

    /// The key a platform provisioned at `config.handle`, as it is: never created, never
    /// evicted. Refused when there is none or it is no attestation key.
    fn load_provisioned_key(&mut self, config: &AkConfig) -> Result<AttestationKey, TpmError> {
        let raw = config.handle.raw();
        let Some((handle, public)) = self.read_persistent(config.handle)? else {
            return Err(TpmError::NoProvisionedKey { handle: raw });
        };
        if let Some(reason) = ak::provisioned_mismatch(config.algorithm, &public) {
            return Err(TpmError::ProvisionedKeyUnusable {
                handle: raw,
                reason,
            });
        }
        debug!(
            handle = format_args!("{raw:#010x}"),
            "using the platform's provisioned AK"
        );
        let public = binding("marshal TPMT_PUBLIC", public.marshall())?;
        self.remember_ak(config.handle, handle, public.clone());
        Ok(AttestationKey {
            algorithm: config.algorithm,
            location: AkLocation::Persistent(config.handle),
            public,
            created: false,
        })
    }

    /// Reads SHA-256 PCR values, ascending by index. Several `TPM2_PCR_Read` calls are made
    /// when more than 8 PCRs are selected; if the TPM's PCR update counter changes between
    /// them, the whole read starts again so the values are one consistent snapshot.
    pub fn read_pcrs(
        &mut self,
        selection: &PcrSelection,
    ) -> Result<Vec<(u32, PcrValue)>, TpmError> {
        for _ in 0..PCR_READ_ROUNDS {
            if let Some(values) = self.read_pcrs_once(selection)? {
                return Ok(values);
            }
            debug!("PCRs changed during a multi-call read; reading again");
        }
        Err(TpmError::UnexpectedResponse {
            operation: "TPM2_PCR_Read",
            detail: format!("PCRs kept changing over {PCR_READ_ROUNDS} reads"),
        })
    }

    /// Quotes the SHA-256 PCRs in `selection` with `ak`, binding `qualifying_data` (at most
    /// [`MAX_QUALIFYING_DATA`] bytes) into the TPMS_ATTEST's `extraData`.
    ///
    /// The PCR values are read right after the quote. A PCR extended between the two would
    /// make the values disagree with the signed `pcrDigest` (a verifier recomputes the digest
    /// and would reject); this function recomputes it too and quotes once more if it differs,
    /// then gives up with [`TpmError::PcrsChangedDuringQuote`].
    pub fn quote(
        &mut self,
        ak: &AttestationKey,
        qualifying_data: &[u8],
        selection: &PcrSelection,
    ) -> Result<Quote, TpmError> {
        if qualifying_data.len() > MAX_QUALIFYING_DATA {
            return Err(TpmError::QualifyingDataTooLong {
                len: qualifying_data.len(),
                max: MAX_QUALIFYING_DATA,
            });
        }
        let key = self.ak_handle(ak)?;
        let pcr_list = binding("PCR selection", sha256_selection(&selection.indices()))?;
        for attempt in 1..=QUOTE_ATTEMPTS {
            let (attest, signature) = self.run("TPM2_Quote", |ctx| {
                let data = Data::try_from(qualifying_data.to_vec())?;
                ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                    ctx.quote(key, data, SignatureScheme::Null, pcr_list.clone())
                })
            })?;
            let AttestInfo::Quote { info } = attest.attested() else {
                return Err(TpmError::UnexpectedResponse {
                    operation: "TPM2_Quote",
                    detail: format!("attestation of type {:?}", attest.attestation_type()),
                });
            };
            let signed_digest = info.pcr_digest().value().to_vec();
            let pcrs = self.read_pcrs(selection)?;
            if pcr::quote_digest(&pcrs).as_slice() == signed_digest.as_slice() {
                return Ok(Quote {
                    attest: binding("marshal TPMS_ATTEST", attest.marshall())?,
                    signature: binding("marshal TPMT_SIGNATURE", signature.marshall())?,
                    selection: selection.indices(),
                    pcrs,
                });
            }
            warn!(attempt, "PCRs changed between TPM2_Quote and TPM2_PCR_Read");
        }
        Err(TpmError::PcrsChangedDuringQuote {
            attempts: QUOTE_ATTEMPTS,
        })
    }

    /// `TPM2_PCR_Extend` of the SHA-256 bank of PCR `index` with `digest`: the PCR becomes
    /// `SHA-256(old || digest)` ([`crate::pcr::extended`]). Other banks are not touched.
    pub fn extend_pcr(&mut self, index: u32, digest: &[u8; 32]) -> Result<(), TpmError> {
        let handle = pcr_handle(index)?;
        let digests = binding("digest", sha256_digest_values(digest))?;
        self.run("TPM2_PCR_Extend", |ctx| {
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.pcr_extend(handle, digests.clone())
            })
        })
    }

    /// Records `data` in PCR `index` the way `TPM2_PCR_Event` does: every
    /// allocated bank is extended with its own hash of `data`, so the SHA-256 PCR becomes
    /// `SHA-256(old || SHA-256(data))` ([`crate::pcr::event_extended`]).
    ///
    /// The TSS Rust binding has no `TPM2_PCR_Event`, and this crate forbids `unsafe`, so the
    /// digests are computed here and sent with one `TPM2_PCR_Extend`; the PCR values are the
    /// same. `data` may be at most [`MAX_EVENT_DATA`] bytes, as for `TPM2_PCR_Event`.
    pub fn pcr_event(&mut self, index: u32, data: &[u8]) -> Result<(), TpmError> {
        let handle = pcr_handle(index)?;
        if data.len() > MAX_EVENT_DATA {
            return Err(TpmError::EventDataTooLong {
                len: data.len(),
                max: MAX_EVENT_DATA,
            });
        }
        let banks = self.banks_with_pcr(index)?;
        if banks.is_empty() {
            return Err(TpmError::UnexpectedResponse {
                operation: "TPM2_GetCapability(PCRS)",
                detail: format!("no allocated PCR bank contains PCR {index}"),
            });
        }
        let mut digests = DigestValues::new();
        for bank in banks {
            let digest = match bank {
                HashingAlgorithm::Sha1 => Sha1::digest(data).to_vec(),
                HashingAlgorithm::Sha256 => Sha256::digest(data).to_vec(),
                HashingAlgorithm::Sha384 => Sha384::digest(data).to_vec(),
                HashingAlgorithm::Sha512 => Sha512::digest(data).to_vec(),
                other => {
                    return Err(TpmError::UnsupportedPcrBank {
                        algorithm: format!("{other:?}"),
                    });
                }
            };
            digests.set(bank, binding("digest", Digest::try_from(digest))?);
        }
        self.run("TPM2_PCR_Extend", |ctx| {
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.pcr_extend(handle, digests.clone())
            })
        })
    }

    /// Reads the DER EK certificate from its NV index, or `None` when the index is not
    /// defined (the TPM has no certificate of that kind).
    pub fn read_ek_certificate(&mut self, slot: EkCertSlot) -> Result<Option<Vec<u8>>, TpmError> {
        if !self.handle_exists(slot.nv_index())? {
            return Ok(None);
        }
        let index = binding("NV index", NvIndexTpmHandle::new(slot.nv_index()))?;
        let read = self.run("TPM2_NV_Read", |ctx| {
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                nv::read_full(ctx, NvAuth::Owner, index)
            })
        });
        match read {
            Ok(der) if der.is_empty() => Ok(None),
            Ok(der) => Ok(Some(der)),
            // Undefined between the look-up and the read.
            Err(TpmError::Tpm { code, .. }) if code.tpm_base() == Some(TPM_RC_HANDLE) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// The EK's `TPMT_PUBLIC` (marshalled, without size prefix) of `slot`'s kind: the primary
    /// key that the TCG default EK template (EK Credential Profile, templates L-1, L-2 and
    /// H-3) makes in the endorsement hierarchy. A TPM derives it from its endorsement seed,
    /// so it is the same key every time, the one the EK certificate in `slot` certifies
    /// (verify with `asterism_attestation::tpm::ek::EkCaBundle::verify`). Nothing is left
    /// loaded.
    pub fn read_ek_public(&mut self, slot: EkCertSlot) -> Result<Vec<u8>, TpmError> {
        let (handle, public) = self.create_ek(slot)?;
        let public = binding("marshal TPMT_PUBLIC", public.marshall());
        self.flush(ObjectHandle::from(handle), "the transient EK");
        public
    }

    /// `TPM2_ActivateCredential`: proves that the attestation key `ak` and the EK of `slot`'s
    /// kind (the TCG default template, as [`Tpm::read_ek_public`] makes it) are in this TPM,
    /// by recovering the credential that `TPM2_MakeCredential` (done by a verifier, in
    /// software) bound to the EK's public key and the AK's name.
    ///
    /// `credential_blob` is the content of the TPM2B_ID_OBJECT (integrity HMAC and encrypted
    /// credential), `secret` the content of the TPM2B_ENCRYPTED_SECRET (the seed, encrypted to
    /// the EK). The EK is used under its standard authorization policy, `PolicySecret` with
    /// the endorsement hierarchy (empty endorsement auth), in a policy session; the AK with
    /// its empty auth value. The TPM refuses (`TPM_RC_INTEGRITY` or a value error) a blob made
    /// for another EK or another AK name. Nothing is left loaded.
    pub fn activate_credential(
        &mut self,
        ak: &AttestationKey,
        slot: EkCertSlot,
        credential_blob: &[u8],
        secret: &[u8],
    ) -> Result<ActivatedCredential, TpmError> {
        let key = self.ak_handle(ak)?;
        let blob = binding(
            "TPM2B_ID_OBJECT",
            IdObject::try_from(credential_blob.to_vec()),
        )?;
        let secret = binding(
            "TPM2B_ENCRYPTED_SECRET",
            EncryptedSecret::try_from(secret.to_vec()),
        )?;
        let (ek, _) = self.create_ek(slot)?;
        let session = self.run("TPM2_StartAuthSession(policy)", |ctx| {
            ctx.execute_without_session(|ctx| {
                ctx.start_auth_session(
                    None,
                    None,
                    None,
                    SessionType::Policy,
                    SymmetricDefinition::AES_128_CFB,
                    HashingAlgorithm::Sha256,
                )
            })
        });
        let session = match session {
            Ok(Some(session)) => session,
            Ok(None) => {
                self.flush(ObjectHandle::from(ek), "the transient EK");
                return Err(TpmError::UnexpectedResponse {
                    operation: "TPM2_StartAuthSession(policy)",
                    detail: "no session handle".to_owned(),
                });
            }
            Err(error) => {
                self.flush(ObjectHandle::from(ek), "the transient EK");
                return Err(error);
            }
        };
        let activated = self.run("TPM2_ActivateCredential", |ctx| {
            let policy = PolicySession::try_from(session)?;
            // A retry starts the policy again: PolicySecret once per attempt.
            ctx.execute_without_session(|ctx| ctx.policy_restart(policy))?;
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.policy_secret(
                    policy,
                    AuthHandle::Endorsement,
                    Default::default(),
                    Default::default(),
                    Default::default(),
                    None,
                )
            })?;
            ctx.execute_with_sessions((Some(AuthSession::Password), Some(session), None), |ctx| {
                ctx.activate_credential(key, ek, blob.clone(), secret.clone())
            })
        });
        self.flush(SessionHandle::from(session).into(), "the policy session");
        self.flush(ObjectHandle::from(ek), "the transient EK");
        let digest = activated?;
        Ok(ActivatedCredential(Zeroizing::new(digest.value().to_vec())))
    }

    /// The contents of the EK certificate chain NV indices (`0x01C00100` to `0x01C001FF`)
    /// the TPM defines, in index order: the certificates of the manufacturer's CAs between
    /// the EK certificate and its root, DER, one or more per index (split them with
    /// `asterism_attestation::tpm::ek::certificates_from_nv`). Most TPMs define none.
    pub fn read_ek_certificate_chain(&mut self) -> Result<Vec<(u32, Vec<u8>)>, TpmError> {
        let (data, _) = self.run("TPM2_GetCapability(HANDLES)", |ctx| {
            ctx.execute_without_session(|ctx| {
                ctx.get_capability(
                    CapabilityType::Handles,
                    EK_CHAIN_NV_FIRST,
                    EK_CHAIN_NV_LAST - EK_CHAIN_NV_FIRST + 1,
                )
            })
        })?;
        let CapabilityData::Handles(handles) = data else {
            return Err(TpmError::UnexpectedResponse {
                operation: "TPM2_GetCapability(HANDLES)",
                detail: "not a handle list".to_owned(),
            });
        };
        let indices: Vec<u32> = handles
            .iter()
            .map(|handle| u32::from(*handle))
            .filter(|index| (EK_CHAIN_NV_FIRST..=EK_CHAIN_NV_LAST).contains(index))
            .collect();
        let mut chain = Vec::with_capacity(indices.len());
        for index in indices {
            chain.push((index, self.read_nv_index(index)?));
        }
        Ok(chain)
    }

    /// Reads the whole NV index `index` with owner authorization (empty password), in chunks
    /// of the TPM's largest NV buffer. Refuses an undefined index and one larger than
    /// [`MAX_NV_READ`] before reading it.
    pub fn read_nv_index(&mut self, index: u32) -> Result<Vec<u8>, TpmError> {
        self.read_nv_index_at_most(index, MAX_NV_READ)
    }

    /// [`Tpm::read_nv_index`] with a lower cap than [`MAX_NV_READ`].
    fn read_nv_index_at_most(&mut self, index: u32, max: usize) -> Result<Vec<u8>, TpmError> {
        if !self.handle_exists(index)? {
            return Err(TpmError::NvIndexNotDefined { index });
        }
        let handle = binding("NV index", NvIndexTpmHandle::new(index))?;
        let size = self.run("TPM2_NV_ReadPublic", |ctx| {
            ctx.execute_without_session(|ctx| {
                let object = ctx.tr_from_tpm_public(TpmHandle::NvIndex(handle))?;
                ctx.nv_read_public(object.into())
            })
        });
        let size = match size {
            Ok((public, _)) => public.data_size(),
            // Undefined between the look-up and the read.
            Err(TpmError::Tpm { code, .. }) if code.tpm_base() == Some(TPM_RC_HANDLE) => {
                return Err(TpmError::NvIndexNotDefined { index });
            }
            Err(other) => return Err(other),
        };
        let too_large = |size| TpmError::NvIndexTooLarge { index, size, max };
        if size > max {
            return Err(too_large(size));
        }
        // `read_full` reads in chunks of TPM_PT_NV_BUFFER_MAX.
        let data = self.run("TPM2_NV_Read", |ctx| {
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                nv::read_full(ctx, NvAuth::Owner, handle)
            })
        })?;
        // Redefined larger between the size check and the read.
        if data.len() > max {
            return Err(too_large(data.len()));
        }
        debug!(
            index = format_args!("{index:#010x}"),
            bytes = data.len(),
            "read NV index"
        );
        Ok(data)
    }

    /// Reads the HCL report an Azure confidential VM's paravisor keeps in NV index
    /// [`HCL_REPORT_NV_INDEX`], whole (zero padding included); parse it with
    /// `asterism_attestation::hcl::HclReport::parse`.
    pub fn read_hcl_report(&mut self) -> Result<Vec<u8>, TpmError> {
        self.read_nv_index(HCL_REPORT_NV_INDEX)
    }

    /// The first of `candidates` whose template NV index is defined: which of a cloud's
    /// AKs this vTPM has. Refused, naming every index looked at, when none is.
    pub fn find_nv_template_ak(
        &mut self,
        candidates: &[NvTemplateAk],
    ) -> Result<NvTemplateAk, TpmError> {
        for candidate in candidates {
            if self.handle_exists(candidate.template_index)? {
                return Ok(*candidate);
            }
        }
        Err(TpmError::NoAkTemplate {
            indices: candidates.iter().map(|c| c.template_index).collect(),
        })
    }

    /// Makes the AK `ak` describes, as the cloud does: reads its template (a TPMT_PUBLIC, at
    /// most [`MAX_AK_TEMPLATE`] bytes, trailing padding ignored) from
    /// `ak.template_index`, refuses a template that is no attestation key of
    /// `ak.algorithm` ([`ak::provisioned_mismatch`]), and creates it with
    /// `TPM2_CreatePrimary` in the endorsement hierarchy (empty endorsement auth). The key is
    /// transient and held by this connection until it is dropped; if something flushes it, the
    /// next quote makes it again from the template (a primary key is a fixed function of the
    /// seed and the template, so it is the same key). Loading it again on the same connection
    /// replaces the held one.
    pub fn load_nv_template_ak(&mut self, ak: &NvTemplateAk) -> Result<AttestationKey, TpmError> {
        let (key, public) = self.create_template_ak(ak)?;
        self.remember_template_ak(ak.template_index, key, public.clone());
        info!(
            algorithm = ?ak.algorithm,
            template = format_args!("{:#010x}", ak.template_index),
            "made the attestation key from the cloud's template"
        );
        Ok(AttestationKey {
            algorithm: ak.algorithm,
            location: AkLocation::NvTemplate(*ak),
            public,
            created: false,
        })
    }

    /// The cloud's certificate for the AK `ak` describes: the first DER certificate in NV
    /// index `ak.certificate_index` (padding after it dropped). Refused, naming the index,
    /// when the index is undefined or holds no certificate.
    pub fn read_nv_template_ak_certificate(
        &mut self,
        ak: &NvTemplateAk,
    ) -> Result<Vec<u8>, TpmError> {
        let index = ak.certificate_index;
        let contents = self.read_nv_index(index)?;
        let unusable = |reason: String| TpmError::NvCertificateUnusable { index, reason };
        asterism_attestation::tpm::ek::certificates_from_nv(&contents)
            .map_err(|e| unusable(e.to_string()))?
            .into_iter()
            .next()
            .ok_or_else(|| unusable("it holds no certificate".to_owned()))
    }

    /// GCE's AK and Google's certificate for it: the AK of `algorithm`, or, when `None`, the
    /// ECC AK if the vTPM has its template and the RSA AK otherwise
    /// ([`NvTemplateAk::GCE`]); see [`Tpm::load_nv_template_ak`] and
    /// [`Tpm::read_nv_template_ak_certificate`].
    pub fn load_gce_ak(
        &mut self,
        algorithm: Option<AkAlgorithm>,
    ) -> Result<(AttestationKey, Vec<u8>), TpmError> {
        let ak = match algorithm {
            Some(algorithm) => NvTemplateAk::gce(algorithm),
            None => self.find_nv_template_ak(&NvTemplateAk::GCE)?,
        };
        let key = self.load_nv_template_ak(&ak)?;
        let certificate = self.read_nv_template_ak_certificate(&ak)?;
        Ok((key, certificate))
    }

    // ---- internals ----

    /// Reads `ak`'s template from NV and creates the primary key from it in the endorsement
    /// hierarchy: a transient object the caller keeps or flushes.
    fn create_template_ak(&mut self, ak: &NvTemplateAk) -> Result<(KeyHandle, Vec<u8>), TpmError> {
        let index = ak.template_index;
        let bytes = self.read_nv_index_at_most(index, MAX_AK_TEMPLATE)?;
        let unusable = |reason: String| TpmError::AkTemplateUnusable { index, reason };
        // The TSS reads one TPMT_PUBLIC from the front and ignores what follows.
        let template = tss_esapi::structures::Public::unmarshall(&bytes)
            .map_err(|e| unusable(format!("not a TPMT_PUBLIC: {e}")))?;
        if let Some(reason) = ak::provisioned_mismatch(ak.algorithm, &template) {
            return Err(unusable(reason));
        }
        let created = self.create_endorsement_primary(&template)?;
        match binding("marshal TPMT_PUBLIC", created.out_public.marshall()) {
            Ok(public) => Ok((created.key_handle, public)),
            Err(error) => {
                self.flush(ObjectHandle::from(created.key_handle), "the transient AK");
                Err(error)
            }
        }
    }

    /// `TPM2_CreatePrimary` in the endorsement hierarchy from `template`: a transient object
    /// the caller flushes.
    fn create_endorsement_primary(
        &mut self,
        template: &tss_esapi::structures::Public,
    ) -> Result<tss_esapi::structures::CreatePrimaryKeyResult, TpmError> {
        self.run("TPM2_CreatePrimary(endorsement)", |ctx| {
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.create_primary(
                    Hierarchy::Endorsement,
                    template.clone(),
                    None,
                    None,
                    None,
                    None,
                )
            })
        })
    }

    /// Keeps the transient AK made from the template at `index`, flushing one made before.
    fn remember_template_ak(&mut self, index: u32, key: KeyHandle, public: Vec<u8>) {
        if let Some((old, _)) = self.template_aks.insert(index, (key, public))
            && old != key
        {
            self.flush(ObjectHandle::from(old), "the previous transient AK");
        }
    }

    /// The ESAPI handle of the transient AK made from `template`, made again from the
    /// template when it was flushed, after checking that it still is `ak`.
    fn template_ak_handle(
        &mut self,
        ak: &AttestationKey,
        template: &NvTemplateAk,
    ) -> Result<KeyHandle, TpmError> {
        let index = template.template_index;
        if !self.template_aks.contains_key(&index) {
            debug!(
                template = format_args!("{index:#010x}"),
                "making the attestation key from its template again"
            );
            let (key, public) = self.create_template_ak(template)?;
            self.remember_template_ak(index, key, public);
        }
        match self.template_aks.get(&index) {
            Some((key, public)) if *public == ak.public => Ok(*key),
            _ => Err(TpmError::TemplateAkChanged { index }),
        }
    }

    /// Creates the EK of `slot`'s kind from the TCG default template in the endorsement
    /// hierarchy: a transient object the caller flushes.
    fn create_ek(
        &mut self,
        slot: EkCertSlot,
    ) -> Result<(KeyHandle, tss_esapi::structures::Public), TpmError> {
        let selection = match slot {
            EkCertSlot::Rsa2048 => AsymmetricAlgorithmSelection::Rsa(RsaKeyBits::Rsa2048),
            EkCertSlot::EccP256 => AsymmetricAlgorithmSelection::Ecc(EccCurve::NistP256),
            EkCertSlot::EccP384 => AsymmetricAlgorithmSelection::Ecc(EccCurve::NistP384),
        };
        let template = binding(
            "EK template",
            tss_ek::create_ek_public_from_default_template_2(selection, None::<DefaultKey>),
        )?;
        let created = self.create_endorsement_primary(&template)?;
        Ok((created.key_handle, created.out_public))
    }

    /// Flushes a transient object or session, logging (not failing) when that fails.
    fn flush(&mut self, handle: ObjectHandle, what: &str) {
        if let Err(error) = self
            .ctx
            .execute_without_session(|ctx| ctx.flush_context(handle))
        {
            warn!(%error, "cannot flush {what}");
        }
    }

    /// Sends one command through the retry loop.
    fn run<T>(
        &mut self,
        operation: &'static str,
        mut command: impl FnMut(&mut Context) -> tss_esapi::Result<T>,
    ) -> Result<T, TpmError> {
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let code = match command(&mut self.ctx) {
                Ok(value) => return Ok(value),
                Err(tss_esapi::Error::WrapperError(kind)) => {
                    return Err(TpmError::Binding {
                        operation,
                        detail: kind.to_string(),
                    });
                }
                Err(tss_esapi::Error::Tss2Error(rc)) => raw_code(rc),
            };
            let action = classify(code);
            if action == RetryAction::Fail {
                return Err(TpmError::Tpm { operation, code });
            }
            let Some(delay) = self.retry.delay(attempts) else {
                return Err(TpmError::RetriesExhausted {
                    operation,
                    code,
                    attempts,
                });
            };
            warn!(operation, %code, attempts, ?delay, "transient TPM failure; retrying");
            if action == RetryAction::FlushAndRetry {
                self.flush_transient_objects();
            }
            std::thread::sleep(delay);
        }
    }

    /// Flushes every transient object this connection can see. Behind the kernel resource
    /// manager (`/dev/tpmrm0`) those are only this connection's own; on a TPM without one
    /// (swtpm, `/dev/tpm0`) this assumes, as the rest of the crate does, that this process is
    /// the TPM's only user. This crate itself keeps no transient object between calls.
    fn flush_transient_objects(&mut self) {
        // The AKs made from NV templates are among them: forget them, to be made again
        // from their templates when next used. Their ESAPI handles are stale (closing
        // them may fail, which does not matter).
        for (_, (key, _)) in std::mem::take(&mut self.template_aks) {
            let mut object = ObjectHandle::from(key);
            if let Err(error) = self.ctx.tr_close(&mut object) {
                debug!(%error, "cannot close the handle of a flushed AK");
            }
        }
        let listed = self.ctx.execute_without_session(|ctx| {
            ctx.get_capability(CapabilityType::Handles, TRANSIENT_FIRST, 64)
        });
        let handles = match listed {
            Ok((CapabilityData::Handles(handles), _)) => handles.into_inner(),
            Ok(_) => return,
            Err(error) => {
                warn!(%error, "cannot list transient objects to flush");
                return;
            }
        };
        for handle in handles {
            if let TpmHandle::Transient(transient) = handle {
                let flushed = self.ctx.execute_without_session(|ctx| {
                    let object = ctx.tr_from_tpm_public(TpmHandle::Transient(transient))?;
                    ctx.flush_context(object)
                });
                match flushed {
                    Ok(()) => info!(handle = ?transient, "flushed transient object"),
                    Err(error) => {
                        warn!(handle = ?transient, %error, "cannot flush transient object")
                    }
                }
            }
        }
    }

    /// Whether a persistent object or NV index exists at `handle`. Asking first (instead of
    /// reading and failing with TPM_RC_HANDLE) keeps the TSS from logging an error for what
    /// is a normal case.
    fn handle_exists(&mut self, handle: u32) -> Result<bool, TpmError> {
        let (data, _) = self.run("TPM2_GetCapability(HANDLES)", |ctx| {
            ctx.execute_without_session(|ctx| {
                ctx.get_capability(CapabilityType::Handles, handle, 1)
            })
        })?;
        let CapabilityData::Handles(handles) = data else {
            return Err(TpmError::UnexpectedResponse {
                operation: "TPM2_GetCapability(HANDLES)",
                detail: "not a handle list".to_owned(),
            });
        };
        Ok(handles
            .first()
            .is_some_and(|found| u32::from(*found) == handle))
    }

    /// The ESAPI handle and public area of the persistent object at `handle`, if any.
    fn read_persistent(
        &mut self,
        handle: PersistentHandle,
    ) -> Result<Option<(KeyHandle, tss_esapi::structures::Public)>, TpmError> {
        if !self.handle_exists(handle.raw())? {
            return Ok(None);
        }
        let tpm_handle = binding("persistent handle", PersistentTpmHandle::new(handle.raw()))?;
        let object = self.run("TPM2_ReadPublic", |ctx| {
            ctx.execute_without_session(|ctx| {
                ctx.tr_from_tpm_public(TpmHandle::Persistent(tpm_handle))
            })
        });
        let object = match object {
            Ok(object) => object,
            Err(TpmError::Tpm { code, .. }) if code.tpm_base() == Some(TPM_RC_HANDLE) => {
                return Ok(None);
            }
            Err(other) => return Err(other),
        };
        let key = KeyHandle::from(object);
        let (public, _, _) = self.run("TPM2_ReadPublic", |ctx| {
            ctx.execute_without_session(|ctx| ctx.read_public(key))
        })?;
        Ok(Some((key, public)))
    }

    /// Removes the persistent object at `handle`.
    fn evict(&mut self, object: KeyHandle, handle: PersistentHandle) -> Result<(), TpmError> {
        let tpm_handle = binding("persistent handle", PersistentTpmHandle::new(handle.raw()))?;
        self.forget_ak(handle, Some(object));
        self.run("TPM2_EvictControl", |ctx| {
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.evict_control(
                    Provision::Owner,
                    object.into(),
                    Persistent::Persistent(tpm_handle),
                )
            })
        })?;
        Ok(())
    }

    fn create_persistent_ak(
        &mut self,
        config: &AkConfig,
        template: tss_esapi::structures::Public,
    ) -> Result<AttestationKey, TpmError> {
        info!(
            algorithm = ?config.algorithm,
            handle = format_args!("{:#010x}", config.handle.raw()),
            "creating attestation key"
        );
        let created = self.run("TPM2_CreatePrimary", |ctx| {
            ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.create_primary(Hierarchy::Owner, template.clone(), None, None, None, None)
            })
        })?;
        let transient = created.key_handle;
        let public = binding("marshal TPMT_PUBLIC", created.out_public.marshall());
        let tpm_handle = binding(
            "persistent handle",
            PersistentTpmHandle::new(config.handle.raw()),
        );
        let persisted = match (public, tpm_handle) {
            (Ok(public), Ok(tpm_handle)) => self
                .run("TPM2_EvictControl", |ctx| {
                    ctx.execute_with_session(Some(AuthSession::Password), |ctx| {
                        ctx.evict_control(
                            Provision::Owner,
                            ObjectHandle::from(transient),
                            Persistent::Persistent(tpm_handle),
                        )
                    })
                })
                .map(|persistent| (public, persistent)),
            (Err(error), _) | (_, Err(error)) => Err(error),
        };
        // The transient copy is no longer needed whether or not persisting worked.
        if let Err(error) = self
            .ctx
            .execute_without_session(|ctx| ctx.flush_context(ObjectHandle::from(transient)))
        {
            warn!(%error, "cannot flush the transient AK");
        }
        let (public, persistent) = persisted?;
        self.remember_ak(config.handle, KeyHandle::from(persistent), public.clone());
        Ok(AttestationKey {
            algorithm: config.algorithm,
            location: AkLocation::Persistent(config.handle),
            public,
            created: true,
        })
    }

    /// Caches the ESAPI handle of the AK at `handle`, closing a previous one.
    fn remember_ak(&mut self, handle: PersistentHandle, key: KeyHandle, public: Vec<u8>) {
        self.forget_ak(handle, Some(key));
        self.aks.insert(handle.raw(), (key, public));
    }

    /// Drops the cached ESAPI handle for `handle` and closes it (it is only a TSS-side
    /// reference; the persistent object stays), unless it is `keep`, which is still in use.
    fn forget_ak(&mut self, handle: PersistentHandle, keep: Option<KeyHandle>) {
        if let Some((old, _)) = self.aks.remove(&handle.raw())
            && Some(old) != keep
        {
            let mut object = ObjectHandle::from(old);
            if let Err(error) = self.ctx.tr_close(&mut object) {
                debug!(%error, "cannot close a stale ESAPI handle");
            }
        }
    }

    /// The ESAPI handle of the persistent key at `ak`'s handle, looked up once per
    /// connection, after checking that it still is `ak` (same public area).
    fn ak_handle(&mut self, ak: &AttestationKey) -> Result<KeyHandle, TpmError> {
        let handle = match ak.location {
            AkLocation::Persistent(handle) => handle,
            AkLocation::NvTemplate(template) => return self.template_ak_handle(ak, &template),
        };
        let raw = handle.raw();
        if !self.aks.contains_key(&raw) {
            let Some((key, public)) = self.read_persistent(handle)? else {
                return Err(TpmError::AkNotFound { handle: raw });
            };
            let public = binding("marshal TPMT_PUBLIC", public.marshall())?;
            self.remember_ak(handle, key, public);
        }
        match self.aks.get(&raw) {
            Some((key, public)) if *public == ak.public => Ok(*key),
            Some(_) => Err(TpmError::AkReplaced { handle: raw }),
            None => Err(TpmError::AkNotFound { handle: raw }),
        }
    }

    /// The allocated banks whose selection includes PCR `index`.
    fn banks_with_pcr(&mut self, index: u32) -> Result<Vec<HashingAlgorithm>, TpmError> {
        let slot = binding("PCR slot", PcrSlot::try_from(1u32 << index))?;
        let (data, _) = self.run("TPM2_GetCapability(PCRS)", |ctx| {
            ctx.execute_without_session(|ctx| ctx.get_capability(CapabilityType::AssignedPcr, 0, 1))
        })?;
        let CapabilityData::AssignedPcr(banks) = data else {
            return Err(TpmError::UnexpectedResponse {
                operation: "TPM2_GetCapability(PCRS)",
                detail: "not a PCR selection list".to_owned(),
            });
        };
        Ok(banks
            .get_selections()
            .iter()
            .filter(|bank| bank.is_selected(slot))
            .map(|bank| bank.hashing_algorithm())
            .collect())
    }

    /// One pass of [`Tpm::read_pcrs`]; `None` when the update counter moved between calls.
    fn read_pcrs_once(
        &mut self,
        selection: &PcrSelection,
    ) -> Result<Option<Vec<(u32, PcrValue)>>, TpmError> {
        let mut pending = selection.indices();
        let mut values = Vec::with_capacity(pending.len());
        let mut counter = None;
        while !pending.is_empty() {
            let batch: Vec<u32> = pending.iter().take(PCR_READ_BATCH).copied().collect();
            let request = binding("PCR selection", sha256_selection(&batch))?;
            let (update_counter, returned, digests) = self.run("TPM2_PCR_Read", |ctx| {
                ctx.execute_without_session(|ctx| ctx.pcr_read(request.clone()))
            })?;
            if counter.is_some_and(|previous| previous != update_counter) {
                return Ok(None);
            }
            counter = Some(update_counter);
            let returned: Vec<u32> = returned
                .get_selections()
                .iter()
                .filter(|bank| bank.hashing_algorithm() == HashingAlgorithm::Sha256)
                .flat_map(|bank| bank.selected())
                .map(|slot| u32::from(slot).trailing_zeros())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let digests = digests.value();
            if returned.is_empty() || returned.len() != digests.len() {
                return Err(TpmError::UnexpectedResponse {
                    operation: "TPM2_PCR_Read",
                    detail: format!(
                        "asked for SHA-256 PCRs {batch:?}, got {} values for PCRs {returned:?} \
                         (is the SHA-256 bank allocated?)",
                        digests.len()
                    ),
                });
            }
            for (index, digest) in returned.iter().zip(digests) {
                let value: PcrValue =
                    digest
                        .value()
                        .try_into()
                        .map_err(|_| TpmError::UnexpectedResponse {
                            operation: "TPM2_PCR_Read",
                            detail: format!(
                                "PCR {index} is {} bytes, not 32",
                                digest.value().len()
                            ),
                        })?;
                if !batch.contains(index) {
                    return Err(TpmError::UnexpectedResponse {
                        operation: "TPM2_PCR_Read",
                        detail: format!("PCR {index} returned but not asked for"),
                    });
                }
                values.push((*index, value));
            }
            pending.retain(|index| !returned.contains(index));
        }
        values.sort_by_key(|(index, _)| *index);
        Ok(Some(values))
    }
}

/// Maps a binding result whose error is not worth retrying (building or marshalling a value).
fn binding<T>(operation: &'static str, result: tss_esapi::Result<T>) -> Result<T, TpmError> {
    result.map_err(|error| match error {
        tss_esapi::Error::Tss2Error(rc) => TpmError::Tpm {
            operation,
            code: raw_code(rc),
        },
        tss_esapi::Error::WrapperError(kind) => TpmError::Binding {
            operation,
            detail: kind.to_string(),
        },
    })
}

/// The raw TSS2_RC inside the binding's response-code type.
fn raw_code(rc: tss_esapi::constants::response_code::Tss2ResponseCode) -> ResponseCode {
    use tss_esapi::constants::response_code::Tss2ResponseCode as Rc;
    ResponseCode::new(match rc {
        Rc::Success => 0,
        Rc::FormatZero(code) => code.0,
        Rc::FormatOne(code) => code.0,
    })
}

fn tcti_name_conf(config: &TpmConfig) -> Result<TctiNameConf, TpmError> {
    let invalid = |kind: tss_esapi::Error| TpmError::Binding {
        operation: "TCTI configuration",
        detail: kind.to_string(),
    };
    match config {
        TpmConfig::Device(path) => {
            let path = path.to_str().ok_or_else(|| TpmError::UnsupportedTcti {
                tcti: config.to_string(),
                reason: "the device path is not valid UTF-8",
            })?;
            Ok(TctiNameConf::Device(
                DeviceConfig::from_str(path).map_err(invalid)?,
            ))
        }
        TpmConfig::SwtpmTcp { host, port } => Ok(TctiNameConf::Swtpm(
            NetworkTPMConfig::from_str(&format!("host={host},port={port}")).map_err(invalid)?,
        )),
        TpmConfig::SwtpmUnix(_) => Err(TpmError::UnsupportedTcti {
            tcti: config.to_string(),
            reason: "the linked TSS binding (tss-esapi 7) passes only host and port to the \
                     swtpm TCTI; start swtpm with `--server type=tcp` and use \
                     `swtpm:host=…,port=…`",
        }),
    }
}

fn pcr_handle(index: u32) -> Result<PcrHandle, TpmError> {
    let index = pcr::check_index(index)?;
    PcrHandle::try_from(index).map_err(|_| TpmError::InvalidPcrIndex { index })
}

fn sha256_selection(indices: &[u32]) -> tss_esapi::Result<PcrSelectionList> {
    let slots = indices
        .iter()
        .map(|index| PcrSlot::try_from(1u32 << index))
        .collect::<tss_esapi::Result<Vec<_>>>()?;
    PcrSelectionList::builder()
        .with_selection(HashingAlgorithm::Sha256, &slots)
        .build()
}

fn sha256_digest_values(digest: &[u8; 32]) -> tss_esapi::Result<DigestValues> {
    let mut values = DigestValues::new();
    values.set(HashingAlgorithm::Sha256, Digest::try_from(digest.to_vec())?);
    Ok(values)
}
