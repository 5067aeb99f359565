//! Subject names: the aggregate, then the event's verb and its publisher.
//!
//! Business events live under `lh.evt.>` on the `LH_EVENTS` stream; heartbeats
//! and usage samples under `lh.tel.>` on `LH_TELEMETRY`. Request/reply between
//! services (never stored) uses `lh.rpc.>`.
//!
//! An event is stored on `<aggregate>.<verb>.<origin>`, for example
//! `lh.evt.lease.<id>.placed.scheduler` or
//! `lh.evt.lease.<id>.started.node-<node>`: the server's subject permissions
//! can then tell event types and publishers apart, so that a node agent can
//! be allowed `started` on any lease but `placed` on none, and only on its own
//! origin token. The guard of a write still covers the whole aggregate: the
//! server compares the expected sequence with the last message under
//! `<aggregate>.>` (see docs/adr/012-subjects-name-type-and-publisher.md).
//! No event belongs on the bare aggregate subject: a reader skips one found
//! there as on the wrong subject.

use uuid::Uuid;

use crate::Actor;

pub const EVENTS_STREAM: &str = "LH_EVENTS";
pub const EVENTS_ALL: &str = "lh.evt.>";
pub const TELEMETRY_STREAM: &str = "LH_TELEMETRY";
pub const TELEMETRY_ALL: &str = "lh.tel.>";

pub const LEASES_ALL: &str = "lh.evt.lease.>";
pub const NODES_ALL: &str = "lh.evt.node.>";
pub const NODE_VIEWS_ALL: &str = "lh.evt.node_view.>";
pub const TENANTS_ALL: &str = "lh.evt.tenant.>";
pub const CHARGES_ALL: &str = "lh.evt.charge.>";
pub const SPOT_ALL: &str = "lh.evt.spot.>";
pub const PRICE_BOOKS_ALL: &str = "lh.evt.price_book.>";
pub const AUDIT_ALL: &str = "lh.evt.audit.>";
pub const ACCESS_ALL: &str = "lh.evt.access.>";
pub const SECURITY_ALL: &str = "lh.evt.security.>";
pub const INVOICES_ALL: &str = "lh.evt.invoice.>";
pub const CREDITS_ALL: &str = "lh.evt.credit.>";
pub const RESERVATIONS_ALL: &str = "lh.evt.reservation.>";
pub const BALANCES_ALL: &str = "lh.evt.balance.>";
pub const QUOTES_ALL: &str = "lh.evt.quote.>";
pub const SESSIONS_ALL: &str = "lh.evt.session.>";
pub const SSH_KEYS_ALL: &str = "lh.evt.ssh_key.>";
pub const STORAGE_ALL: &str = "lh.evt.storage.>";
pub const DATASETS_ALL: &str = "lh.evt.dataset.>";
pub const WORKSPACES_ALL: &str = "lh.evt.workspace.>";

/// Request/reply subject on which the audit service answers chain verification.
pub const RPC_AUDIT_VERIFY: &str = "lh.rpc.audit.verify";
/// Request/reply subject on which the audit service answers a page of the
/// audit copy, filtered (what auditors ask: `GET /v1/audit/events`).
pub const RPC_AUDIT_EVENTS: &str = "lh.rpc.audit.events";
/// Every request/reply subject the audit service answers.
pub const RPC_AUDIT_ALL: &[&str] = &[RPC_AUDIT_VERIFY, RPC_AUDIT_EVENTS];
/// Request/reply subjects on which the gateway gives a node the environment
/// of a lease placed on it, one per node: `lh.rpc.gateway.workload_env.<node>`.
/// A node's user may publish only on its own, so the subject says which
/// node asks.
pub const RPC_GATEWAY_WORKLOAD_ENV_ALL: &str = "lh.rpc.gateway.workload_env.*";
/// The prefix of [`RPC_GATEWAY_WORKLOAD_ENV_ALL`], up to the node's token.
pub const RPC_GATEWAY_WORKLOAD_ENV_PREFIX: &str = "lh.rpc.gateway.workload_env.";

/// The subject on which node `node_id` asks for a lease's environment.
pub fn rpc_workload_env(node_id: &str) -> String {
    format!("{RPC_GATEWAY_WORKLOAD_ENV_PREFIX}{}", token(node_id))
}

/// Request/reply subjects on which a node-agent answers reads of the
/// workload logs it keeps, one per node: `lh.rpc.node.<node>.lease_logs`.
/// Only the gateway asks; each node's user may listen on its own only.
pub const RPC_NODE_LEASE_LOGS_ALL: &str = "lh.rpc.node.*.lease_logs";

/// Sessions into a lease (docs/adr/030), relayed between the gateway and
/// the lease's node; core NATS, never stored. To a node: its opening
/// requests and each session's frames.
pub const SESSIONS_TO_NODES_ALL: &str = "lh.sess.node.*.>";
/// From the nodes: each session's frames.
pub const SESSIONS_FROM_NODES_ALL: &str = "lh.sess.up.>";

/// Where the gateway asks node `node_id` to open a session.
pub fn session_open(node_id: &str) -> String {
    format!("lh.sess.node.{}.open", token(node_id))
}

/// Frames of `session_id` to node `node_id`.
pub fn session_to_node(node_id: &str, session_id: Uuid) -> String {
    format!("lh.sess.node.{}.{session_id}", token(node_id))
}

/// Everything the gateway sends node `node_id` about sessions.
pub fn sessions_to_node(node_id: &str) -> String {
    format!("lh.sess.node.{}.>", token(node_id))
}

/// Frames of `session_id` from node `node_id`.
pub fn session_from_node(node_id: &str, session_id: Uuid) -> String {
    format!("lh.sess.up.{}.{session_id}", token(node_id))
}

/// Every session frame node `node_id` may send.
pub fn sessions_from_node(node_id: &str) -> String {
    format!("lh.sess.up.{}.>", token(node_id))
}

/// The subject on which node `node_id` answers reads of its lease logs.
pub fn rpc_lease_logs(node_id: &str) -> String {
    format!("lh.rpc.node.{}.lease_logs", token(node_id))
}

/// Request/reply subject on which pricing answers invoice requests.
pub const RPC_PRICING_INVOICE: &str = "lh.rpc.pricing.invoice";
/// Request/reply subject on which the spot-broker answers spot prices.
pub const RPC_SPOT_PRICES: &str = "lh.rpc.spot.prices";
/// Request/reply on which the scheduler answers the fleet as it folds it.
pub const RPC_SCHEDULER_FLEET: &str = "lh.rpc.scheduler.fleet";
/// Request/reply subject on which pricing lists a tenant's invoices and notes.
pub const RPC_PRICING_INVOICE_LIST: &str = "lh.rpc.pricing.invoice_list";
/// Request/reply subject on which pricing answers one invoice or note.
pub const RPC_PRICING_INVOICE_DOCUMENT: &str = "lh.rpc.pricing.invoice_document";
/// Request/reply subject on which pricing answers a tenant's weekly cost report.
pub const RPC_PRICING_COST_REPORT: &str = "lh.rpc.pricing.cost_report";
/// Request/reply subject on which pricing lists the price books.
pub const RPC_PRICING_PRICE_BOOKS: &str = "lh.rpc.pricing.price_books";
/// Request/reply subject on which pricing publishes a new price book.
pub const RPC_PRICING_PUBLISH_PRICE_BOOK: &str = "lh.rpc.pricing.price_books.publish";
/// Request/reply subject on which pricing lists the reservations.
pub const RPC_PRICING_RESERVATIONS: &str = "lh.rpc.pricing.reservations";
/// Request/reply subject on which pricing commits a reservation.
pub const RPC_PRICING_COMMIT_RESERVATION: &str = "lh.rpc.pricing.reservations.commit";
/// Request/reply subject on which pricing answers a tenant's balance.
pub const RPC_PRICING_BALANCE: &str = "lh.rpc.pricing.balance";
/// Request/reply subject on which pricing prices a request and issues a quote.
pub const RPC_PRICING_QUOTE: &str = "lh.rpc.pricing.quotes";
/// Request/reply subject on which pricing answers a quote it issued.
pub const RPC_PRICING_QUOTE_GET: &str = "lh.rpc.pricing.quotes.get";
/// Request/reply subject on which pricing prices a past month again on
/// another price book.
pub const RPC_PRICING_WHAT_IF: &str = "lh.rpc.pricing.what_if";
/// Every request/reply subject pricing answers: the gateway may ask on
/// each, pricing may listen on each (`lh_bus::auth`).
pub const RPC_PRICING_ALL: &[&str] = &[
    RPC_PRICING_INVOICE,
    RPC_PRICING_INVOICE_LIST,
    RPC_PRICING_INVOICE_DOCUMENT,
    RPC_PRICING_COST_REPORT,
    RPC_PRICING_PRICE_BOOKS,
    RPC_PRICING_PUBLISH_PRICE_BOOK,
    RPC_PRICING_RESERVATIONS,
    RPC_PRICING_COMMIT_RESERVATION,
    RPC_PRICING_BALANCE,
    RPC_PRICING_QUOTE,
    RPC_PRICING_QUOTE_GET,
    RPC_PRICING_WHAT_IF,
];

pub fn lease(lease_id: Uuid) -> String {
    format!("lh.evt.lease.{lease_id}")
}

pub fn tenant(tenant_id: Uuid) -> String {
    format!("lh.evt.tenant.{tenant_id}")
}

pub fn node(node_id: &str) -> String {
    format!("lh.evt.node.{}", token(node_id))
}

/// What node `node_id` reads: its node's events and those of the leases
/// placed on it, relayed by the scheduler (docs/adr/027).
pub fn node_view(node_id: &str) -> String {
    format!("lh.evt.node_view.{}", token(node_id))
}

/// The relays to every node's view, as the scheduler writes them.
pub const NODE_VIEW_RELAYS_ALL: &str = "lh.evt.node_view.*.relayed.scheduler";

/// The node whose view `subject` (a relay's) is in.
pub fn node_of_view(subject: &str) -> Option<&str> {
    subject
        .strip_prefix("lh.evt.node_view.")?
        .split('.')
        .next()
        .filter(|node| !node.is_empty())
}

/// The stream that mirrors node `node_id`'s view of the log: the node
/// reads it there, so that its consumers are its view's and capped
/// there, never the log's (docs/adr/028).
pub fn node_view_stream(node_id: &str) -> String {
    format!("LH_VIEW_{}", token(node_id))
}

pub fn charge(lease_id: Uuid) -> String {
    format!("lh.evt.charge.{lease_id}")
}

pub fn spot(zone: &str, gpu_model: &str) -> String {
    format!("lh.evt.spot.{}.{}", token(zone), token(gpu_model))
}

pub fn price_book() -> String {
    "lh.evt.price_book.default".to_string()
}

/// The audit trail: its checkpoints and prunes, and the reads of it.
pub fn audit() -> String {
    "lh.evt.audit.chain".to_string()
}

/// Every summary of refused requests (`access.refused`).
pub fn access_refusals() -> String {
    "lh.evt.access.refusals".to_string()
}

/// Every summary of events the readers refused (`security.events_refused`).
pub fn security_refusals() -> String {
    "lh.evt.security.refusals".to_string()
}

/// Every issued invoice and note, on one subject: its last sequence guards
/// the numbering, so two replicas cannot hand out one number twice.
pub fn invoices() -> String {
    "lh.evt.invoice.ledger".to_string()
}

pub fn credit(tenant_id: Uuid) -> String {
    format!("lh.evt.credit.{tenant_id}")
}

pub fn reservation(reservation_id: Uuid) -> String {
    format!("lh.evt.reservation.{reservation_id}")
}

pub fn quote(quote_id: Uuid) -> String {
    format!("lh.evt.quote.{quote_id}")
}

/// A session into a lease: its opening and its end.
pub fn session(session_id: Uuid) -> String {
    format!("lh.evt.session.{session_id}")
}

/// One SSH public key of a tenant: its addition and its removal.
pub fn ssh_key(key_id: Uuid) -> String {
    format!("lh.evt.ssh_key.{key_id}")
}

/// A tenant's object storage: its bucket and identity, and their erasure.
pub fn storage(tenant_id: Uuid) -> String {
    format!("lh.evt.storage.{tenant_id}")
}

/// One dataset of a tenant: its versions and their removal.
pub fn dataset(dataset_id: Uuid) -> String {
    format!("lh.evt.dataset.{dataset_id}")
}

/// One workspace of a tenant: its snapshots, restores and removal.
pub fn workspace(workspace_id: Uuid) -> String {
    format!("lh.evt.workspace.{workspace_id}")
}

/// A tenant's prepaid balance: its top-ups and what pricing decides of them.
pub fn balance(tenant_id: Uuid) -> String {
    format!("lh.evt.balance.{tenant_id}")
}

/// Every node's heartbeats.
pub const HEARTBEATS_ALL: &str = "lh.tel.heartbeat.*";

/// The node a heartbeat's `subject` speaks for.
pub fn node_of_heartbeat(subject: &str) -> Option<&str> {
    subject
        .strip_prefix("lh.tel.heartbeat.")
        .filter(|node| !node.is_empty() && !node.contains('.'))
}

pub fn heartbeat(node_id: &str) -> String {
    format!("lh.tel.heartbeat.{}", token(node_id))
}

/// Every lease's usage samples, of every node.
pub const USAGE_ALL: &str = "lh.tel.usage.*.*";

/// Usage of `lease_id` as reported by `node_id`: the node is in the subject
/// so that a node's credentials can only report usage as itself.
pub fn usage(node_id: &str, lease_id: Uuid) -> String {
    format!("lh.tel.usage.{}.{lease_id}", token(node_id))
}

/// Every usage sample `node_id` reports.
pub fn usage_of_node(node_id: &str) -> String {
    format!("lh.tel.usage.{}.*", token(node_id))
}

/// Usage samples of `lease_id` from whichever node reported them.
pub fn usage_of_lease(lease_id: Uuid) -> String {
    format!("lh.tel.usage.*.{lease_id}")
}

/// Who may publish an event type. Tenants, admins and auditors act
/// through the gateway, which publishes for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Publisher {
    Gateway,
    Scheduler,
    Pricing,
    SpotBroker,
    Audit,
    /// Any node agent, each only as itself (its own origin token).
    Node,
}

impl Publisher {
    /// The services, in the order the server config lists them.
    pub const SERVICES: [Publisher; 5] = [
        Publisher::Gateway,
        Publisher::Scheduler,
        Publisher::Pricing,
        Publisher::SpotBroker,
        Publisher::Audit,
    ];

    /// The service's name: its origin token and its NATS user.
    pub fn service_name(self) -> Option<&'static str> {
        match self {
            Publisher::Gateway => Some("gateway"),
            Publisher::Scheduler => Some("scheduler"),
            Publisher::Pricing => Some("pricing"),
            Publisher::SpotBroker => Some("spot-broker"),
            Publisher::Audit => Some("audit"),
            Publisher::Node => None,
        }
    }

    /// The publisher an envelope's actor speaks through; `None` for a
    /// service this code does not know, which owns nothing.
    pub fn of_actor(actor: &Actor) -> Option<Publisher> {
        match actor {
            Actor::Node(_) => Some(Publisher::Node),
            Actor::Tenant(_) | Actor::Admin | Actor::Auditor | Actor::Operator(_) => {
                Some(Publisher::Gateway)
            }
            Actor::Service(name) => {
                let name = service_token(name);
                Publisher::SERVICES
                    .into_iter()
                    .find(|p| p.service_name() == Some(name))
            }
        }
    }
}

/// Which publishers may write each event type, from what the code does:
/// the only place that says so. The server's permissions
/// (deploy/nats/permissions.conf) are generated from it, and every reader
/// skips an event whose actor is not among its type's publishers.
pub const OWNERS: &[(&str, &[Publisher])] = {
    use Publisher::*;
    &[
        ("tenant.created", &[Gateway]),
        ("tenant.restated", &[Gateway]),
        ("tenant.api_key_issued", &[Gateway]),
        ("tenant.api_key_revoked", &[Gateway]),
        ("tenant.suspended", &[Gateway]),
        ("tenant.resumed", &[Gateway]),
        ("tenant.quota_changed", &[Gateway]),
        ("tenant.erased", &[Gateway]),
        // The scheduler requests a preempted spot lease again (managed
        // recovery) as a new lease.
        ("lease.requested", &[Gateway, Scheduler]),
        ("lease.queued", &[Scheduler]),
        ("lease.rejected", &[Scheduler]),
        ("lease.placed", &[Scheduler]),
        // A tenant or admin asks to stop; a node asks when the spot
        // capacity under a lease is reclaimed.
        // Pricing asks when a prepaid tenant's balance is exhausted.
        ("lease.stop_requested", &[Gateway, Node, Pricing]),
        ("lease.preemption_noticed", &[Scheduler]),
        ("lease.started", &[Node]),
        // The node ends what it ran; the scheduler ends what no node runs
        // any more (a lost node, a lease stopped before it started).
        ("lease.ended", &[Scheduler, Node]),
        ("lease.migrated", &[Scheduler]),
        ("lease.gpu_fault", &[Node]),
        ("lease.idle_detected", &[Node]),
        ("lease.suspended", &[Node]),
        ("lease.resume_requested", &[Gateway]),
        ("lease.restated", &[Scheduler]),
        ("node.registered", &[Node]),
        // An admin enrolls a node: what its registrations may claim.
        ("node.enrolled", &[Gateway]),
        ("node.gpus_allocated", &[Scheduler]),
        ("node.lost", &[Scheduler]),
        ("node.rejoined", &[Scheduler]),
        ("node.gpu_health_changed", &[Node]),
        ("node.gpu_self_tested", &[Node]),
        ("node.cordoned", &[Gateway]),
        ("node.uncordoned", &[Gateway]),
        ("node.restated", &[Scheduler]),
        // What a node may read is relayed to it by the scheduler, which
        // knows where each lease is placed.
        ("node_view.relayed", &[Scheduler]),
        ("spot.price_set", &[SpotBroker]),
        ("spot.capacity_chosen", &[SpotBroker]),
        ("price_book.published", &[Pricing]),
        ("price_book.restated", &[Pricing]),
        ("charge.accrued", &[Pricing]),
        ("invoice.issued", &[Pricing]),
        ("invoice.note_issued", &[Pricing]),
        ("credit.granted", &[Pricing]),
        ("audit.checkpoint", &[Audit]),
        ("audit.pruned", &[Audit]),
        ("audit.divergence_detected", &[Audit]),
        ("audit.accessed", &[Gateway]),
        ("access.refused", &[Gateway]),
        // The audit copy judges every event by the one rule: it sums what
        // was refused for operators.
        ("security.events_refused", &[Audit]),
        ("reservation.committed", &[Pricing]),
        ("balance.topped_up", &[Gateway]),
        ("balance.low", &[Pricing]),
        ("balance.exhausted", &[Pricing]),
        ("balance.restored", &[Pricing]),
        ("quote.issued", &[Pricing]),
        // The gateway relays every session, and knows who opened it.
        ("session.opened", &[Gateway]),
        ("session.ended", &[Gateway]),
        // A tenant registers and removes its SSH keys through the gateway;
        // an admin may remove one.
        ("ssh_key.added", &[Gateway]),
        ("ssh_key.removed", &[Gateway]),
        // The gateway makes a tenant's bucket and identity with the
        // store's admin identity, which no other service holds.
        ("storage.provisioned", &[Gateway]),
        ("storage.erased", &[Gateway]),
        // Only the gateway holds the admin identity that lists any bucket.
        ("storage.measured", &[Gateway]),
        ("charge.storage_accrued", &[Pricing]),
        ("dataset.version_added", &[Gateway]),
        ("dataset.removed", &[Gateway]),
        // The gateway alone reaches every tenant's bucket, and takes the
        // daily snapshots; a tenant restores and removes through it.
        ("workspace.snapshotted", &[Gateway]),
        ("workspace.restored", &[Gateway]),
        ("workspace.removed", &[Gateway]),
        // Only the node that runs a lease copies its workspace.
        ("lease.workspace_synced", &[Node]),
        // A gang's member tells the first that its part is done.
        ("lease.member_completed", &[Node]),
    ]
};

/// The publishers that may write `event_type` (none for an unknown type).
pub fn owners(event_type: &str) -> &'static [Publisher] {
    OWNERS
        .iter()
        .find(|(known, _)| *known == event_type)
        .map_or(&[], |(_, owners)| owners)
}

/// Whether `actor` may publish an event of `event_type`.
pub fn may_publish(actor: &Actor, event_type: &str) -> bool {
    Publisher::of_actor(actor).is_some_and(|p| owners(event_type).contains(&p))
}

/// A service actor's name without the binaries' `lh-` prefix.
fn service_token(name: &str) -> &str {
    name.strip_prefix("lh-").unwrap_or(name)
}

/// The last token of an event's subject: who published it.
pub fn origin(actor: &Actor) -> String {
    match actor {
        Actor::Node(node_id) => node_origin(node_id),
        Actor::Service(name) => token(service_token(name)),
        Actor::Tenant(_) | Actor::Admin | Actor::Auditor | Actor::Operator(_) => {
            "gateway".to_string()
        }
    }
}

/// The origin token of a node agent.
pub fn node_origin(node_id: &str) -> String {
    format!("node-{}", token(node_id))
}

/// The verb of an event type: what follows its family's dot.
pub fn verb(event_type: &str) -> &str {
    event_type
        .split_once('.')
        .map_or(event_type, |(_, verb)| verb)
}

/// The subject an event of `event_type` by `actor` is stored on.
pub fn event(aggregate_subject: &str, event_type: &str, actor: &Actor) -> String {
    format!("{aggregate_subject}.{}.{}", verb(event_type), origin(actor))
}

/// What a guard on an aggregate counts: every event stored on it.
pub fn guarded(aggregate_subject: &str) -> String {
    format!("{aggregate_subject}.>")
}

/// How many id tokens follow `lh.evt.<family>` in an aggregate subject.
pub fn aggregate_id_tokens(family: &str) -> usize {
    match family {
        "spot" => 2,
        _ => 1,
    }
}

/// The aggregate subject a stored event's subject belongs to (an
/// aggregate's own subject is its own aggregate); `None` for a subject
/// outside `lh.evt.>`.
pub fn aggregate_of(stored_subject: &str) -> Option<&str> {
    let mut tokens = stored_subject.split('.');
    if (tokens.next(), tokens.next()) != (Some("lh"), Some("evt")) {
        return None;
    }
    let wanted = 3 + aggregate_id_tokens(tokens.next()?);
    let mut end = 0;
    for (i, token) in stored_subject.split('.').enumerate().take(wanted) {
        end += token.len() + usize::from(i > 0);
        if i + 1 == wanted {
            return Some(&stored_subject[..end]);
        }
    }
    None
}

/// Whether the subject filter `filter` (NATS wildcards: `*` one token, a
/// last `>` one or more) matches the subject `subject`, as the server
/// decides it.
pub fn matches(filter: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for wanted in filter.split('.') {
        match (wanted, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (wanted, Some(token)) if wanted == token => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// Whether some subject matches both filters. nats-server refuses a
/// consumer whose filters overlap.
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.split('.'), b.split('.'));
    loop {
        match (a.next(), b.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some("*"), Some(_)) | (Some(_), Some("*")) => {}
            (Some(x), Some(y)) if x == y => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Makes a name safe as one subject token: NATS reserves `.`, `*`, `>` and
/// whitespace, so those become `_`.
pub fn token(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '.' | '*' | '>' => '_',
            c if c.is_whitespace() => '_',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_overlap_when_a_subject_matches_both() {
        assert!(filters_overlap(LEASES_ALL, "lh.evt.lease.x.>"));
        assert!(filters_overlap("lh.evt.*.x", "lh.evt.lease.*"));
        assert!(filters_overlap(EVENTS_ALL, CHARGES_ALL));
        assert!(filters_overlap("a.b", "a.b"));
        assert!(!filters_overlap(LEASES_ALL, NODES_ALL));
        assert!(!filters_overlap("a.>", "a"));
        assert!(!filters_overlap("a.*", "a.b.c"));
        assert!(!filters_overlap(CHARGES_ALL, INVOICES_ALL));
    }

    #[test]
    fn every_family_wildcard_covers_its_builder() {
        let id = uuid::Uuid::nil();
        for (all, one) in [
            (LEASES_ALL, lease(id)),
            (NODES_ALL, node("n1")),
            (NODE_VIEWS_ALL, node_view("n1")),
            (TENANTS_ALL, tenant(id)),
            (CHARGES_ALL, charge(id)),
            (SPOT_ALL, spot("z", "m")),
            (PRICE_BOOKS_ALL, price_book()),
            (AUDIT_ALL, audit()),
            (ACCESS_ALL, access_refusals()),
            (SECURITY_ALL, security_refusals()),
            (INVOICES_ALL, invoices()),
            (CREDITS_ALL, credit(id)),
            (RESERVATIONS_ALL, reservation(id)),
            (BALANCES_ALL, balance(id)),
            (QUOTES_ALL, quote(id)),
            (SESSIONS_ALL, session(id)),
            (SSH_KEYS_ALL, ssh_key(id)),
            (STORAGE_ALL, storage(id)),
            (DATASETS_ALL, dataset(id)),
            (WORKSPACES_ALL, workspace(id)),
        ] {
            let prefix = all.strip_suffix('>').unwrap();
            assert!(one.starts_with(prefix), "{one} is not under {all}");
            assert!(one.starts_with(EVENTS_ALL.strip_suffix('>').unwrap()));
        }
    }

    #[test]
    fn filters_match_as_the_server_matches() {
        let id = Uuid::nil();
        let started = event(&lease(id), "lease.started", &Actor::Node("n1".into()));
        assert!(matches(LEASES_ALL, &started));
        assert!(matches(EVENTS_ALL, &started));
        assert!(matches(&started, &started));
        assert!(!matches(CHARGES_ALL, &started));
        assert!(!matches(LEASES_ALL, "lh.evt.lease"), "> needs a token");
        assert!(matches(USAGE_ALL, "lh.tel.usage.n1.l1"));
        assert!(!matches(USAGE_ALL, "lh.tel.usage.n1"));
        assert!(!matches(USAGE_ALL, "lh.tel.usage.n1.l1.x"));
        assert!(
            !matches(&lease(id), &started),
            "a literal matches itself only"
        );
    }

    #[test]
    fn every_event_type_has_owners_and_every_owner_entry_a_type() {
        let types: Vec<&str> = crate::EVENT_TYPES.iter().map(|(t, _, _)| *t).collect();
        for event_type in &types {
            assert!(!owners(event_type).is_empty(), "{event_type} has no owner");
        }
        for (event_type, _) in OWNERS {
            assert!(types.contains(event_type), "{event_type} is no event type");
        }
        assert_eq!(OWNERS.len(), types.len(), "a type is named twice");
    }

    #[test]
    fn an_event_subject_names_aggregate_verb_and_origin() {
        let id = Uuid::nil();
        let node = Actor::Node("gpu.7".into());
        assert_eq!(
            event(&lease(id), "lease.started", &node),
            format!("lh.evt.lease.{id}.started.node-gpu_7")
        );
        let scheduler = Actor::Service("lh-scheduler".into());
        assert_eq!(
            event(&lease(id), "lease.placed", &scheduler),
            format!("lh.evt.lease.{id}.placed.scheduler")
        );
        assert_eq!(
            event(&tenant(id), "tenant.created", &Actor::Admin),
            format!("lh.evt.tenant.{id}.created.gateway")
        );
        assert!(may_publish(&scheduler, "lease.placed"));
        assert!(!may_publish(&node, "lease.placed"));
        assert!(may_publish(&node, "lease.ended") && may_publish(&scheduler, "lease.ended"));
        assert!(!may_publish(
            &Actor::Service("lh-stranger".into()),
            "lease.placed"
        ));
    }

    #[test]
    fn the_aggregate_of_a_subject_is_its_leading_tokens() {
        let id = Uuid::nil();
        let placed = format!("{}.placed.scheduler", lease(id));
        assert_eq!(aggregate_of(&placed), Some(lease(id).as_str()));
        assert_eq!(aggregate_of(&lease(id)), Some(lease(id).as_str()));
        let spot_subject = spot("z", "m");
        let priced = format!("{spot_subject}.price_set.spot-broker");
        assert_eq!(aggregate_of(&priced), Some(spot_subject.as_str()));
        assert_eq!(aggregate_of(&spot_subject), Some(spot_subject.as_str()));
        assert_eq!(aggregate_of("lh.tel.heartbeat.n1"), None);
        assert_eq!(aggregate_of("lh.evt.lease"), None);
    }

    #[test]
    fn views_and_heartbeats_name_their_node() {
        assert_eq!(node_of_view(&node_view("gpu-1")), Some("gpu-1"));
        assert_eq!(
            node_of_view("lh.evt.node_view.gpu-1.relayed.scheduler"),
            Some("gpu-1")
        );
        assert_eq!(node_of_view("lh.evt.lease.x.started.node-a"), None);
        assert_eq!(node_of_heartbeat(&heartbeat("gpu-1")), Some("gpu-1"));
        assert_eq!(node_of_heartbeat("lh.tel.heartbeat.a.b"), None);
        assert_eq!(node_of_heartbeat("lh.tel.usage.a.b"), None);
        assert_eq!(node_view_stream("gpu-1"), "LH_VIEW_gpu-1");
    }

    #[test]
    fn tokens_never_split_subjects() {
        assert_eq!(
            super::spot("cn-north.1", "A100 40GB"),
            "lh.evt.spot.cn-north_1.A100_40GB"
        );
    }
}
