//! Reading NATS cluster membership from the two places that name it: the
//! URL lists services connect with, and the `routes` of a server config.

use std::collections::BTreeSet;

/// Members of the NATS cluster every deployment runs.
pub const NATS_CLUSTER_MEMBERS: usize = 3;

/// The hosts of a comma-separated NATS URL list (`nats://host:port,...`).
pub fn nats_url_hosts(urls: &str) -> BTreeSet<String> {
    urls.split(',')
        .map(|url| {
            let rest = url.trim().strip_prefix("nats://").unwrap_or_else(|| {
                panic!("{url:?} in LH_NATS_URL is not a nats:// URL");
            });
            rest.split(':').next().unwrap().to_string()
        })
        .collect()
}

/// The hosts the `routes` list of a nats-server config names (any scheme).
pub fn route_hosts(conf: &str) -> BTreeSet<String> {
    conf.lines()
        .skip_while(|line| !line.trim_start().starts_with("routes"))
        .skip(1)
        .take_while(|line| line.trim() != "]")
        .filter_map(|line| line.trim().trim_matches('"').split_once("://"))
        .map(|(_, rest)| rest.split(':').next().unwrap().to_string())
        .collect()
}
