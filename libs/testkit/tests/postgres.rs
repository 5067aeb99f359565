//! The test kit's PostgreSQL: one cluster per test binary, a fresh database
//! per test, and a private cluster that can be crashed and restarted.

use lh_testkit::{shared_postgres, Postgres};
use sqlx::{Connection, PgConnection};

async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .unwrap_or_else(|err| panic!("connect {url}: {err}"))
}

#[tokio::test]
async fn create_database_twice_gives_two_distinct_working_databases() {
    let pg = shared_postgres().await;
    let first = pg.create_database().await.expect("first database");
    let second = pg.create_database().await.expect("second database");
    assert_ne!(first, second);
    let prefix = format!("postgres://postgres@127.0.0.1:{}/", pg.port());
    assert!(first.starts_with(&prefix), "{first}");
    assert!(second.starts_with(&prefix), "{second}");

    let mut a = connect(&first).await;
    let mut b = connect(&second).await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut b)
        .await
        .unwrap();
    assert_eq!(one, 1);

    // They really are two databases: a table made in one is absent from the other.
    sqlx::raw_sql("CREATE TABLE only_here (id int)")
        .execute(&mut a)
        .await
        .unwrap();
    let seen: Option<String> = sqlx::query_scalar("SELECT to_regclass('only_here')::text")
        .fetch_one(&mut b)
        .await
        .unwrap();
    assert_eq!(seen, None);
    let name_a: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert!(first.ends_with(&name_a));

    let encoding: String = sqlx::query_scalar("SHOW server_encoding")
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert_eq!(encoding, "UTF8");
}

#[tokio::test]
async fn shared_cluster_is_one_per_test_binary() {
    let a = shared_postgres().await;
    let b = shared_postgres().await;
    assert!(std::ptr::eq(a, b));
    let mut conn = connect(&a.admin_url()).await;
    let max: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(max, "200");
}

#[tokio::test]
async fn private_cluster_survives_kill_and_restart_on_the_same_port() {
    let mut pg = Postgres::start().await.expect("start PostgreSQL");
    let url = pg.create_database().await.unwrap();
    {
        let mut conn = connect(&url).await;
        sqlx::raw_sql("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before the crash')")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let port = pg.port();
    pg.kill();
    assert!(!pg.is_running());
    assert!(
        PgConnection::connect(&url).await.is_err(),
        "still accepts connections after kill"
    );

    pg.restart().await.expect("restart");
    assert_eq!(pg.port(), port);
    let mut conn = connect(&url).await;
    let v: String = sqlx::query_scalar("SELECT v FROM kept")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, "before the crash");
}

#[tokio::test]
async fn drop_stops_the_server_and_removes_its_directory() {
    let pg = Postgres::start().await.expect("start PostgreSQL");
    let url = pg.admin_url();
    let data_dir = pg.data_dir();
    assert!(data_dir.join("PG_VERSION").is_file());
    drop(pg);
    assert!(!data_dir.exists(), "{} left behind", data_dir.display());
    assert!(
        PgConnection::connect(&url).await.is_err(),
        "server still up after drop"
    );
}
