//! Opening a TPM: unsupported and unreachable TPMs fail with errors that say why.

use std::net::TcpListener;

use asterism_tpm::{Layer, Tpm, TpmConfig, TpmError};

#[test]
fn a_unix_socket_swtpm_is_refused_with_a_reason() {
    let config: TpmConfig = "swtpm:path=/nonexistent/swtpm.sock".parse().unwrap();
    let error = Tpm::open(&config).unwrap_err();
    assert!(matches!(error, TpmError::UnsupportedTcti { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("swtpm:path=/nonexistent/swtpm.sock")
    );
}

#[test]
fn nothing_listening_is_an_open_error_from_the_tcti_layer() {
    // A port that was free a moment ago: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = TpmConfig::swtpm_tcp("127.0.0.1", port).unwrap();
    let error = Tpm::open(&config).unwrap_err();
    let TpmError::Open { tcti, code } = &error else {
        panic!("expected an open error, got {error}");
    };
    assert_eq!(tcti, &config.to_string());
    assert_eq!(code.layer(), Layer::Tcti, "{code}");
    assert!(
        code.name().is_some_and(|n| n.starts_with("TSS2_TCTI_RC_")),
        "{code}"
    );
}

#[test]
fn a_missing_device_is_an_open_error() {
    let config = TpmConfig::device("/nonexistent/tpmrm0").unwrap();
    let error = Tpm::open(&config).unwrap_err();
    assert!(matches!(error, TpmError::Open { .. }), "{error}");
}
