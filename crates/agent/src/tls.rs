//! TLS: the agent's self-signed certificate and the client's pin of its fingerprint.
//!
//! Pinning rather than mutual TLS: the token already authenticates the client, so the
//! client only has to know it talks to the right agent. The fingerprint the agent prints
//! at start is public (it can go on a command line), needs no CA, and a new one after a
//! restart is visible rather than silently trusted.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The name the certificate carries and the client asks for.
pub const SERVER_NAME: &str = "lagtrace-agent";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `sha256:` and the lowercase hex of the SHA-256 of a DER certificate.
pub fn fingerprint(der: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, der);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Parses a fingerprint as printed by the agent (`sha256:` optional, `:` separators and
/// case ignored).
pub fn parse_fingerprint(s: &str) -> Result<[u8; 32], String> {
    let t = s.trim();
    let t = t
        .strip_prefix("sha256:")
        .or_else(|| t.strip_prefix("SHA256:"))
        .unwrap_or(t);
    let hex: String = t.chars().filter(|c| *c != ':').collect();
    let bad = || format!("{s:?}: expected the agent's fingerprint, sha256: and 64 hex digits");
    if hex.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
            .map_err(|_| bad())?;
    }
    Ok(out)
}

/// A fresh self-signed identity: the server config and its fingerprint.
pub fn server_identity() -> Result<(Arc<rustls::ServerConfig>, String), String> {
    let ck = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
        .map_err(|e| format!("certificate: {e}"))?;
    let der = ck.cert.der().clone();
    let fp = fingerprint(&der);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .map_err(|e| format!("TLS: {e}"))?;
    Ok((Arc::new(cfg), fp))
}

/// Accepts exactly the certificate whose SHA-256 is the pin (signatures still checked).
#[derive(Debug)]
struct Pinned {
    pin: [u8; 32],
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let d = ring::digest::digest(&ring::digest::SHA256, end_entity.as_ref());
        if d.as_ref() == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the agent's certificate does not match the pinned fingerprint".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
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

/// The client's config, trusting only the pinned certificate.
pub fn client_config(pin: [u8; 32]) -> Result<Arc<rustls::ClientConfig>, String> {
    let p = provider();
    let algs = p.signature_verification_algorithms;
    let cfg = rustls::ClientConfig::builder_with_provider(p)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned { pin, algs }))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip_and_bad_ones_fail() {
        let fp = fingerprint(b"abc");
        assert_eq!(
            fp,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let raw = parse_fingerprint(&fp).unwrap();
        assert_eq!(raw[0], 0xba);
        assert_eq!(
            parse_fingerprint(&fp.to_uppercase().replace("SHA256:", "")).unwrap(),
            raw
        );
        assert!(parse_fingerprint("sha256:abcd").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }
}
