//! `lh lease ls`: one page of the tenant's leases, or with `--all` every
//! page from the cursor on, merged into one list. A cursor that comes back
//! twice, or pages without end, are the gateway's fault and said so.

use std::collections::HashSet;

use lh_rpc::http::leases::LeasePage;
use serde_json::{json, Value};

use crate::args::LeaseList;
use crate::client::{Gateway, MAX_PAGES};
use crate::error::{CliError, EXIT_OK};
use crate::output::{emit, write_out, Out};
use crate::render;

/// `lease ls`: one page, or with `--all` every page from the cursor on.
pub(super) async fn list_leases(
    gw: &Gateway,
    l: &LeaseList,
    json: bool,
    out: Out<'_>,
) -> anyhow::Result<i32> {
    let limit = l.limit.map(|n| n.to_string());
    let mut cursor = l.cursor.clone();
    let mut seen: HashSet<String> = cursor.iter().cloned().collect();
    // What `--json` prints is the gateway's JSON, so the pages' items are
    // kept as they came; the typed page drives the paging.
    let mut items: Vec<Value> = Vec::new();
    for _ in 0..MAX_PAGES {
        let mut query = Vec::new();
        if let Some(limit) = &limit {
            query.push(("limit", limit.as_str()));
        }
        if let Some(c) = &cursor {
            query.push(("cursor", c.as_str()));
        }
        let (page, answer) = gw.get_as::<LeasePage>(&["v1", "leases"], &query).await?;
        let bad = |reason: &str| CliError::BadResponse {
            url: gw.url(&["v1", "leases"], &query).to_string(),
            reason: reason.to_string(),
        };
        let next = page.next_cursor.filter(|c| !c.is_empty());
        let page_items = answer["items"].as_array().map_or(&[][..], Vec::as_slice);

        if !l.all {
            if json {
                emit(out, true, &answer, render::lease_view)?;
            } else {
                let mut table = render::lease_list(page_items);
                if let Some(next) = &next {
                    table.push_str(&format!(
                        "\nmore: lh lease ls --cursor {next}  (or --all)\n"
                    ));
                }
                write_out(out, &table)?;
            }
            return Ok(EXIT_OK);
        }

        items.extend(page_items.iter().cloned());
        match next {
            None => {
                let all = json!({"items": items, "next_cursor": null});
                emit(out, json, &all, |v| {
                    render::lease_list(v["items"].as_array().map_or(&[], Vec::as_slice))
                })?;
                return Ok(EXIT_OK);
            }
            Some(next) => {
                if !seen.insert(next.clone()) {
                    return Err(bad(&format!("cursor `{next}` came back twice")).into());
                }
                cursor = Some(next);
            }
        }
    }
    Err(CliError::BadResponse {
        url: gw.url(&["v1", "leases"], &[]).to_string(),
        reason: format!("still more pages after {MAX_PAGES}"),
    }
    .into())
}
