//! A NetworkPolicy simulator: the flows the manifests need are derived from
//! what they run (NATS and database URLs, metrics ports, NATS routes, the
//! CloudNativePG operator), then each is pushed through the policies the
//! way a CNI enforces them, egress at its source and ingress at its
//! destination. Recording which rule part let each flow through is what
//! lets the check also find rules that no needed flow uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_yaml_ng::Value;

use crate::k8s::{
    containers, env_value, pod_templates, port_of, selects, service_backend, Labels, PodTemplate,
    NAMESPACE,
};
use crate::manifests::str_at;
use crate::monitoring::scrape_targets;

/// One end of a network flow: a pod (its namespace and labels) or, for the
/// Kubernetes API server, an address outside any pod network.
#[derive(Clone, Debug)]
pub enum Peer {
    Pod {
        what: String,
        namespace: String,
        labels: Labels,
    },
    ApiServer,
}

impl Peer {
    pub(crate) fn outside(what: &str, namespace: &str, labels: &[(&str, &str)]) -> Self {
        Peer::Pod {
            what: what.to_string(),
            namespace: namespace.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    pub(crate) fn inside(pod: &PodTemplate) -> Self {
        Peer::Pod {
            what: pod.what.clone(),
            namespace: NAMESPACE.to_string(),
            labels: pod.labels.clone(),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Peer::Pod { what, .. } => what,
            Peer::ApiServer => "the API server",
        }
    }
}

/// A connection the platform needs, and why.
#[derive(Clone, Debug)]
pub struct Flow {
    pub from: Peer,
    pub to: Peer,
    pub port: u16,
    pub protocol: &'static str,
    pub why: &'static str,
}

/// The flows the manifests need, derived from what they run: each pod
/// resolves names; a container with `LH_NATS_URL` reaches the NATS members
/// on the URL's port, one with `DATABASE_URL` or `PGHOST` the instances of
/// the CloudNativePG cluster it names; NATS members reach each other on
/// their route port; Prometheus reaches every scrape target; anyone
/// reaches the gateway's API, its SSH endpoint and its leases' web pages;
/// node agents whose bus is plain (no
/// `LH_NATS_CA_FILE`) reach each container with `LH_SESSION_LANE_ADDR` on
/// its port (a session's lane); a container with `LH_STORAGE_ENDPOINT`
/// reaches the object store behind that Service, and every node agent the
/// store at the address such a container hands out
/// (`LH_STORAGE_PUBLIC_ENDPOINT`, else the same); the CloudNativePG
/// operator reaches its instances, which reach each other and the API
/// server.
pub fn needed_flows(docs: &[(PathBuf, Value)]) -> Vec<Flow> {
    let dns = Peer::outside("kube-dns", "kube-system", &[("k8s-app", "kube-dns")]);
    let prometheus = Peer::outside(
        "Prometheus",
        "monitoring",
        &[("app.kubernetes.io/name", "prometheus")],
    );
    let operator = Peer::outside(
        "the CloudNativePG operator",
        "cnpg-system",
        &[("app.kubernetes.io/name", "cloudnative-pg")],
    );
    let anyone = Peer::outside("a client of the API", "ingress", &[]);
    let pods = pod_templates(docs);
    let by_name = |what: &str| pods.iter().find(|p| p.what == what).cloned();
    let nats = by_name("StatefulSet/nats").expect("a nats StatefulSet");
    let route_port = docs
        .iter()
        .find(|(_, d)| str_at(d, &["metadata", "name"]) == Some("nats-config"))
        .and_then(|(_, d)| str_at(d, &["data", "nats.conf"]).map(str::to_string))
        .and_then(|conf| {
            conf.lines()
                .find(|l| l.trim().starts_with("nats://nats-0."))
                .map(|l| port_of(l.trim()))
        })
        .expect("nats-config routes");
    let instances: BTreeMap<String, PodTemplate> = pods
        .iter()
        .filter(|p| p.what.starts_with("Cluster/"))
        .map(|p| (p.labels["cnpg.io/cluster"].clone(), p.clone()))
        .collect();

    let mut flows = Vec::new();
    let mut flow =
        |from: &Peer, to: &Peer, port: u16, protocol: &'static str, why: &'static str| {
            flows.push(Flow {
                from: from.clone(),
                to: to.clone(),
                port,
                protocol,
                why,
            })
        };
    for pod in &pods {
        let me = Peer::inside(pod);
        flow(&me, &dns, 53, "UDP", "names");
        flow(&me, &dns, 53, "TCP", "names");
        for container in containers(pod) {
            if let Some(urls) = env_value(&container, "LH_NATS_URL") {
                for url in urls.split(',') {
                    flow(
                        &me,
                        &Peer::inside(&nats),
                        port_of(url),
                        "TCP",
                        "LH_NATS_URL",
                    );
                }
            }
            let database_host = env_value(&container, "DATABASE_URL")
                .map(|url| {
                    let after_at = url
                        .rsplit_once('@')
                        .map_or(url.as_str(), |(_, h)| h)
                        .to_string();
                    after_at.split(['/', '?']).next().unwrap().to_string()
                })
                .or_else(|| env_value(&container, "PGHOST").map(|h| format!("{h}:5432")));
            if let Some(host_port) = database_host {
                let host = host_port.split(':').next().unwrap();
                let cluster = host
                    .split('.')
                    .next()
                    .and_then(|service| service.strip_suffix("-rw"))
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: database host {host} is no CloudNativePG -rw service",
                            pod.what
                        )
                    });
                let instance = instances
                    .get(cluster)
                    .unwrap_or_else(|| panic!("{}: no Cluster {cluster}", pod.what));
                flow(
                    &me,
                    &Peer::inside(instance),
                    port_of(&host_port),
                    "TCP",
                    "its database",
                );
            }
            if let Some(addr) = env_value(&container, "LH_GATEWAY_ADDR") {
                flow(&anyone, &me, port_of(&addr), "TCP", "the API");
            }
            // Tenants' SSH clients, from wherever they are.
            if let Some(addr) = env_value(&container, "LH_SSH_ADDR").filter(|a| a != "off") {
                flow(&anyone, &me, port_of(&addr), "TCP", "the SSH endpoint");
            }
            // Tenants' browsers, to their leases' web pages.
            if let Some(addr) = env_value(&container, "LH_LEASE_WEB_ADDR") {
                flow(&anyone, &me, port_of(&addr), "TCP", "leases' web pages");
            }
            // The object store, with its admin identity.
            if let Some(endpoint) = env_value(&container, "LH_STORAGE_ENDPOINT") {
                let (store, port) = store_behind(docs, &pods, &pod.what, &endpoint);
                flow(
                    &me,
                    &Peer::inside(&store),
                    port,
                    "TCP",
                    "LH_STORAGE_ENDPOINT",
                );
            }
            // The CLI in a Job (the simulated fleet's enrollment).
            if let Some(url) = env_value(&container, "LH_GATEWAY_URL") {
                let gateway = by_name("Deployment/gateway").expect("a gateway Deployment");
                flow(
                    &me,
                    &Peer::inside(&gateway),
                    port_of(url.trim_end_matches('/')),
                    "TCP",
                    "the API, as a client",
                );
            }
        }
    }
    // A session's lane: the node agent dials the gateway replica that
    // opened the session, by its own address, unless the node's bus is
    // TLS (a lane is plaintext, so such a node keeps to the bus).
    let lane_listeners: Vec<(Peer, u16)> = pods
        .iter()
        .flat_map(|pod| {
            containers(pod)
                .into_iter()
                .filter_map(|c| env_value(&c, "LH_SESSION_LANE_ADDR").filter(|a| a != "off"))
                .map(|addr| (Peer::inside(pod), port_of(&addr)))
                .collect::<Vec<_>>()
        })
        .collect();
    for pod in &pods {
        let plain_node_agent = containers(pod).iter().any(|c| {
            let tls = c["env"].as_sequence().into_iter().flatten().any(|e| {
                str_at(e, &["name"]) == Some("LH_NATS_CA_FILE")
                    && (str_at(e, &["value"]).is_some_and(|v| !v.is_empty())
                        || e.get("valueFrom").is_some())
            });
            str_at(c, &["image"]).is_some_and(|i| i.starts_with("leasehold/lh-node-agent:")) && !tls
        });
        if plain_node_agent {
            for (gateway, port) in &lane_listeners {
                flow(
                    &Peer::inside(pod),
                    gateway,
                    *port,
                    "TCP",
                    "a session's lane",
                );
            }
        }
    }
    // Leases' datasets and workspaces: a node agent has no address of the
    // store of its own, it uses the one the gateway hands it.
    let handed_out: Vec<(String, String)> = pods
        .iter()
        .flat_map(|pod| {
            containers(pod)
                .into_iter()
                .filter_map(|c| {
                    env_value(&c, "LH_STORAGE_PUBLIC_ENDPOINT")
                        .or_else(|| env_value(&c, "LH_STORAGE_ENDPOINT"))
                })
                .map(|endpoint| (pod.what.clone(), endpoint))
                .collect::<Vec<_>>()
        })
        .collect();
    for pod in pods.iter().filter(|pod| is_node_agent(pod)) {
        for (giver, endpoint) in &handed_out {
            let (store, port) = store_behind(docs, &pods, giver, endpoint);
            flow(
                &Peer::inside(pod),
                &Peer::inside(&store),
                port,
                "TCP",
                "leases' data, where the gateway says the store is",
            );
        }
    }
    let nats_peer = Peer::inside(&nats);
    flow(&nats_peer, &nats_peer, route_port, "TCP", "NATS routes");
    for instance in instances.values() {
        let me = Peer::inside(instance);
        flow(
            &operator,
            &me,
            5432,
            "TCP",
            "the operator manages PostgreSQL",
        );
        flow(
            &operator,
            &me,
            8000,
            "TCP",
            "the operator reads the instance manager's status",
        );
        flow(&me, &me, 5432, "TCP", "replication");
        flow(
            &me,
            &Peer::ApiServer,
            443,
            "TCP",
            "the instance manager watches its Cluster",
        );
        flow(
            &me,
            &Peer::ApiServer,
            6443,
            "TCP",
            "the instance manager watches its Cluster",
        );
    }
    for target in scrape_targets(docs) {
        let pod = by_name(&target.pod).expect("scraped pod");
        flow(
            &prometheus,
            &Peer::inside(&pod),
            target.port,
            "TCP",
            "metrics",
        );
    }
    flows
}

/// The store pod and port behind an endpoint that `what` names. A store
/// outside the manifests would need an egress of its own, which this
/// check cannot derive: it says so rather than pass without it.
fn store_behind(
    docs: &[(PathBuf, Value)],
    pods: &[PodTemplate],
    what: &str,
    endpoint: &str,
) -> (PodTemplate, u16) {
    service_backend(docs, pods, endpoint).unwrap_or_else(|| {
        panic!("{what}: the object store {endpoint} is no Service of the manifests")
    })
}

fn is_node_agent(pod: &PodTemplate) -> bool {
    containers(pod)
        .iter()
        .any(|c| str_at(c, &["image"]).is_some_and(|i| i.starts_with("leasehold/lh-node-agent:")))
}

/// Which rule, peer and port entry of which policy a flow went through.
type RulePart = (String, &'static str, usize, &'static str, usize);

/// Whether a NetworkPolicy peer (`podSelector`, `namespaceSelector`,
/// `ipBlock`) covers `peer`, for a policy in the namespace leasehold.
fn peer_matches(rule_peer: &Value, peer: &Peer) -> bool {
    match peer {
        Peer::ApiServer => {
            str_at(rule_peer, &["ipBlock", "cidr"]).is_some_and(|c| c.ends_with("/32"))
        }
        Peer::Pod {
            namespace, labels, ..
        } => {
            if rule_peer.get("ipBlock").is_some() {
                return false;
            }
            let namespace_ok = match rule_peer.get("namespaceSelector") {
                Some(selector) => selects(
                    selector,
                    &[("kubernetes.io/metadata.name".to_string(), namespace.clone())].into(),
                ),
                None => namespace == NAMESPACE,
            };
            let pod_ok = rule_peer
                .get("podSelector")
                .is_none_or(|selector| selects(selector, labels));
            namespace_ok && pod_ok
        }
    }
}

/// The rule parts of `policies` that let `flow` out of its source (egress)
/// or into its destination (ingress); `None` when no policy applies to that
/// end in that direction (everything passes), `Some(empty)` when policies
/// apply and none allows it.
fn allowing_parts(
    policies: &[Value],
    flow: &Flow,
    direction: &'static str,
) -> Option<Vec<RulePart>> {
    let (me, other) = match direction {
        "Egress" => (&flow.from, &flow.to),
        _ => (&flow.to, &flow.from),
    };
    let Peer::Pod {
        namespace, labels, ..
    } = me
    else {
        return None;
    };
    if namespace != NAMESPACE {
        return None; // not ours to police
    }
    let (rules_key, peers_key) = match direction {
        "Egress" => ("egress", "to"),
        _ => ("ingress", "from"),
    };
    let applying: Vec<&Value> = policies
        .iter()
        .filter(|p| selects(&p["spec"]["podSelector"], labels))
        .filter(|p| {
            p["spec"]["policyTypes"]
                .as_sequence()
                .is_some_and(|types| types.iter().any(|t| t.as_str() == Some(direction)))
        })
        .collect();
    if applying.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for policy in applying {
        let name = str_at(policy, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        for (rule_index, rule) in policy["spec"][rules_key]
            .as_sequence()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let peers = rule[peers_key].as_sequence().cloned().unwrap_or_default();
            let peer_index = if peers.is_empty() {
                Some(usize::MAX) // every peer
            } else {
                peers.iter().position(|p| peer_matches(p, other))
            };
            let ports = rule["ports"].as_sequence().cloned().unwrap_or_default();
            let port_index = if ports.is_empty() {
                Some(usize::MAX) // every port
            } else {
                ports.iter().position(|p| {
                    p["port"].as_u64() == Some(flow.port as u64)
                        && str_at(p, &["protocol"]).unwrap_or("TCP") == flow.protocol
                })
            };
            if let (Some(peer), Some(port)) = (peer_index, port_index) {
                parts.push((name.clone(), rules_key, rule_index, peers_key, peer));
                parts.push((name.clone(), rules_key, rule_index, "ports", port));
            }
        }
    }
    Some(parts)
}

/// What is wrong with the NetworkPolicies of `docs`: a needed flow they
/// refuse, a rule without peers or ports (open to all; only the gateway's
/// API, SSH endpoint and leases' web pages may be), a peer or port no needed flow goes through, and a
/// namespace without its default deny.
pub fn network_policy_problems(docs: &[(PathBuf, Value)]) -> Vec<String> {
    let policies: Vec<Value> = docs
        .iter()
        .map(|(_, d)| d.clone())
        .filter(|d| str_at(d, &["kind"]) == Some("NetworkPolicy"))
        .collect();
    let mut problems = Vec::new();

    let default_deny = policies.iter().any(|p| {
        let spec = &p["spec"];
        selects(&spec["podSelector"], &Labels::new())
            && spec["podSelector"]
                .as_mapping()
                .is_none_or(|m| m.is_empty())
            && ["Ingress", "Egress"].iter().all(|t| {
                spec["policyTypes"]
                    .as_sequence()
                    .is_some_and(|types| types.iter().any(|x| x.as_str() == Some(*t)))
            })
            && spec.get("ingress").is_none()
            && spec.get("egress").is_none()
    });
    if !default_deny {
        problems
            .push("no default-deny policy (every pod, Ingress and Egress, no rules)".to_string());
    }

    let mut used: BTreeSet<RulePart> = BTreeSet::new();
    for flow in needed_flows(docs) {
        for direction in ["Egress", "Ingress"] {
            match allowing_parts(&policies, &flow, direction) {
                None => {}
                Some(parts) if parts.is_empty() => problems.push(format!(
                    "{} → {} :{}/{} ({}) is refused ({direction})",
                    flow.from.name(),
                    flow.to.name(),
                    flow.port,
                    flow.protocol,
                    flow.why
                )),
                Some(parts) => used.extend(parts),
            }
        }
    }

    // The gateway's public doors: its API, its SSH endpoint and its
    // leases' web pages.
    let gateway_api_ports: BTreeSet<u64> = pod_templates(docs)
        .iter()
        .flat_map(containers)
        .flat_map(|c| {
            [
                env_value(&c, "LH_GATEWAY_ADDR"),
                env_value(&c, "LH_SSH_ADDR").filter(|a| a != "off"),
                env_value(&c, "LH_LEASE_WEB_ADDR"),
            ]
        })
        .flatten()
        .map(|addr| port_of(&addr) as u64)
        .collect();
    for policy in &policies {
        let name = str_at(policy, &["metadata", "name"])
            .unwrap_or_default()
            .to_string();
        for (rules_key, peers_key) in [("ingress", "from"), ("egress", "to")] {
            for (index, rule) in policy["spec"][rules_key]
                .as_sequence()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let peers = rule[peers_key].as_sequence().cloned().unwrap_or_default();
                let ports = rule["ports"].as_sequence().cloned().unwrap_or_default();
                let only_the_api = rules_key == "ingress"
                    && !ports.is_empty()
                    && ports.iter().all(|p| {
                        p["port"]
                            .as_u64()
                            .is_some_and(|port| gateway_api_ports.contains(&port))
                    });
                if peers.is_empty() && !only_the_api {
                    problems.push(format!(
                        "{name} {rules_key}[{index}] has no `{peers_key}`: open to all"
                    ));
                }
                if ports.is_empty() {
                    problems.push(format!(
                        "{name} {rules_key}[{index}] has no ports: every port"
                    ));
                }
                for (peer_index, peer) in peers.iter().enumerate() {
                    if let Some(cidr) = str_at(peer, &["ipBlock", "cidr"]) {
                        if !cidr.ends_with("/32") {
                            problems.push(format!(
                                "{name} {rules_key}[{index}]: ipBlock {cidr} is not one address"
                            ));
                        }
                    }
                    let part = (name.clone(), rules_key, index, peers_key, peer_index);
                    if !used.contains(&part) {
                        problems.push(format!("{name} {rules_key}[{index}].{peers_key}[{peer_index}] is used by no needed flow"));
                    }
                }
                for (port_index, port) in ports.iter().enumerate() {
                    let part = (name.clone(), rules_key, index, "ports", port_index);
                    if !used.contains(&part) {
                        problems.push(format!(
                            "{name} {rules_key}[{index}] port {:?} is used by no needed flow",
                            port["port"]
                        ));
                    }
                }
            }
        }
    }
    problems
}
