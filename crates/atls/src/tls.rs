//! rustls configuration for aTLS: TLS 1.3 only, ALPN `h2`, ephemeral self-signed
//! certificates that carry no trust (trust comes from the evidence exchange).

use crate::AtlsError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};
use std::sync::Arc;

/// Label of the TLS exporter (RFC 8446 §7.5) that binds evidence to the session.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-asterism-atls-v1";
/// Label of the TLS exporter handed to applications as the connection's channel binding
/// ([`crate::AtlsConnectInfo::channel_binding`]); another label than the evidence's, so the
/// two values are independent.
pub const CHANNEL_BINDING_LABEL: &[u8] = b"EXPORTER-asterism-channel-binding-v1";
/// ALPN protocol negotiated on every aTLS connection.
pub const ALPN_H2: &[u8] = b"h2";

/// ring's provider, with ChaCha20-Poly1305 first among the cipher suites. Both ends of an
/// aTLS connection are ours, so the first suite is the one used: a 256-bit key, as
/// AES-256-GCM has, and a SHA-256 key schedule where AES-256-GCM's is SHA-384. The key
/// schedule and the two exporters hash on every connection; SHA-256 runs on the SHA
/// extensions where the CPU has them, SHA-384 never does (docs/performance.md). Only
/// suites with 256-bit keys are offered.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    Arc::new(CryptoProvider {
        cipher_suites: vec![TLS13_CHACHA20_POLY1305_SHA256, TLS13_AES_256_GCM_SHA384],
        ..rustls::crypto::ring::default_provider()
    })
}

/// A fresh ECDSA P-256 key and a self-signed certificate for it.
///
/// One identity serves a whole acceptor or connector: the certificate is not what the
/// peer trusts, so reusing it across connections loses nothing, while the exporter (and
/// with it the evidence binding) is still fresh per connection.
fn ephemeral_identity() -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), AtlsError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| AtlsError::Config(format!("generating the ephemeral TLS key: {e}")))?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "asterism-atls");
    let cert = params
        .self_signed(&key)
        .map_err(|e| AtlsError::Config(format!("self-signing the ephemeral certificate: {e}")))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((cert.der().clone(), key))
}

/// The server side: TLS 1.3 only, ALPN `h2`, no client certificates, no resumption.
pub(crate) fn server_config() -> Result<ServerConfig, AtlsError> {
    let (cert, key) = ephemeral_identity()?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(AtlsError::Tls)?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .map_err(AtlsError::Tls)?;
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    // Every connection runs a full handshake, so every session has its own exporter.
    cfg.send_tls13_tickets = 0;
    cfg.max_early_data_size = 0;
    Ok(cfg)
}

/// The client side: TLS 1.3 only, ALPN `h2`, any server certificate accepted *as a
/// certificate* (its TLS signature is still checked); trust comes from the evidence.
pub(crate) fn client_config() -> Result<ClientConfig, AtlsError> {
    let provider = provider();
    let verifier = Arc::new(CertCarriesNoTrust {
        algs: provider.signature_verification_algorithms,
    });
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(AtlsError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    cfg.enable_sni = false;
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(cfg)
}

/// The name the client hands rustls; with SNI off it never goes on the wire.
pub(crate) fn server_name() -> ServerName<'static> {
    ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())
}

/// Accepts any server certificate but still checks the handshake signature made with its
/// key. Safe here only because the session is authenticated afterwards by evidence bound
/// to the TLS exporter: a man in the middle has a different exporter on each side.
#[derive(Debug)]
struct CertCarriesNoTrust {
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for CertCarriesNoTrust {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // TLS 1.2 is never negotiated (the config offers TLS 1.3 only).
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{ClientConnection, Connection, ServerConnection, SupportedCipherSuite};

    /// Moves every record `from` has to send into `to`; whether there was any.
    fn deliver(from: &mut Connection, to: &mut Connection) -> Result<bool, rustls::Error> {
        let io = |e: std::io::Error| rustls::Error::General(e.to_string());
        let mut wire = Vec::new();
        let mut moved = false;
        while from.wants_write() {
            wire.clear();
            from.write_tls(&mut wire).map_err(io)?;
            to.read_tls(&mut wire.as_slice()).map_err(io)?;
            to.process_new_packets()?;
            moved = true;
        }
        Ok(moved)
    }

    /// Runs a handshake in memory; the suite both ends settled on, or the first error.
    fn handshake(
        client: ClientConfig,
        server: ServerConfig,
    ) -> Result<SupportedCipherSuite, rustls::Error> {
        let mut c = Connection::from(ClientConnection::new(Arc::new(client), server_name())?);
        let mut s = Connection::from(ServerConnection::new(Arc::new(server))?);
        while c.is_handshaking() || s.is_handshaking() {
            let moved = deliver(&mut c, &mut s)? | deliver(&mut s, &mut c)?;
            if !moved {
                return Err(rustls::Error::General("the handshake stalled".into()));
            }
        }
        assert_eq!(c.negotiated_cipher_suite(), s.negotiated_cipher_suite());
        c.negotiated_cipher_suite()
            .ok_or_else(|| rustls::Error::General("no suite".into()))
    }

    #[test]
    fn atls_connections_use_chacha20_poly1305_with_its_sha256_key_schedule() {
        let suite = handshake(client_config().unwrap(), server_config().unwrap()).unwrap();
        assert_eq!(
            suite.suite(),
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
        );
    }

    #[test]
    fn the_server_refuses_a_client_that_offers_only_a_128_bit_suite() {
        let provider = Arc::new(CryptoProvider {
            cipher_suites: vec![rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256],
            ..rustls::crypto::ring::default_provider()
        });
        let algs = provider.signature_verification_algorithms;
        let mut weak = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(CertCarriesNoTrust { algs }))
            .with_no_client_auth();
        weak.alpn_protocols = vec![ALPN_H2.to_vec()];
        let error = handshake(weak, server_config().unwrap()).unwrap_err();
        assert!(
            matches!(
                error,
                rustls::Error::PeerIncompatible(rustls::PeerIncompatible::NoCipherSuitesInCommon)
            ),
            "{error:?}"
        );
    }
}
