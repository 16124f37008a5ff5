//! TLS and SASL for rill's own Kafka connections (the streams group coordinator's,
//! [`super::streams_group`]), from the same `kafka.*` settings librdkafka honours for the rest of
//! rill, so that `group.protocol=streams` works against a secured broker.
//!
//! What is supported, and how it maps onto librdkafka's settings:
//!
//! - `kafka.security.protocol`: `plaintext`, `ssl`, `sasl_plaintext`, `sasl_ssl` (any case).
//! - TLS: the broker's certificate is verified against `kafka.ssl.ca.location` (a PEM file or a
//!   directory of hashed certificates; unset: the system's trust store), and its name against
//!   the host connected to unless `kafka.ssl.endpoint.identification.algorithm=none`;
//!   `kafka.enable.ssl.certificate.verification=false` turns verification off, as in librdkafka.
//! - SASL (`SaslHandshake` v1, then `SaslAuthenticate` v2): `kafka.sasl.mechanism` (or
//!   librdkafka's alias `kafka.sasl.mechanisms`) `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`
//!   (RFC 5802/7677: the server's signature is checked too), with `kafka.sasl.username` and
//!   `kafka.sasl.password`.
//!
//! Anything else that changes how a connection is secured (client certificates, GSSAPI,
//! OAUTHBEARER, inline PEM) is refused at startup with the key named
//! ([`WireSecurity::from_kafka`]), rather than connecting in a way the broker would refuse.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use base64::Engine as _;
use openssl::hash::MessageDigest;
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};

/// The fewest PBKDF2 iterations a SCRAM server may ask for (Kafka's own minimum): fewer would
/// let a rogue server make the proof cheap to brute-force.
const SCRAM_MIN_ITERATIONS: u32 = 4096;

/// Settings this client refuses because it cannot honour them (librdkafka names).
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "ssl.certificate.location",
        "client certificates (mutual TLS)",
    ),
    ("ssl.key.location", "client certificates (mutual TLS)"),
    ("ssl.certificate.pem", "client certificates (mutual TLS)"),
    ("ssl.key.pem", "client certificates (mutual TLS)"),
    ("ssl.keystore.location", "client certificates (mutual TLS)"),
    (
        "ssl.ca.pem",
        "an inline CA (use kafka.ssl.ca.location with a file)",
    ),
    ("sasl.oauthbearer.config", "OAUTHBEARER"),
];

/// Why the security settings cannot be used, or a secured connection failed.
#[derive(Debug, thiserror::Error)]
pub enum WireSecurityError {
    /// A setting this client cannot honour.
    #[error("config key `kafka.{key}` = `{value}`: {expected}")]
    Unsupported {
        /// The librdkafka key (without `kafka.`).
        key: String,
        /// The value given (never a secret).
        value: String,
        /// What is supported instead.
        expected: String,
    },
    /// A SASL credential is missing.
    #[error("config key `kafka.{0}` is required with SASL (kafka.security.protocol=sasl_*)")]
    Missing(&'static str),
    /// The TLS settings could not be loaded (the CA file, most often).
    #[error("config key `kafka.{key}` = `{value}`: cannot load it: {detail}")]
    Tls {
        /// The key.
        key: &'static str,
        /// The value given.
        value: String,
        /// What OpenSSL said.
        detail: String,
    },
}

impl WireSecurityError {
    /// The config key at fault (with `kafka.`), its value and what it takes.
    pub fn key_value_expected(&self) -> (String, String, String) {
        match self {
            WireSecurityError::Unsupported {
                key,
                value,
                expected,
            } => (format!("kafka.{key}"), value.clone(), expected.clone()),
            WireSecurityError::Missing(key) => (
                format!("kafka.{key}"),
                String::new(),
                "a value with SASL (kafka.security.protocol=sasl_plaintext or sasl_ssl)".into(),
            ),
            WireSecurityError::Tls { key, value, detail } => (
                format!("kafka.{key}"),
                value.clone(),
                format!("a readable PEM file (or directory) of CA certificates: {detail}"),
            ),
        }
    }
}

/// A SASL mechanism this client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// `PLAIN`: the password in the clear (inside TLS, one hopes).
    Plain,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
}

impl Mechanism {
    /// Its name on the wire and in `sasl.mechanism`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    fn digest(self) -> MessageDigest {
        match self {
            Mechanism::ScramSha512 => MessageDigest::sha512(),
            _ => MessageDigest::sha256(),
        }
    }
}

/// SASL credentials (the password never printed).
#[derive(Clone)]
pub struct Sasl {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// `sasl.username`.
    pub username: String,
    password: String,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .finish()
    }
}

/// TLS as configured: the connector (trust store loaded) and whether names are checked.
#[derive(Clone)]
struct Tls {
    connector: SslConnector,
    verify_hostname: bool,
}

/// How rill's own connections to brokers are secured.
#[derive(Clone, Default)]
pub struct WireSecurity {
    tls: Option<Tls>,
    sasl: Option<Sasl>,
}

impl std::fmt::Debug for WireSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireSecurity")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

/// A connection, in the clear or inside TLS.
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<SslStream<TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// librdkafka's spellings of `false`.
fn is_false(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "false" | "f" | "0")
}

impl WireSecurity {
    /// Plain TCP, no authentication.
    pub fn plaintext() -> Self {
        Self::default()
    }

    /// The security `kafka` (the `kafka.*` settings, without the prefix) asks for; an error
    /// names the key this client cannot honour or load.
    pub fn from_kafka(kafka: &BTreeMap<String, String>) -> Result<Self, WireSecurityError> {
        let get = |k: &str| kafka.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let protocol = get("security.protocol").unwrap_or("plaintext");
        let (tls, sasl) = match protocol.to_ascii_lowercase().as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            _ => {
                return Err(WireSecurityError::Unsupported {
                    key: "security.protocol".into(),
                    value: protocol.into(),
                    expected: "plaintext, ssl, sasl_plaintext or sasl_ssl".into(),
                })
            }
        };
        for (key, what) in UNSUPPORTED {
            if get(key).is_some() {
                return Err(WireSecurityError::Unsupported {
                    key: (*key).into(),
                    value: if key.contains("pem") || key.contains("key") {
                        "[redacted]".into()
                    } else {
                        kafka[*key].clone()
                    },
                    expected: format!(
                        "unset with group.protocol=streams: rill's streams group client does not support {what} yet"
                    ),
                });
            }
        }
        let sasl = match sasl {
            false => None,
            true => {
                let (key, name) = match get("sasl.mechanism") {
                    Some(m) => ("sasl.mechanism", m),
                    None => (
                        "sasl.mechanisms",
                        get("sasl.mechanisms").unwrap_or("GSSAPI"),
                    ),
                };
                let mechanism = match name.to_ascii_uppercase().as_str() {
                    "PLAIN" => Mechanism::Plain,
                    "SCRAM-SHA-256" => Mechanism::ScramSha256,
                    "SCRAM-SHA-512" => Mechanism::ScramSha512,
                    _ => {
                        return Err(WireSecurityError::Unsupported {
                            key: key.into(),
                            value: name.into(),
                            expected: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with group.protocol=streams (librdkafka's default, GSSAPI, is not supported by rill's streams group client)".into(),
                        })
                    }
                };
                Some(Sasl {
                    mechanism,
                    username: get("sasl.username")
                        .ok_or(WireSecurityError::Missing("sasl.username"))?
                        .to_string(),
                    // A password is taken as given: spaces may be part of it.
                    password: kafka
                        .get("sasl.password")
                        .filter(|p| !p.is_empty())
                        .ok_or(WireSecurityError::Missing("sasl.password"))?
                        .clone(),
                })
            }
        };
        let tls = match tls {
            false => None,
            true => Some(Self::tls(kafka)?),
        };
        Ok(WireSecurity { tls, sasl })
    }

    fn tls(kafka: &BTreeMap<String, String>) -> Result<Tls, WireSecurityError> {
        let get = |k: &str| kafka.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let failed = |key: &'static str, value: &str, e: openssl::error::ErrorStack| {
            WireSecurityError::Tls {
                key,
                value: value.to_string(),
                detail: e.to_string(),
            }
        };
        let mut builder = SslConnector::builder(SslMethod::tls_client())
            .map_err(|e| failed("security.protocol", "ssl", e))?;
        if let Some(ca) = get("ssl.ca.location") {
            let path = Path::new(ca);
            if !path.exists() {
                return Err(WireSecurityError::Tls {
                    key: "ssl.ca.location",
                    value: ca.to_string(),
                    detail: "no such file or directory".into(),
                });
            }
            let (file, dir) = match path.is_dir() {
                true => (None, Some(path)),
                false => (Some(path), None),
            };
            builder
                .load_verify_locations(file, dir)
                .map_err(|e| failed("ssl.ca.location", ca, e))?;
        }
        let verify = !get("enable.ssl.certificate.verification").is_some_and(is_false);
        if !verify {
            builder.set_verify(SslVerifyMode::NONE);
        }
        let verify_hostname = verify
            && !get("ssl.endpoint.identification.algorithm")
                .is_some_and(|v| v.eq_ignore_ascii_case("none"));
        Ok(Tls {
            connector: builder.build(),
            verify_hostname,
        })
    }

    /// The SASL credentials, when SASL is on.
    pub fn sasl(&self) -> Option<&Sasl> {
        self.sasl.as_ref()
    }

    /// `tcp` to `host`, inside TLS when TLS is on (the handshake done); an error says why the
    /// handshake failed.
    pub fn wrap(&self, tcp: TcpStream, host: &str) -> Result<Stream, String> {
        let Some(tls) = &self.tls else {
            return Ok(Stream::Plain(tcp));
        };
        let config = tls
            .connector
            .configure()
            .map_err(|e| e.to_string())?
            .verify_hostname(tls.verify_hostname);
        config
            .connect(host, tcp)
            .map(|s| Stream::Tls(Box::new(s)))
            .map_err(|e| match e {
                openssl::ssl::HandshakeError::Failure(m) => {
                    let verify = m.ssl().verify_result();
                    match verify == openssl::x509::X509VerifyResult::OK {
                        true => m.error().to_string(),
                        false => format!("certificate verification failed: {verify}"),
                    }
                }
                other => other.to_string(),
            })
    }
}

/// Runs the SASL conversation of `sasl` (after the handshake named its mechanism):
/// `round_trip` sends one client message in a `SaslAuthenticate` and returns the server's.
/// An error says what failed (never the password).
pub fn authenticate(
    sasl: &Sasl,
    mut round_trip: impl FnMut(&[u8]) -> Result<Vec<u8>, String>,
) -> Result<(), String> {
    match sasl.mechanism {
        Mechanism::Plain => {
            let mut message = vec![0u8];
            message.extend_from_slice(sasl.username.as_bytes());
            message.push(0);
            message.extend_from_slice(sasl.password.as_bytes());
            round_trip(&message).map(|_| ())
        }
        Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
            let mut nonce = [0u8; 24];
            openssl::rand::rand_bytes(&mut nonce).map_err(|e| e.to_string())?;
            let nonce = base64::engine::general_purpose::STANDARD.encode(nonce);
            let mut scram = Scram::new(sasl, &nonce);
            let server_first = round_trip(scram.client_first().as_bytes())?;
            let server_first = String::from_utf8(server_first).map_err(|e| e.to_string())?;
            let client_final = scram.client_final(&server_first)?;
            let server_final = round_trip(client_final.as_bytes())?;
            scram.check_server_final(&String::from_utf8_lossy(&server_final))
        }
    }
}

/// One SCRAM conversation (RFC 5802), client side.
struct Scram<'a> {
    sasl: &'a Sasl,
    nonce: String,
    client_first_bare: String,
    /// The server's signature expected in its final message.
    server_signature: Option<Vec<u8>>,
}

impl<'a> Scram<'a> {
    fn new(sasl: &'a Sasl, nonce: &str) -> Self {
        // RFC 5802: `=` and `,` in a name are escaped.
        let user = sasl.username.replace('=', "=3D").replace(',', "=2C");
        Scram {
            sasl,
            nonce: nonce.to_string(),
            client_first_bare: format!("n={user},r={nonce}"),
            server_signature: None,
        }
    }

    fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Result<Vec<u8>, String> {
        let key = openssl::pkey::PKey::hmac(key).map_err(|e| e.to_string())?;
        let mut signer = openssl::sign::Signer::new(self.sasl.mechanism.digest(), &key)
            .map_err(|e| e.to_string())?;
        signer.update(data).map_err(|e| e.to_string())?;
        signer.sign_to_vec().map_err(|e| e.to_string())
    }

    /// The client's final message, from the server's first.
    fn client_final(&mut self, server_first: &str) -> Result<String, String> {
        let attr = |name: &str| {
            server_first
                .split(',')
                .find_map(|a| a.strip_prefix(name).and_then(|a| a.strip_prefix('=')))
        };
        if let Some(e) = attr("e") {
            return Err(format!("the server refused: {e}"));
        }
        let nonce = attr("r").ok_or("the server's first message has no nonce")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the server's nonce does not extend the client's".into());
        }
        let salt = attr("s")
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            .ok_or("the server's first message has no valid salt")?;
        let iterations: u32 = attr("i")
            .and_then(|i| i.parse().ok())
            .ok_or("the server's first message has no valid iteration count")?;
        if iterations < SCRAM_MIN_ITERATIONS {
            return Err(format!(
                "the server asks for {iterations} iterations, fewer than {SCRAM_MIN_ITERATIONS}"
            ));
        }
        let digest = self.sasl.mechanism.digest();
        let mut salted = vec![0u8; digest.size()];
        openssl::pkcs5::pbkdf2_hmac(
            self.sasl.password.as_bytes(),
            &salt,
            iterations as usize,
            digest,
            &mut salted,
        )
        .map_err(|e| e.to_string())?;
        let client_key = self.hmac(&salted, b"Client Key")?;
        let stored_key = openssl::hash::hash(digest, &client_key).map_err(|e| e.to_string())?;
        // "biws": base64 of the GS2 header "n,," (no channel binding).
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = self.hmac(&stored_key, auth_message.as_bytes())?;
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = self.hmac(&salted, b"Server Key")?;
        self.server_signature = Some(self.hmac(&server_key, auth_message.as_bytes())?);
        Ok(format!(
            "{without_proof},p={}",
            base64::engine::general_purpose::STANDARD.encode(proof)
        ))
    }

    /// Checks the server's final message: the server proves it knows the password too.
    fn check_server_final(&self, server_final: &str) -> Result<(), String> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(format!("the server refused: {e}"));
        }
        let got = server_final
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            .ok_or("the server's final message has no signature")?;
        match Some(got) == self.server_signature {
            true => Ok(()),
            false => {
                Err("the server's signature is wrong (not the broker it claims to be?)".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil".
    #[test]
    fn scram_sha_256_matches_the_rfc_7677_example() {
        let sasl = Sasl {
            mechanism: Mechanism::ScramSha256,
            username: "user".into(),
            password: "pencil".into(),
        };
        let mut scram = Scram::new(&sasl, "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(scram.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            scram.client_final(server_first).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        scram
            .check_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(scram
            .check_server_final("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .is_err());
    }

    #[test]
    fn a_server_that_lowers_iterations_or_drops_the_nonce_is_refused() {
        let sasl = Sasl {
            mechanism: Mechanism::ScramSha512,
            username: "u".into(),
            password: "p".into(),
        };
        let mut scram = Scram::new(&sasl, "abc");
        assert!(scram.client_final("r=abcdef,s=QQ==,i=1000").is_err());
        assert!(scram.client_final("r=xyz123,s=QQ==,i=4096").is_err());
        assert!(scram.client_final("e=unknown-user").is_err());
        assert!(scram.client_final("r=abcdef,s=QQ==,i=4096").is_ok());
    }

    #[test]
    fn plain_sends_the_name_and_password_separated_by_nul() {
        let security = WireSecurity::from_kafka(&kafka(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanisms", "PLAIN"),
            ("sasl.username", "alice"),
            ("sasl.password", "s3cret"),
        ]))
        .unwrap();
        let mut sent = Vec::new();
        authenticate(security.sasl().unwrap(), |m| {
            sent.push(m.to_vec());
            Ok(Vec::new())
        })
        .unwrap();
        assert_eq!(sent, vec![b"\0alice\0s3cret".to_vec()]);
        assert!(!format!("{security:?}").contains("s3cret"));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_naming_the_key() {
        let key = |pairs: &[(&str, &str)]| {
            WireSecurity::from_kafka(&kafka(pairs))
                .err()
                .map(|e| e.key_value_expected().0)
        };
        assert_eq!(key(&[]), None);
        assert_eq!(
            key(&[("security.protocol", "tls")]),
            Some("kafka.security.protocol".into())
        );
        assert_eq!(
            key(&[("security.protocol", "sasl_ssl")]),
            Some("kafka.sasl.mechanisms".into()),
            "librdkafka's default mechanism, GSSAPI, is not spoken"
        );
        assert_eq!(
            key(&[
                ("security.protocol", "sasl_plaintext"),
                ("sasl.mechanism", "OAUTHBEARER")
            ]),
            Some("kafka.sasl.mechanism".into())
        );
        assert_eq!(
            key(&[
                ("security.protocol", "sasl_plaintext"),
                ("sasl.mechanism", "PLAIN")
            ]),
            Some("kafka.sasl.username".into())
        );
        assert_eq!(
            key(&[("security.protocol", "ssl"), ("ssl.key.location", "/k.pem")]),
            Some("kafka.ssl.key.location".into())
        );
        assert_eq!(
            key(&[
                ("security.protocol", "ssl"),
                ("ssl.ca.location", "/no/such/ca.pem")
            ]),
            Some("kafka.ssl.ca.location".into())
        );
    }
}
