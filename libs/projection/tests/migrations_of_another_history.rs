//! A schema made by another history of migrations, on a real PostgreSQL:
//! `migrate` refuses it with an error that names the schema and the way
//! out, instead of running on a read model it does not know.

mod common;

use lh_projection::ProjectionError;

#[tokio::test]
async fn a_schema_made_by_other_migrations_is_refused_by_name() {
    let url = lh_testkit::shared_postgres()
        .await
        .create_database()
        .await
        .expect("a fresh database");
    let pool = common::schema(&url, "readmodel").await;

    // A version this build never had, as a schema made before its
    // migrations were squashed would record.
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from another history', TRUE, '\\x00'::bytea, 0)",
    )
    .execute(&pool)
    .await
    .unwrap();

    let refused = lh_projection::migrate(&pool, &common::MIGRATOR)
        .await
        .expect_err("a schema of another history is refused");
    match &refused {
        ProjectionError::ForeignMigrations { schema, detail } => {
            assert_eq!(schema, "readmodel");
            assert!(detail.contains("9999"), "{detail}");
        }
        other => panic!("refused for another reason: {other}"),
    }
    let message = refused.to_string();
    assert!(message.contains("make clean-data"), "{message}");
    assert!(message.contains("rebuilt from the log"), "{message}");

    // A schema of this build's own history migrates again as before.
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 9999")
        .execute(&pool)
        .await
        .unwrap();
    lh_projection::migrate(&pool, &common::MIGRATOR)
        .await
        .expect("its own history migrates");
}
