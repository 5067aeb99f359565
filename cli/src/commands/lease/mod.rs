//! `lh lease ...`: request, read, stop and resume a lease, read its GPU
//! usage. Commands that are one request are here; those that page, poll
//! or follow have a room each: [`list`], [`wait`], [`logs`].

mod list;
mod logs;
mod wait;

use std::time::Duration;

use serde_json::{json, Value};

use crate::args::LeaseCommand;
use crate::client::Gateway;
use crate::error::EXIT_OK;
use crate::output::{emit, Out};
use crate::render;

use super::body::gpu_fields;

pub use logs::LOGS_POLL_INTERVAL;
pub use wait::WAIT_POLL_INTERVAL;

/// Runs one `lh lease` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: LeaseCommand,
    json: bool,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        LeaseCommand::Create(c) => {
            let mut body = json!({
                "gpu_model": c.gpu_model,
                "tier": c.tier.as_str(),
                "priority": c.priority,
            });
            gpu_fields(&mut body, &c.ask);
            if let Some(quote) = &c.quote {
                body["quote_id"] = json!(quote);
            }
            if let Some(price) = &c.max_price {
                body["max_price_cny_per_gpu_hour"] = json!(price);
            }
            if !c.zones.is_empty() {
                body["zones"] = json!(c.zones);
            }
            if !c.regions.is_empty() {
                body["regions"] = json!(c.regions);
            }
            if let Some(max_retries) = c.max_retries {
                body["recovery"] = json!({"max_retries": max_retries, "zone_first": c.zone_first});
            }
            if !c.command.is_empty() || c.image.is_some() || !c.env.is_empty() {
                let env: serde_json::Map<String, Value> =
                    c.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                body["workload"] = json!({"command": c.command, "image": c.image, "env": env});
                if c.image.is_none() {
                    body["workload"].as_object_mut().unwrap().remove("image");
                }
            }
            let headers: Vec<(&str, &str)> = c
                .idempotency_key
                .as_deref()
                .map(|k| ("Idempotency-Key", k))
                .into_iter()
                .collect();
            let lease = gw.post(&["v1", "leases"], Some(&body), &headers).await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
        LeaseCommand::Get(g) => match g.wait {
            None => {
                let lease = gw.get(&["v1", "leases", &g.id], &[]).await?;
                emit(out, json, &lease, render::lease_view)?;
                Ok(EXIT_OK)
            }
            Some(target) => {
                let timeout = Duration::from_secs(g.timeout);
                let (lease, code) = wait::wait_for(gw, &g.id, target, timeout, err).await?;
                emit(out, json, &lease, render::lease_view)?;
                Ok(code)
            }
        },
        LeaseCommand::Ls(l) => list::list_leases(gw, &l, json, out).await,
        LeaseCommand::Stop(s) => {
            let lease = gw.post(&["v1", "leases", &s.id, "stop"], None, &[]).await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
        LeaseCommand::Usage(u) => {
            let step = u.step.map(|s| s.to_string());
            let query: Vec<(&str, &str)> = [
                ("from", u.from.as_deref()),
                ("to", u.to.as_deref()),
                ("step", step.as_deref()),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
            let usage = gw.get(&["v1", "leases", &u.id, "usage"], &query).await?;
            emit(out, json, &usage, render::lease_usage)?;
            Ok(EXIT_OK)
        }
        LeaseCommand::Logs(l) => logs::lease_logs(gw, &l, out, err).await,
        LeaseCommand::Resume(s) => {
            let lease = gw
                .post(&["v1", "leases", &s.id, "resume"], None, &[])
                .await?;
            emit(out, json, &lease, render::lease_view)?;
            Ok(EXIT_OK)
        }
    }
}
