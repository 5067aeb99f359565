//! `lh lease open`: a running lease's web page here. The lease names the
//! template it was made from; the template names its HTTP port and the
//! file its workload writes the page's token to. The token is read by an
//! exec of `cat` into the lease (so only who may exec there, its tenant,
//! reads it), and the port is forwarded as `lease port-forward` does
//! ([`forward`]).

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::SinkExt as _;
use lh_domain::lease::LeaseState;
use lh_rpc::http::sessions::PORT_FORWARD_SUBPROTOCOL;
use lh_rpc::http::templates::{TemplateList, TemplatePort, TOKEN_QUERY_PARAMETER};
use reqwest::Url;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use super::port_forward::forward;
use super::session::{self, ExecRequest};
use super::wire;
use crate::args::LeaseOpen;
use crate::client::Gateway;
use crate::error::{CliError, EXIT_FAILURE, EXIT_OK};
use crate::output::{write_out, Out};

/// How long a workload that has just started may take to write its token
/// and to listen, before `open` gives up.
pub const OPEN_WAIT: Duration = Duration::from_secs(120);
/// The pause between two looks at the token file or the port.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Most bytes of a token `open` takes: a token is a line, not a file.
const MAX_TOKEN_BYTES: usize = 4096;

/// `lease open`: as [`open`], until Ctrl-C or SIGTERM.
pub(super) async fn open_command(
    gw: &Gateway,
    args: &LeaseOpen,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    // Watched from the start: a Ctrl-C while the token is read must not
    // kill `lh` without a word.
    let mut interrupted = signal(SignalKind::interrupt())?;
    let mut terminated = signal(SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = interrupted.recv() => {}
            _ = terminated.recv() => {}
        }
    };
    open(gw, args, stop, out, err).await
}

/// Reads lease `args.id` and its template, waits for its token and its
/// port, listens on 127.0.0.1:`args.port`, prints where and the URL to
/// open (`http://127.0.0.1:<port>/?token=<token>`), and forwards until
/// `shutdown` resolves. Exit code 1, with why on `err`, when the lease
/// does not run or has no web page; `shutdown` before the URL is printed
/// ends it with 0 too.
pub async fn open(
    gw: &Gateway,
    args: &LeaseOpen,
    shutdown: impl Future<Output = ()>,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    tokio::pin!(shutdown);
    let lease = gw.get(&["v1", "leases", &args.id], &[]).await?;
    let port = match web_port(gw, &args.id, &lease).await? {
        Ok(port) => port,
        Err(why) => {
            let _ = writeln!(err, "error: {why}");
            return Ok(EXIT_FAILURE);
        }
    };
    let ready = async {
        let token = match &port.token_file {
            Some(path) => Some(read_token(gw, &args.id, path, &mut *err).await?),
            None => None,
        };
        wait_listening(gw, &args.id, port.port).await?;
        anyhow::Ok(token)
    };
    let token = tokio::select! {
        token = ready => token?,
        _ = &mut shutdown => return Ok(EXIT_OK),
    };
    let wanted = SocketAddr::from((Ipv4Addr::LOCALHOST, args.port));
    let listener = TcpListener::bind(wanted)
        .await
        .map_err(|e| CliError::Usage(format!("cannot listen on {wanted}: {e}")))?;
    let local = listener.local_addr()?;
    write_out(
        out,
        &format!(
            "Forwarding from {local} -> {} ({}); Ctrl-C stops\n{}\n",
            port.port,
            port.name,
            page_url(local, token.as_deref())
        ),
    )?;
    forward(gw, &args.id, listener, port.port, None, shutdown, err).await?;
    Ok(EXIT_OK)
}

/// The lease's web port: the first HTTP port of the template it was made
/// from. `Ok(Err(why))` when it has none to open.
async fn web_port(
    gw: &Gateway,
    id: &str,
    lease: &Value,
) -> Result<Result<TemplatePort, String>, CliError> {
    let state = lease.get("state").cloned().unwrap_or_default();
    if serde_json::from_value::<LeaseState>(state.clone()).ok() != Some(LeaseState::Running) {
        let state = state.as_str().unwrap_or("in no state it names");
        return Ok(Err(format!(
            "lease {id} is {state}, not running: it serves no page \
             (`lh lease get {id} --wait running` waits for it)"
        )));
    }
    let Some(name) = lease
        .get("workload")
        .and_then(|w| w.get("template"))
        .and_then(Value::as_str)
    else {
        return Ok(Err(format!(
            "lease {id} was not made from a template (`lh lease create --template NAME`): \
             nothing says which of its ports is a web page; `lh lease port-forward` \
             forwards any port"
        )));
    };
    let (list, _): (TemplateList, _) = gw.get_as(&["v1", "templates"], &[]).await?;
    let Some(template) = list.templates.into_iter().find(|t| t.name == name) else {
        return Ok(Err(format!(
            "lease {id} was made from template {name:?}, which the gateway no longer \
             offers (`lh template ls`): its ports are unknown"
        )));
    };
    match template.http_port() {
        Some(port) => Ok(Ok(port.clone())),
        None => Ok(Err(format!(
            "template {name:?} of lease {id} has no HTTP port to open"
        ))),
    }
}

/// The token in `path` inside the lease, read with `cat` as the workload
/// writes it; asked again until it is there (a workload that has just
/// started may not have written it yet), for at most [`OPEN_WAIT`]. What
/// the workload got wrong is an `Err` that is no [`CliError`]: `lh` exits
/// 1, the answer being no.
async fn read_token(gw: &Gateway, id: &str, path: &str, err: Out<'_>) -> anyhow::Result<String> {
    let command = ["cat".to_string(), path.to_string()];
    let request = ExecRequest {
        lease_id: id,
        command: &command,
        stdin: false,
        tty: false,
        reason: None,
        node: None,
    };
    let deadline = Instant::now() + OPEN_WAIT;
    let mut told = false;
    loop {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let code = session::run(gw, &request, &mut stdout, &mut stderr).await?;
        let token = String::from_utf8_lossy(&stdout).trim().to_string();
        let why = String::from_utf8_lossy(&stderr).trim().to_string();
        if code == 0 && !token.is_empty() {
            anyhow::ensure!(
                token.len() <= MAX_TOKEN_BYTES && !token.chars().any(char::is_control),
                "{path} in lease {id} does not hold a token (one line of at most \
                 {MAX_TOKEN_BYTES} bytes)"
            );
            return Ok(token);
        }
        // The shell's codes for a command that cannot run: waiting would
        // not bring `cat` into the image.
        anyhow::ensure!(
            code != 126 && code != 127,
            "cannot run `cat` in lease {id} to read its token ({why})"
        );
        anyhow::ensure!(
            Instant::now() < deadline,
            "no token in {path} in lease {id} after {} s{}",
            OPEN_WAIT.as_secs(),
            match why.is_empty() {
                true => String::new(),
                false => format!(": {why}"),
            }
        );
        if !told {
            let _ = writeln!(err, "waiting for the workload to write its token to {path}");
            told = true;
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

/// Waits until something listens on `port` in the lease: the gateway
/// refuses a forward to a port that refuses the connection (502, field
/// `port`) before it accepts the WebSocket, so one forward opened and
/// closed at once tells. A page that has just started is still loading
/// its server after it wrote its token.
async fn wait_listening(gw: &Gateway, id: &str, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + OPEN_WAIT;
    let port_text = port.to_string();
    loop {
        match wire::open(
            gw,
            &["v1", "leases", id, "port-forward"],
            &[("port", &port_text)],
            PORT_FORWARD_SUBPROTOCOL,
        )
        .await
        {
            Ok(mut session) => {
                let _ = session.send(wire::close("")).await;
                return Ok(());
            }
            Err(CliError::Api(problem))
                if problem.status == 502
                    && problem.field.as_deref() == Some("port")
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(RETRY_EVERY).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `http://<local>/`, with `?token=<token>` when there is one.
pub(crate) fn page_url(local: SocketAddr, token: Option<&str>) -> String {
    let mut url = Url::parse(&format!("http://{local}/")).expect("a socket address makes a URL");
    if let Some(token) = token {
        url.query_pairs_mut()
            .append_pair(TOKEN_QUERY_PARAMETER, token);
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_carries_the_token_escaped() {
        let local: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        assert_eq!(page_url(local, None), "http://127.0.0.1:41234/");
        assert_eq!(
            page_url(local, Some("0a1b2c")),
            "http://127.0.0.1:41234/?token=0a1b2c"
        );
        assert_eq!(
            page_url(local, Some("a b&c=d/é")),
            "http://127.0.0.1:41234/?token=a+b%26c%3Dd%2F%C3%A9"
        );
    }
}
