//! Reservations, one row each.

use serde_json::Value;

use super::table::{finish, table, text};

/// One row per reservation.
pub(crate) fn reservations(list: &Value) -> String {
    let mut t = table();
    t.set_header(vec![
        "ID", "TENANT", "MODEL", "ZONE", "GPUS", "FROM", "UNTIL",
    ]);
    let all = list.get("reservations").and_then(Value::as_array);
    for r in all.into_iter().flatten() {
        t.add_row(vec![
            text(r, "reservation_id"),
            text(r, "tenant_id"),
            text(r, "gpu_model"),
            text(r, "zone"),
            text(r, "gpus"),
            text(r, "starts_at"),
            text(r, "ends_at"),
        ]);
    }
    finish(t)
}
