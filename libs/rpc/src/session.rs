//! A session into a lease between the gateway and the lease's node
//! (docs/adr/030): the request that opens it, and the frames both ways.
//!
//! The gateway asks the node on [`subject::session_open`] with an
//! [`OpenSession`]; the node answers [`OpenReply`]. Then frames go to the
//! node on [`subject::session_to_node`] and come back on
//! [`subject::session_from_node`], each numbered in its direction so that
//! a frame core NATS dropped ends the session instead of corrupting it.
//!
//! A frame is `[tag][sequence: u64 big-endian][body]`: tag 0 carries bytes
//! of a stream (`[stream][bytes]`), tag 1 a [`Control`] as JSON.
//!
//! [`subject::session_open`]: lh_events::subject::session_open
//! [`subject::session_to_node`]: lh_events::subject::session_to_node
//! [`subject::session_from_node`]: lh_events::subject::session_from_node

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most bytes of a stream one frame carries: large, as each frame's trip
/// through the bus costs more than its bytes (NATS takes 1 MiB a message).
pub const MAX_FRAME_DATA_BYTES: usize = 512 * 1024;
/// What a frame costs against the window beyond its bytes: a window of
/// one-byte frames (keystrokes) is still a bounded number of frames.
pub const FRAME_OVERHEAD_BYTES: u32 = 64;
/// The window each side may send unacknowledged, in bytes with each
/// frame's overhead.
pub const DEFAULT_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
/// The most frames a window can hold: what a receiver's queue must take.
pub const fn max_frames_in_window(window_bytes: u32) -> usize {
    (window_bytes / FRAME_OVERHEAD_BYTES) as usize
}
/// The gateway pings the node this often while a session is open.
pub const PING_INTERVAL_MS: u64 = 10_000;
/// Either side ends a session that heard nothing from the other this long.
pub const SILENCE_LIMIT_MS: u64 = 30_000;
/// Most bytes of a command line, its arguments together.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024;
/// Most arguments of a command.
pub const MAX_COMMAND_ARGS: usize = 256;

/// The gateway asks a node to open a session into one of its leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    pub session_id: Uuid,
    pub lease_id: Uuid,
    /// The placement the gateway saw the lease on: a node that runs it for
    /// another refuses.
    pub placement: u64,
    pub kind: OpenKind,
    /// What the node may send before the gateway grants more.
    pub window_bytes: u32,
    /// Sessions the node lets one lease have at once.
    pub max_sessions_per_lease: u32,
    /// Where the node may carry the session's frames instead of the bus
    /// ([`crate::session_lane`]); without one, or when the node cannot
    /// take it, they travel on the bus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<LaneOffer>,
}

/// Bytes of a lane's token.
pub const LANE_TOKEN_BYTES: usize = 32;

/// Where a node may dial for a session's lane, and what to show there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneOffer {
    /// `host:port` of the gateway replica that opened the session.
    pub addr: String,
    /// The one-time token, [`LANE_TOKEN_BYTES`] as hex.
    pub token: String,
}

impl LaneOffer {
    pub fn new(addr: String, token: &[u8; LANE_TOKEN_BYTES]) -> Self {
        LaneOffer {
            addr,
            token: hex::encode(token),
        }
    }

    /// The token's bytes, when it is one.
    pub fn token_bytes(&self) -> Option<[u8; LANE_TOKEN_BYTES]> {
        let bytes = hex::decode(&self.token).ok()?;
        bytes.try_into().ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum OpenKind {
    /// A command in the lease's workload (its container, or its user).
    Exec {
        command: Vec<String>,
        /// On a terminal of this size, stdout and stderr one stream.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tty: Option<TtySize>,
        /// Whether the client sends stdin; without, the command's stdin is
        /// empty.
        stdin: bool,
    },
    /// A TCP connection to `127.0.0.1:<port>` in the lease's network.
    PortForward { port: u16 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    pub cols: u16,
    pub rows: u16,
}

/// The node's answer to an [`OpenSession`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum OpenReply {
    Opened {
        /// Whether the frames travel on the lane the gateway offered (the
        /// node dialed it and the gateway took it) rather than the bus.
        #[serde(default)]
        lane: bool,
    },
    Refused {
        reason: Refusal,
        message: String,
    },
}

/// Why a node would not open a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// No workload of the lease runs here at that placement.
    NotRunningHere,
    /// The node simulates its workloads: there is nothing to enter.
    Simulated,
    /// The lease has as many sessions as the node allows.
    TooManySessions,
    /// The request is not one the node can carry out.
    BadRequest,
    /// The command could not be started.
    CannotStart,
    /// Nothing accepts connections on the port.
    ConnectionRefused,
    /// The workload is one this node cannot enter (one a restarted agent
    /// adopted without what it needs to).
    CannotEnter,
}

/// Which stream a frame's bytes belong to. For a port forward, `In` is
/// what the client sends the connection and `Out` what it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdin,
    Stdout,
    Stderr,
}

impl Stream {
    fn byte(self) -> u8 {
        match self {
            Stream::Stdin => 0,
            Stream::Stdout => 1,
            Stream::Stderr => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Stream::Stdin),
            1 => Some(Stream::Stdout),
            2 => Some(Stream::Stderr),
            _ => None,
        }
    }
}

/// What a frame that carries no stream bytes says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "control", rename_all = "snake_case")]
pub enum Control {
    /// The sender has nothing more on `stream`.
    Eof {
        stream: Stream,
    },
    /// The terminal's new size.
    Resize {
        cols: u16,
        rows: u16,
    },
    /// The sender consumed this many window bytes: the other may send
    /// them again.
    Credit {
        bytes: u32,
    },
    /// The command ended (the node's last frame but the close).
    Exit {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// The session is over, and why (the `ended_by` of `session.ended`).
    Close {
        reason: String,
        message: String,
    },
    Ping,
    Pong,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Bytes of a stream; decoded, a view into the frame as it travelled.
    Data {
        stream: Stream,
        bytes: Bytes,
    },
    Control(Control),
}

impl Frame {
    /// What it costs against the receiver's window.
    pub fn window_cost(&self) -> u32 {
        match self {
            Frame::Data { bytes, .. } => bytes.len() as u32 + FRAME_OVERHEAD_BYTES,
            Frame::Control(_) => 0,
        }
    }
}

const TAG_DATA: u8 = 0;
const TAG_CONTROL: u8 = 1;
const HEADER_BYTES: usize = 1 + 8;
/// Bytes in front of a data frame's data: its tag, number and stream. A
/// sender that reads data behind this much room seals the frame in place
/// ([`Outgoing::seal_data`]) instead of copying the data into one.
pub const DATA_HEADER_BYTES: usize = HEADER_BYTES + 1;

fn write_data_header(header: &mut [u8], sequence: u64, stream: Stream) {
    header[0] = TAG_DATA;
    header[1..HEADER_BYTES].copy_from_slice(&sequence.to_be_bytes());
    header[HEADER_BYTES] = stream.byte();
}

/// `frame` numbered `sequence`, as it travels.
pub fn encode(sequence: u64, frame: &Frame) -> Vec<u8> {
    match frame {
        Frame::Data { stream, bytes } => {
            let mut out = vec![0u8; DATA_HEADER_BYTES + bytes.len()];
            write_data_header(&mut out, sequence, *stream);
            out[DATA_HEADER_BYTES..].copy_from_slice(bytes);
            out
        }
        Frame::Control(control) => {
            let mut out = vec![TAG_CONTROL];
            out.extend_from_slice(&sequence.to_be_bytes());
            serde_json::to_writer(&mut out, control).expect("a control serializes");
            out
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a frame of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("a frame of {0} data bytes is over the {MAX_FRAME_DATA_BYTES} allowed")]
    TooBig(usize),
    #[error("unknown frame tag {0}")]
    UnknownTag(u8),
    #[error("unknown stream {0}")]
    UnknownStream(u8),
    #[error("a control frame that is not one: {0}")]
    BadControl(String),
}

/// A frame as it travelled, with its sequence number. A data frame's
/// bytes are a view of `payload`, not a copy.
pub fn decode(payload: &Bytes) -> Result<(u64, Frame), FrameError> {
    if payload.len() < HEADER_BYTES {
        return Err(FrameError::Short(payload.len()));
    }
    let sequence = u64::from_be_bytes(payload[1..HEADER_BYTES].try_into().expect("8 bytes"));
    let body = &payload[HEADER_BYTES..];
    match payload[0] {
        TAG_DATA => {
            let (&stream, bytes) = body.split_first().ok_or(FrameError::Short(payload.len()))?;
            if bytes.len() > MAX_FRAME_DATA_BYTES {
                return Err(FrameError::TooBig(bytes.len()));
            }
            let stream = Stream::from_byte(stream).ok_or(FrameError::UnknownStream(stream))?;
            Ok((
                sequence,
                Frame::Data {
                    stream,
                    bytes: payload.slice(DATA_HEADER_BYTES..),
                },
            ))
        }
        TAG_CONTROL => serde_json::from_slice(body)
            .map(|c| (sequence, Frame::Control(c)))
            .map_err(|e| FrameError::BadControl(e.to_string())),
        tag => Err(FrameError::UnknownTag(tag)),
    }
}

/// Numbers the frames one side sends.
#[derive(Debug, Default)]
pub struct Outgoing {
    next: u64,
}

impl Outgoing {
    /// `frame`, encoded with the next number.
    pub fn encode(&mut self, frame: &Frame) -> Vec<u8> {
        let out = encode(self.next, frame);
        self.next += 1;
        out
    }

    /// Makes `frame`, whose first [`DATA_HEADER_BYTES`] are room and the
    /// rest data of `stream`, the next data frame, in place.
    pub fn seal_data(&mut self, frame: &mut [u8], stream: Stream) {
        write_data_header(frame, self.next, stream);
        self.next += 1;
    }
}

/// Checks the numbers of the frames one side receives.
#[derive(Debug, Default)]
pub struct Incoming {
    next: u64,
}

impl Incoming {
    /// The frame in `payload`, when it is the next one; an error naming
    /// the gap otherwise.
    pub fn decode(&mut self, payload: &Bytes) -> Result<Frame, String> {
        let (sequence, frame) = decode(payload).map_err(|e| e.to_string())?;
        if sequence != self.next {
            return Err(format!(
                "frame {sequence} arrived where {} was due: frames were lost",
                self.next
            ));
        }
        self.next += 1;
        Ok(frame)
    }
}

/// Bytes a receiver has consumed and not yet given back as credit: given
/// back once a quarter of the window is, so that credit costs a frame per
/// quarter window, not one per frame.
#[derive(Debug)]
pub struct CreditBack {
    owed: u32,
    threshold: u32,
}

impl CreditBack {
    pub fn new(window_bytes: u32) -> Self {
        CreditBack {
            owed: 0,
            threshold: (window_bytes / 4).max(1),
        }
    }

    /// Counts `frame` consumed; the credit to send now, if any.
    pub fn consumed(&mut self, cost: u32) -> Option<u32> {
        self.owed = self.owed.saturating_add(cost);
        (self.owed >= self.threshold).then(|| std::mem::take(&mut self.owed))
    }

    /// Whatever is owed, when the sender may be waiting on it (its
    /// stream went quiet).
    pub fn flush(&mut self) -> Option<u32> {
        (self.owed > 0).then(|| std::mem::take(&mut self.owed))
    }
}

/// What one side may still send.
#[derive(Debug)]
pub struct Window {
    available: u32,
    size: u32,
}

impl Window {
    pub fn new(size: u32) -> Self {
        Window {
            available: size,
            size,
        }
    }

    /// Bytes of data the next frame may carry (0: wait for credit).
    pub fn room(&self) -> usize {
        (self.available.saturating_sub(FRAME_OVERHEAD_BYTES) as usize).min(MAX_FRAME_DATA_BYTES)
    }

    pub fn spend(&mut self, cost: u32) {
        self.available = self.available.saturating_sub(cost);
    }

    /// Credit from the other side. More than was ever spent is a broken
    /// peer; the window stays at its size.
    pub fn credit(&mut self, bytes: u32) {
        self.available = self.available.saturating_add(bytes).min(self.size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_the_wire_in_order_and_a_gap_is_named() {
        let frames = [
            Frame::Data {
                stream: Stream::Stdout,
                bytes: Bytes::from_static(b"hello\n"),
            },
            Frame::Control(Control::Resize { cols: 80, rows: 24 }),
            Frame::Control(Control::Exit {
                code: Some(3),
                signal: None,
            }),
            Frame::Data {
                stream: Stream::Stdin,
                bytes: Bytes::from(vec![0; MAX_FRAME_DATA_BYTES]),
            },
        ];
        let mut out = Outgoing::default();
        let mut into = Incoming::default();
        for frame in &frames {
            assert_eq!(&into.decode(&out.encode(frame).into()).unwrap(), frame);
        }
        let _lost = out.encode(&Frame::Control(Control::Ping));
        let err = into
            .decode(&out.encode(&Frame::Control(Control::Pong)).into())
            .unwrap_err();
        assert!(err.contains("frames were lost"), "{err}");
    }

    #[test]
    fn hostile_frames_are_refused_with_their_cause() {
        assert_eq!(
            decode(&Bytes::from_static(&[0; 3])),
            Err(FrameError::Short(3))
        );
        let mut big = encode(
            0,
            &Frame::Data {
                stream: Stream::Stdout,
                bytes: Bytes::new(),
            },
        );
        big.extend(vec![0; MAX_FRAME_DATA_BYTES + 1]);
        assert_eq!(
            decode(&big.into()),
            Err(FrameError::TooBig(MAX_FRAME_DATA_BYTES + 1))
        );
        let mut bad_tag = encode(0, &Frame::Control(Control::Ping));
        bad_tag[0] = 9;
        assert_eq!(decode(&bad_tag.into()), Err(FrameError::UnknownTag(9)));
        let mut bad_stream = encode(
            0,
            &Frame::Data {
                stream: Stream::Stdout,
                bytes: Bytes::from_static(&[1]),
            },
        );
        bad_stream[HEADER_BYTES] = 7;
        assert_eq!(
            decode(&bad_stream.into()),
            Err(FrameError::UnknownStream(7))
        );
        let mut bad_json = vec![TAG_CONTROL];
        bad_json.extend(0u64.to_be_bytes());
        bad_json.extend(b"{\"control\":\"launch\"}");
        assert!(matches!(
            decode(&bad_json.into()),
            Err(FrameError::BadControl(_))
        ));
    }

    #[test]
    fn a_frame_sealed_in_place_is_the_frame_encoded() {
        let data = b"zeros and ones";
        let mut room = vec![0xAAu8; DATA_HEADER_BYTES];
        room.extend_from_slice(data);
        let mut sealed = Outgoing::default();
        let mut encoded = Outgoing::default();
        let frame = Frame::Data {
            stream: Stream::Stderr,
            bytes: Bytes::from_static(data),
        };
        for _ in 0..3 {
            sealed.seal_data(&mut room, Stream::Stderr);
            assert_eq!(room, encoded.encode(&frame));
        }
    }

    #[test]
    fn a_window_holds_back_until_credit_comes() {
        let mut window = Window::new(1024);
        assert_eq!(window.room(), 1024 - FRAME_OVERHEAD_BYTES as usize);
        window.spend(1024);
        assert_eq!(window.room(), 0);
        let mut back = CreditBack::new(1024);
        assert_eq!(back.consumed(100), None);
        assert_eq!(back.consumed(200), Some(300));
        window.credit(300);
        assert_eq!(window.room(), 300 - FRAME_OVERHEAD_BYTES as usize);
        window.credit(u32::MAX);
        assert_eq!(window.room(), 1024 - FRAME_OVERHEAD_BYTES as usize);
        assert_eq!(back.flush(), None);
        back.consumed(1);
        assert_eq!(back.flush(), Some(1));
    }

    #[test]
    fn an_open_request_keeps_its_shape() {
        let open = OpenSession {
            session_id: Uuid::nil(),
            lease_id: Uuid::nil(),
            placement: 2,
            kind: OpenKind::Exec {
                command: vec!["sh".into()],
                tty: Some(TtySize { cols: 80, rows: 24 }),
                stdin: true,
            },
            window_bytes: DEFAULT_WINDOW_BYTES,
            max_sessions_per_lease: 8,
            lane: None,
        };
        let json = serde_json::to_string(&open).unwrap();
        assert_eq!(serde_json::from_str::<OpenSession>(&json).unwrap(), open);
        // A node from before lanes reads an opening without one.
        assert!(!json.contains("lane"), "{json}");
        // A gateway from before lanes reads the node's yes.
        let opened: OpenReply = serde_json::from_str(r#"{"result":"opened"}"#).unwrap();
        assert_eq!(opened, OpenReply::Opened { lane: false });
        let refused = OpenReply::Refused {
            reason: Refusal::TooManySessions,
            message: "8".into(),
        };
        let json = serde_json::to_string(&refused).unwrap();
        assert!(json.contains("too_many_sessions"), "{json}");
    }
}
