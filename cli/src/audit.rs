//! `lh audit verify` reading the log itself: the auditor's check that needs
//! no trust in the platform, only in the pinned public key.
//!
//! The engine is [`lh_domain::chain_check`]; this module reads the stream in
//! order (an ordered consumer, which a read-only `auditor` user may open),
//! feeds it, shows progress and saves where the next run may resume.

use std::io::IsTerminal as _;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use lh_bus::async_nats;
use lh_bus::async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use lh_domain::chain_check::{parse_public_key, SignedHead, StreamCheck, StreamReport};

use crate::args::AuditVerify;
use crate::error::CliError;
use crate::output::Out;

/// How long the stream may stay silent before the read is given up.
pub const READ_STALL_TIMEOUT_SECS: u64 = 10;
/// How long connecting to NATS may take.
pub const CONNECT_TIMEOUT_SECS: u64 = 5;
/// Least time between two redraws of the progress line.
const PROGRESS_REDRAW_MILLIS: u64 = 200;
/// Largest key or state file read, in bytes.
pub const MAX_AUDIT_FILE_BYTES: u64 = 64 * 1024;
/// Width of the progress bar, in characters.
const PROGRESS_BAR_CHARS: u64 = 30;

/// The mode: the log is read when a key is pinned (a server must then be
/// named); without a key the gateway is asked, even when
/// `LH_NATS_URL` is set for other tools.
pub fn reads_the_log(args: &AuditVerify) -> Result<bool, CliError> {
    let key = args.public_key.is_some() || args.public_key_file.is_some();
    match (args.nats_url.is_some(), key) {
        (true, true) => Ok(true),
        (false, true) => Err(CliError::Usage(
            "a pinned key needs the log to check it against: --nats-url URL (or LH_NATS_URL)"
                .into(),
        )),
        (_, false) if args.resume_from.is_some() || args.save_state.is_some() => {
            Err(CliError::Usage(
                "--resume-from and --save-state read the log: they need --nats-url and a \
                 pinned key (--public-key HEX or --public-key-file PATH)"
                    .into(),
            ))
        }
        (_, false) => Ok(false),
    }
}

fn read_small_file(path: &Path, what: &str) -> Result<String, CliError> {
    let unreadable = |e: std::io::Error| {
        CliError::Usage(format!("cannot read the {what} {}: {e}", path.display()))
    };
    let len = std::fs::metadata(path).map_err(unreadable)?.len();
    if len > MAX_AUDIT_FILE_BYTES {
        return Err(CliError::Usage(format!(
            "the {what} {} is larger than {MAX_AUDIT_FILE_BYTES} bytes",
            path.display()
        )));
    }
    std::fs::read_to_string(path).map_err(unreadable)
}

fn pinned_key(args: &AuditVerify) -> Result<[u8; 32], CliError> {
    let text = match (&args.public_key, &args.public_key_file) {
        (Some(hex), _) => hex.clone(),
        (None, Some(path)) => read_small_file(path, "public key file")?,
        (None, None) => unreachable!("checked by reads_the_log"),
    };
    parse_public_key(&text).map_err(|e| CliError::Usage(format!("--public-key: {e}")))
}

/// `--resume-from`: a token, or a file holding a [`SignedHead`] or a
/// report whose `last_checkpoint` is one.
fn resume_point(value: &str) -> Result<SignedHead, CliError> {
    if value.split(':').count() == 4 {
        return SignedHead::parse_resume_token(value)
            .map_err(|e| CliError::Usage(format!("--resume-from: {e}")));
    }
    let text = read_small_file(Path::new(value), "state file")?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("--resume-from {value}: not JSON: {e}")))?;
    let state = json.get("last_checkpoint").cloned().unwrap_or(json);
    serde_json::from_value(state).map_err(|e| {
        CliError::Usage(format!(
            "--resume-from {value}: no checkpoint (sequence, events, head, signature): {e}"
        ))
    })
}

fn unreadable(url: &str, what: impl std::fmt::Display) -> CliError {
    CliError::LogUnreadable {
        url: url.to_string(),
        reason: what.to_string(),
    }
}

async fn connect(url: &str) -> Result<async_nats::Client, CliError> {
    let env = |name: &str| std::env::var(name).ok();
    let credentials = lh_bus::Credentials::from_env(std::iter::empty(), env)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let tls = lh_bus::TlsFiles::from_env(env).map_err(|e| CliError::Usage(e.to_string()))?;
    let servers = lh_bus::server_addrs(url).map_err(|e| CliError::Usage(e.to_string()))?;
    let mut options = async_nats::ConnectOptions::new();
    match &credentials {
        lh_bus::Credentials::Anonymous => {}
        lh_bus::Credentials::Nkey { seed, .. } => options = options.nkey(seed.clone()),
        lh_bus::Credentials::Password { user, password } => {
            options = options.user_and_password(user.clone(), password.clone())
        }
    }
    if let Some(user) = credentials.user() {
        // The server lets each user read replies on its own prefix only.
        options = options.custom_inbox_prefix(lh_bus::auth::inbox_prefix(user));
    }
    if let Some(tls) = &tls {
        options = options
            .require_tls(true)
            .add_root_certificates(tls.ca_file.clone());
        if let Some((cert, key)) = &tls.client_cert {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
    }
    options
        .name("lh audit verify")
        .connection_timeout(Duration::from_secs(CONNECT_TIMEOUT_SECS))
        .connect(servers)
        .await
        .map_err(|e| unreadable(url, e))
}

/// A one-line progress bar on a terminal; nothing elsewhere.
struct Progress {
    shown: bool,
    drawn_at: Option<Instant>,
    from: u64,
    to: u64,
}

impl Progress {
    fn new(from: u64, to: u64) -> Self {
        Self {
            shown: std::io::stderr().is_terminal(),
            drawn_at: None,
            from,
            to,
        }
    }

    fn update(&mut self, err: Out<'_>, at: u64) {
        if !self.shown
            || self
                .drawn_at
                .is_some_and(|t| t.elapsed() < Duration::from_millis(PROGRESS_REDRAW_MILLIS))
        {
            return;
        }
        self.drawn_at = Some(Instant::now());
        let total = (self.to + 1).saturating_sub(self.from).max(1);
        let done = (at + 1).saturating_sub(self.from).min(total);
        let filled = done * PROGRESS_BAR_CHARS / total;
        let _ = write!(
            err,
            "\r[{}{}] {done}/{total} messages ({}%)",
            "#".repeat(filled as usize),
            "-".repeat((PROGRESS_BAR_CHARS - filled) as usize),
            done * 100 / total
        );
        let _ = err.flush();
    }

    fn finish(&self, err: Out<'_>) {
        if self.shown && self.drawn_at.is_some() {
            let _ = writeln!(err);
        }
    }
}

/// Reads the stream from where the check starts to its last message as it
/// stood when the run began, and returns what the check found.
pub async fn verify_stream(args: &AuditVerify, err: Out<'_>) -> Result<StreamReport, CliError> {
    let pinned = pinned_key(args)?;
    let mut check = match &args.resume_from {
        Some(value) => StreamCheck::resume(pinned, &resume_point(value)?)
            .map_err(|e| CliError::Usage(format!("--resume-from: {e}")))?,
        None => StreamCheck::from_genesis(pinned),
    };
    let url = args.nats_url.as_deref().expect("checked by reads_the_log");
    let client = connect(url).await?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js
        .get_stream(&args.stream)
        .await
        .map_err(|e| unreadable(url, format!("stream {}: {e}", args.stream)))?;
    let state = stream
        .info()
        .await
        .map_err(|e| unreadable(url, format!("stream {}: {e}", args.stream)))?
        .state
        .clone();
    let from = check.checked_from();
    if state.messages > 0 && state.first_sequence > from {
        return Ok(check.refused(format!(
            "the log starts at sequence {}: the messages from {from} have expired; resume from a \
             checkpoint this key signed at sequence {} or later (--resume-from)",
            state.first_sequence,
            state.first_sequence - 1
        )));
    }
    let last = state.last_sequence;
    if state.messages == 0 || last < from {
        return Ok(check.report());
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: if from <= 1 {
                DeliverPolicy::All
            } else {
                DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                }
            },
            ..Default::default()
        })
        .await
        .map_err(|e| unreadable(url, format!("reading {}: {e}", args.stream)))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| unreadable(url, format!("reading {}: {e}", args.stream)))?;
    let mut progress = Progress::new(from, last);
    while check.last_sequence() < last {
        let next = tokio::time::timeout(
            Duration::from_secs(READ_STALL_TIMEOUT_SECS),
            messages.next(),
        )
        .await
        .map_err(|_| {
            unreadable(
                url,
                format!(
                    "{} sent nothing for {READ_STALL_TIMEOUT_SECS} s after sequence {}",
                    args.stream,
                    check.last_sequence()
                ),
            )
        })?;
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(unreadable(url, format!("reading {}: {e}", args.stream))),
            None => {
                return Err(unreadable(
                    url,
                    format!("{} ended before sequence {last}", args.stream),
                ))
            }
        };
        let sequence = message
            .info()
            .map_err(|e| unreadable(url, format!("a message without its sequence: {e}")))?
            .stream_sequence;
        check.message(sequence, message.subject.as_str(), &message.payload);
        progress.update(err, sequence);
    }
    progress.finish(err);
    Ok(check.report())
}

/// Writes the last verified checkpoint where `--save-state` says.
pub fn save_state(path: &Path, report: &StreamReport) -> Result<(), CliError> {
    let Some(state) = &report.last_checkpoint else {
        return Ok(());
    };
    let mut text = serde_json::to_string_pretty(state).expect("a checkpoint serialises");
    text.push('\n');
    std::fs::write(path, text)
        .map_err(|e| CliError::Usage(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nats: bool, key: bool) -> AuditVerify {
        AuditVerify {
            nats_url: nats.then(|| "nats://127.0.0.1:1".into()),
            public_key: key.then(|| "00".repeat(32)),
            ..Default::default()
        }
    }

    #[test]
    fn the_log_is_read_only_with_a_server_and_a_key() {
        assert!(!reads_the_log(&args(false, false)).unwrap());
        assert!(reads_the_log(&args(true, true)).unwrap());
        assert!(!reads_the_log(&args(true, false)).unwrap());
        assert!(reads_the_log(&args(false, true)).is_err());
    }

    #[test]
    fn a_state_file_or_a_report_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let head = SignedHead {
            sequence: 10,
            events: 10,
            head: "ab".repeat(32),
            signature: "cd".repeat(64),
        };
        let state = dir.path().join("state.json");
        std::fs::write(&state, serde_json::to_string(&head).unwrap()).unwrap();
        assert_eq!(resume_point(state.to_str().unwrap()).unwrap(), head);
        let report = dir.path().join("report.json");
        std::fs::write(
            &report,
            serde_json::json!({"ok": true, "last_checkpoint": head}).to_string(),
        )
        .unwrap();
        assert_eq!(resume_point(report.to_str().unwrap()).unwrap(), head);
        assert_eq!(resume_point(&head.to_resume_token()).unwrap(), head);
        assert!(resume_point("1:2:3").is_err());
    }
}
