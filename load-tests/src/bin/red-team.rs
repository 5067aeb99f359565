//! The red-team harness's long run: a whole platform in this process (a
//! real nats-server and PostgreSQL, every service) on four nodes of one
//! GPU each, a victim lease filling every GPU, then `--rounds` rounds of
//! every principal's repertoire against them (`lh_test_stack::red_team`).
//! Prints one line
//!
//!   red-team: principals=N attempts=N obeyed=0 overcommitted=0 misbilled=0 dead=0
//!
//! and what it found, and exits non-zero unless all four counts are zero.
//! `load-tests/red-team.sh [ROUNDS]` builds and runs it.

use clap::Parser;
use lh_test_stack::{one_a100_each, red_team, Stack};

#[derive(Parser)]
struct Args {
    /// How many times every principal runs its whole repertoire.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args = Args::parse();
    // One GPU a node: the victims hold every GPU, so a GPU given twice
    // would show.
    let nodes = ["node-a", "node-b", "node-c", "node-d"];
    let stack = Stack::start(&one_a100_each(&nodes)).await;
    let started = std::time::Instant::now();
    let (report, found) = red_team::run(&stack, &nodes, args.rounds).await;
    for line in &found {
        eprintln!("red-team: found: {line}");
    }
    eprintln!("red-team: {:.1} s", started.elapsed().as_secs_f64());
    println!("{report}");
    if !report.is_clean() {
        std::process::exit(1);
    }
}
