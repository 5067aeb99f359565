//! Where a command's answer goes: stdout as a table or, with `--json`, as
//! the gateway's JSON pretty-printed. A failed write is an error of its own
//! (exit code 1), not a lost answer.

use std::io::Write;

use anyhow::Context as _;
use serde_json::Value;

/// Output sink: anything writable that may cross threads.
pub type Out<'a> = &'a mut (dyn Write + Send);

/// Prints `value` as pretty JSON or through `table`.
pub(crate) fn emit(
    out: Out<'_>,
    json: bool,
    value: &Value,
    table: fn(&Value) -> String,
) -> anyhow::Result<()> {
    if json {
        let mut text = serde_json::to_string_pretty(value)?;
        text.push('\n');
        write_out(out, &text)
    } else {
        write_out(out, &table(value))
    }
}

/// Writes `text` and flushes it, so that a reader at the other end of a
/// pipe sees each answer whole as soon as it is printed.
pub(crate) fn write_out(out: Out<'_>, text: &str) -> anyhow::Result<()> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write output")
}
