//! Reading rendered tables back in tests: a row by its first word, the
//! value of a key/value row.

/// The words of the first line of `out` that starts with `prefix`.
pub(super) fn row_of(out: &str, prefix: &str) -> Vec<String> {
    out.lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{out}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Rows of a key/value table as (key, value) pairs.
pub(super) fn rows(rendered: &str) -> Vec<(String, String)> {
    rendered
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            // Keys may hold one space ("gpu model"); the gap is wider.
            let split = l.find("  ")?;
            Some((l[..split].to_string(), l[split..].trim().to_string()))
        })
        .collect()
}

pub(super) fn value_of(rendered: &str, key: &str) -> Option<String> {
    rows(rendered)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}
