//! Load harnesses for Leasehold. Each binary starts the servers it needs on
//! loopback, runs a bounded amount of work and prints its figures with the
//! method, so results in docs/benchmarks.md can be reproduced.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

/// A nats-server with JetStream on loopback, fsyncing every write
/// (`sync_interval: always`, as production runs) or with the server's lazy
/// default; stopped on drop.
pub struct NatsServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts one on a free port, its store in a temporary directory.
    pub fn start(sync_always: bool) -> anyhow::Result<NatsServer> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let sync = if sync_always {
            "  sync_interval: always\n"
        } else {
            ""
        };
        let conf = dir.path().join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "host: 127.0.0.1\nport: {port}\njetstream {{\n  store_dir: \"{}\"\n{sync}}}\n",
                dir.path().join("store").display()
            ),
        )?;
        let child = Command::new(lh_testkit::nats_server_binary()?)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nats-server")?;
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(NatsServer {
                    child,
                    port,
                    _dir: dir,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        anyhow::bail!("nats-server did not start")
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Appends events straight onto the log without waiting for each
/// acknowledgement: the oldest is awaited once `max_in_flight` are
/// outstanding. One connection keeps the order in which they were published.
pub struct Appender {
    js: async_nats::jetstream::Context,
    in_flight: std::collections::VecDeque<async_nats::jetstream::context::PublishAckFuture>,
    max_in_flight: usize,
    /// Events appended so far (counting those the caller says the log held).
    pub appended: usize,
}

impl Appender {
    /// An appender on `js`; `appended` counts events already on the log.
    pub fn new(js: async_nats::jetstream::Context, max_in_flight: usize, appended: usize) -> Self {
        Appender {
            js,
            in_flight: std::collections::VecDeque::new(),
            max_in_flight: max_in_flight.max(1),
            appended,
        }
    }

    pub async fn append(&mut self, envelope: &lh_events::Envelope) -> anyhow::Result<()> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            envelope.id.to_string().as_str(),
        );
        headers.insert(lh_bus::EVENT_TYPE_HEADER, envelope.event_type.as_str());
        let ack = self
            .js
            .publish_with_headers(envelope.subject(), headers, envelope.to_json().into())
            .await
            .context("publishing")?;
        self.outstanding(ack).await
    }

    /// Appends a telemetry sample (`subject` on `LH_TELEMETRY`), its store
    /// acknowledged as an event's.
    pub async fn append_sample(&mut self, subject: String, payload: Vec<u8>) -> anyhow::Result<()> {
        let ack = self
            .js
            .publish(subject, payload.into())
            .await
            .context("publishing")?;
        self.outstanding(ack).await
    }

    async fn outstanding(
        &mut self,
        ack: async_nats::jetstream::context::PublishAckFuture,
    ) -> anyhow::Result<()> {
        self.in_flight.push_back(ack);
        self.appended += 1;
        if self.in_flight.len() >= self.max_in_flight {
            self.settle_oldest().await?;
        }
        Ok(())
    }

    async fn settle_oldest(&mut self) -> anyhow::Result<()> {
        if let Some(ack) = self.in_flight.pop_front() {
            let ack = ack.await.context("acknowledgement")?;
            anyhow::ensure!(!ack.duplicate, "an event was taken for a duplicate");
        }
        Ok(())
    }

    /// Waits for every outstanding acknowledgement.
    pub async fn flush(&mut self) -> anyhow::Result<()> {
        while !self.in_flight.is_empty() {
            self.settle_oldest().await?;
        }
        Ok(())
    }
}

/// Appends per second that `writers` concurrent writers get from the log
/// when each appends `event()` and waits for its acknowledgement before the
/// next, every one guarded by an expected subject sequence of 0 (its
/// aggregate must be empty, as the gateway appends a lease request): with
/// `sync_interval: always`, the rate JetStream's fsync allows at that
/// concurrency, the ceiling of any writer that waits for durability.
pub async fn guarded_append_rate(
    bus: &lh_bus::Bus,
    events: usize,
    writers: usize,
    event: fn() -> lh_events::Envelope,
) -> anyhow::Result<f64> {
    let writers = writers.max(1);
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let bus = bus.clone();
        let share = events / writers + usize::from(w < events % writers);
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                bus.publish(&event(), lh_bus::Expect::LastSubjectSequence(0))
                    .await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

pub mod money_month;

/// `VmRSS` and `VmHWM` of a process, kB.
pub fn memory_kb(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// A tenant as an operator creates it, with an API key digest of its own:
/// the gateway keeps digests unique, so each is 64 hex digits from its id.
pub fn tenant_created(tenant_id: uuid::Uuid, max_gpus: u32) -> lh_events::Envelope {
    use lh_events::{derived_id, fixtures, Actor, Envelope, EventData, TenantCreated};
    let api_key_sha256 = format!(
        "{}{}",
        tenant_id.simple(),
        derived_id(&["api-key", &tenant_id.to_string()]).simple()
    );
    let data = EventData::TenantCreated(TenantCreated {
        api_key_sha256,
        ..fixtures::tenant(tenant_id, max_gpus)
    });
    Envelope::new(Actor::Admin, chrono::Utc::now(), data)
}

/// An event as its writer would append it: a node registers itself, a
/// tenant asks for its leases, an operator does the rest. Readers refuse an
/// event from an actor that may not write it, so a harness that appended
/// every event as the operator would measure a scheduler that places nothing.
/// A node's registration as the log must hold it to count: first an
/// operator's enrollment for exactly what it claims, then the
/// registration as the node's own.
pub fn enrolled(node: lh_events::NodeRegistered) -> [lh_events::Envelope; 2] {
    use lh_events::{fixtures, Actor, Envelope, EventData};
    [
        Envelope::new(
            Actor::Admin,
            chrono::Utc::now(),
            EventData::NodeEnrolled(fixtures::enrollment_of(&node)),
        ),
        as_its_writer(EventData::NodeRegistered(node)),
    ]
}

pub fn as_its_writer(data: lh_events::EventData) -> lh_events::Envelope {
    use lh_events::{Actor, Envelope, EventData};
    let actor = match &data {
        EventData::NodeRegistered(n) => Actor::Node(n.node_id.clone()),
        EventData::LeaseRequested(r) => Actor::Tenant(r.tenant_id),
        _ => Actor::Admin,
    };
    Envelope::new(actor, chrono::Utc::now(), data)
}
