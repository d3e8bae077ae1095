//! The agent against a real etcd (Debian's `etcd-server`, started by the test on
//! 127.0.0.1) that serves TLS only and checks client certificates, with certificates
//! the test makes; and against an etcd with user authentication on. Each way of getting
//! it wrong (no client certificate, a stranger's, the wrong CA, http against https and
//! the reverse, a wrong password, a user without permission) must fail with an error
//! that says what to fix; and both at once, client certificates and a user, as
//! docs/cluster.md's production example (a certificate without a Common Name works, one
//! with a CN is refused by etcd's gateway and the error says so). Skipped, saying so,
//! without etcd.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use it_harness::etcd::{Etcd, EtcdTls, etcd_or_skip};
use it_harness::pki::Pki;
use nvmf_qos_agent::connect::{EtcdOptions, http_agent};
use nvmf_qos_agent::store::{AuthError, EtcdGateway, Store, StoreError};
use serde_json::json;

fn opts(url: &str) -> EtcdOptions {
    EtcdOptions {
        endpoint: url.into(),
        timeout: Duration::from_millis(2000),
        ..Default::default()
    }
}

fn with_tls(url: &str, ca: &Path, client: Option<(PathBuf, PathBuf)>) -> EtcdOptions {
    let (cert, key) = client.unzip();
    EtcdOptions {
        ca: Some(ca.into()),
        cert,
        key,
        ..opts(url)
    }
}

fn gateway(o: &EtcdOptions) -> EtcdGateway {
    EtcdGateway::connect(o).unwrap_or_else(|e| panic!("{e}"))
}

/// A write and a read back through `g`, or the error of the first that failed.
fn round_trip(g: &mut EtcdGateway) -> Result<(), StoreError> {
    g.put("/nvmf-qos/t/probe", "{\"x\":1}", None)?;
    assert_eq!(g.get("/nvmf-qos/t/probe")?.as_deref(), Some("{\"x\":1}"));
    Ok(())
}

fn agent_cmd(etcd_args: &[String], args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-qos-agent"))
        .args(etcd_args)
        .args(args)
        .output()
        .expect("run nvmf-qos-agent");
    let code = out.status.code();
    (
        out.status.success(),
        format!(
            "exit {code:?}, stdout {}, stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn mutual_tls_reaches_etcd_and_each_mistake_says_what_to_fix() {
    let Some(bin) = etcd_or_skip("the agent against a real etcd over TLS") else {
        return;
    };
    let pki = Pki::new("mtls");
    let tls = EtcdTls {
        cert: pki.server_cert(),
        key: pki.server_key(),
        client_ca: Some(pki.ca()),
    };
    let etcd = Etcd::start_with(bin.clone(), Some(tls), &[]).unwrap_or_else(|e| panic!("{e}"));
    let url = etcd.url();
    assert!(url.starts_with("https://"), "{url}");
    let client = Some((pki.client_cert(), pki.client_key()));

    // With the CA and a client certificate signed by etcd's trusted CA: it works.
    let mut g = gateway(&with_tls(&url, &pki.ca(), client.clone()));
    round_trip(&mut g).unwrap_or_else(|e| panic!("{e}"));

    // Each mistake, and what the error says.
    let cases: Vec<(&str, EtcdOptions, &str)> = vec![
        (
            "no client certificate",
            with_tls(&url, &pki.ca(), None),
            "give --etcd-cert and --etcd-key",
        ),
        (
            "a client certificate from another CA",
            with_tls(
                &url,
                &pki.ca(),
                Some((pki.stranger_cert(), pki.stranger_key())),
            ),
            "signed by etcd's --trusted-ca-file",
        ),
        (
            "the wrong CA",
            with_tls(&url, &pki.other_ca(), client.clone()),
            "not signed by the CA of --etcd-ca",
        ),
        (
            "http:// against an etcd that serves TLS",
            opts(&url.replace("https://", "http://")),
            "use --etcd https://",
        ),
    ];
    for (what, o, says) in cases {
        let e = round_trip(&mut gateway(&o)).unwrap_err();
        println!("{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
    }

    // The command line, with and without the client certificate.
    let mut args: Vec<String> = ["--etcd", &url, "--etcd-ca"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(pki.ca().display().to_string());
    let (ok, out) = agent_cmd(&args, &["cluster", "create", "--cluster", "c"]);
    assert!(!ok && out.contains("exit Some(2)"), "{out}");
    assert!(out.contains("give --etcd-cert and --etcd-key"), "{out}");
    for (flag, path) in [
        ("--etcd-cert", pki.client_cert()),
        ("--etcd-key", pki.client_key()),
    ] {
        args.push(flag.into());
        args.push(path.display().to_string());
    }
    let (ok, out) = agent_cmd(&args, &["cluster", "create", "--cluster", "c"]);
    assert!(ok, "{out}");
    let (ok, out) = agent_cmd(&args, &["show", "--cluster", "c"]);
    assert!(ok && out.contains("cluster c"), "{out}");
    // A CA path that does not exist is named before any call.
    args[3] = "/nonexistent/ca.pem".into();
    let (ok, out) = agent_cmd(&args, &["show", "--cluster", "c"]);
    assert!(
        !ok && out.contains("cannot read --etcd-ca /nonexistent/ca.pem"),
        "{out}"
    );
}

#[test]
fn https_against_a_plain_etcd_says_to_use_http() {
    let Some(bin) = etcd_or_skip("the agent against a plain etcd with an https URL") else {
        return;
    };
    let pki = Pki::new("plain");
    let etcd = Etcd::start(bin).unwrap_or_else(|e| panic!("{e}"));
    let url = etcd.url().replace("http://", "https://");
    let e = round_trip(&mut gateway(&with_tls(&url, &pki.ca(), None))).unwrap_err();
    println!("https against plain: {e}");
    assert!(matches!(e, StoreError::Tls { .. }), "{e}");
    assert!(e.to_string().contains("use --etcd http://"), "{e}");
}

/// One call to etcd's gateway as its root user would make it (the test's setup).
fn gateway_call(
    http: &ureq::Agent,
    url: &str,
    token: Option<&str>,
    path: &str,
    body: serde_json::Value,
) {
    let mut req = http.post(&format!("{url}{path}"));
    if let Some(t) = token {
        req = req.set("Authorization", t);
    }
    if let Err(e) = req.send_json(body.clone()) {
        let detail = match e {
            ureq::Error::Status(s, r) => format!("{s} {}", r.into_string().unwrap_or_default()),
            e => e.to_string(),
        };
        panic!("{path} {body}: {detail}");
    }
}

/// Users `root` (role root), `agent` (readwrite on /nvmf-qos/) and `nobody` (no role),
/// then authentication on; through `http` (TLS and a client certificate when etcd needs
/// them: before authentication is on, a certificate with a CN is fine).
fn enable_auth(http: &ureq::Agent, url: &str) {
    let b64 = |s: &str| B64.encode(s);
    let steps = [
        (
            "/v3/auth/user/add",
            json!({"name": "root", "password": "rootpw"}),
        ),
        ("/v3/auth/role/add", json!({"name": "root"})),
        (
            "/v3/auth/user/grant",
            json!({"user": "root", "role": "root"}),
        ),
        (
            "/v3/auth/user/add",
            json!({"name": "agent", "password": "agentpw"}),
        ),
        ("/v3/auth/role/add", json!({"name": "nvmf-qos"})),
        (
            "/v3/auth/role/grant",
            json!({"name": "nvmf-qos", "perm": {
                "permType": "READWRITE", "key": b64("/nvmf-qos/"), "range_end": b64("/nvmf-qos0")
            }}),
        ),
        (
            "/v3/auth/user/grant",
            json!({"user": "agent", "role": "nvmf-qos"}),
        ),
        (
            "/v3/auth/user/add",
            json!({"name": "nobody", "password": "nobodypw"}),
        ),
        ("/v3/auth/enable", json!({})),
    ];
    for (path, body) in steps {
        gateway_call(http, url, None, path, body);
    }
}

fn password_file(dir: &Path, name: &str, password: &str) -> PathBuf {
    let f = dir.join(name);
    std::fs::write(&f, format!("{password}\n")).unwrap();
    f
}

#[test]
fn user_authentication_with_a_token_that_is_refreshed_when_it_expires() {
    let Some(bin) = etcd_or_skip("the agent against a real etcd with authentication") else {
        return;
    };
    // Tokens expire after 1 s without use, so the test sees a refresh.
    let etcd =
        Etcd::start_with(bin, None, &["--auth-token-ttl", "1"]).unwrap_or_else(|e| panic!("{e}"));
    let url = etcd.url();
    enable_auth(&ureq::agent(), &url);
    let pki = Pki::new("auth"); // only for its directory
    let user = |name: &str, password: &str| EtcdOptions {
        user: Some(name.into()),
        password_file: Some(password_file(&pki.dir, name, password)),
        ..opts(&url)
    };

    // Without credentials.
    let e = round_trip(&mut gateway(&opts(&url))).unwrap_err();
    println!("no user: {e}");
    assert!(matches!(e, StoreError::NeedsAuth { .. }), "{e}");
    assert!(e.to_string().contains("give --etcd-user"), "{e}");
    // A wrong password.
    let e = round_trip(&mut gateway(&user("agent", "wrong"))).unwrap_err();
    println!("wrong password: {e}");
    assert!(
        matches!(e, StoreError::Auth(AuthError::Rejected { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("wrong user name or password"), "{e}");
    // A user without a role on the prefix.
    let e = round_trip(&mut gateway(&user("nobody", "nobodypw"))).unwrap_err();
    println!("no permission: {e}");
    assert!(matches!(e, StoreError::PermissionDenied { .. }), "{e}");
    assert!(e.to_string().contains("readwrite"), "{e}");

    // The agent's user: its calls go through, a lease too, and after the token expired
    // it authenticates again by itself.
    let mut g = gateway(&user("agent", "agentpw"));
    round_trip(&mut g).unwrap_or_else(|e| panic!("{e}"));
    let lease = g.grant(5).unwrap_or_else(|e| panic!("{e}"));
    assert!(g.keep_alive(lease).unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(g.authentications(), 1);
    std::thread::sleep(Duration::from_millis(2500));
    round_trip(&mut g).unwrap_or_else(|e| panic!("after the token expired: {e}"));
    assert_eq!(
        g.authentications(),
        2,
        "one more authentication after the token expired"
    );
    g.revoke(lease).unwrap_or_else(|e| panic!("{e}"));

    // The command line with the password in a file.
    let pw = password_file(&pki.dir, "agent-cli", "agentpw");
    let args: Vec<String> = vec![
        "--etcd".into(),
        url.clone(),
        "--etcd-user".into(),
        "agent".into(),
        "--etcd-password-file".into(),
        pw.display().to_string(),
    ];
    let (ok, out) = agent_cmd(&args, &["cluster", "create", "--cluster", "c"]);
    assert!(ok, "{out}");
    let (ok, out) = agent_cmd(&args[..2], &["show", "--cluster", "c"]);
    assert!(!ok && out.contains("give --etcd-user"), "{out}");
}

#[test]
fn client_certificates_and_a_user_together_need_a_certificate_without_a_common_name() {
    let Some(bin) = etcd_or_skip("the agent against a real etcd with TLS and authentication")
    else {
        return;
    };
    let pki = Pki::new("tls-auth");
    let tls = EtcdTls {
        cert: pki.server_cert(),
        key: pki.server_key(),
        client_ca: Some(pki.ca()),
    };
    let etcd = Etcd::start_with(bin, Some(tls), &[]).unwrap_or_else(|e| panic!("{e}"));
    let url = etcd.url();
    let with_cn = Some((pki.client_cert(), pki.client_key()));
    let without_cn = Some((pki.client_no_cn_cert(), pki.client_no_cn_key()));
    let setup = http_agent(&with_tls(&url, &pki.ca(), with_cn.clone())).unwrap();
    enable_auth(&setup, &url);
    let pw = password_file(&pki.dir, "agent", "agentpw");
    let user = |client: Option<(PathBuf, PathBuf)>| EtcdOptions {
        user: Some("agent".into()),
        password_file: Some(pw.clone()),
        ..with_tls(&url, &pki.ca(), client)
    };

    // A certificate with a CN and the right user and password: refused by the gateway,
    // and the error names the certificate, not the password.
    let e = round_trip(&mut gateway(&user(with_cn))).unwrap_err();
    println!("certificate with a CN: {e}");
    assert!(matches!(e, StoreError::CommonNameWithAuth { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("without a CN") && !text.contains("wrong user name or password"),
        "{text}"
    );

    // Without a CN: calls, leases and the command line go through as user `agent`.
    let mut g = gateway(&user(without_cn.clone()));
    round_trip(&mut g).unwrap_or_else(|e| panic!("{e}"));
    let lease = g.grant(5).unwrap_or_else(|e| panic!("{e}"));
    assert!(g.keep_alive(lease).unwrap_or_else(|e| panic!("{e}")));
    g.revoke(lease).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(g.authentications(), 1);
    let (cert, key) = (pki.client_no_cn_cert(), pki.client_no_cn_key());
    let args: Vec<String> = [
        "--etcd",
        &url,
        "--etcd-ca",
        &pki.ca().display().to_string(),
        "--etcd-cert",
        &cert.display().to_string(),
        "--etcd-key",
        &key.display().to_string(),
        "--etcd-user",
        "agent",
        "--etcd-password-file",
        &pw.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (ok, out) = agent_cmd(&args, &["cluster", "create", "--cluster", "c"]);
    assert!(ok, "{out}");
    let (ok, out) = agent_cmd(&args, &["show", "--cluster", "c"]);
    assert!(ok && out.contains("cluster c"), "{out}");
    // The same command line without the user: etcd asks for one.
    let (ok, out) = agent_cmd(&args[..8], &["show", "--cluster", "c"]);
    assert!(!ok && out.contains("give --etcd-user"), "{out}");
}
