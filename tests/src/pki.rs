//! Certificates for the TLS tests, made at run time (rcgen): one CA signs a server's
//! certificate (for its address) and a client certificate; a second CA, which signed nothing
//! the server shows or trusts, is the "wrong CA" of the error tests. For a secured etcd (the
//! fleet tests) also etcd's arguments and its own users; the control API's TLS listener
//! uses the same files.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The user the balancers log in as, and the keys it may use.
pub const USER: &str = "balancer";
pub const USER_PREFIX: &str = "/balancer/";
const ROOT_PASSWORD: &str = "root-secret-for-tests";
const USER_PASSWORD: &str = "balancer-secret-for-tests";

/// The files (PEM) of a TLS server (a secured etcd, the API listener) and its clients.
#[derive(Clone, Debug)]
pub struct TestPki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed neither etcd's certificate nor any etcd trusts.
    pub other_ca: PathBuf,
    pub password_file: PathBuf,
    pub wrong_password_file: PathBuf,
}

fn ca(name: &str) -> Result<(String, Issuer<'static, KeyPair>)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    common_name: &str,
    ip: Option<IpAddr>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(ip) = ip {
        params.subject_alt_names.push(SanType::IpAddress(ip));
    }
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl TestPki {
    /// Makes the certificates for a server at `server` under `dir`.
    pub fn make(dir: &Path, server: IpAddr) -> Result<TestPki> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (ca_pem, issuer) = ca("balancer tests etcd CA")?;
        let (other_pem, _) = ca("a CA etcd does not know")?;
        let (server_cert, server_key) = leaf(
            &issuer,
            "etcd",
            Some(server),
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        // Not named after an etcd user: the password, not the certificate, says who it is.
        let (client_cert, client_key) = leaf(
            &issuer,
            "fleet-client",
            None,
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let pki = TestPki {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("etcd.pem"),
            server_key: dir.join("etcd-key.pem"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
            other_ca: dir.join("other-ca.pem"),
            password_file: dir.join("password"),
            wrong_password_file: dir.join("wrong-password"),
        };
        for (path, text) in [
            (&pki.ca, ca_pem.as_str()),
            (&pki.server_cert, &server_cert),
            (&pki.server_key, &server_key),
            (&pki.client_cert, &client_cert),
            (&pki.client_key, &client_key),
            (&pki.other_ca, &other_pem),
            (&pki.password_file, &format!("{USER_PASSWORD}\n")),
            (&pki.wrong_password_file, "not-the-password\n"),
        ] {
            fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(pki)
    }

    /// etcd's arguments for TLS on its client URL with client certificates required.
    pub fn etcd_args(&self) -> Vec<String> {
        let path = |p: &PathBuf| p.display().to_string();
        vec![
            "--cert-file".into(),
            path(&self.server_cert),
            "--key-file".into(),
            path(&self.server_key),
            "--trusted-ca-file".into(),
            path(&self.ca),
            "--client-cert-auth".into(),
        ]
    }

    /// Turns on etcd's authentication: a root user, and [`USER`] with read and write on
    /// [`USER_PREFIX`] only. Runs in the caller's network namespace.
    pub fn enable_auth(&self, endpoint: &str) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(fs::read(&self.ca)?))
                .identity(etcd_client::Identity::from_pem(
                    fs::read(&self.client_cert)?,
                    fs::read(&self.client_key)?,
                ));
            let options = etcd_client::ConnectOptions::new().with_tls(tls);
            let mut c = etcd_client::Client::connect([endpoint], Some(options))
                .await
                .context("connecting to etcd to set its users up")?;
            c.user_add("root", ROOT_PASSWORD, None).await?;
            c.user_grant_role("root", "root").await?;
            c.role_add("fleet").await?;
            c.role_grant_permission(
                "fleet",
                etcd_client::Permission::read_write(USER_PREFIX).with_prefix(),
            )
            .await?;
            c.user_add(USER, USER_PASSWORD, None).await?;
            c.user_grant_role(USER, "fleet").await?;
            c.auth_enable()
                .await
                .context("enabling etcd's authentication")?;
            anyhow::Ok(())
        })
    }
}
