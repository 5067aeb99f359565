//! Lints the deployment files so they stay deployable; the checks are this
//! crate's tests, one file per concern, and this library is what they share:
//!
//! - `docker-compose.yml` validates against the official Compose
//!   Specification schema (vendored in `deploy/schemas/compose-spec.json`),
//!   checked by `check-jsonschema`;
//! - every manifest in `k8s/` and `k8s/simulated/` validates, strictly (no
//!   unknown fields): built-in kinds against the Kubernetes API schemas,
//!   checked by `kubernetes-validate`, custom resources (CloudNativePG,
//!   Prometheus Operator) against the CRDs vendored in
//!   `deploy/schemas/crds/`, made strict JSON Schemas by
//!   `scripts/crd-to-jsonschema.py` and checked by `check-jsonschema`;
//! - the PrometheusRule carries exactly the rules of
//!   `deploy/prometheus/rules/`, and a monitor scrapes every service's
//!   `/metrics` port under the job name the rules and dashboards use;
//! - the NetworkPolicies allow every flow the manifests need (derived from
//!   them: NATS, database and object store URLs, metrics ports, NATS
//!   routes, the CloudNativePG operator) and no rule that no such flow
//!   uses;
//! - the object store offers its S3 port alone (compose publishes nothing
//!   else, the k8s Service exposes nothing else, `make up` keeps it on
//!   loopback), runs one SeaweedFS version wherever it runs, and the
//!   gateway is given its admin identity with the secret from a file;
//! - the node-agent runs as a DaemonSet on GPU nodes with what NVML, MIG and
//!   MPS need, and keeps its state on the host;
//! - NATS and PostgreSQL are production-shaped: three members or instances
//!   on different hosts, persistent volumes, disruption budgets, and each
//!   service a role of its own;
//! - every image in either file runs a binary that the workspace builds, and
//!   every service binary is deployed by both;
//! - the simulated fleet and the NATS settings the files carry agree with
//!   `dev/`;
//! - NATS is a three-node JetStream cluster in both, and every service is
//!   given every member's URL and three stream replicas.
//! - compose's Prometheus scrapes every service on the port it serves
//!   `/metrics` on, by its compose name, and Grafana is provisioned with
//!   that Prometheus and the dashboards of `deploy/grafana/dashboards/`;
//!   nothing is published beyond 127.0.0.1.
//!
//! The validators come from `make deps` (`.data/venv`). A missing validator
//! fails the check, it never skips it. The linter is a crate of its own, not
//! a system test: it starts nothing and reads only files, so it builds
//! without the platform.

pub mod binaries;
pub mod command;
pub mod compose;
pub mod k8s;
pub mod manifests;
pub mod monitoring;
pub mod nats;
pub mod network_policy;
pub mod node_agent;
pub mod schemas;
pub mod workspace;
