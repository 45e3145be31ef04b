//! Calling an [`Issuer`] from async code: the one place that knows a TPM quote blocks.
//!
//! Both the per-connection exchange and the session-key issuer produce evidence through
//! here, so neither needs the other.

use crate::AtlsError;
use asterism_attestation::{IssueError, Issuer, ReportData};
use std::sync::Arc;

/// Calls `issuer`, off the reactor when it blocks (a TPM quote).
pub(crate) async fn issue(
    issuer: Arc<dyn Issuer>,
    report_data: ReportData,
) -> Result<Vec<u8>, AtlsError> {
    if issuer.blocks() {
        let variant = issuer.variant();
        tokio::task::spawn_blocking(move || issuer.issue(&report_data))
            .await
            .map_err(|e| IssueError {
                variant,
                message: "issuer task failed".into(),
                source: Some(Box::new(e)),
            })?
            .map_err(AtlsError::Issue)
    } else {
        issuer.issue(&report_data).map_err(AtlsError::Issue)
    }
}
