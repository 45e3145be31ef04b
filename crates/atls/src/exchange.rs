//! The evidence exchange that runs on a fresh TLS 1.3 connection before HTTP/2.

use crate::wire::{self, Hello, VerdictCode};
use crate::{AtlsConfig, AtlsError, VerifiedPeer};
use asterism_attestation::{ReportData, Role};
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// Runs the exchange for `role` on `stream`, whose TLS exporter value is `exporter`.
///
/// Returns the verified peer when this side verifies, `None` when it does not.
/// On error the caller drops (closes) the connection.
pub(crate) async fn run<S>(
    stream: &mut S,
    role: Role,
    exporter: &[u8; 32],
    cfg: &AtlsConfig,
    remote_addr: Option<SocketAddr>,
) -> Result<Option<VerifiedPeer>, AtlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let requires = !cfg.validators.is_empty();
    let mut flags = 0;
    if cfg.issuer.is_some() {
        flags |= wire::FLAG_SENDS_EVIDENCE;
    }
    if requires {
        flags |= wire::FLAG_REQUIRES_EVIDENCE;
    }
    let hello = Hello {
        version: wire::VERSION,
        flags,
    };

    // Sending and receiving run concurrently: issuing evidence may take a TPM round trip,
    // and two large evidence frames must not wait on each other's socket buffers.
    let (mut rd, mut wr) = tokio::io::split(&mut *stream);
    let send = async {
        let mut out = Vec::new();
        wire::encode_hello(&mut out, hello)?;
        if let Some(issuer) = &cfg.issuer {
            let report_data = ReportData::atls(role, exporter);
            let evidence = issue(issuer.clone(), report_data).await?;
            wire::encode_evidence(&mut out, issuer.variant(), &evidence)?;
        }
        wr.write_all(&out).await.map_err(AtlsError::Io)?;
        wr.flush().await.map_err(AtlsError::Io)?;
        Ok::<_, AtlsError>(())
    };
    let recv = async {
        let peer = wire::read_hello(&mut rd).await?;
        if peer.version != wire::VERSION {
            return Err(AtlsError::UnsupportedVersion(peer.version));
        }
        if peer.requires_evidence() && cfg.issuer.is_none() {
            return Err(AtlsError::NoIssuer);
        }
        if requires && !peer.sends_evidence() {
            return Err(AtlsError::EvidenceRequired);
        }
        let verified = if peer.sends_evidence() {
            let frame = wire::read_evidence(&mut rd, cfg.max_frame_len).await?;
            if requires {
                Some(verify(cfg, role, exporter, &frame, remote_addr)?)
            } else {
                // This side does not verify: the evidence is read to keep the stream in
                // step and then dropped unexamined.
                None
            }
        } else {
            None
        };
        Ok((peer, verified))
    };
    let (sent, received) = tokio::join!(send, recv);
    drop((rd, wr));
    sent?;

    let (peer_hello, verified) = match received {
        Ok(r) => r,
        Err(e) => {
            // Tell a peer that waits for our verdict why; best effort, then close.
            if requires {
                let (code, reason) = e.verdict();
                let _ = send_verdict(stream, code, &reason).await;
            }
            return Err(e);
        }
    };
    if requires {
        send_verdict(stream, VerdictCode::Accepted, "").await?;
    }
    if peer_hello.requires_evidence() {
        let verdict = wire::read_verdict(stream).await?;
        if verdict.code != VerdictCode::Accepted {
            return Err(AtlsError::RefusedByPeer {
                code: verdict.code,
                reason: verdict.reason,
            });
        }
    }
    Ok(verified)
}

async fn issue(
    issuer: std::sync::Arc<dyn asterism_attestation::Issuer>,
    report_data: ReportData,
) -> Result<Vec<u8>, AtlsError> {
    if issuer.blocks() {
        let variant = issuer.variant();
        tokio::task::spawn_blocking(move || issuer.issue(&report_data))
            .await
            .map_err(|e| asterism_attestation::IssueError {
                variant,
                message: "issuer task failed".into(),
                source: Some(Box::new(e)),
            })?
            .map_err(AtlsError::Issue)
    } else {
        issuer.issue(&report_data).map_err(AtlsError::Issue)
    }
}

fn verify(
    cfg: &AtlsConfig,
    role: Role,
    exporter: &[u8; 32],
    frame: &wire::EvidenceFrame,
    remote_addr: Option<SocketAddr>,
) -> Result<VerifiedPeer, AtlsError> {
    let validator = cfg
        .validators
        .iter()
        .find(|v| v.variant() == frame.variant)
        .ok_or_else(|| AtlsError::UnknownVariant(frame.variant.clone()))?;
    // The peer attests in its own role: the opposite of ours.
    let expected = ReportData::atls(role.peer(), exporter);
    match validator.validate(&frame.evidence, &expected) {
        Ok(evidence) => {
            tracing::info!(
                variant = evidence.variant(),
                identity = evidence.identity(),
                peer = ?remote_addr,
                "peer evidence verified"
            );
            Ok(VerifiedPeer {
                evidence,
                remote_addr,
            })
        }
        Err(e) => {
            tracing::warn!(variant = %frame.variant, peer = ?remote_addr, error = %e, "peer evidence rejected");
            Err(AtlsError::Rejected(e))
        }
    }
}

async fn send_verdict<S: AsyncWrite + Unpin>(
    stream: &mut S,
    code: VerdictCode,
    reason: &str,
) -> Result<(), AtlsError> {
    let mut out = Vec::new();
    wire::encode_verdict(&mut out, code, reason)?;
    stream.write_all(&out).await.map_err(AtlsError::Io)?;
    stream.flush().await.map_err(AtlsError::Io)
}
