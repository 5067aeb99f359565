//! Human-readable tables for the gateway's JSON answers.
//!
//! Everything is read from `serde_json::Value` with lenient accessors:
//! a missing or oddly typed field shows as `-` instead of failing, and
//! fields this CLI does not know are ignored.

use comfy_table::{presets, CellAlignment, Table};
use serde_json::Value;

/// Shown for a missing or null field.
const NONE: &str = "-";

/// A field as text: strings as they are, numbers and booleans printed,
/// arrays joined with `,`, null or missing as `-`.
fn text(v: &Value, key: &str) -> String {
    v.get(key).map_or_else(|| NONE.to_string(), scalar)
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => NONE.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => NONE.to_string(),
        Value::Array(items) => items.iter().map(scalar).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Whether a field carries something worth a row (not missing, null or empty).
fn present(v: &Value, key: &str) -> bool {
    match v.get(key) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t
}

/// Two-column `key  value` table with no header.
fn key_values(rows: Vec<(&str, String)>) -> String {
    let mut t = table();
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
    finish(t)
}

/// Drops the padding comfy-table leaves at the ends of each line.
fn finish(t: Table) -> String {
    let mut out = String::new();
    for line in t.lines() {
        let line = line.strip_prefix(' ').unwrap_or(&line);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The state column of a lease: `queued (#3)` while it waits in line.
fn state_summary(lease: &Value) -> String {
    let state = text(lease, "state");
    if present(lease, "queue_position") {
        format!("{state} (#{})", text(lease, "queue_position"))
    } else {
        state
    }
}

/// One lease, as a key/value table. Optional fields appear only when set.
pub fn lease_view(lease: &Value) -> String {
    let mut rows = vec![
        ("id", text(lease, "id")),
        ("tenant", text(lease, "tenant_id")),
        ("state", text(lease, "state")),
        ("gpus", text(lease, "gpus")),
        ("gpu model", text(lease, "gpu_model")),
        ("tier", text(lease, "tier")),
    ];
    let optional = [
        ("share", "gpu_fraction"),
        ("mig profile", "mig_profile"),
        ("mig instance", "mig_instance"),
        ("workload", "workload"),
        ("moved because", "last_migration_reason"),
        ("idle since", "idle_since"),
        ("suspended", "suspended_at"),
        ("queue position", "queue_position"),
        ("queued reason", "queued_reason"),
        ("rejected reason", "rejected_reason"),
        ("end reason", "end_reason"),
        ("failure", "failure"),
        ("node", "node_id"),
        ("zone", "zone"),
        ("gpu uuids", "gpu_uuids"),
        ("gpu indices", "gpu_indices"),
    ];
    rows.extend(
        optional
            .iter()
            .filter(|(_, key)| present(lease, key))
            .map(|(label, key)| (*label, text(lease, key))),
    );
    rows.push(("created", text(lease, "created_at")));
    for (label, key) in [
        ("placed", "placed_at"),
        ("started", "started_at"),
        ("ended", "ended_at"),
    ] {
        if present(lease, key) {
            rows.push((label, text(lease, key)));
        }
    }
    key_values(rows)
}

/// A node after a drain or an uncordon.
pub fn node_cordon(node: &Value) -> String {
    let mut rows = vec![
        ("node", text(node, "node_id")),
        ("cordoned", text(node, "cordoned")),
    ];
    if present(node, "drain") {
        rows.push(("drain", text(node, "drain")));
    }
    rows.push(("sequence", text(node, "sequence")));
    key_values(rows)
}

/// A page (or several) of leases, one row each.
pub fn lease_list(items: &[Value]) -> String {
    if items.is_empty() {
        return "no leases\n".to_string();
    }
    let mut t = table();
    t.set_header(vec![
        "ID", "STATE", "GPUS", "MODEL", "TIER", "NODE", "ZONE", "CREATED",
    ]);
    for lease in items {
        t.add_row(vec![
            text(lease, "id"),
            state_summary(lease),
            text(lease, "gpus"),
            text(lease, "gpu_model"),
            text(lease, "tier"),
            text(lease, "node_id"),
            text(lease, "zone"),
            text(lease, "created_at"),
        ]);
    }
    align_right(&mut t, &[2]);
    finish(t)
}

fn align_right(t: &mut Table, columns: &[usize]) {
    for &i in columns {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// Spot markets: one row per (zone, model) with its current price and,
/// oldest first, the prices before it.
pub fn spot_prices(prices: &Value) -> String {
    let markets: &[Value] = prices
        .get("markets")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut t = table();
    t.set_header(vec![
        "ZONE", "REGION", "MODEL", "CNY/GB-H", "USED", "SINCE", "HISTORY",
    ]);
    for m in markets {
        let current = m.get("current").cloned().unwrap_or(Value::Null);
        let history: Vec<String> = m
            .get("history")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|p| text(p, "price_cny_per_gb_hour"))
            .collect();
        t.add_row(vec![
            text(m, "zone"),
            text(m, "region"),
            text(m, "gpu_model"),
            text(&current, "price_cny_per_gb_hour"),
            format!("{}/{}", text(m, "gpus_used"), text(m, "gpus_total")),
            text(&current, "at"),
            history.join(" "),
        ]);
    }
    align_right(&mut t, &[3, 4]);
    format!("{t}\n")
}

/// A document's number, with which part it is when it was issued in
/// parts: `INV-000011 (part 2 of 3)`.
fn document_number(doc: &Value) -> String {
    let number = text(doc, "number");
    let of = |key: &str| doc.get(key).and_then(Value::as_u64).unwrap_or(1);
    match (of("part"), of("parts")) {
        (part, parts) if parts > 1 && present(doc, "number") => {
            format!("{number} (part {part} of {parts})")
        }
        _ => number,
    }
}

/// An invoice or note: a heading, one row per line and per credit, a
/// total row with the currency.
pub fn invoice(inv: &Value) -> String {
    let mut heading = vec![
        ("tenant", text(inv, "tenant_id")),
        ("period", text(inv, "period")),
    ];
    for (label, key) in [
        ("kind", "kind"),
        ("number", "number"),
        ("status", "status"),
        ("refers to", "refers_to_number"),
        ("issued at", "issued_at"),
    ] {
        if present(inv, key) {
            let value = if key == "number" {
                document_number(inv)
            } else {
                text(inv, key)
            };
            heading.push((label, value));
        }
    }
    let mut out = key_values(heading);
    let rows = |key: &str| -> Vec<Value> {
        inv.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut t = table();
    t.set_header(vec![
        "LEASE",
        "TIER",
        "FROM",
        "TO",
        "CHARGES",
        "SECONDS",
        "AMOUNT",
        "PRICE BOOK",
    ]);
    for line in rows("lines") {
        t.add_row(vec![
            text(&line, "lease_id"),
            text(&line, "tier"),
            text(&line, "from"),
            text(&line, "to"),
            text(&line, "charges"),
            text(&line, "billed_seconds"),
            text(&line, "amount"),
            if present(&line, "price_book_version") {
                format!("v{}", text(&line, "price_book_version"))
            } else {
                NONE.to_string()
            },
        ]);
    }
    for credit in rows("credits") {
        let mut row = vec![String::new(); 8];
        row[0] = format!("SLA credit {}", text(&credit, "period"));
        row[6] = text(&credit, "amount");
        t.add_row(row);
    }
    let currency = inv
        .get("currency")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut total = vec![String::new(); 8];
    total[0] = "TOTAL".to_string();
    total[6] = format!("{} {currency}", text(inv, "total"))
        .trim_end()
        .to_string();
    t.add_row(total);
    align_right(&mut t, &[4, 5, 6]);
    out.push('\n');
    out.push_str(&finish(t));
    if present(inv, "content_hash") {
        out.push('\n');
        out.push_str(&format!("content hash: {}\n", text(inv, "content_hash")));
    }
    out
}

/// Invoices and notes, one row each.
pub fn invoice_list(list: &Value) -> String {
    let items: &[Value] = list
        .get("invoices")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    if items.is_empty() {
        return "no invoices\n".to_string();
    }
    let mut t = table();
    t.set_header(vec![
        "ID", "NUMBER", "KIND", "STATUS", "PERIOD", "TENANT", "TOTAL", "ISSUED",
    ]);
    for doc in items {
        t.add_row(vec![
            text(doc, "id"),
            document_number(doc),
            text(doc, "kind"),
            text(doc, "status"),
            text(doc, "period"),
            text(doc, "tenant_id"),
            format!("{} {}", text(doc, "total"), text(doc, "currency")),
            text(doc, "issued_at"),
        ]);
    }
    align_right(&mut t, &[6]);
    finish(t)
}

/// A weekly cost report: one row per tier and a total row.
pub fn cost_report(report: &Value) -> String {
    let mut out = key_values(vec![
        ("tenant", text(report, "tenant_id")),
        ("week", text(report, "week")),
        ("from", text(report, "from")),
        ("to", text(report, "to")),
    ]);
    let mut t = table();
    t.set_header(vec![
        "TIER",
        "CHARGES",
        "SECONDS",
        "SPEND",
        "ON DEMAND",
        "SAVING",
    ]);
    for row in cost_rows(report) {
        t.add_row(row);
    }
    align_right(&mut t, &[1, 2, 3, 4, 5]);
    out.push('\n');
    out.push_str(&finish(t));
    out.push_str(&format!("currency: {}\n", text(report, "currency")));
    out
}

/// A number with `places` decimals, or `-` when null or missing.
fn decimals(v: &Value, key: &str, places: usize) -> String {
    v.get(key)
        .and_then(Value::as_f64)
        .map_or_else(|| NONE.to_string(), |n| format!("{n:.places$}"))
}

/// A lease's usage: per GPU, one row per step (time, samples, utilisation,
/// VRAM average and peak, hottest temperature, average power).
pub fn lease_usage(report: &Value) -> String {
    let series: &[Value] = report
        .get("series")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut out = format!(
        "from {} to {}, every {} s\n",
        text(report, "from"),
        text(report, "to"),
        text(report, "step_secs")
    );
    if series.is_empty() {
        out.push_str("no usage in this window\n");
        return out;
    }
    for gpu in series {
        out.push_str(&format!(
            "\nGPU {} {} on {}\n",
            text(gpu, "gpu_index"),
            text(gpu, "gpu_uuid"),
            text(gpu, "node_id")
        ));
        let mut t = table();
        t.set_header(vec![
            "TIME",
            "SAMPLES",
            "UTIL %",
            "VRAM MIB AVG",
            "VRAM MIB MAX",
            "TEMP C MAX",
            "POWER W AVG",
        ]);
        for point in gpu
            .get("points")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
        {
            t.add_row(vec![
                text(point, "at"),
                text(point, "samples"),
                decimals(point, "utilization_pct_avg", 1),
                decimals(point, "memory_used_mib_avg", 0),
                text(point, "memory_used_mib_max"),
                text(point, "temperature_c_max"),
                decimals(point, "power_w_avg", 1),
            ]);
        }
        align_right(&mut t, &[1, 2, 3, 4, 5, 6]);
        out.push_str(&finish(t));
    }
    out
}

/// A weekly cost report as CSV: a header, one row per tier, a total row.
pub fn cost_report_csv(report: &Value) -> String {
    let mut out =
        String::from("week,tier,charges,billed_seconds,spend,on_demand,saving,currency\n");
    let week = csv_cell(&text(report, "week"));
    let currency = csv_cell(&text(report, "currency"));
    for row in cost_rows(report) {
        let cells: Vec<String> = row.iter().map(|c| csv_cell(c)).collect();
        out.push_str(&format!("{week},{},{currency}\n", cells.join(",")));
    }
    out
}

/// Columns of an audit record, in table and CSV order.
const AUDIT_RECORD_COLUMNS: [&str; 8] = [
    "sequence",
    "occurred_at",
    "actor",
    "event_type",
    "object",
    "outcome",
    "tenant_id",
    "subject",
];

/// A page of audit records, one row each, and the cursor of the next page.
pub fn audit_events(page: &Value) -> String {
    let items: &[Value] = page
        .get("events")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut out = if items.is_empty() {
        "no audit records\n".to_string()
    } else {
        let mut t = table();
        t.set_header(vec![
            "SEQ", "TIME", "ACTOR", "TYPE", "OBJECT", "OUTCOME", "TENANT", "SUBJECT",
        ]);
        for record in items {
            t.add_row(AUDIT_RECORD_COLUMNS.map(|c| text(record, c)).to_vec());
        }
        align_right(&mut t, &[0]);
        finish(t)
    };
    if present(page, "next") {
        out.push_str(&format!("next page: --after {}\n", text(page, "next")));
    }
    out
}

/// The header of an audit CSV export.
pub fn audit_csv_header() -> String {
    let mut header = AUDIT_RECORD_COLUMNS.join(",");
    header.push_str(",payload\n");
    header
}

/// One audit record as a CSV row: its columns, then its payload as JSON;
/// no cell can run as a spreadsheet formula.
pub fn audit_csv_row(record: &Value) -> String {
    let mut cells: Vec<String> = AUDIT_RECORD_COLUMNS
        .iter()
        .map(|c| csv_cell(&text(record, c)))
        .collect();
    let payload = record
        .get("payload")
        .map_or_else(String::new, Value::to_string);
    cells.push(csv_cell(&payload));
    let mut row = cells.join(",");
    row.push('\n');
    row
}

/// A CSV cell from the server's words that can neither break its row nor
/// run as a spreadsheet formula (a cell starting with `=`, `+`, `-`, `@`,
/// a tab or a carriage return); a number, or the lone dash of a missing
/// value, stays as it is.
fn csv_cell(value: &str) -> String {
    let plain = value == NONE || value.parse::<f64>().is_ok_and(f64::is_finite);
    let defused = if !plain && value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_string()
    };
    if defused.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", defused.replace('"', "\"\""))
    } else {
        defused
    }
}

fn cost_rows(report: &Value) -> Vec<Vec<String>> {
    let tiers: &[Value] = report
        .get("tiers")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut rows: Vec<Vec<String>> = tiers
        .iter()
        .map(|t| {
            [
                "tier",
                "charges",
                "billed_seconds",
                "spend",
                "on_demand",
                "saving",
            ]
            .iter()
            .map(|k| text(t, k))
            .collect()
        })
        .collect();
    let mut total = vec!["TOTAL".to_string(), String::new(), String::new()];
    total.extend(
        ["spend", "on_demand", "saving"]
            .iter()
            .map(|k| text(report, k)),
    );
    rows.push(total);
    rows
}

/// A what-if: the month and book, one row per tenant, a total row.
pub fn what_if(report: &Value) -> String {
    let mut out = key_values(vec![
        ("period", text(report, "period")),
        ("book", format!("v{}", text(report, "book_version"))),
    ]);
    let mut t = table();
    t.set_header(vec![
        "TENANT",
        "CHARGES",
        "CURRENT CNY",
        "WHAT-IF CNY",
        "DIFFERENCE CNY",
    ]);
    for row in what_if_rows(report) {
        t.add_row(row);
    }
    align_right(&mut t, &[1, 2, 3, 4]);
    out.push('\n');
    out.push_str(&finish(t));
    out
}

/// A what-if as CSV: a header, one row per tenant, a total row.
pub fn what_if_csv(report: &Value) -> String {
    let mut out = String::from("period,tenant_id,charges,current_cny,what_if_cny,difference_cny\n");
    let period = csv_cell(&text(report, "period"));
    for row in what_if_rows(report) {
        let cells: Vec<String> = row.iter().map(|c| csv_cell(c)).collect();
        out.push_str(&format!("{period},{}\n", cells.join(",")));
    }
    out
}

fn what_if_rows(report: &Value) -> Vec<Vec<String>> {
    const COLUMNS: [&str; 5] = [
        "tenant_id",
        "charges",
        "current_cny",
        "what_if_cny",
        "difference_cny",
    ];
    let tenants: &[Value] = report
        .get("tenants")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| COLUMNS.iter().map(|k| text(t, k)).collect())
        .collect();
    let mut total = vec!["TOTAL".to_string()];
    total.extend(COLUMNS[1..].iter().map(|k| text(report, k)));
    rows.push(total);
    rows
}

/// A new tenant, with its API key and how to use it.
pub fn tenant_created(tenant: &Value) -> String {
    let max_gpus = tenant
        .get("quota")
        .map_or_else(|| NONE.to_string(), |q| text(q, "max_gpus"));
    let mut rows = vec![("id", text(tenant, "id")), ("name", text(tenant, "name"))];
    if present(tenant, "email") {
        rows.push(("email", text(tenant, "email")));
    }
    rows.push(("max gpus", max_gpus));
    rows.push(("api key", text(tenant, "api_key")));
    let mut out = key_values(rows);
    if let Some(key) = tenant.get("api_key").and_then(Value::as_str) {
        out.push_str("\nThe API key is shown only this once. To use it:\n");
        out.push_str(&format!("  export LH_API_KEY={}\n", shell_quote(key)));
        out.push_str("or keep it in a file (mode 0600) and pass --api-key-file PATH.\n");
    }
    out
}

/// A tenant as the gateway shows it.
pub fn tenant_view(tenant: &Value) -> String {
    let mut rows = vec![
        ("id", text(tenant, "id")),
        ("name", text(tenant, "name")),
        ("email", text(tenant, "email")),
        ("erased", text(tenant, "erased")),
        ("max gpus", text(tenant, "max_gpus")),
        ("max vram gb", text(tenant, "max_vram_gb")),
        ("weight", text(tenant, "weight")),
        ("suspended", text(tenant, "suspended")),
    ];
    if present(tenant, "suspended_reason") {
        rows.push(("reason", text(tenant, "suspended_reason")));
    }
    key_values(rows)
}

/// A tenant after a suspension or resumption, and the leases it stopped.
pub fn tenant_changed(changed: &Value) -> String {
    let mut out = tenant_view(changed.get("tenant").unwrap_or(&Value::Null));
    let stopping = changed
        .get("leases_stopping")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if stopping > 0 {
        out.push_str(&format!("{stopping} lease(s) asked to stop\n"));
    }
    out
}

/// A newly issued key, with how to use it without putting it on a command line.
pub fn key_issued(key: &Value) -> String {
    let mut out = key_values(vec![
        ("key id", text(key, "key_id")),
        ("prefix", text(key, "prefix")),
        ("expires at", text(key, "expires_at")),
        ("api key", text(key, "api_key")),
    ]);
    if key.get("api_key").and_then(Value::as_str).is_some() {
        out.push_str("\nThe API key is shown only this once. Keep it in a file (mode 0600) and\n");
        out.push_str("pass --api-key-file PATH, or export LH_API_KEY.\n");
    }
    out
}

/// One key, never its secret.
pub fn key_view(key: &Value) -> String {
    key_values(vec![
        ("key id", text(key, "key_id")),
        ("prefix", text(key, "prefix")),
        ("state", text(key, "state")),
        ("created at", text(key, "created_at")),
        ("expires at", text(key, "expires_at")),
        ("revoked at", text(key, "revoked_at")),
    ])
}

/// A tenant's keys, one a row.
pub fn key_list(keys: &Value) -> String {
    let mut t = table();
    t.set_header(["KEY", "PREFIX", "STATE", "CREATED", "EXPIRES", "REVOKED"]);
    for key in keys
        .get("items")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        t.add_row([
            text(key, "key_id"),
            text(key, "prefix"),
            text(key, "state"),
            text(key, "created_at"),
            text(key, "expires_at"),
            text(key, "revoked_at"),
        ]);
    }
    finish(t)
}

/// Quotes a value for a POSIX shell when it has anything but safe characters.
fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/+=@%,".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The audit check: `ok`, number of events, chain head, and any other field.
pub fn audit(report: &Value) -> String {
    let ok = report.get("ok").and_then(Value::as_bool) == Some(true);
    let mut rows = vec![
        ("ok", if ok { "yes" } else { "NO" }.to_string()),
        ("events", text(report, "events")),
        ("head", text(report, "head")),
    ];
    if let Some(obj) = report.as_object() {
        for (k, v) in obj {
            if !matches!(k.as_str(), "ok" | "events" | "head") {
                rows.push((k.as_str(), scalar_or_json(v)));
            }
        }
    }
    key_values(rows)
}

/// One row per (version, tier): what each book charges.
pub fn price_books(list: &Value) -> String {
    let books: &[Value] = list
        .get("books")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let mut t = table();
    t.set_header(vec!["VERSION", "EFFECTIVE FROM", "TIER", "MODEL", "PRICE"]);
    for book in books {
        for tier in book
            .get("tiers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let model = tier.get("model");
            let kind = model.map_or("flat".to_string(), |m| text(m, "kind"));
            let price = match model.and_then(|m| m.get("steps")).and_then(Value::as_array) {
                Some(steps) => steps
                    .iter()
                    .map(|s| {
                        format!(
                            "{}h:{}",
                            text(s, "from_hour"),
                            text(s, "price_cny_per_gb_hour")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                None => text(tier, "price_cny_per_gb_hour"),
            };
            t.add_row(vec![
                format!("v{}", text(book, "version")),
                text(book, "effective_from"),
                text(tier, "tier"),
                kind,
                price,
            ]);
        }
    }
    finish(t)
}

/// One row per reservation.
pub fn reservations(list: &Value) -> String {
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

/// A tenant's prepaid balance.
pub fn balance(b: &Value) -> String {
    if b.get("prepaid").and_then(Value::as_bool) != Some(true) {
        return key_values(vec![
            ("tenant", text(b, "tenant_id")),
            (
                "billing",
                "postpaid (never topped up): invoiced, never stopped".into(),
            ),
        ]);
    }
    let covers = match b.get("covers_seconds").and_then(Value::as_u64) {
        Some(s) => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        None => "nothing running".into(),
    };
    key_values(vec![
        ("tenant", text(b, "tenant_id")),
        ("state", text(b, "state")),
        ("balance (CNY)", text(b, "balance")),
        ("topped up", text(b, "topped_up")),
        ("charged", text(b, "charged")),
        ("credited", text(b, "credited")),
        ("not yet charged", text(b, "unbilled")),
        ("burn rate (CNY/h)", text(b, "burn_rate_cny_per_hour")),
        ("lasts", covers),
    ])
}

/// A quote: what the request costs and until when it may be used.
pub fn quote(q: &Value) -> String {
    let mut rows = vec![
        ("quote", text(q, "quote_id")),
        (
            "amount",
            format!("{} {}", text(q, "amount"), text(q, "currency")),
        ),
        ("per GB-hour", text(q, "unit_price_cny_per_gb_hour")),
        ("GB", text(q, "vram_gb")),
        ("seconds", text(q, "duration_seconds")),
        ("price book", format!("v{}", text(q, "price_book_version"))),
        ("valid until", text(q, "expires_at")),
    ];
    if q.get("price_moves").and_then(Value::as_bool) == Some(true) {
        rows.push((
            "note",
            "spot: the market price now; the lease is billed at the price of each moment".into(),
        ));
    }
    key_values(rows)
}

/// A top-up as stored.
pub fn top_up(t: &Value) -> String {
    key_values(vec![
        ("top-up", text(t, "top_up_id")),
        ("tenant", text(t, "tenant_id")),
        (
            "amount",
            format!("{} {}", text(t, "amount"), text(t, "currency")),
        ),
    ])
}

fn scalar_or_json(v: &Value) -> String {
    match v {
        Value::Object(_) => v.to_string(),
        _ => scalar(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The words of the first line of `out` that starts with `prefix`.
    fn row_of(out: &str, prefix: &str) -> Vec<String> {
        out.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    fn queued_lease() -> Value {
        json!({
            "id": "0193b7e2-0000-7000-8000-000000000001",
            "tenant_id": "0193b7e2-0000-7000-8000-0000000000aa",
            "state": "queued",
            "gpus": 2,
            "gpu_model": "H100-80G",
            "tier": "basic",
            "node_id": null,
            "zone": null,
            "gpu_uuids": [],
            "gpu_indices": [],
            "queued_reason": "no capacity",
            "queue_position": 3,
            "rejected_reason": null,
            "end_reason": null,
            "created_at": "2026-12-01T10:00:00Z",
            "placed_at": null,
            "started_at": null,
            "ended_at": null,
            "some_future_field": {"x": 1}
        })
    }

    fn running_lease() -> Value {
        json!({
            "id": "0193b7e2-0000-7000-8000-000000000002",
            "tenant_id": "0193b7e2-0000-7000-8000-0000000000aa",
            "state": "running",
            "gpus": 2,
            "gpu_model": "H100-80G",
            "tier": "spot",
            "node_id": "node-7",
            "zone": "cn-east-1a",
            "gpu_uuids": ["GPU-aaaa", "GPU-bbbb"],
            "gpu_indices": [0, 1],
            "queued_reason": null,
            "queue_position": null,
            "rejected_reason": null,
            "end_reason": null,
            "created_at": "2026-12-01T10:00:00Z",
            "placed_at": "2026-12-01T10:00:01Z",
            "started_at": "2026-12-01T10:00:03Z",
            "ended_at": null
        })
    }

    /// Rows of a key/value table as (key, value) pairs.
    fn rows(rendered: &str) -> Vec<(String, String)> {
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

    fn value_of(rendered: &str, key: &str) -> Option<String> {
        rows(rendered)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    #[test]
    fn queued_lease_view() {
        let out = lease_view(&queued_lease());
        assert_eq!(
            value_of(&out, "id").as_deref(),
            Some("0193b7e2-0000-7000-8000-000000000001")
        );
        assert_eq!(value_of(&out, "state").as_deref(), Some("queued"));
        assert_eq!(value_of(&out, "gpus").as_deref(), Some("2"));
        assert_eq!(value_of(&out, "gpu model").as_deref(), Some("H100-80G"));
        assert_eq!(value_of(&out, "queue position").as_deref(), Some("3"));
        assert_eq!(
            value_of(&out, "queued reason").as_deref(),
            Some("no capacity")
        );
        assert_eq!(
            value_of(&out, "created").as_deref(),
            Some("2026-12-01T10:00:00Z")
        );
        // Unset optional fields are left out rather than shown empty.
        for absent in ["node", "zone", "gpu uuids", "placed", "ended", "end reason"] {
            assert_eq!(value_of(&out, absent), None, "{absent} in\n{out}");
        }
        assert!(!out.contains("some_future_field"));
    }

    #[test]
    fn running_lease_view() {
        let out = lease_view(&running_lease());
        assert_eq!(value_of(&out, "tier").as_deref(), Some("spot"));
        assert_eq!(value_of(&out, "node").as_deref(), Some("node-7"));
        assert_eq!(value_of(&out, "zone").as_deref(), Some("cn-east-1a"));
        assert_eq!(
            value_of(&out, "gpu uuids").as_deref(),
            Some("GPU-aaaa,GPU-bbbb")
        );
        assert_eq!(value_of(&out, "gpu indices").as_deref(), Some("0,1"));
        assert_eq!(
            value_of(&out, "started").as_deref(),
            Some("2026-12-01T10:00:03Z")
        );
        assert_eq!(value_of(&out, "queue position"), None);
    }

    #[test]
    fn lease_view_survives_junk() {
        for junk in [json!({}), json!(null), json!([1, 2]), json!({"state": 5})] {
            let out = lease_view(&junk);
            assert_eq!(value_of(&out, "id").as_deref(), Some("-"));
        }
    }

    #[test]
    fn list_table() {
        let out = lease_list(&[queued_lease(), running_lease()]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            header,
            ["ID", "STATE", "GPUS", "MODEL", "TIER", "NODE", "ZONE", "CREATED"]
        );
        let first: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            first,
            [
                "0193b7e2-0000-7000-8000-000000000001",
                "queued",
                "(#3)",
                "2",
                "H100-80G",
                "basic",
                "-",
                "-",
                "2026-12-01T10:00:00Z"
            ]
        );
        let second: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(second[1], "running");
        assert_eq!(second[5], "node-7");
        assert_eq!(second[6], "cn-east-1a");
        assert_eq!(lease_list(&[]), "no leases\n");
    }

    fn sample_invoice() -> Value {
        json!({
            "id": "0193b7e2-0000-7000-8000-0000000000ff",
            "kind": "invoice",
            "status": "issued",
            "number": "INV-000007",
            "tenant_id": "0193b7e2-0000-7000-8000-0000000000aa",
            "period": "2026-12",
            "currency": "CNY",
            "issued_at": "2027-01-04T00:00:00Z",
            "lines": [
                {"lease_id": "L-1", "tier": "basic", "charges": 1,
                 "billed_seconds": 90, "amount": "1.00",
                 "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T10:01:30Z",
                 "price_book_version": 1},
                {"lease_id": "L-2", "tier": "spot", "charges": 3,
                 "billed_seconds": 10800, "amount": "12.00",
                 "from": "2026-12-02T00:00:00Z", "to": "2026-12-02T03:00:00Z",
                 "price_book_version": 2}
            ],
            "credits": [{"credit_id": "C-1", "period": "2026-11", "amount": "-0.50"}],
            "total": "12.50",
            "content_hash": "ab12cd"
        })
    }

    #[test]
    fn spot_price_table() {
        let out = spot_prices(&json!({"markets": [{
            "zone": "cn-north.1", "region": "cn-north", "gpu_model": "A100-40GB",
            "current": {"price_cny_per_gb_hour": "0.2", "utilisation": "0.5", "at": "2026-12-04T10:00:00Z"},
            "gpus_total": 4, "gpus_used": 2,
            "history": [
                {"price_cny_per_gb_hour": "0.1", "utilisation": "0", "at": "2026-12-04T09:00:00Z"},
                {"price_cny_per_gb_hour": "0.2", "utilisation": "0.5", "at": "2026-12-04T10:00:00Z"}
            ]
        }]}));
        let row: Vec<&str> = out
            .lines()
            .find(|l| l.contains("cn-north.1"))
            .unwrap_or_else(|| panic!("no market row in\n{out}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            [
                "cn-north.1",
                "cn-north",
                "A100-40GB",
                "0.2",
                "2/4",
                "2026-12-04T10:00:00Z",
                "0.1",
                "0.2"
            ]
        );
    }

    #[test]
    fn invoice_table() {
        let out = invoice(&sample_invoice());
        assert_eq!(
            value_of(&out, "tenant").as_deref(),
            Some("0193b7e2-0000-7000-8000-0000000000aa")
        );
        assert_eq!(value_of(&out, "period").as_deref(), Some("2026-12"));
        assert_eq!(value_of(&out, "number").as_deref(), Some("INV-000007"));
        assert_eq!(value_of(&out, "status").as_deref(), Some("issued"));
        let line = |prefix: &str| -> Vec<String> {
            out.lines()
                .find(|l| l.trim_start().starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} row in\n{out}"))
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            line("LEASE"),
            ["LEASE", "TIER", "FROM", "TO", "CHARGES", "SECONDS", "AMOUNT", "PRICE", "BOOK"]
        );
        assert_eq!(
            line("L-1"),
            [
                "L-1",
                "basic",
                "2026-12-01T10:00:00Z",
                "2026-12-01T10:01:30Z",
                "1",
                "90",
                "1.00",
                "v1"
            ]
        );
        assert_eq!(line("L-2")[6], "12.00");
        assert_eq!(line("SLA credit"), ["SLA", "credit", "2026-11", "-0.50"]);
        assert_eq!(line("TOTAL"), ["TOTAL", "12.50", "CNY"]);
        assert!(out.contains("content hash: ab12cd"));
        let mut part = sample_invoice();
        part["part"] = 3.into();
        part["parts"] = 3.into();
        assert_eq!(
            value_of(&invoice(&part), "number").as_deref(),
            Some("INV-000007 (part 3 of 3)")
        );
    }

    #[test]
    fn cost_report_table_and_csv() {
        let report = json!({
            "tenant_id": "T", "week": "2026-W49", "currency": "CNY",
            "from": "2026-11-30T00:00:00Z", "to": "2026-12-07T00:00:00Z",
            "tiers": [
                {"tier": "basic", "charges": 2, "billed_seconds": 7200,
                 "spend": "80.00", "on_demand": "80.00", "saving": "0.00"},
                {"tier": "spot", "charges": 1, "billed_seconds": 3600,
                 "spend": "16.00", "on_demand": "40.00", "saving": "24.00"}
            ],
            "spend": "96.00", "on_demand": "120.00", "saving": "24.00"
        });
        let out = cost_report(&report);
        let row = |p: &str| row_of(&out, p);
        assert_eq!(
            row("spot"),
            ["spot", "1", "3600", "16.00", "40.00", "24.00"]
        );
        assert_eq!(row("TOTAL"), ["TOTAL", "96.00", "120.00", "24.00"]);
        let csv = cost_report_csv(&report);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 4, "{csv}");
        assert_eq!(lines[2], "2026-W49,spot,1,3600,16.00,40.00,24.00,CNY");
        assert_eq!(lines[3], "2026-W49,TOTAL,,,96.00,120.00,24.00,CNY");
    }

    #[test]
    fn cost_report_csv_cells_cannot_run_as_formulas() {
        let report = json!({
            "week": "=HYPERLINK(\"x\")", "currency": "@SUM(A1)",
            "tiers": [
                {"tier": "-2+3,x", "charges": 1, "billed_seconds": 60,
                 "spend": "-1.50", "on_demand": "+cmd|' /C calc'!A0", "saving": "\t=1"}
            ],
            "spend": "-1.50", "on_demand": "0.00", "saving": "1.50"
        });
        let csv = cost_report_csv(&report);
        let row = csv.lines().nth(1).unwrap();
        assert_eq!(
            row,
            "\"'=HYPERLINK(\"\"x\"\")\",\"'-2+3,x\",1,60,-1.50,'+cmd|' /C calc'!A0,'\t=1,'@SUM(A1)"
        );
    }

    #[test]
    fn what_if_table_and_csv() {
        let report = json!({
            "period": "2026-11", "book_version": 0,
            "tenants": [
                {"tenant_id": "T-1", "charges": 5, "current_cny": "800.00",
                 "what_if_cny": "720.00", "difference_cny": "-80.00"},
                {"tenant_id": "T-2", "charges": 2, "current_cny": "40.00",
                 "what_if_cny": "48.00", "difference_cny": "8.00"}
            ],
            "charges": 7, "current_cny": "840.00", "what_if_cny": "768.00",
            "difference_cny": "-72.00"
        });
        let out = what_if(&report);
        let row = |p: &str| row_of(&out, p);
        assert_eq!(row("book"), ["book", "v0"]);
        assert_eq!(
            row("TENANT"),
            [
                "TENANT",
                "CHARGES",
                "CURRENT",
                "CNY",
                "WHAT-IF",
                "CNY",
                "DIFFERENCE",
                "CNY"
            ]
        );
        assert_eq!(row("T-1"), ["T-1", "5", "800.00", "720.00", "-80.00"]);
        assert_eq!(row("TOTAL"), ["TOTAL", "7", "840.00", "768.00", "-72.00"]);
        let csv = what_if_csv(&report);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines,
            [
                "period,tenant_id,charges,current_cny,what_if_cny,difference_cny",
                "2026-11,T-1,5,800.00,720.00,-80.00",
                "2026-11,T-2,2,40.00,48.00,8.00",
                "2026-11,TOTAL,7,840.00,768.00,-72.00",
            ]
        );
    }

    #[test]
    fn what_if_csv_cells_cannot_run_as_formulas() {
        let report = json!({
            "period": "=1+1",
            "tenants": [{"tenant_id": "@SUM(A1)", "charges": 1, "current_cny": "-1.50",
                         "what_if_cny": "+cmd|' /C calc'!A0", "difference_cny": "a,\"b"}],
            "charges": 1, "current_cny": "-1.50", "what_if_cny": "0.00", "difference_cny": "1.50"
        });
        let csv = what_if_csv(&report);
        assert_eq!(
            csv.lines().nth(1).unwrap(),
            "'=1+1,'@SUM(A1),1,-1.50,'+cmd|' /C calc'!A0,\"a,\"\"b\""
        );
    }

    #[test]
    fn invoice_list_rows() {
        let list = json!({"invoices": [
            {"id": "I-1", "number": "INV-000001", "kind": "invoice", "status": "issued",
             "period": "2026-11", "tenant_id": "T", "total": "3.00", "currency": "CNY",
             "issued_at": "2026-12-04T00:00:00Z"},
            {"id": "I-2", "number": null, "kind": "invoice", "status": "draft",
             "period": "2026-12", "tenant_id": "T", "total": "1.00", "currency": "CNY",
             "issued_at": null},
            {"id": "I-3", "number": "INV-000003", "kind": "invoice", "status": "issued",
             "period": "2026-10", "tenant_id": "T", "total": "9.00", "currency": "CNY",
             "issued_at": "2026-11-04T00:00:00Z", "part": 2, "parts": 3, "first_part_id": "I-0"}
        ]});
        let out = invoice_list(&list);
        let rows: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[1][..4], ["I-1", "INV-000001", "invoice", "issued"]);
        assert_eq!(rows[2][..4], ["I-2", "-", "invoice", "draft"]);
        assert_eq!(
            rows[3][..7],
            ["I-3", "INV-000003", "(part", "2", "of", "3)", "invoice"]
        );
        assert_eq!(invoice_list(&json!({"invoices": []})), "no invoices\n");
    }

    #[test]
    fn empty_invoice_still_has_total() {
        let out =
            invoice(&json!({"period": "2026-11", "currency": "CNY", "lines": [], "total": "0.00"}));
        let total = out
            .lines()
            .find(|l| l.trim_start().starts_with("TOTAL"))
            .unwrap();
        assert_eq!(
            total.split_whitespace().collect::<Vec<_>>(),
            ["TOTAL", "0.00", "CNY"]
        );
        assert!(!out.contains("content hash"));
    }

    #[test]
    fn tenant_table_and_hint() {
        let out = tenant_created(&json!({
            "id": "0193b7e2-0000-7000-8000-0000000000aa",
            "api_key": "lh_live_abc123",
            "name": "acme",
            "quota": {"max_gpus": 8}
        }));
        assert_eq!(
            value_of(&out, "id").as_deref(),
            Some("0193b7e2-0000-7000-8000-0000000000aa")
        );
        assert_eq!(value_of(&out, "api key").as_deref(), Some("lh_live_abc123"));
        assert_eq!(value_of(&out, "max gpus").as_deref(), Some("8"));
        assert!(out.contains("export LH_API_KEY=lh_live_abc123\n"), "{out}");
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("abc_1-2"), "abc_1-2");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$(rm)"), "'$(rm)'");
    }

    #[test]
    fn audit_records_as_table_and_defused_csv() {
        let page = json!({"events": [{
            "sequence": 7, "occurred_at": "2026-12-01T00:00:00Z", "actor": "tenant:t1",
            "event_type": "lease.requested", "object": "lease.l1", "outcome": "success",
            "tenant_id": "t1", "subject": "lh.evt.lease.l1.requested.gateway",
            "payload": {"note": "=HYPERLINK(\"x\")"}
        }], "next": 7});
        let out = audit_events(&page);
        assert!(
            out.contains("lease.requested") && out.contains("tenant:t1"),
            "{out}"
        );
        assert!(out.contains("next page: --after 7"), "{out}");
        let row = audit_csv_row(&page["events"][0]);
        assert!(
            row.starts_with("7,2026-12-01T00:00:00Z,tenant:t1,lease.requested,"),
            "{row}"
        );
        assert!(
            row.ends_with("\"{\"\"note\"\":\"\"=HYPERLINK(\\\"\"x\\\"\")\"\"}\"\n"),
            "{row}"
        );
        assert!(audit_csv_header().ends_with(",subject,payload\n"));
        let formula = audit_csv_row(&json!({"sequence": 1, "actor": "=cmd|' /C calc'!A0"}));
        assert!(formula.contains("'=cmd"), "{formula}");
        assert_eq!(audit_events(&json!({"events": []})), "no audit records\n");
    }

    #[test]
    fn audit_table() {
        let out = audit(&json!({"ok": true, "events": 42, "head": "deadbeef"}));
        assert_eq!(value_of(&out, "ok").as_deref(), Some("yes"));
        assert_eq!(value_of(&out, "events").as_deref(), Some("42"));
        assert_eq!(value_of(&out, "head").as_deref(), Some("deadbeef"));
        let out = audit(&json!({"ok": false, "events": 7, "head": "00", "first_bad_seq": 5}));
        assert_eq!(value_of(&out, "ok").as_deref(), Some("NO"));
        assert_eq!(value_of(&out, "first_bad_seq").as_deref(), Some("5"));
        // Verified from an anchor once the log's oldest events expired.
        let out = audit(&json!({
            "ok": true, "events": 9, "head": "ab", "checked_from": 6,
            "anchor": {"sequence": 5, "events": 5, "head": "cd"}
        }));
        assert_eq!(value_of(&out, "checked_from").as_deref(), Some("6"));
        assert_eq!(
            value_of(&out, "anchor").as_deref(),
            Some(r#"{"events":5,"head":"cd","sequence":5}"#)
        );
        let out = audit(&json!({"ok": false, "events": 0, "head": "00", "problem": "no anchor"}));
        assert_eq!(value_of(&out, "ok").as_deref(), Some("NO"));
        assert_eq!(value_of(&out, "problem").as_deref(), Some("no anchor"));
    }
}
