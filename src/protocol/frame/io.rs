//! Shell I/O (PROTOCOL.md §6): the `io_*` frames, and the binary messages that carry a
//! session's bytes (a 5-byte header: channel and stream).

use serde::{Deserialize, Serialize};

use serde_json::Value;

use super::{DecodeError, MAX_FRAME_BYTES, short};

/// cp → manager: open a shell in an agent's container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoOpen {
    /// Unique on the connection; prefixes every binary message of the session.
    pub channel: u32,
    pub session_id: String,
    pub actor: String,
    pub target: IoTarget,
    #[serde(default = "default_command")]
    pub command: Vec<String>,
    #[serde(default = "default_tty")]
    pub tty: bool,
    /// Terminal size; meaningless without a PTY, so optional (see [`IoOpen::size`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
}

/// The terminal size of an `io_open` that names none.
pub const DEFAULT_TERMINAL: (u16, u16) = (80, 24);

impl IoOpen {
    /// The PTY's starting size, `(cols, rows)`: 80×24 where the frame names none; `None`
    /// without a PTY (`tty: false`), where a size means nothing.
    pub fn size(&self) -> Option<(u16, u16)> {
        self.tty.then(|| {
            (
                self.cols.unwrap_or(DEFAULT_TERMINAL.0),
                self.rows.unwrap_or(DEFAULT_TERMINAL.1),
            )
        })
    }
}

/// What can be read of an `io_open` that failed to decode but whose `channel` is a u32:
/// enough to refuse it on that channel (`io_close` `denied`) and to audit the refusal,
/// so the control plane's session is answered instead of waiting forever. Strings are
/// empty where missing or not strings, and cut short like error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialIoOpen {
    pub channel: u32,
    pub session_id: String,
    pub actor: String,
    pub namespace: String,
    pub agent: String,
    pub container: String,
}

impl PartialIoOpen {
    pub(super) fn read(object: &serde_json::Map<String, Value>) -> Option<Self> {
        let channel = u32::try_from(object.get("channel")?.as_u64()?).ok()?;
        let text = |v: Option<&Value>| short(v.and_then(Value::as_str).unwrap_or_default().into());
        let target = object.get("target");
        let field = |name: &str| target.and_then(|t| t.get(name));
        Some(PartialIoOpen {
            channel,
            session_id: text(object.get("session_id")),
            actor: text(object.get("actor")),
            namespace: text(field("namespace")),
            agent: text(field("agent")),
            container: match field("container") {
                None => default_container(),
                c => text(c),
            },
        })
    }
}

/// The container a shell opens in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoTarget {
    pub namespace: String,
    pub agent: String,
    #[serde(default = "default_container")]
    pub container: String,
}

fn default_command() -> Vec<String> {
    vec!["/bin/sh".to_owned()]
}

fn default_tty() -> bool {
    true
}

fn default_container() -> String {
    "runtime".to_owned()
}

/// manager → cp: the exec is running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoOpened {
    pub channel: u32,
}

/// cp → manager: new PTY size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoResize {
    pub channel: u32,
    pub cols: u16,
    pub rows: u16,
}

/// both ways: the session ended (manager) or should end (cp).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoClose {
    pub channel: u32,
    /// The process's exit status, when the manager knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Which pipe of an exec a binary message belongs to (§6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stream {
    /// cp → manager.
    Stdin = 0,
    /// manager → cp.
    Stdout = 1,
    /// manager → cp.
    Stderr = 2,
}

impl TryFrom<u8> for Stream {
    type Error = DecodeError;

    fn try_from(byte: u8) -> Result<Self, DecodeError> {
        match byte {
            0 => Ok(Stream::Stdin),
            1 => Ok(Stream::Stdout),
            2 => Ok(Stream::Stderr),
            other => Err(DecodeError::IoStream(other)),
        }
    }
}

/// Bytes before the payload of a binary message: channel (u32 BE) and stream.
pub const IO_HEADER_LEN: usize = 5;

/// Largest payload of a binary message [`decode_io`] accepts. §6 sets no figure; the
/// control plane writes only stdin, and a session holds at most 1 MiB of unread input
/// (`shell::input::SESSION_LIMIT`), so a larger chunk could only close its session.
pub const MAX_IO_PAYLOAD: usize = MAX_FRAME_BYTES;

/// Largest WebSocket message the manager reads: the larger of a text frame
/// ([`MAX_FRAME_BYTES`]) and a binary one (header + [`MAX_IO_PAYLOAD`]).
pub const MAX_MESSAGE_BYTES: usize = IO_HEADER_LEN + MAX_IO_PAYLOAD;

/// One binary message, borrowing its payload from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoChunk<'a> {
    pub channel: u32,
    pub stream: Stream,
    pub data: &'a [u8],
}

/// The bytes of a binary message: 4-byte big-endian channel, 1 stream byte, payload.
pub fn encode_io(channel: u32, stream: Stream, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(IO_HEADER_LEN + data.len());
    out.extend_from_slice(&channel.to_be_bytes());
    out.push(stream as u8);
    out.extend_from_slice(data);
    out
}

/// Reads one binary message. An empty payload is valid; one over [`MAX_IO_PAYLOAD`] is not.
pub fn decode_io(bytes: &[u8]) -> Result<IoChunk<'_>, DecodeError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(DecodeError::TooLarge { len: bytes.len() });
    }
    let Some((&[c0, c1, c2, c3, s], data)) = bytes.split_first_chunk::<IO_HEADER_LEN>() else {
        return Err(DecodeError::IoTooShort { len: bytes.len() });
    };
    Ok(IoChunk {
        channel: u32::from_be_bytes([c0, c1, c2, c3]),
        stream: Stream::try_from(s)?,
        data,
    })
}
