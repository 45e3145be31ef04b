//! The HCL report read from the vTPM's NV index, as on an Azure confidential VM: here an
//! swtpm stands in for the vTPM and the test plays the paravisor, writing a real HCL report
//! into NV index 0x01400001.
//!
//! swtpm caps an NV index at 2048 bytes, so the report written is the real Azure SEV-SNP one
//! (1820 bytes, header restored), zero-padded to 2048 as Azure pads its larger index; the
//! 2600-byte Azure TDX report does not fit in an swtpm index.

use std::io::Write as _;
use std::str::FromStr as _;

use asterism_attestation::hcl::{HCL_REPORT_NV_INDEX, HardwareKind, HclReport};
use asterism_testkit::Swtpm;
use asterism_tpm::{Tpm, TpmError};
use tss_esapi::Context;
use tss_esapi::abstraction::nv::NvOpenOptions;
use tss_esapi::attributes::NvIndexAttributesBuilder;
use tss_esapi::handles::NvIndexTpmHandle;
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::resource_handles::NvAuth;
use tss_esapi::interface_types::session_handles::AuthSession;
use tss_esapi::structures::NvPublicBuilder;
use tss_esapi::tcti_ldr::{NetworkTPMConfig, TctiNameConf};

const DATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../attestation/tests/data/cvm/snp-azure"
);

/// The largest NV index swtpm defines (TPM_PT_NV_INDEX_MAX).
const SWTPM_NV_INDEX_MAX: usize = 2048;

/// The real Azure SNP HCL report, whole.
fn snp_hcl_report() -> Vec<u8> {
    asterism_testkit::cvm::azure_snp_hcl_report().unwrap()
}

/// Defines an owner-read/write NV index of `data.len()` bytes and writes `data` into it,
/// over a connection of its own (closed before the code under test connects). The EK tests
/// use it to play a manufacturer that stores its CA certificates in NV.
pub(crate) fn paravisor_writes(swtpm: &Swtpm, index: u32, data: &[u8]) {
    let conf = NetworkTPMConfig::from_str(&format!("host=127.0.0.1,port={}", swtpm.port()));
    let mut ctx = Context::new(TctiNameConf::Swtpm(conf.unwrap())).unwrap();
    ctx.set_sessions((Some(AuthSession::Password), None, None));
    let attributes = NvIndexAttributesBuilder::new()
        .with_owner_write(true)
        .with_owner_read(true)
        .build()
        .unwrap();
    let public = NvPublicBuilder::new()
        .with_nv_index(NvIndexTpmHandle::new(index).unwrap())
        .with_index_name_algorithm(HashingAlgorithm::Sha256)
        .with_index_attributes(attributes)
        .with_data_area_size(data.len())
        .build()
        .unwrap();
    let mut nv = NvOpenOptions::NewIndex {
        nv_public: public,
        auth_handle: NvAuth::Owner,
    }
    .open(&mut ctx)
    .unwrap();
    nv.write_all(data).unwrap();
}

#[test]
fn reads_the_hcl_report_from_its_nv_index_whole_and_it_parses() {
    let swtpm = Swtpm::start().unwrap();
    let report = snp_hcl_report();
    let mut index = report.clone();
    index.resize(SWTPM_NV_INDEX_MAX, 0);
    paravisor_writes(&swtpm, HCL_REPORT_NV_INDEX, &index);

    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    // Two NV reads: swtpm's TPM_PT_NV_BUFFER_MAX is 1024.
    let read = tpm.read_hcl_report().unwrap();
    assert_eq!(read, index);

    let parsed = HclReport::parse(&read).unwrap();
    assert_eq!(parsed.kind(), HardwareKind::Snp);
    assert_eq!(
        parsed.runtime_data(),
        std::fs::read(format!("{DATA}/runtimedata.bin")).unwrap()
    );
    assert_eq!(
        parsed.hardware_report().unverified_report_data(),
        parsed.expected_report_data()
    );
}

#[test]
fn reads_any_nv_index_the_owner_may_read() {
    let swtpm = Swtpm::start().unwrap();
    let data: Vec<u8> = (0..1500u32).map(|i| (i % 251) as u8).collect();
    paravisor_writes(&swtpm, 0x0150_0000, &data);
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    assert_eq!(tpm.read_nv_index(0x0150_0000).unwrap(), data);
}

#[test]
fn a_tpm_without_an_hcl_report_says_so() {
    let swtpm = Swtpm::start().unwrap();
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let err = tpm.read_hcl_report().unwrap_err();
    assert!(
        matches!(err, TpmError::NvIndexNotDefined { index } if index == HCL_REPORT_NV_INDEX),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "NV index 0x01400001 is not defined");
}
