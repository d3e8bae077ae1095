//! How the agent reaches etcd: the client URL's scheme, the TLS files (the CA that
//! signed etcd's certificate, and a client certificate and key for etcd's
//! `--client-cert-auth`) and the user name and password of etcd's authentication, checked
//! and turned into an HTTP client before the first call, so a wrong path or a missing
//! file is reported by name at start-up rather than as a failed call later.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// Where etcd is and how to prove who we are to it.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// etcd's client URL, `http://...` or `https://...`; several members' URLs
    /// separated by commas (see [`endpoints`]).
    pub endpoint: String,
    pub timeout: Duration,
    /// PEM file of the CA that signed etcd's server certificate (`https://` only).
    pub ca: Option<PathBuf>,
    /// PEM client certificate and its private key, for an etcd started with
    /// `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// etcd user name; its password is read from `password_file`.
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// An etcd user's name and password (the gateway's `/v3/auth/authenticate`).
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

// Never print the password, also not in a `{:?}` of the options.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What is wrong with the options, found before any call to etcd.
#[derive(Debug, Error)]
pub enum ConnectError {
    #[error(
        "--etcd {0}: give etcd's client URL starting with http:// or https:// (as in etcd's --advertise-client-urls)"
    )]
    Scheme(String),
    #[error(
        "--etcd {0}: the members' URLs mix http:// and https://; an etcd cluster serves its clients one way: give them all the same scheme"
    )]
    MixedSchemes(String),
    #[error(
        "--etcd {endpoint} is http:// but {flag} was given: TLS needs an https:// URL (etcd started with --cert-file serves https only); use https://, or drop {flag}"
    )]
    TlsFileOverHttp {
        endpoint: String,
        flag: &'static str,
    },
    #[error(
        "--etcd {endpoint} is https:// and needs --etcd-ca FILE: the PEM certificate of the CA that signed etcd's server certificate (what etcd's clients give as --cacert)"
    )]
    NoCa { endpoint: String },
    #[error("cannot read {flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{flag} {path} holds no PEM certificate ({detail}): give the certificate in PEM (a -----BEGIN CERTIFICATE----- block)"
    )]
    NoCertificate {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "--etcd-key {path} holds no PEM private key ({detail}): give the client certificate's key in PEM (-----BEGIN PRIVATE KEY----- or ... RSA/EC PRIVATE KEY)"
    )]
    NoKey { path: PathBuf, detail: String },
    #[error(
        "--etcd-cert and --etcd-key go together: give both (the client certificate and its key) or neither"
    )]
    HalfClientIdentity,
    #[error("--etcd-cert {cert} and --etcd-key {key} do not make a TLS client identity: {source}")]
    BadIdentity {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error(
        "--etcd-user needs its password: --etcd-password-file FILE (or NVMF_QOS_ETCD_PASSWORD_FILE), a file holding the password on its first line"
    )]
    NoPassword,
    #[error("--etcd-password-file was given without --etcd-user: name the etcd user too")]
    NoUser,
}

/// The members' URLs of `--etcd` (`https://10.0.0.1:2379,https://10.0.0.2:2379`, one
/// or more, separated by commas), without trailing slashes; each checked for its scheme,
/// all of one scheme.
pub fn endpoints(list: &str) -> Result<Vec<String>, ConnectError> {
    let urls: Vec<String> = list
        .split(',')
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(ConnectError::Scheme(list.into()));
    }
    let mut tls = None;
    for u in &urls {
        let this = if u.starts_with("https://") {
            true
        } else if u.starts_with("http://") {
            false
        } else {
            return Err(ConnectError::Scheme(u.clone()));
        };
        if tls.is_some_and(|t| t != this) {
            return Err(ConnectError::MixedSchemes(list.into()));
        }
        tls = Some(this);
    }
    Ok(urls)
}

/// Whether the endpoints are `https://` (after checking them, see [`endpoints`]).
pub fn is_tls(endpoint: &str) -> Result<bool, ConnectError> {
    Ok(endpoints(endpoint)?[0].starts_with("https://"))
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::Read {
        flag,
        path: path.into(),
        source,
    })
}

fn certificates(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ConnectError> {
    let bytes = read(flag, path)?;
    let no_cert = |detail: String| ConnectError::NoCertificate {
        flag,
        path: path.into(),
        detail,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| no_cert(e.to_string()))?;
    if certs.is_empty() {
        return Err(no_cert("none found".into()));
    }
    Ok(certs)
}

/// The HTTP client for `opts`: plain for `http://`, TLS trusting only the CA of
/// `--etcd-ca` (and presenting the client certificate, if given) for `https://`.
pub fn http_agent(opts: &EtcdOptions) -> Result<ureq::Agent, ConnectError> {
    let tls = is_tls(&opts.endpoint)?;
    let builder = ureq::AgentBuilder::new().timeout(opts.timeout);
    if !tls {
        for (flag, given) in [
            ("--etcd-ca", opts.ca.is_some()),
            ("--etcd-cert", opts.cert.is_some()),
            ("--etcd-key", opts.key.is_some()),
        ] {
            if given {
                return Err(ConnectError::TlsFileOverHttp {
                    endpoint: opts.endpoint.clone(),
                    flag,
                });
            }
        }
        return Ok(builder.build());
    }
    let Some(ca) = &opts.ca else {
        return Err(ConnectError::NoCa {
            endpoint: opts.endpoint.clone(),
        });
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates("--etcd-ca", ca)? {
        roots.add(cert).map_err(|e| ConnectError::NoCertificate {
            flag: "--etcd-ca",
            path: ca.clone(),
            detail: e.to_string(),
        })?;
    }
    // One crypto provider named here, not a process-wide default: ring, as ureq uses.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots);
    let config = match (&opts.cert, &opts.key) {
        (None, None) => config.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = certificates("--etcd-cert", cert)?;
            let key_der =
                PrivateKeyDer::from_pem_slice(&read("--etcd-key", key)?).map_err(|e| {
                    ConnectError::NoKey {
                        path: key.clone(),
                        detail: e.to_string(),
                    }
                })?;
            config
                .with_client_auth_cert(chain, key_der)
                .map_err(|source| ConnectError::BadIdentity {
                    cert: cert.clone(),
                    key: key.clone(),
                    source,
                })?
        }
        _ => return Err(ConnectError::HalfClientIdentity),
    };
    Ok(builder.tls_config(Arc::new(config)).build())
}

/// The credentials of `opts`, the password read from its file (first line, without its
/// line end, so `echo secret > file` works).
pub fn credentials(opts: &EtcdOptions) -> Result<Option<Credentials>, ConnectError> {
    match (&opts.user, &opts.password_file) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(ConnectError::NoPassword),
        (None, Some(_)) => Err(ConnectError::NoUser),
        (Some(user), Some(path)) => {
            let text = read("--etcd-password-file", path)?;
            let text = String::from_utf8_lossy(&text);
            let password = text.lines().next().unwrap_or("").to_string();
            Ok(Some(Credentials {
                user: user.clone(),
                password,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(endpoint: &str) -> EtcdOptions {
        EtcdOptions {
            endpoint: endpoint.into(),
            timeout: Duration::from_millis(100),
            ..Default::default()
        }
    }

    #[test]
    fn the_scheme_and_the_tls_files_must_agree() {
        let e = http_agent(&opts("127.0.0.1:2379")).unwrap_err();
        assert!(e.to_string().contains("http:// or https://"), "{e}");
        let e = http_agent(&opts("https://127.0.0.1:2379")).unwrap_err();
        assert!(e.to_string().contains("needs --etcd-ca"), "{e}");
        let mut o = opts("http://127.0.0.1:2379");
        o.ca = Some("/etc/ca.pem".into());
        let e = http_agent(&o).unwrap_err();
        assert!(e.to_string().contains("use https://"), "{e}");
        let e = http_agent(&opts("http://127.0.0.1:2379,https://127.0.0.1:2380")).unwrap_err();
        assert!(e.to_string().contains("mix http:// and https://"), "{e}");
        let e = http_agent(&opts("http://127.0.0.1:2379,127.0.0.1:2380")).unwrap_err();
        assert!(e.to_string().contains("--etcd 127.0.0.1:2380"), "{e}");
        assert_eq!(
            endpoints(" http://a:1/, http://b:2 ,").unwrap(),
            ["http://a:1", "http://b:2"]
        );
        assert!(endpoints(",").is_err());
    }

    #[test]
    fn a_missing_or_wrong_file_is_named() {
        let mut o = opts("https://127.0.0.1:2379");
        o.ca = Some("/nonexistent/ca.pem".into());
        let e = http_agent(&o).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot read --etcd-ca /nonexistent/ca.pem"),
            "{e}"
        );
        // A file that is not PEM (the crate's manifest).
        o.ca = Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
        let e = http_agent(&o).unwrap_err();
        assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
    }

    #[test]
    fn a_user_needs_a_password_file_and_its_first_line_is_the_password() {
        let mut o = opts("http://127.0.0.1:2379");
        o.user = Some("agent".into());
        assert!(matches!(credentials(&o), Err(ConnectError::NoPassword)));
        let f = std::env::temp_dir().join(format!("nvmf-qos-pw-{}", std::process::id()));
        std::fs::write(&f, "s3cret\n").unwrap();
        o.password_file = Some(f.clone());
        let c = credentials(&o).unwrap().unwrap();
        std::fs::remove_file(&f).unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("agent", "s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
