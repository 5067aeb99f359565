//! How each service is configured when a stack starts it: the test
//! tokens, the gateway's relaxed front door, the knobs a test set on the
//! stack, and the same `start` each service's binary calls.

use lh_service::CancellationToken;

use super::Stack;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef0123456789";
pub const AUDITOR_TOKEN: &str = "test-auditor-token-0123456789abcdef012345678";

impl Stack {
    pub async fn start_service(&mut self, name: &str) {
        let common = self.common();
        let token = CancellationToken::new();
        let running = match name.split_once(':').map(|(a, _)| a).unwrap_or(name) {
            "scheduler" => {
                let mut config = lh_scheduler::Config::for_test(&self.nats.url());
                config.preemption_min_runtime_secs = self.preemption_min_runtime_secs;
                config.preemption_notice_secs = self.preemption_notice_secs;
                config.common = common;
                Box::pin(lh_scheduler::start(config, token.clone())).await
            }
            "pricing" => {
                Box::pin(lh_pricing::start(
                    lh_pricing::Config {
                        common,
                        ..lh_pricing::Config::for_test(
                            &self.nats.url(),
                            &self.database_url_for("pricing"),
                        )
                    },
                    token.clone(),
                ))
                .await
            }
            "spot-broker" => {
                Box::pin(lh_spot_broker::start(
                    lh_spot_broker::Config::for_test(common),
                    token.clone(),
                ))
                .await
            }
            "audit" => {
                Box::pin(lh_audit::start(
                    lh_audit::Config {
                        common,
                        database_url: self.database_url_for("audit").into(),
                        schema: "audit".into(),
                        // Kept across restarts: checkpoints an earlier run
                        // signed must still verify against the trusted key.
                        signing_key_file: Some(self._dir.path().join("audit-signing.key")),
                        checkpoint_every_events: 50,
                        // A log that expires in seconds needs checkpoints as
                        // often, to verify from after expiry.
                        checkpoint_every_secs: if self.short_retention.is_some() {
                            1
                        } else {
                            3600
                        },
                        // A stack on a log that expires in seconds prunes in step.
                        prune_every_secs: 1,
                        trusted_public_keys: Vec::new(),
                        trusted_public_keys_file: None,
                        verify_token_file: None,
                    },
                    token.clone(),
                ))
                .await
            }
            "gateway" => {
                // A restarted gateway comes back where clients knew it.
                let gateway_addr = self
                    .gateway_url
                    .strip_prefix("http://")
                    .unwrap_or("127.0.0.1:0")
                    .to_string();
                let mut config = lh_gateway::Config {
                    common,
                    gateway_addr,
                    database_url: self.database_url_for("gateway").into(),
                    schema: "gateway".into(),
                    admin_token: Some(ADMIN_TOKEN.into()),
                    admin_token_file: None,
                    auditor_token: Some(AUDITOR_TOKEN.into()),
                    auditor_token_file: None,
                    admin_keys_file: None,
                    oidc: Default::default(),
                    console_sign_in: Default::default(),
                    lease_web: Default::default(),
                    master_key_file: self.master_key_file.clone(),
                    front: self.gateway_front.clone(),
                    limits: self.gateway_limits,
                    usage: Default::default(),
                    sessions: Default::default(),
                    templates_file: None,
                    ssh: Default::default(),
                    storage: Default::default(),
                };
                if let Some(change) = &self.gateway_config {
                    change(&mut config);
                }
                Box::pin(lh_gateway::start(config, token.clone())).await
            }
            "node-agent" => {
                let node_id = name.split_once(':').unwrap().1.to_string();
                self.enroll(&node_id).await;
                Box::pin(lh_node_agent::start(
                    lh_node_agent::Config {
                        runtime: self.node_runtime,
                        container_cli_args: self.node_container_args.clone(),
                        container_start_timeout_secs: self.node_container_start_timeout_secs,
                        mps_control: self.node_mps_control.clone(),
                        lease_log_test_limits: self.node_lease_log_limits,
                        stop_grace_secs: 2,
                        gpus: self.node_gpus.clone(),
                        storage: self.node_storage.clone(),
                        common,
                        ..lh_node_agent::Config::for_test(
                            &self.nats.url(),
                            self.fleet_file.clone(),
                            &node_id,
                        )
                    },
                    token.clone(),
                ))
                .await
            }
            other => panic!("unknown service {other}"),
        }
        .unwrap_or_else(|e| panic!("{name} starts: {e:#}"));
        if name == "gateway" {
            self.gateway_url = format!("http://{}", running.http_addr);
        }
        self.running.insert(name.to_string(), (token, running));
    }

    /// Enrolls node `node_id` of the fleet file, once, as an operator would
    /// before its agent starts: for its zone, GPU count and model, and any
    /// isolation and GPU sharing (a test's real runtime declares its own).
    pub async fn enroll(&mut self, node_id: &str) {
        if !self.auto_enroll || !self.enrolled.insert(node_id.to_string()) {
            return;
        }
        let fleet = lh_node_agent::gpu::backend::sim::fleet::FleetFile::load(&self.fleet_file)
            .expect("the stack's fleet file loads");
        let mut enrollment = fleet
            .node(node_id, &self.fleet_file)
            .expect("the node is in the fleet file")
            .enrollment();
        enrollment.max_isolation = lh_events::Isolation::Container;
        enrollment.gpu_sharing = vec![
            lh_events::GpuSharing::Mig,
            lh_events::GpuSharing::HamiCore,
            lh_events::GpuSharing::Mps,
        ];
        let operator = lh_events::Actor::Operator(lh_events::Operator {
            name: "test-stack".into(),
            role: lh_events::OperatorRole::Admin,
        });
        let envelope = lh_events::Envelope::new(
            operator,
            chrono::Utc::now(),
            lh_events::EventData::NodeEnrolled(enrollment),
        );
        self.bus()
            .await
            .publish(&envelope, lh_events::Expect::Any)
            .await
            .expect("the enrollment is stored");
    }

    /// A gateway's configuration on this stack (port 0, the test admin
    /// token), for tests that start or rebuild one themselves.
    pub fn gateway_config(&self) -> lh_gateway::Config {
        lh_gateway::Config {
            common: self.common(),
            gateway_addr: "127.0.0.1:0".into(),
            database_url: self.database_url.clone().into(),
            schema: "gateway".into(),
            admin_token: Some(ADMIN_TOKEN.into()),
            admin_token_file: None,
            auditor_token: None,
            auditor_token_file: None,
            admin_keys_file: None,
            oidc: Default::default(),
            console_sign_in: Default::default(),
            lease_web: Default::default(),
            master_key_file: self.master_key_file.clone(),
            front: test_front(),
            limits: Default::default(),
            usage: Default::default(),
            sessions: Default::default(),
            templates_file: None,
            ssh: Default::default(),
            storage: Default::default(),
        }
    }
}

/// A master-key file as an operator would write one: a random key, 0600.
pub fn write_master_key_file(path: &std::path::Path) {
    use rand::RngCore as _;
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(path, format!("test-1 {hex}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

/// The gateway's front door for tests: metrics on a free port, and request
/// budgets far above what a test sends (a test of the budgets sets its own).
pub fn test_front() -> lh_gateway::http::front::FrontArgs {
    lh_gateway::http::front::FrontArgs {
        metrics_addr: "127.0.0.1:0".into(),
        requests_per_s_per_key: 100_000.0,
        request_burst_per_key: 100_000,
        anonymous_requests_per_s_per_ip: 100_000.0,
        anonymous_request_burst_per_ip: 100_000,
        ..Default::default()
    }
}
