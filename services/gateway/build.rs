//! Lists the console's files (`console/` at the repository's root) for
//! the gateway to build in: every page, script and style there is served
//! under `/console/`, and nothing else.

use std::path::{Path, PathBuf};

/// What is served, by how a file's name ends, with its content type.
const SERVED: &[(&str, &str)] = &[
    ("html", "text/html; charset=utf-8"),
    ("css", "text/css; charset=utf-8"),
    ("js", "text/javascript; charset=utf-8"),
    ("mjs", "text/javascript; charset=utf-8"),
];

fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
    // A directory's own time changes when a file is added to it.
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a console entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, found);
        } else {
            found.push(path);
        }
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../console");
    let root = root.canonicalize().expect("console/ beside services/");
    let mut found = Vec::new();
    walk(&root, &mut found);
    let mut table = String::from("&[\n");
    for path in found {
        println!("cargo:rerun-if-changed={}", path.display());
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let Some((_, content_type)) = SERVED.iter().find(|(e, _)| *e == ext) else {
            continue;
        };
        let relative = path.strip_prefix(&root).unwrap().to_str().unwrap();
        table.push_str(&format!(
            "    File {{ path: {relative:?}, content_type: {content_type:?}, bytes: include_bytes!({:?}) }},\n",
            path.display().to_string()
        ));
    }
    table.push_str("]\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("console_files.rs");
    std::fs::write(out, table).unwrap();
}
