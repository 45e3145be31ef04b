//! The hardware report a confidential VM attaches to its TPM-quote evidence, so that
//! verifiers trusting confidential-VM AKs (`AkTrust::ConfidentialVm`) accept the node's AK.
//!
//! The report vouches for the AK, not for a session, and does not change while the VM runs:
//! it is gathered once at start, before the node issues any evidence.
//!
//! * **Azure SEV-SNP**: the HCL report from the vTPM's NV index (SNP report + runtime data
//!   naming the AK), and the VCEK with its ASK from Azure's THIM
//!   (`GET {imds}/metadata/THIM/amd/certification`).
//! * **Azure TDX**: the HCL report's TD report turned into a DCAP quote by Azure's instance
//!   metadata service (`POST {imds}/acc/tdquote`), and the runtime data.
//! * **AWS SEV-SNP**: an SNP report whose REPORT_DATA is the SHA-512 of the AK, from the
//!   kernel's configfs-tsm, and the VLEK (with the ASVK when the host attaches it) from its
//!   certificate table.
//!
//! The instance metadata service (`asterism_metadata::imds`) is plain HTTP on a link-local
//! address: nothing it returns is secret, and everything is checked by the verifier against
//! AMD's or Intel's roots.

use asterism_attestation::hcl::{self, HardwareKind, HardwareReport, HclReport};
use asterism_attestation::tpm::{AwsSnp, AzureSnp, AzureTdx, CvmPlatform, PlatformKind};
use asterism_metadata::imds::{Imds, ImdsError};
use asterism_tpm::{
    AkAlgorithm, AkConfig, AkLocation, AttestationKey, NvTemplateAk, PcrSelection,
    PersistentHandle, Tpm, TpmError, TpmIssuer,
};
use asterism_tsm::{CertKind, CertTableError, ConfigfsTsm, Provider, TsmError};

/// Why the hardware report could not be gathered. Each error of a call names its URL.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    /// The instance metadata service gave no usable answer.
    #[error(transparent)]
    Imds(#[from] ImdsError),
    /// THIM's certificates are not the PEM certificates it documents.
    #[error("{url}: {reason}")]
    ThimCerts {
        /// The URL called.
        url: String,
        /// What is wrong with them.
        reason: String,
    },
    /// The vTPM's HCL report could not be read.
    #[error("cannot read the HCL report from the vTPM")]
    Tpm(#[source] TpmError),
    /// An Azure platform, but no HCL report was read from the vTPM.
    #[error("--confidential-vm {0} needs the HCL report from the vTPM; none was read")]
    NoHclReport(CvmPlatform),
    /// The HCL report does not parse.
    #[error("the vTPM's HCL report does not parse")]
    HclReport(#[source] asterism_attestation::ValidationError),
    /// The HCL report holds another hardware's report than the platform's.
    #[error("--confidential-vm {platform}, but the vTPM's HCL report holds a {found:?} report")]
    WrongHardware {
        /// The platform configured.
        platform: CvmPlatform,
        /// What the HCL report holds.
        found: HardwareKind,
    },
    /// The AK's public area cannot be bound into an SNP report.
    #[error("cannot compute the AK's REPORT_DATA")]
    AkReportData(#[source] asterism_attestation::ValidationError),
    /// configfs-tsm gave no report.
    #[error("cannot get an SEV-SNP report from configfs-tsm")]
    Tsm(#[source] TsmError),
    /// configfs-tsm answered with another provider's report than SEV-SNP's.
    #[error("configfs-tsm answered a {0:?} report; --confidential-vm aws-sev-snp needs sev_guest")]
    NotSnp(Provider),
    /// The cloud vTPM's AK could not be loaded or made.
    #[error("cannot load the {cloud} AK from the vTPM")]
    CloudAk {
        /// The cloud vTPM.
        cloud: CloudVtpm,
        /// Why.
        #[source]
        source: TpmError,
    },
    /// The cloud vTPM's AK certificate could not be read from its NV index.
    #[error("cannot read the {cloud} AK certificate from NV index {index:#010x}")]
    AkCertificate {
        /// The cloud vTPM.
        cloud: CloudVtpm,
        /// The NV index.
        index: u32,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The SNP certificate table is malformed.
    #[error("the SEV-SNP certificate table from configfs-tsm is malformed")]
    CertTable(#[source] CertTableError),
    /// The host attached no VLEK, which AWS signs its reports with.
    #[error(
        "the SEV-SNP certificate table holds no VLEK (found: {found:?}); AWS signs reports \
         with a VLEK, which the host must attach"
    )]
    NoVlek {
        /// The kinds the table holds.
        found: Vec<CertKind>,
    },
    /// The hardware report vouches for another AK than the one this node quotes with, so
    /// every verifier would refuse the evidence.
    #[error(
        "the {platform} hardware report vouches for another AK than the one this node quotes \
         with (on Azure the AK is the vTPM's own, made by the paravisor)"
    )]
    ForeignAk {
        /// The platform.
        platform: CvmPlatform,
        /// The field that differs, with the expected and observed values.
        #[source]
        source: asterism_attestation::ValidationError,
    },
    /// A blocking task did not finish.
    #[error("the {0} task failed")]
    Task(&'static str),
}

/// The VCEK of this VM's chip and TCB and its ASK, DER, from Azure THIM (the ARK is left
/// out: verifiers trust their embedded AMD roots).
pub async fn azure_vcek(imds: &Imds) -> Result<Vec<Vec<u8>>, PlatformError> {
    let thim = imds.azure_thim().await?;
    let bad = |reason: String| PlatformError::ThimCerts {
        url: imds.azure_thim_url(),
        reason,
    };
    let first = |what: &str, pem: &str| {
        pem_certs(pem)
            .map_err(|e| bad(format!("{what}: {e}")))?
            .into_iter()
            .next()
            .ok_or_else(|| bad(format!("{what} holds no certificate")))
    };
    Ok(vec![
        first("vcekCert", &thim.vcek_cert)?,
        first("certificateChain", &thim.certificate_chain)?,
    ])
}

/// The DER certificates of a PEM text, in order.
fn pem_certs(text: &str) -> Result<Vec<Vec<u8>>, String> {
    x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .map(|pem| match pem {
            Ok(pem) if pem.label == "CERTIFICATE" => Ok(pem.contents),
            Ok(pem) => Err(format!("unexpected PEM block {:?}", pem.label)),
            Err(e) => Err(format!("not PEM: {e}")),
        })
        .collect()
}

/// Where Azure's vTPM keeps the AK its runtime data names (persistent, RSA-2048, made by
/// the paravisor; without noDA).
pub const AZURE_AK_HANDLE: u32 = 0x8100_0003;

/// NV index of the certificate Azure's vTPM CA issued for the AK at [`AZURE_AK_HANDLE`].
pub const AZURE_AK_CERT_NV_INDEX: u32 = 0x01c1_01d0;

/// A cloud vTPM whose AK the cloud made and certified, on a VM that is no confidential VM:
/// the node quotes with that AK and sends the cloud's certificate for it, which verifiers
/// trust with `--cloud-ak-root` (docs/provisioning.md, "Cloud vTPMs").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloudVtpm {
    /// Azure Trusted Launch: the AK at [`AZURE_AK_HANDLE`], its certificate in NV index
    /// [`AZURE_AK_CERT_NV_INDEX`].
    AzureTrustedLaunch,
    /// GCE (Shielded and Confidential VMs): the AK made as a primary key of the
    /// endorsement hierarchy from Google's template in NV (ECC `0x01c10003` if present,
    /// else RSA `0x01c10001`), its certificate in NV `0x01c10002` or `0x01c10000`
    /// ([`NvTemplateAk::GCE`]).
    Gce,
}

impl CloudVtpm {
    /// The name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Self::AzureTrustedLaunch => "azure-trusted-launch",
            Self::Gce => "gce",
        }
    }

    /// Azure's AK, as Azure made it: loaded, never created or replaced.
    pub fn azure_ak_config() -> Result<AkConfig, TpmError> {
        Ok(AkConfig::provisioned_at(
            AkAlgorithm::Rsa2048,
            PersistentHandle::try_from(AZURE_AK_HANDLE)?,
        ))
    }

    /// Loads the cloud's AK as the cloud made it (Azure: the persistent key; GCE: the
    /// primary key made from Google's NV template, ECC preferred) and returns it with the
    /// NV index of its certificate. Blocking.
    pub fn load_ak(self, tpm: &mut Tpm) -> Result<(AttestationKey, u32), PlatformError> {
        let error = |source| PlatformError::CloudAk {
            cloud: self,
            source,
        };
        match self {
            Self::AzureTrustedLaunch => {
                let key = Self::azure_ak_config()
                    .and_then(|config| tpm.load_attestation_key(&config))
                    .map_err(error)?;
                Ok((key, AZURE_AK_CERT_NV_INDEX))
            }
            Self::Gce => {
                let ak = tpm.find_nv_template_ak(&NvTemplateAk::GCE).map_err(error)?;
                let key = tpm.load_nv_template_ak(&ak).map_err(error)?;
                Ok((key, ak.certificate_index))
            }
        }
    }

    /// The issuer a node on this cloud quotes with: the cloud's AK ([`CloudVtpm::load_ak`])
    /// and, unless `chain` is given (`--ak-cert`), the cloud's certificate for it read from
    /// the vTPM. Blocking.
    pub fn issuer(self, mut tpm: Tpm, chain: Vec<Vec<u8>>) -> Result<TpmIssuer, PlatformError> {
        let (key, index) = self.load_ak(&mut tpm)?;
        let chain = if chain.is_empty() {
            let cert = self.read_ak_certificate(&mut tpm, index)?;
            tracing::info!(
                cloud = %self,
                index = format_args!("{index:#010x}"),
                "sending the cloud's AK certificate from the vTPM"
            );
            vec![cert]
        } else {
            chain
        };
        if let AkLocation::NvTemplate(ak) = key.location() {
            tracing::info!(
                cloud = %self,
                algorithm = ?ak.algorithm,
                template = format_args!("{:#010x}", ak.template_index),
                "quoting with the AK made from the cloud's template"
            );
        }
        Ok(TpmIssuer::with_key(tpm, key, PcrSelection::all(), chain))
    }

    /// Reads the AK's certificate (DER) from NV index `index` of the vTPM; padding after
    /// it is dropped. Blocking.
    pub fn read_ak_certificate(self, tpm: &mut Tpm, index: u32) -> Result<Vec<u8>, PlatformError> {
        let error =
            |source: Box<dyn std::error::Error + Send + Sync>| PlatformError::AkCertificate {
                cloud: self,
                index,
                source,
            };
        let contents = tpm.read_nv_index(index).map_err(|e| error(Box::new(e)))?;
        asterism_attestation::tpm::ek::certificates_from_nv(&contents)
            .map_err(|e| error(Box::new(e)))?
            .into_iter()
            .next()
            .ok_or_else(|| error("the NV index holds no certificate".into()))
    }
}

impl std::fmt::Display for CloudVtpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CloudVtpm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "azure-trusted-launch" => Ok(Self::AzureTrustedLaunch),
            "gce" => Ok(Self::Gce),
            other => Err(format!(
                "unknown cloud vTPM {other:?}; known: azure-trusted-launch, gce"
            )),
        }
    }
}

/// The attestation key to quote with on `platform`: on Azure the vTPM's own AK, as the
/// paravisor made it (the HCL report vouches for that key and no other); elsewhere (AWS,
/// where the report is made over our AK, and plain machines) ours.
pub fn ak_config(platform: Option<CvmPlatform>) -> Result<AkConfig, TpmError> {
    Ok(match platform {
        Some(CvmPlatform::AzureSevSnp | CvmPlatform::AzureTdx) => AkConfig::provisioned_at(
            AkAlgorithm::Rsa2048,
            PersistentHandle::try_from(AZURE_AK_HANDLE)?,
        ),
        Some(CvmPlatform::AwsSevSnp) | None => AkConfig::default(),
    })
}

/// What the platform needs from the vTPM, read before the TPM moves into the issuer: the
/// HCL report on Azure, nothing elsewhere. Blocking.
pub fn read_from_tpm(
    platform: CvmPlatform,
    tpm: &mut Tpm,
) -> Result<Option<Vec<u8>>, PlatformError> {
    match platform {
        CvmPlatform::AzureSevSnp | CvmPlatform::AzureTdx => {
            tpm.read_hcl_report().map(Some).map_err(PlatformError::Tpm)
        }
        CvmPlatform::AwsSevSnp => Ok(None),
    }
}

/// Gathers the hardware report for the AK `ak_public` (`TPMT_PUBLIC`). `hcl_report` is what
/// [`read_from_tpm`] returned; `tsm` is the kernel's configfs-tsm (AWS).
pub async fn gather(
    platform: CvmPlatform,
    hcl_report: Option<Vec<u8>>,
    ak_public: &[u8],
    imds: &Imds,
    tsm: ConfigfsTsm,
) -> Result<PlatformKind, PlatformError> {
    let kind = match (platform, hcl_report) {
        (CvmPlatform::AzureSevSnp, Some(hcl_report)) => azure_sev_snp(hcl_report, imds).await?,
        (CvmPlatform::AzureTdx, Some(hcl_report)) => azure_tdx(&hcl_report, imds).await?,
        (CvmPlatform::AzureSevSnp | CvmPlatform::AzureTdx, None) => {
            return Err(PlatformError::NoHclReport(platform));
        }
        (CvmPlatform::AwsSevSnp, _) => {
            let report_data =
                hcl::aws_snp_report_data(ak_public).map_err(PlatformError::AkReportData)?;
            tokio::task::spawn_blocking(move || aws_sev_snp(&report_data, &tsm))
                .await
                .map_err(|_| PlatformError::Task("configfs-tsm"))??
        }
    };
    log_gathered(&kind);
    Ok(kind)
}

fn log_gathered(kind: &PlatformKind) {
    match kind {
        PlatformKind::AzureSevSnp(azure) => tracing::info!(
            platform = %CvmPlatform::AzureSevSnp,
            hcl_report_bytes = azure.hcl_report.len(),
            certs = azure.certs.len(),
            "gathered the hardware report that vouches for the AK"
        ),
        PlatformKind::AzureTdx(azure) => tracing::info!(
            platform = %CvmPlatform::AzureTdx,
            quote_bytes = azure.quote.len(),
            runtime_data_bytes = azure.runtime_data.len(),
            "gathered the hardware report that vouches for the AK"
        ),
        PlatformKind::AwsSevSnp(aws) => tracing::info!(
            platform = %CvmPlatform::AwsSevSnp,
            report_bytes = aws.report.len(),
            certs = aws.certs.len(),
            "gathered the hardware report that vouches for the AK"
        ),
    }
}

/// Checks, before the node issues anything, that `kind` vouches for the AK `ak_public`
/// (`TPMT_PUBLIC`): on Azure the runtime data must name it. An AWS report is made over
/// the AK by [`gather`], so it does.
pub fn check_ak(kind: &PlatformKind, ak_public: &[u8]) -> Result<(), PlatformError> {
    let (platform, runtime_data) = match kind {
        PlatformKind::AzureSevSnp(azure) => {
            let parsed = parsed_hcl(CvmPlatform::AzureSevSnp, &azure.hcl_report)?;
            (CvmPlatform::AzureSevSnp, parsed.runtime_data().to_vec())
        }
        PlatformKind::AzureTdx(azure) => (CvmPlatform::AzureTdx, azure.runtime_data.clone()),
        PlatformKind::AwsSevSnp(_) => return Ok(()),
    };
    hcl::RuntimeData::parse(&runtime_data)
        .and_then(|runtime| hcl::hcl_ak_matches(&runtime, ak_public))
        .map_err(|source| PlatformError::ForeignAk { platform, source })
}

/// The HCL report, parsed, holding the hardware report `platform` needs.
fn parsed_hcl(platform: CvmPlatform, hcl_report: &[u8]) -> Result<HclReport, PlatformError> {
    let parsed = HclReport::parse(hcl_report).map_err(PlatformError::HclReport)?;
    let want = match platform {
        CvmPlatform::AzureTdx => HardwareKind::Tdx,
        CvmPlatform::AzureSevSnp | CvmPlatform::AwsSevSnp => HardwareKind::Snp,
    };
    if parsed.kind() != want {
        return Err(PlatformError::WrongHardware {
            platform,
            found: parsed.kind(),
        });
    }
    Ok(parsed)
}

/// Azure SEV-SNP: the HCL report as read from the vTPM, and the VCEK with its ASK from THIM.
pub async fn azure_sev_snp(
    hcl_report: Vec<u8>,
    imds: &Imds,
) -> Result<PlatformKind, PlatformError> {
    parsed_hcl(CvmPlatform::AzureSevSnp, &hcl_report)?;
    let certs = azure_vcek(imds).await?;
    Ok(PlatformKind::AzureSevSnp(AzureSnp { hcl_report, certs }))
}

/// Azure TDX: a quote over the HCL report's TD report from Azure's quote service, and the
/// runtime data the TD report's REPORT_DATA is the SHA-256 of.
pub async fn azure_tdx(hcl_report: &[u8], imds: &Imds) -> Result<PlatformKind, PlatformError> {
    let parsed = parsed_hcl(CvmPlatform::AzureTdx, hcl_report)?;
    let HardwareReport::Tdx(td_report) = parsed.hardware_report() else {
        return Err(PlatformError::WrongHardware {
            platform: CvmPlatform::AzureTdx,
            found: parsed.kind(),
        });
    };
    let quote = imds.azure_td_quote(td_report).await?;
    Ok(PlatformKind::AzureTdx(AzureTdx {
        quote,
        runtime_data: parsed.runtime_data().to_vec(),
    }))
}

/// AWS SEV-SNP: an SNP report over `report_data` (the AK's, [`hcl::aws_snp_report_data`])
/// from configfs-tsm, with the VLEK (and ASVK) from its certificate table. Blocking.
pub fn aws_sev_snp(
    report_data: &[u8; 64],
    tsm: &ConfigfsTsm,
) -> Result<PlatformKind, PlatformError> {
    let report = tsm.report(report_data).map_err(PlatformError::Tsm)?;
    if report.provider != Provider::SevGuest {
        return Err(PlatformError::NotSnp(report.provider));
    }
    let certs = vlek_certs(report.auxblob.as_deref().unwrap_or_default())?;
    Ok(PlatformKind::AwsSevSnp(AwsSnp {
        report: report.outblob,
        certs,
    }))
}

/// The VLEK and, when present, its intermediate (ASVK) from an SNP certificate table, in
/// the order the evidence carries them. Refuses a table without a VLEK: AWS signs with one.
pub fn vlek_certs(auxblob: &[u8]) -> Result<Vec<Vec<u8>>, PlatformError> {
    let table = if auxblob.is_empty() {
        Vec::new()
    } else {
        asterism_tsm::parse_snp_cert_table(auxblob).map_err(PlatformError::CertTable)?
    };
    let take = |kind: CertKind| {
        table
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, der)| der.clone())
    };
    let Some(vlek) = take(CertKind::Vlek) else {
        return Err(PlatformError::NoVlek {
            found: table.iter().map(|(k, _)| *k).collect(),
        });
    };
    Ok(std::iter::once(vlek).chain(take(CertKind::Ask)).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn on_azure_trusted_launch_the_vtpms_own_ak_and_certificate_are_used() {
        let cloud: CloudVtpm = "azure-trusted-launch".parse().unwrap();
        assert_eq!(cloud, CloudVtpm::AzureTrustedLaunch);
        assert_eq!(cloud.to_string(), "azure-trusted-launch");
        let ak = CloudVtpm::azure_ak_config().unwrap();
        assert!(ak.provisioned, "never create or replace the cloud's AK");
        assert_eq!(ak.handle.raw(), AZURE_AK_HANDLE);
        assert_eq!(ak.algorithm, AkAlgorithm::Rsa2048);
        assert_eq!(AZURE_AK_CERT_NV_INDEX, 0x01c1_01d0);
        let gce: CloudVtpm = "gce".parse().unwrap();
        assert_eq!(gce, CloudVtpm::Gce);
        assert_eq!(gce.to_string(), "gce");
        assert!("gcp".parse::<CloudVtpm>().is_err());
    }

    #[test]
    fn on_azure_the_vtpms_own_ak_is_used_and_elsewhere_ours() {
        for azure in [CvmPlatform::AzureSevSnp, CvmPlatform::AzureTdx] {
            let ak = ak_config(Some(azure)).unwrap();
            assert!(ak.provisioned, "never create or replace the paravisor's AK");
            assert_eq!(ak.handle.raw(), AZURE_AK_HANDLE);
            assert_eq!(ak.algorithm, AkAlgorithm::Rsa2048);
        }
        for ours in [Some(CvmPlatform::AwsSevSnp), None] {
            assert_eq!(ak_config(ours).unwrap(), AkConfig::default());
        }
    }
}
