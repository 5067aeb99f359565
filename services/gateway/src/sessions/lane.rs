//! The gateway's end of session lanes (lh_rpc::session_lane): it offers
//! a node a one-time token with each opening, and takes the connection
//! that shows it. A connection with any other token, or none within the
//! handshake's time, is closed unanswered; at most [`MAX_LANE_HANDSHAKES`]
//! are heard at once, and at most [`MAX_WAITING_LANES`] offers wait.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use lh_rpc::session_lane::{self, Lane, LaneOffer, LANE_HANDSHAKE_TIMEOUT, LANE_TOKEN_BYTES};
use lh_service::CancellationToken;
use rand::RngCore;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};

/// Dialed connections heard at once; more are closed at once.
pub const MAX_LANE_HANDSHAKES: usize = 64;
/// Offers waiting for their node at once (each session holds one for at
/// most the opening's time); past it, sessions keep to the bus.
pub const MAX_WAITING_LANES: usize = 4096;

type Token = [u8; LANE_TOKEN_BYTES];

/// The offers this replica made and the nodes have not dialed yet.
pub struct Lanes {
    /// Where nodes reach this replica's lane listener.
    public_addr: String,
    waiting: Mutex<HashMap<Token, oneshot::Sender<Lane>>>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tokens are secrets: only how many wait.
        let waiting = self.waiting.lock().map(|w| w.len()).unwrap_or(0);
        f.debug_struct("Lanes")
            .field("public_addr", &self.public_addr)
            .field("waiting", &waiting)
            .finish()
    }
}

/// An offer made for one opening; withdrawn when dropped.
pub struct PendingLane {
    pub offer: LaneOffer,
    token: Token,
    taken: oneshot::Receiver<Lane>,
    lanes: Arc<Lanes>,
}

impl Lanes {
    /// A new offer, unless too many wait.
    pub fn offer(self: &Arc<Self>) -> Option<PendingLane> {
        let mut token = [0u8; LANE_TOKEN_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut token);
        let (tx, rx) = oneshot::channel();
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if waiting.len() >= MAX_WAITING_LANES {
                return None;
            }
            waiting.insert(token, tx);
        }
        Some(PendingLane {
            offer: LaneOffer::new(self.public_addr.clone(), &token),
            token,
            taken: rx,
            lanes: self.clone(),
        })
    }

    fn take(&self, token: &Token) -> Option<oneshot::Sender<Lane>> {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token)
    }
}

impl PendingLane {
    /// The lane the node dialed for this offer; `None` when it did not
    /// arrive (the node said it took it, so it is on its way: a moment's
    /// wait at most).
    pub async fn taken(mut self) -> Option<Lane> {
        tokio::time::timeout(LANE_HANDSHAKE_TIMEOUT, &mut self.taken)
            .await
            .ok()?
            .ok()
    }
}

impl Drop for PendingLane {
    fn drop(&mut self) {
        self.lanes.take(&self.token);
    }
}

/// Binds the lane listener of `addr` (`off`: none), offering
/// `public_addr`, or the bound address when that is not a wildcard.
pub async fn bind(
    addr: &str,
    public_addr: Option<&str>,
) -> anyhow::Result<Option<(TcpListener, Arc<Lanes>)>> {
    if addr == "off" {
        return Ok(None);
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("LH_SESSION_LANE_ADDR {addr}"))?;
    let bound: SocketAddr = listener.local_addr()?;
    let public_addr = match public_addr {
        Some(public) => public.to_string(),
        None if bound.ip().is_unspecified() => anyhow::bail!(
            "LH_SESSION_LANE_ADDR {addr} listens on every address: set LH_SESSION_LANE_PUBLIC_ADDR to where nodes reach this replica"
        ),
        None => bound.to_string(),
    };
    tracing::info!(addr = %bound, public = %public_addr, "session lanes listening");
    Ok(Some((
        listener,
        Arc::new(Lanes {
            public_addr,
            waiting: Mutex::default(),
        }),
    )))
}

/// Takes the lanes nodes dial until `shutdown`.
pub fn serve(
    listener: TcpListener,
    lanes: Arc<Lanes>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let handshakes = Arc::new(Semaphore::new(MAX_LANE_HANDSHAKES));
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: a moment, then on.
                    tracing::warn!(error = %e, "a session lane was not accepted");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                metrics::counter!("lh_gateway_session_lanes_total", "result" => "too_many")
                    .increment(1);
                continue;
            };
            let lanes = lanes.clone();
            tokio::spawn(async move {
                let result = hear(stream, &lanes).await;
                drop(permit);
                metrics::counter!("lh_gateway_session_lanes_total", "result" => result)
                    .increment(1);
            });
        }
    })
}

/// One dialed connection: taken for its session, or closed.
async fn hear(mut stream: TcpStream, lanes: &Lanes) -> &'static str {
    let Ok(token) = session_lane::read_token(&mut stream).await else {
        return "no_token";
    };
    let Some(waiting) = lanes.take(&token) else {
        return "unknown_token";
    };
    match session_lane::accept(stream).await {
        Ok(lane) => {
            if waiting.send(lane).is_err() {
                // The opening gave up meanwhile: the lane closes, and the
                // node's session with it.
                return "abandoned";
            }
            "taken"
        }
        Err(_) => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_lane_is_taken_once_for_its_token_and_refused_for_any_other() {
        let (listener, lanes) = bind("127.0.0.1:0", None).await.unwrap().unwrap();
        let shutdown = CancellationToken::new();
        let _serving = serve(listener, lanes.clone(), shutdown.clone());
        let pending = lanes.offer().unwrap();
        let offer = pending.offer.clone();

        // A connection that shows nothing holds up nobody else's.
        let _silent = TcpStream::connect(&offer.addr).await.unwrap();
        // Another token: closed without the answer byte.
        let mut stranger = TcpStream::connect(&offer.addr).await.unwrap();
        stranger.write_all(&[0u8; LANE_TOKEN_BYTES]).await.unwrap();
        let mut answer = Vec::new();
        stranger.read_to_end(&mut answer).await.unwrap();
        assert!(answer.is_empty());

        let node = tokio::spawn(async move { session_lane::dial(&offer).await.is_ok() });
        assert!(pending.taken().await.is_some());
        assert!(node.await.unwrap());
        // The token was spent.
        assert!(lanes.waiting.lock().unwrap().is_empty());
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_withdrawn_offer_leaves_nothing_and_a_wildcard_needs_a_public_address() {
        let (_listener, lanes) = bind("127.0.0.1:0", None).await.unwrap().unwrap();
        let pending = lanes.offer().unwrap();
        assert_eq!(lanes.waiting.lock().unwrap().len(), 1);
        drop(pending);
        assert!(lanes.waiting.lock().unwrap().is_empty());
        assert!(bind("0.0.0.0:0", None).await.is_err());
        let (_l, named) = bind("0.0.0.0:0", Some("gw-0.example:7000"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(named.offer().unwrap().offer.addr, "gw-0.example:7000");
        assert!(bind("off", None).await.unwrap().is_none());
    }
}
