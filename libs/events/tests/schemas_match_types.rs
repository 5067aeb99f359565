//! The JSON Schemas in `schemas/` are generated from the event types; this
//! test fails when a type changes and the schema was not regenerated
//! (`make schemas`), or when a schema file has no type behind it.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas")
}

#[test]
fn every_event_schema_matches_its_type() {
    for (name, generated) in lh_events::schemas() {
        let path = schemas_dir().join(&name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("{} is missing: run `make schemas`", path.display()));
        let stored: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            stored, generated,
            "{name} drifted from its Rust type: run `make schemas` and review the diff"
        );
    }
}

#[test]
fn no_schema_file_lacks_a_type() {
    let generated: BTreeSet<String> = lh_events::schemas().into_iter().map(|(n, _)| n).collect();
    for entry in std::fs::read_dir(schemas_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".json") {
            assert!(
                generated.contains(&name),
                "schemas/{name} has no event type behind it"
            );
        }
    }
}

#[test]
fn a_real_event_validates_against_the_envelope_schema_shape() {
    // The envelope schema names every field the envelope serialises.
    let (_, schema) = lh_events::schemas().into_iter().next().unwrap();
    let props = schema["properties"].as_object().unwrap();
    for field in [
        "id",
        "type",
        "version",
        "occurred_at",
        "actor",
        "correlation_id",
        "data",
    ] {
        assert!(props.contains_key(field), "envelope schema lacks {field}");
    }
}
