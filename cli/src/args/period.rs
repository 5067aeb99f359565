//! A billing month as flags take it, `YYYY-MM`, checked before anything
//! is sent.

/// Accepts `YYYY-MM` with a month from 01 to 12.
pub(super) fn parse_period(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let shape_ok = bytes.len() == 7
        && bytes[4] == b'-'
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[5..].iter().all(u8::is_ascii_digit);
    if !shape_ok {
        return Err(format!("expected YYYY-MM, got `{s}`"));
    }
    let month: u8 = s[5..].parse().map_err(|_| format!("bad month in `{s}`"))?;
    if !(1..=12).contains(&month) {
        return Err(format!("month must be 01..12, got `{s}`"));
    }
    Ok(s.to_string())
}
