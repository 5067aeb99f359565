//! `GET /v1/leases/{id}/exec` and `GET /v1/leases/{id}/port-forward`:
//! WebSockets into a running lease (docs/adr/030). Everything that can be
//! refused is refused before the upgrade, as problem+json; the node is
//! asked to open the session first, so that a WebSocket the client gets is
//! one that works.

use axum::extract::ws::{rejection::WebSocketUpgradeRejection, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use lh_events::{OperatorRole, SessionKind, SessionTransport};
use lh_rpc::http::sessions::{
    EXEC_SUBPROTOCOL, MAX_SESSION_MESSAGE_BYTES, PORT_FORWARD_SUBPROTOCOL,
};
use lh_rpc::session::{OpenKind, TtySize, MAX_COMMAND_ARGS, MAX_COMMAND_BYTES};

use super::leases::{parse_id, visible};
use super::{ApiContext, ApiError, Caller};
use crate::sessions::websocket::{Channels, WebSocketClient, SOCKET_MESSAGE_SLACK};

/// Most characters of an operator's reason.
const MAX_REASON_CHARS: usize = 500;
/// Terminal sizes beyond this are not terminals.
const MAX_TERMINAL_CELLS: u16 = 10_000;

/// What the query asks, by name, in order (a command's arguments repeat
/// `command`).
fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    raw.map(|q| {
        form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    })
    .unwrap_or_default()
}

/// The last value given for `name`, as a query's last word wins.
fn last<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn flag(pairs: &[(String, String)], name: &str) -> Result<Option<bool>, ApiError> {
    match last(pairs, name) {
        None => Ok(None),
        Some(v) => match v {
            "true" | "1" => Ok(Some(true)),
            "false" | "0" => Ok(Some(false)),
            other => Err(
                ApiError::bad_request(format!("{name} is true or false, not {other:?}"))
                    .field(name),
            ),
        },
    }
}

fn number<T: std::str::FromStr>(
    pairs: &[(String, String)],
    name: &str,
) -> Result<Option<T>, ApiError> {
    match last(pairs, name) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!("{name} is a number, not {v:?}")).field(name)
        }),
    }
}

fn check_known(pairs: &[(String, String)], known: &[&str]) -> Result<(), ApiError> {
    match pairs.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::bad_request(format!(
            "unknown query parameter {k:?}; known: {}",
            known.join(", ")
        ))
        .field(k.clone())),
        None => Ok(()),
    }
}

/// Who opens a session: the lease's tenant, or an admin with a reason where
/// the replica allows it. The auditor never.
fn may_open(
    ctx: &ApiContext,
    caller: &Caller,
    reason: Option<&str>,
) -> Result<Option<String>, ApiError> {
    match caller {
        Caller::Tenant { .. } => Ok(None),
        Caller::Operator(o) if o.role == OperatorRole::Auditor => Err(ApiError::forbidden(
            "the auditor role reads the audit trail; it never enters a tenant's lease",
        )),
        Caller::Operator(_) if !ctx.sessions.args.operator_sessions => Err(ApiError::forbidden(
            "operators do not enter tenants' leases on this gateway (LH_OPERATOR_SESSIONS is off)",
        )),
        Caller::Operator(_) => {
            let reason = reason.map(str::trim).filter(|r| !r.is_empty()).ok_or_else(|| {
                ApiError::unprocessable("an operator entering a tenant's lease gives a reason, which the trail keeps", "reason")
            })?;
            if reason.chars().count() > MAX_REASON_CHARS {
                return Err(ApiError::unprocessable(
                    format!("a reason of at most {MAX_REASON_CHARS} characters"),
                    "reason",
                ));
            }
            Ok(Some(reason.to_string()))
        }
    }
}

/// The client's upgrade, checked once the lease is known to be its.
struct Upgrade {
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    headers: axum::http::HeaderMap,
    protocol: &'static str,
}

fn upgrade_of(
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    protocol: &str,
    headers: &axum::http::HeaderMap,
) -> Result<WebSocketUpgrade, ApiError> {
    let ws = ws.map_err(|e| {
        ApiError::bad_request(format!(
            "this route is a WebSocket (Upgrade: websocket, subprotocol {protocol}): {e}"
        ))
        .field("Upgrade")
    })?;
    let offered = headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == protocol);
    if !offered {
        return Err(ApiError::bad_request(format!(
            "offer the subprotocol {protocol} (Sec-WebSocket-Protocol)"
        ))
        .field("Sec-WebSocket-Protocol"));
    }
    Ok(ws
        .protocols([protocol.to_string()])
        .max_message_size(MAX_SESSION_MESSAGE_BYTES * SOCKET_MESSAGE_SLACK)
        .max_frame_size(MAX_SESSION_MESSAGE_BYTES * SOCKET_MESSAGE_SLACK))
}

#[utoipa::path(
    get, path = "/v1/leases/{id}/exec",
    params(
        ("id" = String, Path, description = "lease id"),
        ("command" = Vec<String>, Query, description = "the program and its arguments, one `command` each"),
        ("stdin" = Option<bool>, Query, description = "send input on channel 0 (default false)"),
        ("tty" = Option<bool>, Query, description = "run it on a terminal (default false)"),
        ("cols" = Option<u16>, Query, description = "the terminal's width (default 80)"),
        ("rows" = Option<u16>, Query, description = "the terminal's height (default 24)"),
        ("reason" = Option<String>, Query, description = "an operator's reason (required of operators)"),
        ("node" = Option<String>, Query, description = "for a lease across nodes, the member to enter (default the first)")
    ),
    responses(
        (status = 101, description = "A WebSocket, subprotocol v5.channel.k8s.io: 0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize, 255 close"),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "An auditor, or an operator where operator sessions are off"),
        (status = 404, body = super::Problem),
        (status = 409, body = super::Problem, description = "The lease is not running, or it moved"),
        (status = 422, body = super::Problem),
        (status = 429, body = super::Problem, description = "The lease or the tenant holds as many sessions as allowed"),
        (status = 503, body = super::Problem, description = "The lease's node did not answer within 5 s")
    )
)]
pub async fn exec(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: axum::http::HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let pairs = query_pairs(raw.as_deref());
    check_known(
        &pairs,
        &["command", "stdin", "tty", "cols", "rows", "reason", "node"],
    )?;
    let command: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if command.is_empty() || command[0].is_empty() {
        return Err(ApiError::unprocessable(
            "name the program to run: command=PROGRAM&command=ARG...",
            "command",
        ));
    }
    if command.len() > MAX_COMMAND_ARGS
        || command.iter().map(String::len).sum::<usize>() > MAX_COMMAND_BYTES
        || command.iter().any(|a| a.contains('\0'))
    {
        return Err(ApiError::unprocessable(
            format!("a command of at most {MAX_COMMAND_ARGS} arguments and {MAX_COMMAND_BYTES} bytes, without NUL"),
            "command",
        ));
    }
    let stdin = flag(&pairs, "stdin")?.unwrap_or(false);
    let tty = flag(&pairs, "tty")?.unwrap_or(false);
    let cols = number::<u16>(&pairs, "cols")?.unwrap_or(80);
    let rows = number::<u16>(&pairs, "rows")?.unwrap_or(24);
    for (name, value) in [("cols", cols), ("rows", rows)] {
        if value == 0 || value > MAX_TERMINAL_CELLS {
            return Err(ApiError::unprocessable(
                format!("{name} is 1 to {MAX_TERMINAL_CELLS}"),
                name,
            ));
        }
    }
    let reason = may_open(&ctx, &caller, last(&pairs, "reason"))?;
    let upgrade = Upgrade {
        ws,
        headers,
        protocol: EXEC_SUBPROTOCOL,
    };
    let kind = OpenKind::Exec {
        command,
        tty: tty.then_some(TtySize { cols, rows }),
        stdin,
    };
    let session_kind = if tty {
        SessionKind::Shell
    } else {
        SessionKind::Exec
    };
    open(
        ctx,
        caller,
        &id,
        kind,
        session_kind,
        reason,
        last(&pairs, "node"),
        upgrade,
        Channels::Exec { stdin },
    )
    .await
}

#[utoipa::path(
    get, path = "/v1/leases/{id}/port-forward",
    params(
        ("id" = String, Path, description = "lease id"),
        ("port" = u16, Query, description = "the TCP port inside the lease (on its 127.0.0.1)"),
        ("reason" = Option<String>, Query, description = "an operator's reason (required of operators)"),
        ("node" = Option<String>, Query, description = "for a lease across nodes, the member to reach (default the first)")
    ),
    responses(
        (status = 101, description = "A WebSocket, subprotocol v1.port-forward.leasehold.dev: 0 data, 1 error, 255 end of data"),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 404, body = super::Problem),
        (status = 409, body = super::Problem), (status = 422, body = super::Problem),
        (status = 429, body = super::Problem),
        (status = 502, body = super::Problem, description = "Nothing in the lease accepts connections on the port"),
        (status = 503, body = super::Problem)
    )
)]
pub async fn port_forward(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: axum::http::HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let pairs = query_pairs(raw.as_deref());
    check_known(&pairs, &["port", "reason", "node"])?;
    let port = number::<u16>(&pairs, "port")?
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::unprocessable("port is 1 to 65535", "port"))?;
    let reason = may_open(&ctx, &caller, last(&pairs, "reason"))?;
    let upgrade = Upgrade {
        ws,
        headers,
        protocol: PORT_FORWARD_SUBPROTOCOL,
    };
    open(
        ctx,
        caller,
        &id,
        OpenKind::PortForward { port },
        SessionKind::PortForward,
        reason,
        last(&pairs, "node"),
        upgrade,
        Channels::PortForward,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn open(
    ctx: ApiContext,
    caller: Caller,
    id: &str,
    kind: OpenKind,
    session_kind: SessionKind,
    reason: Option<String>,
    node: Option<&str>,
    upgrade: Upgrade,
    channels: Channels,
) -> Result<Response, ApiError> {
    // Whether the lease is the caller's first: another tenant learns
    // nothing of it, not even that the route wants a WebSocket.
    let lease = visible(&ctx, &caller, parse_id(id)?).await?;
    let member = super::leases::named_member(&lease, node)?;
    let ws = upgrade_of(upgrade.ws, upgrade.protocol, &upgrade.headers)?;
    let opened = crate::sessions::open::open(
        &ctx.bus,
        &ctx.sessions,
        crate::sessions::open::Opening {
            actor: caller.actor(),
            lease,
            kind,
            session_kind,
            transport: SessionTransport::WebSocket,
            reason,
            ssh_key_fingerprint: None,
            member,
        },
    )
    .await?;
    let bus = ctx.bus.clone();
    Ok(ws.on_upgrade(move |socket| async move {
        opened
            .relay(&bus, WebSocketClient::new(socket, channels))
            .await;
    }))
}
