//! The SSH server: who may sign in (the lease's tenant, with a key it
//! registered; the user name is the lease's id), and what each channel
//! becomes ([`super::channel`]).

use std::sync::Arc;

use lh_events::{Actor, SessionKind};
use lh_rpc::session::OpenKind;
use lh_service::CancellationToken;
use russh::keys::ssh_key::{HashAlg, PublicKey};
use russh::server::{Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, ChannelOpenFailure};
use uuid::Uuid;

use super::channel::{self, SignedIn};
use crate::http::ApiContext;

/// One client's connection.
pub struct Connection {
    ctx: ApiContext,
    peer: Option<std::net::SocketAddr>,
    who: Option<SignedIn>,
}

/// Serves connections on `listener` until `shutdown`, at most
/// `max_connections` at once: past it a new one is closed at once, so that
/// a flood of connections costs a socket each for an instant, never the
/// gateway's memory or its database.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: Arc<russh::server::Config>,
    max_connections: usize,
    ctx: ApiContext,
    shutdown: CancellationToken,
) {
    let room = Arc::new(tokio::sync::Semaphore::new(max_connections.max(1)));
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: the next accept may work.
                    tracing::warn!(error = %e, "the SSH endpoint cannot accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = room.clone().try_acquire_owned() else {
            metrics::counter!("lh_gateway_ssh_connections_refused_total").increment(1);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            ctx: ctx.clone(),
            peer: Some(peer),
            who: None,
        };
        let (config, stop) = (config.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match russh::server::run_stream(config, stream, connection).await {
                Ok(session) => tokio::select! {
                    ended = session => if let Err(e) = ended {
                        tracing::debug!(error = %e, peer = %peer, "an SSH connection ended in error");
                    },
                    _ = stop.cancelled() => {}
                },
                Err(e) => tracing::debug!(error = %e, peer = %peer, "an SSH handshake failed"),
            }
        });
    }
}

impl Connection {
    /// Whether `key` signs `user` (a lease id, or `<lease id>+<node>` for
    /// one member of a lease across nodes) in: a key its tenant
    /// registered. Nothing says which part failed, as OpenSSH says nothing.
    async fn allowed(&self, user: &str, key: &PublicKey) -> Option<SignedIn> {
        let (lease, member) = match user.split_once('+') {
            Some((lease, node)) => (lease, Some(node)),
            None => (user, None),
        };
        let lease_id: Uuid = lease.parse().ok()?;
        let lease = crate::http::leases::lookup_lease(&self.ctx, lease_id)
            .await
            .ok()
            .flatten()?;
        let member = crate::http::leases::named_member(&lease.lease, member).ok()?;
        let tenant_id = lease.lease.view.tenant_id;
        // A suspended tenant reads but changes nothing: no commands.
        let suspended: Option<bool> =
            sqlx::query_scalar("SELECT suspended FROM tenants WHERE id = $1")
                .bind(tenant_id)
                .fetch_optional(&self.ctx.pool)
                .await
                .map_err(|e| tracing::warn!(error = %e, "cannot read a tenant's state"))
                .ok()?;
        if suspended != Some(false) {
            return None;
        }
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let keys = crate::ssh_keys::authorized_keys(&self.ctx.pool, tenant_id)
            .await
            .map_err(|e| tracing::warn!(error = %e, "cannot read tenants' SSH keys"))
            .ok()?;
        keys.iter()
            .any(|k| k.fingerprint == fingerprint)
            .then_some(SignedIn {
                actor: Actor::Tenant(tenant_id),
                lease_id,
                key_fingerprint: fingerprint,
                member,
            })
    }
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(match self.allowed(user, offer.public_key).await {
            Some(_) => Auth::Accept,
            None => Auth::reject(),
        })
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        match self.allowed(user, key.public_key).await {
            Some(who) => {
                tracing::info!(lease = %who.lease_id, key = %who.key_fingerprint, peer = ?self.peer, "signed in over SSH");
                self.who = Some(who);
                Ok(Auth::Accept)
            }
            None => {
                metrics::counter!("lh_gateway_ssh_sign_ins_refused_total").increment(1);
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(who) = self.who.clone() else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        reply.accept().await;
        tokio::spawn(channel::run_session(channel, self.ctx.clone(), who));
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host_to_connect: &str,
        port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(who) = self.who.clone() else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        // Only the lease's own loopback: never an address the gateway or
        // the node could reach for the tenant.
        let loopback = matches!(host_to_connect, "localhost" | "127.0.0.1" | "::1" | "[::1]");
        let port = u16::try_from(port_to_connect).ok().filter(|p| *p > 0);
        let (true, Some(port)) = (loopback, port) else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            match channel::open_for(
                &ctx,
                &who,
                OpenKind::PortForward { port },
                SessionKind::PortForward,
            )
            .await
            {
                Ok(opened) => {
                    reply.accept().await;
                    channel::run_forward(channel, ctx, opened).await;
                }
                Err(e) => {
                    tracing::info!(lease = %who.lease_id, port, why = %e.detail, "an SSH forward refused");
                    reply.reject(ChannelOpenFailure::ConnectFailed).await;
                }
            }
        });
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _col_width: u32,
        _row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        _name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn tcpip_forward(
        &mut self,
        _address: &str,
        _port: &mut u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        // A lease's workload reaches no one through the gateway.
        Ok(false)
    }
}
