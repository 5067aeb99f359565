//! The decide loop against a real nats-server: guarded writes from racing
//! deciders never overshoot, expectations chain across the batches of one
//! pass, and decisions pack into atomic batches by the subject rule.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::{subject, Actor, Envelope, EventData, NodeCordoned};
use lh_service::clock::SystemClock;
use lh_service::decider::{self, pack, Batch, Decider, Pace};
use lh_service::{CancellationToken, Readiness};
use lh_testkit::Nats;

const NODE: &str = "n1";

fn cordon(reason: &str) -> Envelope {
    Envelope::new(
        Actor::Admin,
        Utc::now(),
        EventData::NodeCordoned(NodeCordoned {
            node_id: NODE.into(),
            drain: None,
            reason: reason.into(),
        }),
    )
}

/// Wants the node's subject to hold `target` events, `per_pass` at a time,
/// each write guarded by the subject's last sequence as the fold saw it.
struct Filler {
    /// Shared so that a test can ask for more while the loop runs.
    target: Arc<AtomicUsize>,
    per_pass: usize,
    seen: usize,
    last_sequence: u64,
    /// Passes that had something to write.
    busy_passes: Arc<AtomicUsize>,
}

impl Filler {
    fn new(target: usize, per_pass: usize) -> Self {
        Self {
            target: Arc::new(AtomicUsize::new(target)),
            per_pass,
            seen: 0,
            last_sequence: 0,
            busy_passes: Arc::default(),
        }
    }
}

impl Decider for Filler {
    type Signal = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "filler"
    }

    fn filters(&self) -> &[&'static str] {
        &[subject::NODES_ALL]
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: Duration::from_millis(20),
            tick: Duration::from_millis(50),
            ..Pace::default()
        }
    }

    fn apply(&mut self, sequence: u64, _envelope: &Envelope) {
        // Own events come back through the feed: count each sequence once.
        if sequence > self.last_sequence {
            self.seen += 1;
            self.last_sequence = sequence;
        }
    }

    fn decide(&mut self, _now: DateTime<Utc>) -> Vec<Batch> {
        let missing = self
            .target
            .load(Ordering::Relaxed)
            .saturating_sub(self.seen)
            .min(self.per_pass);
        if missing > 0 {
            self.busy_passes.fetch_add(1, Ordering::Relaxed);
        }
        // Every decision expects what the fold saw; the loop chains the
        // later ones to the sequences the earlier ones get.
        (0..missing)
            .map(|i| {
                vec![(
                    cordon(&format!("fill {i}")),
                    Expect::LastSubjectSequence(self.last_sequence),
                )]
            })
            .collect()
    }
}

async fn stored_on_node(bus: &Bus) -> u64 {
    let mut feed = bus.feed(&[subject::NODES_ALL], 1).await.unwrap();
    let mut n = 0;
    while let Some(event) = feed.next_within(Duration::from_millis(200)).await {
        event.unwrap();
        n += 1;
    }
    n
}

async fn settle(bus: &Bus, target: u64) -> u64 {
    for _ in 0..100 {
        if stored_on_node(bus).await >= target {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give a racing writer the chance to overshoot, were it able to.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stored_on_node(bus).await
}

#[tokio::test]
async fn one_pass_chains_its_expectations_across_batches() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let ready = Readiness::default();
    let mut filler = Filler::new(5, 5);
    let busy_passes = filler.busy_passes.clone();
    let run = {
        let (bus, shutdown, ready) = (bus.clone(), shutdown.clone(), ready.clone());
        tokio::spawn(
            async move { decider::run(&bus, &mut filler, &SystemClock, shutdown, ready).await },
        )
    };
    // Five writes to one subject in one pass: five batches, each expecting
    // the sequence the one before got. Unchained, the second would conflict
    // on every pass and the subject would grow one event per pass.
    assert_eq!(settle(&bus, 5).await, 5);
    assert_eq!(
        busy_passes.load(Ordering::Relaxed),
        1,
        "all five in one pass"
    );
    assert!(ready.is_ready());
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn racing_deciders_never_overshoot_a_guarded_target() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (bus, shutdown) = (bus.clone(), shutdown.clone());
        runs.push(tokio::spawn(async move {
            let mut filler = Filler::new(30, 3);
            decider::run(
                &bus,
                &mut filler,
                &SystemClock,
                shutdown,
                Readiness::default(),
            )
            .await
        }));
    }
    assert_eq!(
        settle(&bus, 30).await,
        30,
        "conflicts re-read, never double"
    );
    shutdown.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
}

fn on(node: &str) -> (Envelope, Expect) {
    let mut envelope = cordon("x");
    if let EventData::NodeCordoned(c) = &mut envelope.data {
        c.node_id = node.into();
    }
    (envelope, Expect::Any)
}

fn never(_: &Envelope, _: &Envelope) -> bool {
    false
}

/// Folds by appending the second message's reason to the first's.
fn join_reasons(first: &mut Envelope, more: &Envelope) {
    if let (EventData::NodeCordoned(first), EventData::NodeCordoned(more)) =
        (&mut first.data, &more.data)
    {
        first.reason = format!("{}+{}", first.reason, more.reason);
    }
}

#[test]
fn packing_never_repeats_a_subject_across_decisions_in_a_batch() {
    let packed = pack(
        vec![vec![on("a")], vec![on("b")], vec![on("a")]],
        never,
        join_reasons,
    );
    assert_eq!(packed.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
    // A decision is kept whole, even when it writes one subject twice.
    let packed = pack(
        vec![vec![on("a"), on("a")], vec![on("b")]],
        never,
        join_reasons,
    );
    assert_eq!(packed.iter().map(Vec::len).collect::<Vec<_>>(), vec![3]);
}

#[test]
fn packing_merges_where_the_decider_can_and_caps_the_batch() {
    let packed = pack(
        vec![vec![on("a")], vec![on("a")], vec![on("b")]],
        |_, _| true,
        join_reasons,
    );
    assert_eq!(packed.iter().map(Vec::len).collect::<Vec<_>>(), vec![2]);
    let EventData::NodeCordoned(merged) = &packed[0][0].0.data else {
        panic!("{:?}", packed[0][0].0)
    };
    assert_eq!(
        merged.reason, "x+x",
        "the second write folded into the first"
    );
    let many: Vec<Batch> = (0..100).map(|i| vec![on(&format!("n{i}"))]).collect();
    let packed = pack(many, never, join_reasons);
    assert!(packed.iter().all(|b| b.len() <= lh_bus::MAX_BATCH_MESSAGES));
    assert_eq!(packed.iter().map(Vec::len).sum::<usize>(), 100);
}

/// Writes one cordon per signal, and notes how much of the log it had
/// folded when each signal arrived.
#[derive(Default)]
struct Echo {
    folded: usize,
    pending: Vec<String>,
    folded_at_signal: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Decider for Echo {
    type Signal = String;

    fn name(&self) -> &'static str {
        "echo"
    }

    fn filters(&self) -> &[&'static str] {
        &[subject::NODES_ALL]
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: Duration::from_millis(20),
            ..Pace::default()
        }
    }

    fn apply(&mut self, _sequence: u64, _envelope: &Envelope) {
        self.folded += 1;
    }

    fn signal(&mut self, signal: String, _now: DateTime<Utc>) -> bool {
        self.folded_at_signal.lock().unwrap().push(self.folded);
        self.pending.push(signal);
        true
    }

    fn decide(&mut self, _now: DateTime<Utc>) -> Vec<Batch> {
        self.pending
            .drain(..)
            .map(|reason| vec![(cordon(&reason), Expect::Any)])
            .collect()
    }
}

#[tokio::test]
async fn signals_wait_for_the_fold_to_catch_up_then_lead_to_decisions() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    for i in 0..3 {
        bus.publish(&cordon(&format!("before {i}")), Expect::Any)
            .await
            .unwrap();
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Sent before the loop starts: it must not be judged on an empty fold.
    tx.send("early".to_string()).unwrap();
    let mut echo = Echo::default();
    let folded_at_signal = echo.folded_at_signal.clone();
    let shutdown = CancellationToken::new();
    let run = {
        let (bus, shutdown) = (bus.clone(), shutdown.clone());
        tokio::spawn(async move {
            let signals = tokio_stream_from(rx);
            decider::run_with_signals(
                &bus,
                &mut echo,
                &SystemClock,
                shutdown,
                Readiness::default(),
                signals,
            )
            .await
        })
    };
    assert_eq!(settle(&bus, 4).await, 4);
    tx.send("late".to_string()).unwrap();
    assert_eq!(settle(&bus, 5).await, 5);
    assert_eq!(
        folded_at_signal.lock().unwrap()[0],
        3,
        "judged on the whole log"
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Offers its events until the loop says they are stored, as an agent does
/// with what it observed.
struct Outbox {
    waiting: Arc<std::sync::Mutex<Vec<Envelope>>>,
    busy_passes: Arc<AtomicUsize>,
}

impl Decider for Outbox {
    type Signal = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "outbox"
    }

    fn filters(&self) -> &[&'static str] {
        &[subject::NODES_ALL]
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: Duration::from_millis(20),
            tick: Duration::from_millis(50),
            ..Pace::default()
        }
    }

    fn apply(&mut self, _sequence: u64, _envelope: &Envelope) {}

    fn decide(&mut self, _now: DateTime<Utc>) -> Vec<Batch> {
        let waiting = self.waiting.lock().unwrap();
        if !waiting.is_empty() {
            self.busy_passes.fetch_add(1, Ordering::Relaxed);
        }
        waiting
            .iter()
            .map(|e| vec![(e.clone(), Expect::Any)])
            .collect()
    }

    fn appended(&mut self, batch: &Batch) {
        let stored: Vec<_> = batch.iter().map(|(e, _)| e.id).collect();
        self.waiting
            .lock()
            .unwrap()
            .retain(|e| !stored.contains(&e.id));
    }
}

fn cordon_of(node: &str, reason: &str) -> Envelope {
    let mut e = cordon(reason);
    if let EventData::NodeCordoned(c) = &mut e.data {
        c.node_id = node.into();
    }
    e
}

/// Unguarded events that the log already holds count as stored, alone or
/// packed into one atomic batch with new ones (which JetStream refuses as a
/// whole): the new ones are stored once, and nothing is offered forever.
#[tokio::test]
async fn unguarded_events_the_log_holds_count_as_stored() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let seen_twice = cordon_of("n1", "observed before");
    bus.publish(&seen_twice, Expect::Any).await.unwrap();
    for offered in [
        vec![seen_twice.clone()],
        vec![seen_twice.clone(), cordon_of("n2", "new")],
    ] {
        let expected = offered.len() as u64;
        let waiting = Arc::new(std::sync::Mutex::new(offered));
        let busy_passes = Arc::new(AtomicUsize::new(0));
        let mut outbox = Outbox {
            waiting: waiting.clone(),
            busy_passes: busy_passes.clone(),
        };
        let shutdown = CancellationToken::new();
        let run = {
            let (bus, shutdown) = (bus.clone(), shutdown.clone());
            tokio::spawn(async move {
                decider::run(
                    &bus,
                    &mut outbox,
                    &SystemClock,
                    shutdown,
                    Readiness::default(),
                )
                .await
            })
        };
        assert_eq!(settle(&bus, expected).await, expected);
        shutdown.cancel();
        run.await.unwrap().unwrap();
        assert!(waiting.lock().unwrap().is_empty(), "everything stored");
        assert_eq!(busy_passes.load(Ordering::Relaxed), 1, "offered once");
    }
}

async fn publish_undecodable_on_the_node(bus: &Bus) {
    for (_, bytes) in lh_events::fixtures::undecodable() {
        bus.jetstream()
            .publish(
                subject::event(&subject::node(NODE), "node.garbled", &Actor::Admin),
                bytes.into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn messages_it_cannot_decode_neither_stop_nor_block_the_loop() {
    let nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    // The newest message on the guarded subject is one the decider cannot
    // read: its guard must move past it, or every write conflicts forever.
    publish_undecodable_on_the_node(&bus).await;
    let shutdown = CancellationToken::new();
    let spawn = |target: usize, ready: Readiness| {
        let (bus, shutdown) = (bus.clone(), shutdown.clone());
        let mut filler = Filler::new(target, 1);
        tokio::spawn(
            async move { decider::run(&bus, &mut filler, &SystemClock, shutdown, ready).await },
        )
    };
    let ready = Readiness::default();
    let first = spawn(3, ready.clone());
    assert_eq!(settle(&bus, 3).await, 3);
    assert!(ready.is_ready(), "skipped messages count as read");

    // Again after its own events, with a second decider that wants more.
    publish_undecodable_on_the_node(&bus).await;
    let second = spawn(5, Readiness::default());
    assert_eq!(settle(&bus, 5).await, 5);
    assert!(!first.is_finished() && !second.is_finished());
    shutdown.cancel();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_loop_lives_through_a_killed_and_restarted_server() {
    let mut nats = Nats::start().await.unwrap();
    let bus = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let ready = Readiness::default();
    let mut filler = Filler::new(3, 1);
    let target = filler.target.clone();
    let run = {
        let (bus, shutdown, ready) = (bus.clone(), shutdown.clone(), ready.clone());
        tokio::spawn(
            async move { decider::run(&bus, &mut filler, &SystemClock, shutdown, ready).await },
        )
    };
    assert_eq!(settle(&bus, 3).await, 3);

    nats.kill();
    // Asked for more while the server is down: writes are refused and
    // retried, the feed waits for its server.
    target.store(6, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !run.is_finished(),
        "the loop gave up while the server was down"
    );
    nats.restart().await.unwrap();

    let again = Bus::connect(&BusConfig::new(nats.url(), "test"))
        .await
        .unwrap();
    for _ in 0..100 {
        if stored_on_node(&again).await >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(settle(&again, 6).await, 6, "no write lost, none doubled");
    assert!(!run.is_finished());
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[test]
fn unguarded_decisions_are_never_packed_with_guarded_ones() {
    let guarded = |node: &str| vec![(cordon_of(node, "g"), Expect::LastSubjectSequence(0))];
    let free = |node: &str| vec![(cordon_of(node, "f"), Expect::Any)];
    let packed = pack(
        vec![free("a"), free("b"), guarded("c"), guarded("d"), free("e")],
        never,
        join_reasons,
    );
    let sizes: Vec<usize> = packed.iter().map(Vec::len).collect();
    assert_eq!(sizes, [2, 2, 1]);
}
