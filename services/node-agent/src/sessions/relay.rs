//! One session at the node: frames from the gateway into the command or
//! the connection, what it answers back as frames, within the windows both
//! sides grant (docs/adr/030).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use bytes::{BufMut, BytesMut};
use futures::{FutureExt, StreamExt};
use lh_rpc::session::{
    Control, CreditBack, Frame, Incoming, Outgoing, Stream, Window, DATA_HEADER_BYTES,
    FRAME_OVERHEAD_BYTES, MAX_FRAME_DATA_BYTES, SILENCE_LIMIT_MS,
};
use lh_rpc::session_lane::{self, LENGTH_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

use super::enter::{Exec, ExecIo};
use crate::workload::door::Entry;

/// After the command exits, how long its output may stay silent, while
/// the window has room for more, before the session ends anyway: what it
/// left running (a `sleep &`) may hold the output open for ever. Output
/// still coming, or held back by the window, is waited for.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);
/// How long a finished session's lane is read after this side shut it,
/// for the gateway to read the last frames and close its side.
const LANE_LINGER: Duration = Duration::from_secs(30);

/// How a session's frames go back to the gateway.
pub enum Way {
    Bus {
        client: async_nats::Client,
        subject: String,
    },
    Lane(OwnedWriteHalf),
}

/// Where a session's frames go back to the gateway.
pub struct Uplink {
    pub way: Way,
    pub numbers: Outgoing,
}

impl Uplink {
    async fn send(&mut self, frame: Frame) {
        let payload = self.numbers.encode(&frame);
        match &mut self.way {
            Way::Bus { client, subject } => {
                if let Err(e) = client.publish(subject.clone(), payload.into()).await {
                    tracing::debug!(subject = %subject, error = %e, "a session frame was not sent");
                }
            }
            // A lane that fails is seen closed by its reader, which ends
            // the session.
            Way::Lane(sink) => {
                if let Err(e) = session_lane::send(sink, &payload).await {
                    tracing::debug!(error = %e, "a session frame was not sent on its lane");
                }
            }
        }
    }

    /// Sends `chunk` ([`ROOM_BYTES`] of room, then data of `stream`) as
    /// the next data frame, sealed where it lies.
    async fn send_data(&mut self, stream: Stream, mut chunk: BytesMut) {
        self.numbers.seal_data(&mut chunk[LENGTH_BYTES..], stream);
        match &mut self.way {
            Way::Bus { client, subject } => {
                let frame = chunk.freeze().slice(LENGTH_BYTES..);
                if let Err(e) = client.publish(subject.clone(), frame).await {
                    tracing::debug!(subject = %subject, error = %e, "a session frame was not sent");
                }
            }
            Way::Lane(sink) => {
                if let Err(e) = session_lane::send_in_place(sink, &mut chunk).await {
                    tracing::debug!(error = %e, "a session frame was not sent on its lane");
                }
            }
        }
    }

    fn is_lane(&self) -> bool {
        matches!(self.way, Way::Lane(_))
    }

    /// Ends a lane without resetting it. A socket closed with frames of the
    /// gateway's still unread (its credits, its pings) answers them with a
    /// reset, and a reset throws away what the gateway has not read yet:
    /// the session's last output, which a slow client leaves queued there.
    /// So this side shuts its half, then reads until the gateway closes its
    /// own, for at most [`LANE_LINGER`].
    async fn linger(&mut self, frames: &mut mpsc::Receiver<Bytes>) {
        let Way::Lane(sink) = &mut self.way else {
            return;
        };
        let _ = sink.shutdown().await;
        let read_to_the_end = async { while frames.recv().await.is_some() {} };
        if tokio::time::timeout(LANE_LINGER, read_to_the_end)
            .await
            .is_err()
        {
            tracing::debug!("the gateway kept a finished session's lane open");
        }
    }

    async fn close(&mut self, reason: &str, message: impl Into<String>) {
        self.send(Frame::Control(Control::Close {
            reason: reason.into(),
            message: message.into(),
        }))
        .await;
    }
}

/// Puts what comes on a session's lane into its queue; the queue closes
/// when the lane does, or when the gateway sends beyond the window.
pub fn read_lane(
    mut lane: FramedRead<OwnedReadHalf, LengthDelimitedCodec>,
    frames: mpsc::Sender<Bytes>,
) {
    tokio::spawn(async move {
        while let Some(Ok(frame)) = lane.next().await {
            if frames.try_send(frame.freeze()).is_err() {
                return;
            }
        }
    });
}

/// What the session carries.
pub enum Work {
    Exec(Box<Exec>),
    Port(TcpStream),
}

/// Room in front of the bytes read for a data frame: its header, and a
/// lane's length before that, so that the frame is sealed where it was
/// read.
const ROOM_BYTES: usize = LENGTH_BYTES + DATA_HEADER_BYTES;

/// Bytes read from the command or the connection behind [`ROOM_BYTES`]
/// of room; none: that stream ended.
type Chunk = (Stream, BytesMut);

/// Whether a chunk carries no bytes: its stream ended.
fn ended(chunk: &BytesMut) -> bool {
    chunk.len() <= ROOM_BYTES
}

/// A zeroed buffer for the next read of a terminal, which reads into a
/// slice.
fn next_buffer(buf: &mut BytesMut) -> &mut [u8] {
    buf.clear();
    buf.reserve(ROOM_BYTES + MAX_FRAME_DATA_BYTES);
    buf.resize(ROOM_BYTES + MAX_FRAME_DATA_BYTES, 0);
    &mut buf[ROOM_BYTES..]
}

fn read_into<R: AsyncRead + Unpin + Send + 'static>(
    mut reader: R,
    stream: Stream,
    tx: mpsc::Sender<Chunk>,
) {
    tokio::spawn(async move {
        let mut buf = BytesMut::new();
        loop {
            // The memory of a frame already sent comes back here; the read
            // goes into it unzeroed.
            buf.reserve(ROOM_BYTES + MAX_FRAME_DATA_BYTES);
            buf.resize(ROOM_BYTES, 0);
            let mut n = reader
                .read_buf(&mut (&mut buf).limit(MAX_FRAME_DATA_BYTES))
                .await
                .unwrap_or(0);
            // What is ready already goes in the same frame: a stream read
            // as it trickles in would cost a frame (and its trip) per few
            // KiB.
            while n > 0 && n < MAX_FRAME_DATA_BYTES {
                let more = reader
                    .read_buf(&mut (&mut buf).limit(MAX_FRAME_DATA_BYTES - n))
                    .now_or_never();
                match more {
                    Some(Ok(more)) if more > 0 => n += more,
                    _ => break,
                }
            }
            if tx.send((stream, buf.split())).await.is_err() || n == 0 {
                return;
            }
        }
    });
}

/// Writes what the gateway sends into `writer`, in order, telling the
/// relay what it has written (the credit to give back); shuts `writer`
/// down once the queue ends.
fn write_from<W: AsyncWrite + Unpin + Send + 'static>(
    mut writer: W,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    written: mpsc::UnboundedSender<u32>,
) {
    tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            let cost = bytes.len() as u32 + FRAME_OVERHEAD_BYTES;
            if writer.write_all(&bytes).await.is_err() {
                // The reader went away: what is left is dropped, and its
                // credit still given back, so that the client is not
                // held up by a stdin nobody reads.
                let _ = written.send(cost);
                continue;
            }
            let _ = written.send(cost);
        }
        let _ = writer.shutdown().await;
    });
}

/// Runs the session until it ends; says why.
pub async fn run(
    work: Work,
    entry: Entry,
    mut frames: mpsc::Receiver<Bytes>,
    mut up: Uplink,
    window_bytes: u32,
) -> &'static str {
    let mut window = Window::new(window_bytes);
    let mut credit_back = CreditBack::new(window_bytes);
    let mut incoming = Incoming::default();
    let (chunk_tx, mut chunks) = mpsc::channel::<Chunk>(1);
    let (written_tx, mut written) = mpsc::unbounded_channel::<u32>();
    let mut input: Option<mpsc::UnboundedSender<Bytes>> = None;
    let mut pty: Option<Arc<super::pty::PtyMaster>> = None;
    let mut open_streams: usize;
    let is_port = matches!(work, Work::Port(_));
    let mut exec = None;
    match work {
        Work::Exec(mut running) => {
            match running
                .io
                .take()
                .expect("a command's streams are taken once")
            {
                ExecIo::Tty(master) => {
                    let master = Arc::new(master);
                    pty = Some(master.clone());
                    open_streams = 1;
                    let reader = master.clone();
                    let tx = chunk_tx.clone();
                    tokio::spawn(async move {
                        let mut buf = BytesMut::new();
                        loop {
                            let n = reader.read(next_buffer(&mut buf)).await.unwrap_or(0);
                            buf.truncate(ROOM_BYTES + n);
                            if tx.send((Stream::Stdout, buf.split())).await.is_err() || n == 0 {
                                return;
                            }
                        }
                    });
                    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
                    let done = written_tx.clone();
                    tokio::spawn(async move {
                        while let Some(bytes) = rx.recv().await {
                            let cost = bytes.len() as u32 + FRAME_OVERHEAD_BYTES;
                            let _ = master.write_all(&bytes).await;
                            let _ = done.send(cost);
                        }
                    });
                    input = Some(tx);
                }
                ExecIo::Pipes {
                    stdin,
                    stdout,
                    stderr,
                } => {
                    open_streams = 2;
                    read_into(stdout, Stream::Stdout, chunk_tx.clone());
                    read_into(stderr, Stream::Stderr, chunk_tx.clone());
                    if let Some(stdin) = stdin {
                        let (tx, rx) = mpsc::unbounded_channel();
                        write_from(stdin, rx, written_tx.clone());
                        input = Some(tx);
                    }
                }
            }
            exec = Some(running);
        }
        Work::Port(stream) => {
            let (read, write) = stream.into_split();
            open_streams = 1;
            read_into(read, Stream::Stdout, chunk_tx.clone());
            let (tx, rx) = mpsc::unbounded_channel();
            write_from(write, rx, written_tx.clone());
            input = Some(tx);
        }
    }
    drop(chunk_tx);
    let mut exited: Option<std::process::ExitStatus> = None;
    let mut drain_until: Option<Instant> = None;
    let mut input_ended = false;
    let mut last_heard = Instant::now();
    let mut silence = tokio::time::interval(Duration::from_secs(1));
    let silence_limit = Duration::from_millis(SILENCE_LIMIT_MS);

    let why = loop {
        let child_running = exited.is_none() && exec.is_some();
        tokio::select! {
            _ = entry.ended.cancelled() => {
                up.close("lease_ended", "the lease's workload ended or moved").await;
                break "lease_ended";
            }
            frame = frames.recv() => {
                let Some(payload) = frame else {
                    if up.is_lane() {
                        up.close("lane_closed", "the session's lane closed, or carried more than the window allows").await;
                        break "lane_closed";
                    }
                    up.close("frames_beyond_window", "the gateway sent more than the window allows").await;
                    break "frames_beyond_window";
                };
                last_heard = Instant::now();
                let frame = match incoming.decode(&payload) {
                    Ok(frame) => frame,
                    Err(e) => {
                        up.close("frames_lost", e).await;
                        break "frames_lost";
                    }
                };
                match frame {
                    Frame::Data { bytes, .. } => match &input {
                        Some(tx) if !input_ended => { let _ = tx.send(bytes); }
                        // Input after its end, or to a command without
                        // stdin: counted as written.
                        _ => {
                            if let Some(c) = credit_back.consumed(bytes.len() as u32 + FRAME_OVERHEAD_BYTES) {
                                up.send(Frame::Control(Control::Credit { bytes: c })).await;
                            }
                        }
                    },
                    Frame::Control(Control::Eof { .. }) => {
                        input_ended = true;
                        // A terminal has no end of input but the ^D its
                        // line discipline reads as one.
                        if pty.is_some() {
                            if let Some(tx) = &input { let _ = tx.send(Bytes::from_static(&[4])); }
                        } else {
                            input = None;
                        }
                    }
                    Frame::Control(Control::Resize { cols, rows }) => {
                        if let Some(pty) = &pty {
                            let _ = pty.resize(cols.max(1), rows.max(1));
                        }
                    }
                    Frame::Control(Control::Credit { bytes }) => {
                        // Output held back by the window may go on now.
                        if window.room() == 0 && drain_until.is_some() {
                            drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                        }
                        window.credit(bytes);
                    }
                    Frame::Control(Control::Ping) => up.send(Frame::Control(Control::Pong)).await,
                    Frame::Control(Control::Close { .. }) => break "client_closed",
                    Frame::Control(Control::Pong | Control::Exit { .. }) => {}
                }
            }
            Some(cost) = written.recv() => {
                if let Some(c) = credit_back.consumed(cost) {
                    up.send(Frame::Control(Control::Credit { bytes: c })).await;
                }
            }
            chunk = chunks.recv(), if window.room() > 0 && open_streams > 0 => {
                let Some((stream, chunk)) = chunk else { open_streams = 0; continue };
                if ended(&chunk) {
                    open_streams -= 1;
                    if is_port {
                        up.send(Frame::Control(Control::Eof { stream })).await;
                    }
                } else {
                    window.spend((chunk.len() - ROOM_BYTES) as u32 + FRAME_OVERHEAD_BYTES);
                    up.send_data(stream, chunk).await;
                    if drain_until.is_some() {
                        drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                    }
                }
            }
            status = wait_child(&mut exec), if child_running => {
                match status {
                    Ok(status) => {
                        exited = Some(status);
                        drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                    }
                    Err(e) => {
                        up.close("exec_failed", format!("cannot wait for the command: {e}")).await;
                        break "exec_failed";
                    }
                }
            }
            _ = silence.tick() => {
                if last_heard.elapsed() > silence_limit {
                    break "gateway_silent";
                }
                // Credit owed for a stream that went quiet: the sender may
                // be waiting on it.
                if let Some(c) = credit_back.flush() {
                    up.send(Frame::Control(Control::Credit { bytes: c })).await;
                }
            }
        }
        let drained = drain_until.is_some_and(|t| Instant::now() >= t) && window.room() > 0;
        if open_streams == 0 || drained {
            if exited.is_some() && entry.ended.is_cancelled() {
                up.close("lease_ended", "the lease's workload ended or moved")
                    .await;
                break "lease_ended";
            }
            if let Some(status) = exited {
                use std::os::unix::process::ExitStatusExt;
                up.send(Frame::Control(Control::Exit {
                    code: status.code(),
                    signal: status.signal(),
                }))
                .await;
                up.close("exited", "the command exited").await;
                break "exited";
            }
            if is_port && (input_ended || input.is_none()) {
                up.close("closed", "both sides of the connection closed")
                    .await;
                break "closed";
            }
        }
    };
    if why != "exited" {
        if let Some(exec) = &mut exec {
            exec.kill();
        }
    }
    drop(entry);
    up.linger(&mut frames).await;
    why
}

async fn wait_child(exec: &mut Option<Box<Exec>>) -> std::io::Result<std::process::ExitStatus> {
    match exec {
        Some(exec) => exec.child.wait().await,
        None => std::future::pending().await,
    }
}
