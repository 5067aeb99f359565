//! JSON Schemas of the envelope and of every event type, as stored in
//! `schemas/` (`make schemas` writes them; a test fails when they drift).

use schemars::JsonSchema;

use crate::Envelope;

pub(crate) fn of<T: JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(T)).expect("schema serialises")
}

/// One JSON Schema per event type, keyed by file name (`lease.placed.v1.json`),
/// after the envelope's. `schemas/` holds exactly these files.
pub fn schemas() -> Vec<(String, serde_json::Value)> {
    let mut all = vec![(
        format!("envelope.v{ENVELOPE_VERSION}.json"),
        of::<Envelope>(),
    )];
    all.extend(crate::payload_schemas());
    all
}

/// Version of the envelope's own shape (not of the payloads: each event type
/// has its own, in the table in `lib.rs`).
pub const ENVELOPE_VERSION: u16 = 1;
