//! Certificates for the cluster tests over TLS, made at run time (rcgen): a CA, etcd's server
//! certificate for 127.0.0.1 signed by it, a client certificate signed by it (with a
//! Common Name, and one without: what etcd's gateway needs when authentication is on
//! too), and a second, unrelated CA, written as PEM files into a directory removed on
//! drop.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

/// The files of one test's PKI.
#[derive(Debug)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }
    /// A client certificate without a Common Name (subject O=nvmf-qos only).
    pub fn client_no_cn_cert(&self) -> PathBuf {
        self.dir.join("client-no-cn.pem")
    }
    pub fn client_no_cn_key(&self) -> PathBuf {
        self.dir.join("client-no-cn.key")
    }
    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }
    /// A client certificate signed by the other CA.
    pub fn stranger_cert(&self) -> PathBuf {
        self.dir.join("stranger.pem")
    }
    pub fn stranger_key(&self) -> PathBuf {
        self.dir.join("stranger.key")
    }

    pub fn new(name: &str) -> Pki {
        let dir =
            std::env::temp_dir().join(format!("nvmf-qos-it-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        let ca = make_ca("nvmf-qos test CA");
        let other = make_ca("some other CA");
        write(&pki.ca(), &ca.pem());
        write(&pki.other_ca(), &other.pem());
        let leaf = |cn: &str, sans: Vec<String>, usage, issuer: &CertifiedIssuer<KeyPair>| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(sans).unwrap();
            p.distinguished_name = DistinguishedName::new();
            if cn.is_empty() {
                p.distinguished_name
                    .push(DnType::OrganizationName, "nvmf-qos");
            } else {
                p.distinguished_name.push(DnType::CommonName, cn);
            }
            p.extended_key_usages = usage;
            let cert = p.signed_by(&key, issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (cert, key) = leaf(
            "etcd",
            vec!["127.0.0.1".into(), "localhost".into()],
            // etcd's gateway dials etcd's gRPC port with the server's certificate as
            // its client certificate: under --client-cert-auth it needs clientAuth too.
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            &ca,
        );
        write(&pki.server_cert(), &cert);
        write(&pki.server_key(), &key);
        let (cert, key) = leaf(
            "agent",
            vec![],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &ca,
        );
        write(&pki.client_cert(), &cert);
        write(&pki.client_key(), &key);
        let (cert, key) = leaf("", vec![], vec![ExtendedKeyUsagePurpose::ClientAuth], &ca);
        write(&pki.client_no_cn_cert(), &cert);
        write(&pki.client_no_cn_key(), &key);
        let (cert, key) = leaf(
            "stranger",
            vec![],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &other,
        );
        write(&pki.stranger_cert(), &cert);
        write(&pki.stranger_key(), &key);
        pki
    }
}

fn make_ca(cn: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, cn);
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
