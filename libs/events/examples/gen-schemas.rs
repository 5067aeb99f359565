//! Writes one JSON Schema per event type into `schemas/` (run by `make schemas`).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    std::fs::create_dir_all(&dir)?;
    for (name, schema) in lh_events::schemas() {
        let text = serde_json::to_string_pretty(&schema)? + "\n";
        std::fs::write(dir.join(&name), text)?;
        println!("wrote schemas/{name}");
    }
    Ok(())
}
