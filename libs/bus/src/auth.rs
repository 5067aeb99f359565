//! Who may do what on NATS: the users of the server config and the subject
//! permissions of each, generated from the owner table
//! ([`lh_events::subject::OWNERS`]) so that the server refuses what the
//! table does not allow.
//!
//! Every service has one user, every node agent its own, and two more
//! exist for people: `operator` (the only one that may update, delete or
//! purge the log) and `auditor` (reads the log, nothing else). A user
//! publishes events only on the subjects of the types its publisher owns,
//! with its own origin token; a node agent only as itself. Replies come to
//! a per-user inbox prefix, so that no user can read another's replies
//! (JetStream deliveries, invoices).
//!
//! `deploy/nats/permissions.conf` is [`permissions_conf`] checked in; a
//! test fails when the two drift. The users themselves (one public nkey
//! each) are a deployment's, written by [`users_conf`] (see the
//! `lh-nats-auth` binary and docs/adr/012-subjects-name-type-and-publisher.md).
//!
//! Users live in accounts (docs/adr/028-an-account-per-node.md): the log,
//! the services, the operator and the auditor in [`LOG_ACCOUNT`]; each node
//! in an account of its own, which holds its snapshots and is capped in
//! connections, subscriptions and storage, and which reaches the log only
//! through what the log's account exports to it: the subjects its
//! permissions allow, nothing else.

use lh_events::subject::{self, Publisher, OWNERS};

/// The user that manages streams.
pub const OPERATOR_USER: &str = "operator";
/// The read-only user for people who check the log.
pub const AUDITOR_USER: &str = "auditor";
/// Most characters a user name may have (it becomes a subject token).
pub const MAX_USER_NAME_CHARS: usize = 64;

/// Where replies to `user` arrive (`<prefix>.>`).
pub fn inbox_prefix(user: &str) -> String {
    format!("_INBOX_{user}")
}

/// A user name as the config and the inbox prefix need it: letters,
/// digits, `-` and `_`, at most [`MAX_USER_NAME_CHARS`].
pub fn check_user_name(user: &str) -> Result<(), String> {
    if user.is_empty() || user.chars().count() > MAX_USER_NAME_CHARS {
        return Err(format!(
            "a NATS user name has 1 to {MAX_USER_NAME_CHARS} characters, not {:?}",
            user
        ));
    }
    if let Some(bad) = user
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!(
            "a NATS user name holds only letters, digits, '-' and '_': {bad:?} in {user:?}"
        ));
    }
    Ok(())
}

/// The NATS user of a node agent.
pub fn node_user(node_id: &str) -> String {
    subject::node_origin(node_id)
}

/// Whether `user` is a node agent's (see [`node_user`]).
pub fn is_node_user(user: &str) -> bool {
    user.starts_with("node-")
}

/// The account that holds the streams, the services, the operator and the
/// auditor.
pub const LOG_ACCOUNT: &str = "LH";
/// Where a node's account sees the log's JetStream API. Its own `$JS.API`
/// is its own account's, which holds its snapshots.
pub const NODE_LOG_API_PREFIX: &str = "$JS.LH.API";
/// Connections one node's credential may hold at once: an agent uses one,
/// a restart overlaps two, a cluster failover reconnects; the rest is room.
pub const NODE_MAX_CONNECTIONS: u32 = 8;
/// Subscriptions all of one node's connections may hold together (an
/// agent holds a few dozen).
pub const NODE_MAX_SUBSCRIPTIONS: u32 = 1024;
/// Streams a node may have in its own account: its snapshot bucket.
pub const NODE_MAX_STREAMS: u32 = 1;
/// Consumers a node may have in its own account at once (reading a
/// snapshot takes one, for a moment).
pub const NODE_MAX_CONSUMERS: u32 = 16;
/// Size limit of one node agent's snapshot store, in bytes: what it folds
/// is its own leases and inventory, and there is one store per node.
pub const NODE_SNAPSHOTS_MAX_BYTES: i64 = 16 * 1024 * 1024;
/// Disk a node's account may take: its snapshot bucket at the most
/// replicas a stream may have (5).
pub const NODE_MAX_FILE_BYTES: i64 = NODE_SNAPSHOTS_MAX_BYTES * 5;
/// How long the log's account keeps the way back open for replies to a
/// node's request: a pull request waits up to its expiry (30 s) for
/// messages, with room.
const NODE_RESPONSE_THRESHOLD: &str = "2m";

/// The account of node `node_id`.
pub fn node_account(node_id: &str) -> String {
    format!("NODE_{}", subject::token(node_id))
}

/// One user's subject permissions (allow lists; everything else is denied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    /// Refused even where an allow matches (the server applies deny last).
    pub publish_deny: Vec<String>,
    pub subscribe: Vec<String>,
    /// May answer requests it received (request/reply responders).
    pub allow_responses: bool,
}

/// What nobody but the operator may do to the logs, even if an allow
/// list grew by mistake.
fn stream_management() -> Vec<String> {
    let mut deny = vec![
        "$JS.API.STREAM.UPDATE.>".to_string(),
        "$JS.API.STREAM.DELETE.>".to_string(),
        "$JS.API.STREAM.MSG.DELETE.>".to_string(),
    ];
    for stream in [subject::EVENTS_STREAM, subject::TELEMETRY_STREAM] {
        deny.push(format!("$JS.API.STREAM.PURGE.{stream}"));
    }
    deny
}

/// Reading a stream: its info, ordered consumers, and single messages.
fn read_stream(stream: &str) -> Vec<String> {
    vec![
        format!("$JS.API.STREAM.INFO.{stream}"),
        // Ordered consumers have no name: their create has no more tokens.
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.DELETE.{stream}.>"),
        format!("$JS.API.CONSUMER.INFO.{stream}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"),
        format!("$JS.API.STREAM.MSG.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
    ]
}

/// `user`'s own snapshot store: services and node agents keep their
/// folded state there (a cache: a lost snapshot costs a replay, never a
/// wrong answer), each user in a bucket no other user may read, write or
/// purge.
fn snapshots(user: &str) -> Vec<String> {
    let bucket = crate::snapshots_bucket(user);
    let stream = format!("OBJ_{bucket}");
    let mut subjects = read_stream(&stream);
    subjects.extend([
        format!("$JS.API.STREAM.CREATE.{stream}"),
        // Replacing an object purges the chunks of the one it replaces.
        format!("$JS.API.STREAM.PURGE.{stream}"),
        format!("$O.{bucket}.>"),
    ]);
    subjects
}

/// The aggregate subjects of `family` with `*` for each id token, or a
/// node's own for the node family.
fn aggregate_pattern(family: &str, node: Option<&str>) -> String {
    match (family, node) {
        ("node", Some(node_id)) => subject::node(node_id),
        _ => {
            let ids = subject::aggregate_id_tokens(family);
            format!("lh.evt.{family}{}", ".*".repeat(ids))
        }
    }
}

/// The subjects on which `publisher` may publish events (for a node agent,
/// as `node_id`), one per owned type.
pub fn event_subjects(publisher: Publisher, node_id: Option<&str>) -> Vec<String> {
    let origin = match (publisher.service_name(), node_id) {
        (Some(name), _) => name.to_string(),
        (None, Some(node_id)) => subject::node_origin(node_id),
        (None, None) => return Vec::new(),
    };
    OWNERS
        .iter()
        .filter(|(_, owners)| owners.contains(&publisher))
        .map(|(event_type, _)| {
            let family = event_type.split('.').next().unwrap_or_default();
            format!(
                "{}.{}.{origin}",
                aggregate_pattern(family, node_id),
                subject::verb(event_type)
            )
        })
        .collect()
}

/// Reading node `node_id`'s own view of the log (docs/adr/027) and
/// nothing else of it: the business log's info (its head and limits, no
/// event), and every read of the mirror of its view (docs/adr/028), which
/// holds nothing but that view. It may make no consumer of the log itself.
fn read_own_view(node_id: &str) -> Vec<String> {
    let mut reads = vec![format!("$JS.API.STREAM.INFO.{}", subject::EVENTS_STREAM)];
    reads.extend(read_stream(&subject::node_view_stream(node_id)));
    reads
}

/// A service of the log's account that a node's account imports: `subject`
/// as the log's account answers it, `local` as the node asks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeImport {
    pub subject: String,
    pub local: String,
    /// Answered with many messages (a pull request's deliveries), not one.
    pub streamed: bool,
}

/// Everything node `node_id` may ask of the log's account: reads of its own
/// view of the log (docs/adr/027), the telemetry stream's info, its events,
/// its heartbeat, its usage samples and its leases' environments. The
/// JetStream API comes under [`NODE_LOG_API_PREFIX`]; the rest under its
/// own subjects.
pub fn node_imports(node_id: &str) -> Vec<NodeImport> {
    let api = |subject: String| NodeImport {
        local: subject.replacen("$JS.API.", &format!("{NODE_LOG_API_PREFIX}."), 1),
        streamed: subject.contains(".MSG.NEXT."),
        subject,
    };
    let same = |subject: String| NodeImport {
        local: subject.clone(),
        subject,
        streamed: false,
    };
    let mut imports: Vec<NodeImport> = read_own_view(node_id).into_iter().map(api).collect();
    imports.push(api(format!(
        "$JS.API.STREAM.INFO.{}",
        subject::TELEMETRY_STREAM
    )));
    imports.extend(
        event_subjects(Publisher::Node, Some(node_id))
            .into_iter()
            .map(same),
    );
    imports.push(same(subject::heartbeat(node_id)));
    imports.push(same(subject::usage_of_node(node_id)));
    // Only its own: the gateway gives a lease's environment to the node
    // whose subject it is asked on, and only for a lease placed there.
    imports.push(same(subject::rpc_workload_env(node_id)));
    // Its sessions' frames to the gateway, under its own name only.
    imports.push(same(subject::sessions_from_node(node_id)));
    imports
}

/// What the log's account sends node `node_id`'s account unasked: the
/// announcements of a new leader of its view's mirror (its feed reopens on
/// one).
fn node_stream_imports(node_id: &str) -> Vec<String> {
    vec![format!(
        "{LEADER_ELECTED}.{}",
        subject::node_view_stream(node_id)
    )]
}

/// Announcements of a new leader of a stream, by the stream's name.
const LEADER_ELECTED: &str = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED";

/// What the log's account offers any account that imports it: the same
/// for every node, so that adding a node changes nothing in the log's
/// account. Each node's account imports a narrow part of it, its own
/// ([`node_imports`]); an account exists only in the server's config, so
/// no other can import anything.
fn log_exports() -> Vec<NodeImport> {
    let service = |subject: String| NodeImport {
        local: subject.clone(),
        streamed: subject.contains(".MSG.NEXT."),
        subject,
    };
    let mut exports: Vec<NodeImport> = read_stream("*").into_iter().map(service).collect();
    exports.extend(
        [
            subject::EVENTS_ALL,
            subject::TELEMETRY_ALL,
            subject::RPC_GATEWAY_WORKLOAD_ENV_ALL,
            subject::SESSIONS_FROM_NODES_ALL,
        ]
        .map(|s| service(s.to_string())),
    );
    exports
}

/// What the log's account sends any account that imports it: the
/// announcements of a new leader of any of its streams.
fn log_stream_exports() -> Vec<String> {
    vec![format!("{LEADER_ELECTED}.*")]
}

/// What node `node_id`'s account answers for the log's account: reads of
/// its leases' logs, and the sessions into its leases (the gateway asks).
fn node_exports(node_id: &str) -> Vec<String> {
    vec![
        subject::rpc_lease_logs(node_id),
        subject::sessions_to_node(node_id),
    ]
}

/// What every service and node agent needs besides its events: `log`, its
/// reads of the log, the telemetry stream's info, its inbox, the snapshot
/// store, and the announcements of a new leader of the log.
fn base(user: &str, log: Vec<String>) -> Permissions {
    let mut publish = log;
    publish.push(format!("$JS.API.STREAM.INFO.{}", subject::TELEMETRY_STREAM));
    publish.extend(snapshots(user));
    Permissions {
        publish,
        publish_deny: stream_management(),
        subscribe: vec![
            format!("{}.>", inbox_prefix(user)),
            format!(
                "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{}",
                subject::EVENTS_STREAM
            ),
        ],
        allow_responses: false,
    }
}

/// The permissions of a service's user.
pub fn service_permissions(service: Publisher) -> Permissions {
    let name = service.service_name().expect("a service has a name");
    let mut p = base(name, read_stream(subject::EVENTS_STREAM));
    p.publish.extend(event_subjects(service, None));
    // A service creates the logs when they are missing; the server
    // refuses a create whose config differs from the stream's, so it
    // cannot change one that exists.
    p.publish.extend([
        format!("$JS.API.STREAM.CREATE.{}", subject::EVENTS_STREAM),
        format!("$JS.API.STREAM.CREATE.{}", subject::TELEMETRY_STREAM),
    ]);
    match service {
        Publisher::Gateway => {
            p.publish
                .extend(subject::RPC_AUDIT_ALL.iter().map(|s| s.to_string()));
            p.publish.push(subject::RPC_SPOT_PRICES.to_string());
            p.publish.push(subject::RPC_SCHEDULER_FLEET.to_string());
            p.publish
                .extend(subject::RPC_PRICING_ALL.iter().map(|s| s.to_string()));
            p.subscribe
                .push(subject::RPC_GATEWAY_WORKLOAD_ENV_ALL.to_string());
            p.publish.push(subject::RPC_NODE_LEASE_LOGS_ALL.to_string());
            // It relays every session into a lease (docs/adr/030).
            p.publish.push(subject::SESSIONS_TO_NODES_ALL.to_string());
            p.subscribe
                .push(subject::SESSIONS_FROM_NODES_ALL.to_string());
            p.allow_responses = true;
            // The usage projection reads the samples with an ordered
            // consumer from the position it stored, and reopens it when a
            // cluster elects a new leader of the stream.
            p.publish.extend(read_stream(subject::TELEMETRY_STREAM));
            p.subscribe.push(format!(
                "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{}",
                subject::TELEMETRY_STREAM
            ));
        }
        Publisher::Scheduler => {
            p.publish.extend(read_stream(subject::TELEMETRY_STREAM));
            // It keeps the mirror of each node's view (docs/adr/028). A
            // stream's name is one token, so the permission cannot name
            // the mirrors' alone; update and delete stay the operator's.
            // It renews a mirror stalled on the log's old leader.
            p.publish.extend([
                "$JS.API.STREAM.INFO.*".to_string(),
                "$JS.API.STREAM.CREATE.*".to_string(),
                "$JS.API.STREAM.LEADER.STEPDOWN.*".to_string(),
            ]);
            p.subscribe.push(subject::HEARTBEATS_ALL.to_string());
            p.subscribe.push(subject::RPC_SCHEDULER_FLEET.to_string());
            p.allow_responses = true;
        }
        Publisher::Pricing => {
            p.subscribe
                .extend(subject::RPC_PRICING_ALL.iter().map(|s| s.to_string()));
            p.allow_responses = true;
        }
        Publisher::Audit => {
            p.subscribe
                .extend(subject::RPC_AUDIT_ALL.iter().map(|s| s.to_string()));
            p.allow_responses = true;
        }
        Publisher::SpotBroker => {
            p.subscribe.push(subject::RPC_SPOT_PRICES.to_string());
            p.allow_responses = true;
        }
        Publisher::Node => {}
    }
    p.publish.dedup();
    p
}

/// The permissions of node `node_id`'s agent, in its own account: what it
/// imports from the log's account (its events, its own view of the log, its
/// heartbeat, its usage samples, its leases' environments), its own
/// snapshot bucket, its inbox, and the reads of its leases' logs; nothing as
/// another node, nothing of another node's leases. The account would refuse
/// the rest anyway; the permissions say so on the user too.
pub fn node_permissions(node_id: &str) -> Permissions {
    let user = node_user(node_id);
    let mut publish: Vec<String> = node_imports(node_id)
        .into_iter()
        .map(|import| import.local)
        .collect();
    publish.extend(snapshots(&user));
    let mut subscribe = vec![format!("{}.>", inbox_prefix(&user))];
    subscribe.extend(node_stream_imports(node_id));
    subscribe.extend(node_exports(node_id));
    Permissions {
        publish,
        publish_deny: stream_management(),
        subscribe,
        allow_responses: true,
    }
}

/// The auditor: reads the log, writes nothing.
pub fn auditor_permissions() -> Permissions {
    let mut publish = read_stream(subject::EVENTS_STREAM);
    // Connecting checks that both logs exist.
    publish.push(format!("$JS.API.STREAM.INFO.{}", subject::TELEMETRY_STREAM));
    Permissions {
        publish,
        publish_deny: stream_management(),
        subscribe: vec![format!("{}.>", inbox_prefix(AUDITOR_USER))],
        allow_responses: false,
    }
}

/// The operator: everything, stream management included.
pub fn operator_permissions() -> Permissions {
    Permissions {
        publish: vec![">".into()],
        publish_deny: Vec::new(),
        subscribe: vec![">".into()],
        allow_responses: false,
    }
}

/// The name of a user's permissions in permissions.conf.
fn variable(user: &str) -> String {
    format!("PERMS_{}", user.to_uppercase().replace('-', "_"))
}

fn quoted(subjects: &[String]) -> String {
    let items: Vec<String> = subjects.iter().map(|s| format!("\"{s}\"")).collect();
    format!("[\n      {}\n    ]", items.join("\n      "))
}

/// One permissions block in the server's config syntax.
pub fn render(p: &Permissions) -> String {
    let mut out = String::from("{\n  publish: {\n    allow: ");
    out.push_str(&quoted(&p.publish));
    if !p.publish_deny.is_empty() {
        out.push_str("\n    deny: ");
        out.push_str(&quoted(&p.publish_deny));
    }
    out.push_str("\n  }\n  subscribe: {\n    allow: ");
    out.push_str(&quoted(&p.subscribe));
    out.push_str("\n  }\n");
    if p.allow_responses {
        out.push_str("  allow_responses: true\n");
    }
    out.push('}');
    out
}

/// Every fixed user: its name and permissions.
pub fn fixed_users() -> Vec<(String, Permissions)> {
    let mut users: Vec<(String, Permissions)> = Publisher::SERVICES
        .into_iter()
        .map(|s| {
            (
                s.service_name().unwrap_or_default().to_string(),
                service_permissions(s),
            )
        })
        .collect();
    users.push((OPERATOR_USER.into(), operator_permissions()));
    users.push((AUDITOR_USER.into(), auditor_permissions()));
    users
}

/// deploy/nats/permissions.conf: one variable per fixed user.
pub fn permissions_conf() -> String {
    let mut out = String::from(
        "# Generated by `lh-nats-auth permissions` from the owner table of\n\
         # libs/events/src/subject.rs; a test fails when they differ.\n\
         # Included by users.conf, which gives each user its nkey.\n",
    );
    for (user, permissions) in fixed_users() {
        out.push_str(&format!(
            "\n{} = {}\n",
            variable(&user),
            render(&permissions)
        ));
    }
    out
}

/// A deployment's users.conf: the log's account with the fixed users in
/// `keys` (user name, public nkey) and their permissions from
/// permissions.conf, and one account per node in `nodes` (node id, public
/// nkey) holding that node's user, its limits, and what it imports from
/// the log's account (and exports to it).
pub fn users_conf(keys: &[(String, String)], nodes: &[(String, String)]) -> String {
    let mut out = String::from(
        "# Generated by lh-nats-auth: the log's account (one user per service,\n\
         # the operator, the auditor) and one account per node agent, which\n\
         # reaches the log only through what is exported to it\n\
         # (docs/adr/028-an-account-per-node.md). Nobody connects without an nkey.\n\
         include \"permissions.conf\"\n\naccounts {\n",
    );
    out.push_str(&format!(
        "  {LOG_ACCOUNT}: {{\n    jetstream: enabled\n    users: [\n"
    ));
    for (user, public_key) in keys {
        out.push_str(&format!(
            "      # {user}\n      {{ nkey: \"{public_key}\", permissions: ${} }}\n",
            variable(user)
        ));
    }
    out.push_str("    ]\n");
    out.push_str("    exports: [\n");
    for export in log_exports() {
        let response = if export.streamed {
            format!(", response_type: stream, response_threshold: \"{NODE_RESPONSE_THRESHOLD}\"")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "      {{ service: \"{}\"{response} }}\n",
            export.subject
        ));
    }
    for stream in log_stream_exports() {
        out.push_str(&format!("      {{ stream: \"{stream}\" }}\n"));
    }
    out.push_str("    ]\n");
    if !nodes.is_empty() {
        out.push_str("    imports: [\n");
        for (node_id, _) in nodes {
            for export in node_exports(node_id) {
                out.push_str(&format!(
                    "      {{ service: {{ account: \"{}\", subject: \"{export}\" }} }}\n",
                    node_account(node_id)
                ));
            }
        }
        out.push_str("    ]\n");
    }
    out.push_str("  }\n");
    for (node_id, public_key) in nodes {
        let account = node_account(node_id);
        let block = render(&node_permissions(node_id)).replace('\n', "\n        ");
        out.push_str(&format!(
            "  # node {node_id}\n  \"{account}\": {{\n\
             \x20   jetstream: {{ max_mem: 0, max_file: {NODE_MAX_FILE_BYTES}, max_streams: {NODE_MAX_STREAMS}, max_consumers: {NODE_MAX_CONSUMERS} }}\n\
             \x20   limits: {{ max_connections: {NODE_MAX_CONNECTIONS}, max_subscriptions: {NODE_MAX_SUBSCRIPTIONS} }}\n\
             \x20   users: [\n      {{ nkey: \"{public_key}\", permissions: {block} }}\n    ]\n    imports: [\n"
        ));
        for import in node_imports(node_id) {
            let to = if import.local == import.subject {
                String::new()
            } else {
                format!(", to: \"{}\"", import.local)
            };
            out.push_str(&format!(
                "      {{ service: {{ account: \"{LOG_ACCOUNT}\", subject: \"{}\" }}{to} }}\n",
                import.subject
            ));
        }
        for stream in node_stream_imports(node_id) {
            out.push_str(&format!(
                "      {{ stream: {{ account: \"{LOG_ACCOUNT}\", subject: \"{stream}\" }} }}\n"
            ));
        }
        out.push_str("    ]\n    exports: [\n");
        for export in node_exports(node_id) {
            out.push_str(&format!(
                "      {{ service: \"{export}\", accounts: [\"{LOG_ACCOUNT}\"] }}\n"
            ));
        }
        out.push_str("    ]\n  }\n");
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_permissions_are_the_owner_tables() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/nats/permissions.conf"
        );
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == permissions_conf(),
            "{path} differs from the owner table: run \
             `cargo run -p lh-bus --bin lh-nats-auth -- permissions > deploy/nats/permissions.conf`"
        );
    }

    #[test]
    fn a_node_publishes_its_own_types_as_itself_only() {
        let p = node_permissions("gpu-1");
        assert!(p
            .publish
            .contains(&"lh.evt.lease.*.started.node-gpu-1".to_string()));
        assert!(p
            .publish
            .contains(&"lh.evt.node.gpu-1.registered.node-gpu-1".to_string()));
        assert!(p.publish.contains(&"lh.tel.heartbeat.gpu-1".to_string()));
        assert!(p.publish.contains(&"lh.tel.usage.gpu-1.*".to_string()));
        assert!(!p.publish.iter().any(|s| s.contains("placed")));
        assert!(!p.publish.iter().any(|s| s.contains("gpu-2")));
        assert!(p.subscribe.contains(&"_INBOX_node-gpu-1.>".to_string()));
    }

    #[test]
    fn a_node_reads_the_log_only_in_its_own_view() {
        let p = node_permissions("gpu-1");
        let log: Vec<&String> = p
            .publish
            .iter()
            .filter(|s| s.contains(subject::EVENTS_STREAM))
            .collect();
        assert_eq!(log, ["$JS.LH.API.STREAM.INFO.LH_EVENTS"]);
        let view: Vec<&String> = p.publish.iter().filter(|s| s.contains("LH_VIEW")).collect();
        assert!(
            view.iter()
                .all(|s| s.starts_with("$JS.LH.API.") && s.contains(".LH_VIEW_gpu-1")),
            "{view:?}"
        );
        assert!(view.contains(&&"$JS.LH.API.CONSUMER.CREATE.LH_VIEW_gpu-1.>".to_string()));
        // Services read as before.
        let scheduler = service_permissions(Publisher::Scheduler);
        assert!(scheduler
            .publish
            .contains(&"$JS.API.STREAM.MSG.GET.LH_EVENTS".to_string()));
        // What it may ask is exactly what its account imports.
        let imported: Vec<String> = node_imports("gpu-1").into_iter().map(|i| i.local).collect();
        let asked: Vec<&String> = p
            .publish
            .iter()
            .filter(|s| !s.contains("lh-snapshots-node-gpu-1"))
            .collect();
        assert_eq!(asked, imported.iter().collect::<Vec<_>>());
    }

    #[test]
    fn each_user_keeps_snapshots_in_its_own_bucket_only() {
        let node = node_permissions("gpu-1");
        assert!(node
            .publish
            .contains(&"$O.lh-snapshots-node-gpu-1.>".to_string()));
        assert!(node
            .publish
            .contains(&"$JS.API.STREAM.PURGE.OBJ_lh-snapshots-node-gpu-1".to_string()));
        let scheduler = service_permissions(Publisher::Scheduler);
        assert!(scheduler
            .publish
            .contains(&"$O.lh-snapshots-scheduler.>".to_string()));
        for p in [&node, &scheduler] {
            let buckets: Vec<&String> = p
                .publish
                .iter()
                .filter(|s| s.contains("lh-snapshots"))
                .collect();
            let own = if std::ptr::eq(p, &node) {
                "lh-snapshots-node-gpu-1"
            } else {
                "lh-snapshots-scheduler"
            };
            assert!(buckets.iter().all(|s| s.contains(own)), "{buckets:?}");
        }
    }

    /// Whether every subject `narrow` matches, `wide` matches too.
    fn subject_within(narrow: &str, wide: &str) -> bool {
        let (mut n, mut w) = (narrow.split('.'), wide.split('.'));
        loop {
            match (n.next(), w.next()) {
                (_, Some(">")) => return true,
                (Some(">"), _) => return false,
                (Some(_), Some("*")) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    #[test]
    fn a_node_imports_only_parts_of_what_the_log_exports() {
        let exports = log_exports();
        for import in node_imports("gpu-1") {
            let within = exports
                .iter()
                .find(|e| subject_within(&import.subject, &e.subject))
                .unwrap_or_else(|| panic!("{} is exported by nothing", import.subject));
            assert_eq!(within.streamed, import.streamed, "{}", import.subject);
        }
        assert!(subject_within("a.*.b.>", "a.>"));
        assert!(subject_within("a.*.b", "a.*.*"));
        assert!(!subject_within("a.>", "a.*"));
        assert!(!subject_within("a.b", "a.b.c"));
        assert!(!subject_within("a.*", "a.b"));
    }

    #[test]
    fn user_names_are_single_tokens() {
        assert!(check_user_name("node-gpu_1").is_ok());
        for bad in ["", "a.b", "a*", "a b", &"x".repeat(MAX_USER_NAME_CHARS + 1)] {
            assert!(check_user_name(bad).is_err(), "{bad:?}");
        }
    }
}
