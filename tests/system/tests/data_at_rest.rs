//! Data at rest: each service runs under its own PostgreSQL role and can
//! read nothing of the others', and tenants' data keys sit in the database
//! only wrapped by a master key that is not there.

use std::path::Path;
use std::process::Command;

use lh_test_stack::{of_type, read_log, Stack, FLEET};
use reqwest::Method;
use serde_json::json;
use sqlx::Connection as _;

/// Runs scripts/pg-roles.sh as the operator would, with the test cluster's
/// psql; returns the services' URLs it wrote.
fn give_services_roles(admin_url: &str, out: &Path) -> [(&'static str, String); 3] {
    let psql = lh_testkit::pg_bin_dir().unwrap().join("psql");
    let status = Command::new(lh_testkit::workspace_root().join("scripts/pg-roles.sh"))
        .arg(admin_url)
        .arg(out)
        .env("PSQL", psql)
        .status()
        .expect("scripts/pg-roles.sh runs");
    assert!(status.success(), "pg-roles.sh failed: {status}");
    ["gateway", "pricing", "audit"].map(|svc| {
        let url = std::fs::read_to_string(out.join(format!("{svc}.url"))).unwrap();
        assert!(url.starts_with(&format!("postgres://lh_{svc}:")), "{url}");
        (svc, url.trim().to_string())
    })
}

/// `Ok` or the SQLSTATE of the refusal.
async fn try_sql(url: &str, sql: &str) -> Result<(), String> {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let result = sqlx::raw_sql(sql).execute(&mut conn).await;
    let _ = conn.close().await;
    match result {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) => Err(e.code().unwrap_or_default().to_string()),
        Err(e) => panic!("{sql}: {e}"),
    }
}

const DENIED: &str = "42501";

/// A row of `gateway_keys.tenant_keys`: tenant, bare key, wrapped, master key id.
type KeyRow = (uuid::Uuid, Option<Vec<u8>>, Vec<u8>, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_service_runs_under_its_own_role_and_touches_nothing_of_the_others() {
    // Services first run as the superuser, as on a database from before
    // roles: the script must hand over what they created.
    let mut stack = Stack::start(FLEET).await;
    let (_, key) = stack.create_tenant("acme", 8).await;
    let dir = tempfile::tempdir().unwrap();
    let urls = give_services_roles(&stack.database_url, dir.path());
    // Idempotent: a second run changes nothing and keeps the passwords.
    let again = give_services_roles(&stack.database_url, dir.path());
    assert_eq!(urls, again);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("gateway.url"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "URLs hold passwords: {mode:o}");
    }

    for (svc, url) in &urls {
        stack.service_database_urls.insert(svc, url.clone());
    }
    for svc in ["gateway", "pricing", "audit"] {
        stack.stop_service(svc).await;
        stack.start_service(svc).await;
    }
    stack.wait_ready().await;

    // Everything still works under the roles: a tenant, a lease run, billed,
    // chained.
    let (_, key2) = stack.create_tenant("beta", 8).await;
    for k in [&key, &key2] {
        let id = stack
            .lease(k, json!({"gpus": 1, "gpu_model": "A10G-24GB"}))
            .await;
        stack.wait_lease(k, &id, |l| l["state"] == "running").await;
        let (s, _) = stack
            .call(Method::POST, &format!("/v1/leases/{id}/stop"), k, None)
            .await;
        assert_eq!(s, 202);
    }
    stack
        .wait_log(30, |log| {
            (of_type(log, "charge.accrued").len() == 2).then_some(())
        })
        .await;
    let (s, verify) = stack
        .call(
            Method::GET,
            "/v1/audit/verify",
            lh_test_stack::ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(s, 200, "{verify}");
    assert_eq!(verify["ok"], true, "{verify}");

    let url = |svc: &str| urls.iter().find(|(s, _)| *s == svc).unwrap().1.clone();
    let (gateway, pricing, audit) = (url("gateway"), url("pricing"), url("audit"));
    // Each reads its own.
    assert_eq!(
        try_sql(&gateway, "SELECT * FROM gateway.leases").await,
        Ok(())
    );
    assert_eq!(
        try_sql(&pricing, "SELECT * FROM pricing.invoice_lines").await,
        Ok(())
    );
    assert_eq!(try_sql(&audit, "SELECT * FROM audit.events").await, Ok(()));
    // The gateway cannot read pricing's or audit's, nor write audit's.
    for sql in [
        "SELECT * FROM pricing.invoice_lines",
        "SELECT * FROM audit.events",
        "INSERT INTO audit.checkpoints DEFAULT VALUES",
        "CREATE TABLE public.stash (x int)",
    ] {
        assert_eq!(try_sql(&gateway, sql).await, Err(DENIED.into()), "{sql}");
    }
    // Pricing cannot read the tenant keys, the read models or audit's.
    for sql in [
        "SELECT * FROM gateway_keys.tenant_keys",
        "SELECT * FROM gateway.tenants",
        "SELECT * FROM audit.events",
    ] {
        assert_eq!(try_sql(&pricing, sql).await, Err(DENIED.into()), "{sql}");
    }
    // Audit reads only its copy.
    for sql in [
        "SELECT * FROM gateway_keys.tenant_keys",
        "SELECT * FROM pricing.invoice_lines",
    ] {
        assert_eq!(try_sql(&audit, sql).await, Err(DENIED.into()), "{sql}");
    }
    // No service may grant itself more.
    assert_eq!(
        try_sql(&gateway, "ALTER ROLE lh_gateway SUPERUSER").await,
        Err(DENIED.into())
    );
    stack.assert_none_stopped();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_data_keys_are_stored_wrapped_and_rewrapped_after_a_rotation() {
    let mut stack = Stack::start(FLEET).await;
    stack.create_tenant("acme", 8).await;
    let mut db = sqlx::PgConnection::connect(&stack.database_url)
        .await
        .unwrap();
    let rows: Vec<KeyRow> = sqlx::query_as(
        "SELECT tenant_id, key, wrapped, master_key_id FROM gateway_keys.tenant_keys",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, None, "no bare key in the database");
    assert_eq!(rows[0].3, "test-1");

    // A row as an older gateway wrote it: the key bare.
    let (old_tenant, bare) = (uuid::Uuid::from_u128(42), [7u8; 32]);
    sqlx::query("INSERT INTO gateway_keys.tenant_keys (tenant_id, key) VALUES ($1, $2)")
        .bind(old_tenant)
        .bind(bare.as_slice())
        .execute(&mut db)
        .await
        .unwrap();

    // Rotation: a second key appended; the gateway restarts on it.
    let old_file = std::fs::read_to_string(&stack.master_key_file).unwrap();
    let next = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
    std::fs::write(&stack.master_key_file, format!("{old_file}test-2 {next}\n")).unwrap();
    stack.stop_service("gateway").await;
    stack.start_service("gateway").await;
    stack.wait_ready().await;

    let rows: Vec<KeyRow> = sqlx::query_as(
        "SELECT tenant_id, key, wrapped, master_key_id FROM gateway_keys.tenant_keys ORDER BY tenant_id",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    for (tenant, key, wrapped, master) in &rows {
        assert_eq!(key, &None, "{tenant}: rewrapped, bare column cleared");
        assert_eq!(master, "test-2", "{tenant}: wrapped by the newest key");
        assert!(!wrapped.windows(32).any(|w| w == bare), "{tenant}");
    }
    // The old line can go now: the gateway starts on the new key alone, and
    // the rewrapped key still opens to what it was.
    std::fs::write(&stack.master_key_file, format!("test-2 {next}\n")).unwrap();
    let keys = lh_gateway::keyring::FileKeyProvider::load(&stack.master_key_file).unwrap();
    let pool = sqlx::PgPool::connect(&stack.database_url).await.unwrap();
    let opened = lh_gateway::seal::load_key(&pool, &keys, old_tenant)
        .await
        .unwrap();
    assert_eq!(opened, Some(bare));
    stack.stop_service("gateway").await;
    stack.start_service("gateway").await;
    stack.wait_ready().await;
    let (_, key) = stack.create_tenant("beta", 8).await;
    assert!(!key.is_empty());

    // Without the master key the gateway refuses to start, naming the file.
    std::fs::remove_file(&stack.master_key_file).unwrap();
    let mut config = stack.gateway_config();
    config.master_key_file = stack.master_key_file.clone();
    let err = Box::pin(lh_gateway::start(
        config,
        tokio_util::sync::CancellationToken::new(),
    ))
    .await
    .err()
    .expect("no master key, no gateway")
    .to_string();
    assert!(err.contains("master key file"), "{err}");
    let log = read_log(&stack.bus().await).await;
    assert_eq!(of_type(&log, "tenant.created").len(), 2);
}

/// A throwaway CA and a server certificate for 127.0.0.1 signed by it.
struct Certs {
    ca_pem: String,
    server_pem: String,
    server_key_pem: String,
}

fn certs() -> Certs {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    Certs {
        ca_pem: ca.pem(),
        server_pem: server.pem(),
        server_key_pem: server_key.serialize_pem(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_reach_the_database_over_verified_tls_when_the_url_asks() {
    let pg = lh_testkit::Postgres::start().await.unwrap();
    let url = pg.create_database().await.unwrap();
    let ours = certs();
    // The server's files in its data directory, owned by the server's user
    // (PostgreSQL refuses a key file that others may read).
    let data = pg.data_dir();
    let owner = std::fs::metadata(&data).unwrap();
    for (name, text) in [
        ("server.crt", &ours.server_pem),
        ("server.key", &ours.server_key_pem),
    ] {
        let path = data.join(name);
        std::fs::write(&path, text).unwrap();
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mut admin = sqlx::PgConnection::connect(&pg.admin_url()).await.unwrap();
    sqlx::raw_sql("ALTER SYSTEM SET ssl = on")
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut admin)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ours.ca_pem).unwrap();
    let tls_url = format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        ca_file.display()
    );
    // The reload is asynchronous: the first connections may still find TLS off.
    let mut pool = None;
    for _ in 0..50 {
        match lh_projection::connect_schema(&tls_url, "gateway").await {
            Ok(p) => {
                pool = Some(p);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    let pool = pool.expect("a verified TLS connection");
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(ssl, "the connection is not encrypted");

    // A server whose certificate another CA signed is refused.
    let other = certs();
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, &other.ca_pem).unwrap();
    let err = sqlx::PgConnection::connect(&format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        other_ca.display()
    ))
    .await
    .expect_err("an unknown CA is refused");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}
