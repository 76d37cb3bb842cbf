//! The autonomic.v1 codec (PROTOCOL.md §3, §6, §7): frames to and from text and bytes.
//!
//! No I/O here. The session reads a WebSocket message, hands its text to [`decode`] or
//! its bytes to [`decode_io`], and acts on the result; heartbeats, timers and reconnects
//! live one level up.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::AuditEvent;
use crate::text::{MAX_ID_BYTES, MAX_TEXT_BYTES, cap_utf8_marked};

mod io;
mod json;

pub use io::*;
pub use json::Json;

/// The WebSocket subprotocol the manager asks for.
pub const SUBPROTOCOL: &str = "autonomic.v1";

/// The `protocol` number sent in `hello`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest text frame [`decode`] accepts.
///
/// The control plane only sends small frames to the manager (`control`, `io_open`, …:
/// a few hundred bytes), and a parsed JSON tree takes several times the memory of its
/// text, so an unbounded message is the cheapest way for a peer to exhaust the pod's
/// memory. 1 MiB leaves three orders of magnitude of headroom; the socket caps its
/// WebSocket messages at [`MAX_MESSAGE_BYTES`] (a binary frame's header above this).
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// Longest peer-derived text quoted back in a [`DecodeError`]: serde quotes offending
/// values whole, and an error frame must not echo a megabyte back to its sender.
const MAX_ERROR_MESSAGE: usize = 200;

/// [`Frame`], [`KNOWN_TYPES`] and [`Frame::type_name`] from one list: each frame's
/// wire `type` is written once.
macro_rules! frames {
    ($($(#[$doc:meta])* $variant:ident $(($body:ty))? = $name:literal,)*) => {
        /// One control message: a WebSocket text message holding one JSON object.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        pub enum Frame {
            $($(#[$doc])* #[serde(rename = $name)] $variant $(($body))?,)*
        }

        /// The `type` of every frame this codec knows, in the order of the §3 table.
        pub const KNOWN_TYPES: &[&str] = &[$($name),*];

        impl Frame {
            /// The wire `type` of this frame, for logs.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(Frame::$variant { .. } => $name,)*
                }
            }
        }
    };
}

frames! {
    Hello(Hello) = "hello",
    Welcome(Welcome) = "welcome",
    Snapshot(Snapshot) = "snapshot",
    Delta(Delta) = "delta",
    Heartbeat(Heartbeat) = "heartbeat",
    /// The control plane asks for a fresh `snapshot`.
    Resync = "resync",
    Control(Control) = "control",
    ControlResult(ControlResult) = "control_result",
    IoOpen(IoOpen) = "io_open",
    IoOpened(IoOpened) = "io_opened",
    IoResize(IoResize) = "io_resize",
    IoClose(IoClose) = "io_close",
    Audit(Audit) = "audit",
    Error(ErrorFrame) = "error",
}

/// manager → cp: the first frame after the upgrade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The manager's version.
    pub version: String,
    /// A UUID drawn at process start, so the control plane can tell a restart from a reconnect.
    pub boot_id: String,
    pub cluster_id: String,
    pub host: Host,
    /// e.g. `["snapshot","delta","io","control","audit"]`.
    pub capabilities: Vec<String>,
}

/// Where the manager runs, for the dashboard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    pub hostname: String,
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub kubernetes_version: String,
    pub os: String,
    pub arch: String,
}

/// cp → manager: the session is accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub deployment_id: String,
    #[serde(default = "default_heartbeat_interval_s")]
    pub heartbeat_interval_s: u64,
    #[serde(default = "default_snapshot_interval_s")]
    pub snapshot_interval_s: u64,
}

impl Welcome {
    /// What the session goes on with when no `welcome` came (§4.1): the default
    /// intervals, no deployment id.
    pub fn defaults() -> Self {
        Welcome {
            deployment_id: String::new(),
            heartbeat_interval_s: default_heartbeat_interval_s(),
            snapshot_interval_s: default_snapshot_interval_s(),
        }
    }

    /// The heartbeat period, kept within 1 s ..= 1 day.
    ///
    /// The wire value is the peer's to choose, but 0 would make `tokio::time::interval`
    /// panic and a huge value would overflow `3 × interval`; neither may crash us.
    pub fn heartbeat_interval(&self) -> std::time::Duration {
        clamp_interval(self.heartbeat_interval_s)
    }

    /// The full-snapshot period, kept within 1 s ..= 1 day (see [`Self::heartbeat_interval`]).
    pub fn snapshot_interval(&self) -> std::time::Duration {
        clamp_interval(self.snapshot_interval_s)
    }
}

fn clamp_interval(seconds: u64) -> std::time::Duration {
    std::time::Duration::from_secs(seconds.clamp(1, 86_400))
}

fn default_heartbeat_interval_s() -> u64 {
    15
}

fn default_snapshot_interval_s() -> u64 {
    300
}

/// manager → cp: every watched object, in wire form (§5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// 1 on the first frame of a connection, +1 on every `snapshot` and `delta`.
    pub seq: u64,
    pub resources: Vec<Json>,
}

/// manager → cp: what changed since the previous `snapshot` or `delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub seq: u64,
    pub changes: Vec<Change>,
}

/// One entry of `delta.changes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Change {
    /// The object's newest state, in wire form (§5).
    Upsert { resource: Json },
    Remove {
        kind: String,
        namespace: String,
        name: String,
        uid: String,
    },
}

/// both ways: liveness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// RFC 3339.
    pub sent_at: String,
}

/// cp → manager: act on an Agent or a Tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Control {
    /// Echoed in `control_result`.
    pub id: String,
    pub action: ControlAction,
    pub target: ControlTarget,
    /// Who asked, for the audit trail.
    pub actor: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlAction {
    /// Delete the owned pod so it is recreated.
    Restart,
    /// Set `spec.paused` (Agent) or `spec.disabled` (Tool).
    Pause,
    Resume,
    /// Delete the custom resource.
    Delete,
}

impl ControlAction {
    /// The action as the frame names it (`AUTONOMIC_CONTROL_ACTIONS` uses these).
    pub fn wire_name(self) -> &'static str {
        match self {
            ControlAction::Restart => "restart",
            ControlAction::Pause => "pause",
            ControlAction::Resume => "resume",
            ControlAction::Delete => "delete",
        }
    }
}

/// What a `control` acts on. `kind` stays a string: a kind the manager does not act on
/// is refused with `ok: false`, not rejected as a malformed frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlTarget {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// manager → cp: the outcome of a `control`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlResult {
    pub id: String,
    pub ok: bool,
    /// Why it failed, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// manager → cp: one audit event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Audit {
    pub event: AuditEvent,
}

/// both ways: the peer sent something wrong; the connection stays up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorFrame {
    /// `bad_frame`, `unknown_channel`, `denied`, …
    pub code: String,
    pub message: String,
    /// The `type` of the offending frame, when known.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

impl Frame {
    /// The answer to a frame that failed to decode (§3: answer, keep the connection).
    pub fn bad_frame(err: &DecodeError) -> Frame {
        Frame::Error(ErrorFrame {
            code: "bad_frame".to_owned(),
            message: err.to_string(),
            reference: err.frame_type().map(str::to_owned),
        })
    }
}

/// Why a message is not a frame. Its `Display` is short enough to send back in an
/// `error` frame's `message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge { len: usize },
    #[error("not JSON: {0}")]
    Syntax(String),
    #[error("frame is not a JSON object")]
    NotObject,
    #[error("frame has no string `type`")]
    MissingType,
    #[error("bad `{frame_type}` frame: {message}")]
    Invalid { frame_type: String, message: String },
    /// An `io_open` that failed to decode but whose channel can be answered.
    #[error("bad `io_open` frame: {message}")]
    InvalidIoOpen {
        message: String,
        open: Box<PartialIoOpen>,
    },
    #[error("binary frame of {len} bytes is shorter than its 5-byte header")]
    IoTooShort { len: usize },
    #[error("binary frame has unknown stream {0} (expected 0, 1 or 2)")]
    IoStream(u8),
}

impl DecodeError {
    /// The offending frame's `type`, for the `ref` of the answer.
    pub fn frame_type(&self) -> Option<&str> {
        match self {
            DecodeError::Invalid { frame_type, .. } => Some(frame_type),
            DecodeError::InvalidIoOpen { .. } => Some("io_open"),
            _ => None,
        }
    }

    /// The readable part of a malformed `io_open` whose `channel` is a u32: the manager
    /// answers it on that channel (`io_close` `denied`) besides the `error` frame.
    pub fn malformed_io_open(&self) -> Option<&PartialIoOpen> {
        match self {
            DecodeError::InvalidIoOpen { open, .. } => Some(open),
            _ => None,
        }
    }
}

/// The text of a frame.
pub fn encode(frame: &Frame) -> String {
    // The two frames that carry written resources: their envelope around the texts as
    // they are, byte for byte what serde writes (the tests compare).
    match frame {
        Frame::Snapshot(s) => {
            return envelope(
                "snapshot",
                s.seq,
                "resources",
                s.resources.iter().map(|r| r.get().to_owned()),
            );
        }
        Frame::Delta(d) => {
            let changes = d.changes.iter().map(|c| match c {
                Change::Upsert { resource } => {
                    format!(r#"{{"op":"upsert","resource":{}}}"#, resource.get())
                }
                remove => serde_json::to_string(remove).expect("a Change always serializes"),
            });
            return envelope("delta", d.seq, "changes", changes);
        }
        _ => {}
    }
    // Cannot fail: derived impls, string map keys, and a `Value` holds no NaN or infinity.
    serde_json::to_string(frame).expect("a Frame always serializes")
}

/// `{"type":TYPE,"seq":SEQ,"FIELD":[ITEMS]}`.
fn envelope(
    frame_type: &str,
    seq: u64,
    field: &str,
    items: impl Iterator<Item = String>,
) -> String {
    let mut out = format!(r#"{{"type":"{frame_type}","seq":{seq},"{field}":["#);
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&item);
    }
    out.push_str("]}");
    out
}

/// Reads one text message.
///
/// `Ok(None)` is a well-formed object of a `type` this codec does not know: the control
/// plane may add frame types, so the caller logs it at debug and goes on. Anything else
/// that is not a valid frame is an `Err` the caller answers with [`Frame::bad_frame`].
///
/// `decode(encode(f)) == f` for every frame, except that a float inside an opaque
/// resource's [`Json`] (snapshot and delta) may come back one ULP off: serde_json is built without
/// its `float_roundtrip` feature. No field the manager reads is a float.
pub fn decode(text: &str) -> Result<Option<Frame>, DecodeError> {
    if text.len() > MAX_FRAME_BYTES {
        return Err(DecodeError::TooLarge { len: text.len() });
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| DecodeError::Syntax(short(e.to_string())))?;
    let Value::Object(object) = value else {
        return Err(DecodeError::NotObject);
    };
    let frame_type = match object.get("type") {
        Some(Value::String(t)) if KNOWN_TYPES.contains(&t.as_str()) => t.clone(),
        Some(Value::String(_)) => return Ok(None),
        _ => return Err(DecodeError::MissingType),
    };
    let io_open = (frame_type == "io_open")
        .then(|| PartialIoOpen::read(&object))
        .flatten();
    serde_json::from_value(Value::Object(object))
        .map(|f: Frame| Some(f.bound_strings()))
        .map_err(|e| {
            let message = short(e.to_string());
            match io_open {
                Some(open) => DecodeError::InvalidIoOpen {
                    message,
                    open: Box::new(open),
                },
                None => DecodeError::Invalid {
                    frame_type,
                    message,
                },
            }
        })
}

fn short(mut s: String) -> String {
    cap_utf8_marked(&mut s, MAX_ERROR_MESSAGE);
    s
}

fn cap_id(s: &mut String) {
    cap_utf8_marked(s, MAX_ID_BYTES);
}

fn cap_text(s: &mut String) {
    cap_utf8_marked(s, MAX_TEXT_BYTES);
}

impl Frame {
    /// Cuts every peer string that reaches logs or audit events to [`MAX_ID_BYTES`] or
    /// [`MAX_TEXT_BYTES`]. An `io_open`'s `command` is left whole: it is what runs (the
    /// frame limit bounds it), and the audit log bounds its copy.
    fn bound_strings(mut self) -> Frame {
        match &mut self {
            Frame::Welcome(w) => cap_id(&mut w.deployment_id),
            Frame::Heartbeat(h) => cap_id(&mut h.sent_at),
            Frame::Control(c) => {
                for s in [
                    &mut c.id,
                    &mut c.actor,
                    &mut c.target.kind,
                    &mut c.target.namespace,
                    &mut c.target.name,
                ] {
                    cap_id(s);
                }
            }
            Frame::ControlResult(r) => {
                cap_id(&mut r.id);
                if let Some(e) = &mut r.error {
                    cap_text(e);
                }
            }
            Frame::IoOpen(o) => {
                for s in [
                    &mut o.session_id,
                    &mut o.actor,
                    &mut o.target.namespace,
                    &mut o.target.agent,
                    &mut o.target.container,
                ] {
                    cap_id(s);
                }
            }
            Frame::IoClose(c) => {
                if let Some(r) = &mut c.reason {
                    cap_text(r);
                }
            }
            Frame::Error(e) => {
                cap_id(&mut e.code);
                cap_text(&mut e.message);
                if let Some(r) = &mut e.reference {
                    cap_id(r);
                }
            }
            Frame::Hello(_)
            | Frame::Snapshot(_)
            | Frame::Delta(_)
            | Frame::Resync
            | Frame::IoOpened(_)
            | Frame::IoResize(_)
            | Frame::Audit(_) => {}
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditAction, AuditDetail, AuditTarget};
    use serde_json::json;

    /// One frame of every type, with every optional field set where there is one.
    fn samples() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                version: "0.1.0".into(),
                boot_id: "0b6c3f0e-7d4a-4f1e-9a51-1c2d3e4f5a6b".into(),
                cluster_id: "autonomic-system/manager-0".into(),
                host: Host {
                    hostname: "manager-0".into(),
                    namespace: "autonomic-system".into(),
                    pod: "manager-0".into(),
                    node: "n1".into(),
                    kubernetes_version: "v1.33.1".into(),
                    os: "linux".into(),
                    arch: "amd64".into(),
                },
                capabilities: vec!["snapshot".into(), "delta".into(), "io".into()],
            }),
            Frame::Welcome(Welcome {
                deployment_id: "dep-1".into(),
                heartbeat_interval_s: 5,
                snapshot_interval_s: 60,
            }),
            Frame::Snapshot(Snapshot {
                seq: 1,
                resources: vec![Json::from(&json!({"kind":"Agent","namespace":"team-a",
                    "name":"triage","generation":3,"ready":true,"pods":[],"spec":{"paused":false}}))],
            }),
            Frame::Delta(Delta {
                seq: 2,
                changes: vec![
                    Change::Upsert {
                        resource: Json::from(&json!({"kind":"Tool","name":"search"})),
                    },
                    Change::Remove {
                        kind: "Agent".into(),
                        namespace: "team-a".into(),
                        name: "old".into(),
                        uid: "u-1".into(),
                    },
                ],
            }),
            Frame::Heartbeat(Heartbeat {
                sent_at: "2026-12-01T10:00:00Z".into(),
            }),
            Frame::Resync,
            Frame::Control(Control {
                id: "c-1".into(),
                action: ControlAction::Pause,
                target: ControlTarget {
                    kind: "Agent".into(),
                    namespace: "team-a".into(),
                    name: "triage".into(),
                },
                actor: "ada@example.com".into(),
            }),
            Frame::ControlResult(ControlResult {
                id: "c-1".into(),
                ok: false,
                error: Some("agent team-a/triage not found".into()),
            }),
            Frame::IoOpen(IoOpen {
                channel: 7,
                session_id: "s-1".into(),
                actor: "ada@example.com".into(),
                target: IoTarget {
                    namespace: "team-a".into(),
                    agent: "triage".into(),
                    container: "agentlet".into(),
                },
                command: vec!["/bin/bash".into(), "-l".into()],
                tty: false,
                cols: Some(120),
                rows: Some(40),
            }),
            Frame::IoOpened(IoOpened { channel: 7 }),
            Frame::IoResize(IoResize {
                channel: 7,
                cols: 80,
                rows: 24,
            }),
            Frame::IoClose(IoClose {
                channel: 7,
                exit_code: Some(130),
                reason: Some("exited".into()),
            }),
            Frame::Audit(Audit {
                event: AuditEvent {
                    id: "a-1".into(),
                    time: "2026-12-01T10:00:01Z".into(),
                    action: AuditAction::SessionClose,
                    actor: "ada@example.com".into(),
                    session_id: Some("s-1".into()),
                    target: AuditTarget {
                        kind: "Agent".into(),
                        namespace: "team-a".into(),
                        name: "triage".into(),
                        pod: Some("triage".into()),
                        container: Some("runtime".into()),
                    },
                    detail: AuditDetail {
                        command: Some(vec!["/bin/sh".into()]),
                        exit_code: Some(0),
                        bytes_in: Some(12),
                        bytes_out: Some(3400),
                        duration_ms: Some(61_000),
                        reason: Some("exited".into()),
                    },
                },
            }),
            Frame::Error(ErrorFrame {
                code: "unknown_channel".into(),
                message: "no session on channel 9".into(),
                reference: Some("io_resize".into()),
            }),
        ]
    }

    #[test]
    fn samples_cover_every_known_type_once() {
        let names: Vec<_> = samples().iter().map(Frame::type_name).collect();
        assert_eq!(names, KNOWN_TYPES);
    }

    /// `encode` writes the snapshot's and the delta's envelope by hand around the
    /// resources' texts: byte for byte what serde writes, empty lists and removals too.
    #[test]
    fn the_hand_written_envelopes_are_serdes() {
        let mut frames = samples();
        frames.push(Frame::Snapshot(Snapshot {
            seq: 9,
            resources: vec![],
        }));
        frames.push(Frame::Delta(Delta {
            seq: 10,
            changes: vec![],
        }));
        for frame in frames {
            let serde = serde_json::to_string(&frame).unwrap();
            assert_eq!(encode(&frame), serde);
        }
    }

    #[test]
    fn every_frame_round_trips() {
        for frame in samples() {
            let text = encode(&frame);
            let object: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(object["type"], frame.type_name(), "{text}");
            assert_eq!(decode(&text), Ok(Some(frame)), "{text}");
        }
    }

    #[test]
    fn optional_fields_are_omitted_when_unset_and_round_trip() {
        let cases = [
            (
                Frame::ControlResult(ControlResult {
                    id: "c-2".into(),
                    ok: true,
                    error: None,
                }),
                r#"{"type":"control_result","id":"c-2","ok":true}"#,
            ),
            (
                Frame::IoClose(IoClose {
                    channel: 1,
                    exit_code: None,
                    reason: None,
                }),
                r#"{"type":"io_close","channel":1}"#,
            ),
            (
                Frame::Error(ErrorFrame {
                    code: "denied".into(),
                    message: "no".into(),
                    reference: None,
                }),
                r#"{"type":"error","code":"denied","message":"no"}"#,
            ),
        ];
        for (frame, text) in cases {
            assert_eq!(encode(&frame), text);
            assert_eq!(decode(text), Ok(Some(frame)));
        }
    }

    /// Hand-written from the §3 table; field order is declaration order.
    #[test]
    fn exact_json_of_spec_examples() {
        let by_type = |t: &str| samples().into_iter().find(|f| f.type_name() == t).unwrap();
        let cases = [
            (
                by_type("welcome"),
                r#"{"type":"welcome","deployment_id":"dep-1","heartbeat_interval_s":5,"snapshot_interval_s":60}"#,
            ),
            (by_type("resync"), r#"{"type":"resync"}"#),
            (
                by_type("heartbeat"),
                r#"{"type":"heartbeat","sent_at":"2026-12-01T10:00:00Z"}"#,
            ),
            (
                by_type("control"),
                r#"{"type":"control","id":"c-1","action":"pause","target":{"kind":"Agent","namespace":"team-a","name":"triage"},"actor":"ada@example.com"}"#,
            ),
            (
                by_type("delta"),
                r#"{"type":"delta","seq":2,"changes":[{"op":"upsert","resource":{"kind":"Tool","name":"search"}},{"op":"remove","kind":"Agent","namespace":"team-a","name":"old","uid":"u-1"}]}"#,
            ),
            (
                by_type("io_open"),
                r#"{"type":"io_open","channel":7,"session_id":"s-1","actor":"ada@example.com","target":{"namespace":"team-a","agent":"triage","container":"agentlet"},"command":["/bin/bash","-l"],"tty":false,"cols":120,"rows":40}"#,
            ),
            (
                by_type("error"),
                r#"{"type":"error","code":"unknown_channel","message":"no session on channel 9","ref":"io_resize"}"#,
            ),
            (
                by_type("audit"),
                r#"{"type":"audit","event":{"id":"a-1","time":"2026-12-01T10:00:01Z","action":"session.close","actor":"ada@example.com","session_id":"s-1","target":{"kind":"Agent","namespace":"team-a","name":"triage","pod":"triage","container":"runtime"},"detail":{"command":["/bin/sh"],"exit_code":0,"bytes_in":12,"bytes_out":3400,"duration_ms":61000,"reason":"exited"}}}"#,
            ),
            (
                by_type("hello"),
                r#"{"type":"hello","protocol":1,"version":"0.1.0","boot_id":"0b6c3f0e-7d4a-4f1e-9a51-1c2d3e4f5a6b","cluster_id":"autonomic-system/manager-0","host":{"hostname":"manager-0","namespace":"autonomic-system","pod":"manager-0","node":"n1","kubernetes_version":"v1.33.1","os":"linux","arch":"amd64"},"capabilities":["snapshot","delta","io"]}"#,
            ),
        ];
        for (frame, text) in cases {
            assert_eq!(encode(&frame), text);
        }
    }

    #[test]
    fn every_control_action_is_one_the_admin_can_name() {
        let all = [
            ControlAction::Restart,
            ControlAction::Pause,
            ControlAction::Resume,
            ControlAction::Delete,
        ];
        let names: Vec<&str> = all.iter().map(|a| a.wire_name()).collect();
        assert_eq!(names, crate::config::CONTROL_ACTIONS);
        for a in all {
            assert_eq!(serde_json::to_value(a).unwrap(), a.wire_name());
        }
    }

    #[test]
    fn every_control_and_audit_action_has_its_wire_name() {
        for (action, name) in [
            (ControlAction::Restart, "restart"),
            (ControlAction::Pause, "pause"),
            (ControlAction::Resume, "resume"),
            (ControlAction::Delete, "delete"),
        ] {
            assert_eq!(serde_json::to_value(action).unwrap(), name);
        }
        for (action, name) in [
            (AuditAction::SessionOpen, "session.open"),
            (AuditAction::SessionClose, "session.close"),
            (AuditAction::SessionDenied, "session.denied"),
            (AuditAction::ControlDone, "control.done"),
            (AuditAction::ControlDenied, "control.denied"),
        ] {
            assert_eq!(serde_json::to_value(action).unwrap(), name);
        }
    }

    #[test]
    fn defaults_are_applied_on_decode() {
        let welcome = decode(r#"{"type":"welcome","deployment_id":"d"}"#);
        assert_eq!(
            welcome,
            Ok(Some(Frame::Welcome(Welcome {
                deployment_id: "d".into(),
                heartbeat_interval_s: 15,
                snapshot_interval_s: 300,
            })))
        );

        let open = decode(
            r#"{"type":"io_open","channel":3,"session_id":"s","actor":"a",
                "target":{"namespace":"ns","agent":"ag"},"cols":80,"rows":24}"#,
        );
        assert_eq!(
            open,
            Ok(Some(Frame::IoOpen(IoOpen {
                channel: 3,
                session_id: "s".into(),
                actor: "a".into(),
                target: IoTarget {
                    namespace: "ns".into(),
                    agent: "ag".into(),
                    container: "runtime".into(),
                },
                command: vec!["/bin/sh".into()],
                tty: true,
                cols: Some(80),
                rows: Some(24),
            })))
        );

        let audit = decode(
            r#"{"type":"audit","event":{"id":"a","time":"t","action":"control.done",
                "actor":"x","target":{"kind":"Tool","namespace":"ns","name":"n"}}}"#,
        );
        let Ok(Some(Frame::Audit(Audit { event }))) = audit else {
            panic!("{audit:?}");
        };
        assert_eq!(event.session_id, None);
        assert_eq!(event.target.pod, None);
        assert_eq!(event.detail, AuditDetail::default());
        assert_eq!(
            encode(&Frame::Audit(Audit { event })),
            r#"{"type":"audit","event":{"id":"a","time":"t","action":"control.done","actor":"x","target":{"kind":"Tool","namespace":"ns","name":"n"},"detail":{}}}"#
        );
    }

    #[test]
    fn io_open_terminal_size_is_optional() {
        // (fields after `target`, PTY size): no size needed without a PTY.
        let cases: &[(&str, Option<(u16, u16)>)] = &[
            (r#""tty":false"#, None),
            (r#""tty":false,"cols":120,"rows":40"#, None),
            (r#""command":["ls","-l"],"tty":false"#, None),
            ("", Some((80, 24))),
            (r#""tty":true"#, Some((80, 24))),
            (r#""tty":true,"cols":120,"rows":40"#, Some((120, 40))),
            (r#""cols":120"#, Some((120, 24))),
            (r#""rows":40"#, Some((80, 40))),
        ];
        for &(fields, size) in cases {
            let sep = if fields.is_empty() { "" } else { "," };
            let text = format!(
                r#"{{"type":"io_open","channel":3,"session_id":"s","actor":"a","target":{{"namespace":"ns","agent":"ag"}}{sep}{fields}}}"#
            );
            let Ok(Some(Frame::IoOpen(open))) = decode(&text) else {
                panic!("{text}: {:?}", decode(&text));
            };
            assert_eq!(open.size(), size, "{text}");
            // Absent sizes stay absent on the way out.
            let again = encode(&Frame::IoOpen(open.clone()));
            assert_eq!(again.contains("cols"), fields.contains("cols"), "{again}");
            assert_eq!(decode(&again), Ok(Some(Frame::IoOpen(open))));
        }
    }

    #[test]
    fn a_malformed_io_open_keeps_its_channel_when_readable() {
        let open = |fields: &str| {
            format!(r#"{{"type":"io_open","session_id":"s","actor":"ada",{fields}}}"#)
        };
        let target = r#""target":{"namespace":"ns","agent":"ag"}"#;
        // (input, channel to answer on with io_close, words of the message)
        let cases = [
            (open(r#""channel":7"#), Some(7), "missing field `target`"),
            (
                open(&format!(r#""channel":7,{target},"tty":"yes""#)),
                Some(7),
                "expected a boolean",
            ),
            (
                open(&format!(r#""channel":0,{target},"cols":-1"#)),
                Some(0),
                "invalid value",
            ),
            (
                open(&format!(r#""channel":4294967295,{target},"command":"sh""#)),
                Some(u32::MAX),
                "expected a sequence",
            ),
            (
                open(r#""channel":9,"target":{"namespace":"ns"}"#),
                Some(9),
                "missing field `agent`",
            ),
            // No channel to answer on: only the `error` frame.
            (open(target), None, "missing field `channel`"),
            (
                open(&format!(r#""channel":"7",{target}"#)),
                None,
                "invalid type",
            ),
            (
                open(&format!(r#""channel":4294967296,{target}"#)),
                None,
                "expected u32",
            ),
            (
                open(&format!(r#""channel":-1,{target}"#)),
                None,
                "expected u32",
            ),
            (
                open(&format!(r#""channel":1.5,{target}"#)),
                None,
                "invalid type",
            ),
        ];
        for (input, channel, words) in cases {
            let err = decode(&input).expect_err(&input);
            assert!(err.to_string().contains(words), "{input}: {err}");
            assert_eq!(err.frame_type(), Some("io_open"), "{input}");
            assert!(
                err.to_string().starts_with("bad `io_open` frame: "),
                "{err}"
            );
            let got = err.malformed_io_open().map(|o| o.channel);
            assert_eq!(got, channel, "{input}");
        }
        // What can be read is kept for the audit; the rest is empty or the default.
        let err = decode(&open(
            r#""channel":7,"target":{"namespace":"ns","agent":5}"#,
        ))
        .unwrap_err();
        assert_eq!(
            err.malformed_io_open(),
            Some(&PartialIoOpen {
                channel: 7,
                session_id: "s".into(),
                actor: "ada".into(),
                namespace: "ns".into(),
                agent: String::new(),
                container: "runtime".into(),
            })
        );
        // Other frames never carry one.
        assert_eq!(
            decode(r#"{"type":"io_close","channel":"x"}"#)
                .unwrap_err()
                .malformed_io_open(),
            None
        );
    }

    #[test]
    fn welcome_intervals_are_clamped_to_safe_durations() {
        use std::time::Duration;
        let welcome = |h, s| Welcome {
            deployment_id: "d".into(),
            heartbeat_interval_s: h,
            snapshot_interval_s: s,
        };
        let w = welcome(15, 300);
        assert_eq!(w.heartbeat_interval(), Duration::from_secs(15));
        assert_eq!(w.snapshot_interval(), Duration::from_secs(300));
        let w = welcome(0, u64::MAX);
        assert_eq!(w.heartbeat_interval(), Duration::from_secs(1));
        assert_eq!(w.snapshot_interval(), Duration::from_secs(86_400));
    }

    #[test]
    fn unknown_types_are_ignored_and_unknown_fields_tolerated() {
        assert_eq!(decode(r#"{"type":"telemetry","x":[1,2]}"#), Ok(None));
        assert_eq!(decode(r#"{"type":""}"#), Ok(None));
        assert_eq!(
            decode(r#"{"type":"Welcome","deployment_id":"d"}"#),
            Ok(None)
        );
        assert_eq!(
            decode(r#"{"type":"resync","reason":"gap","v":2}"#),
            Ok(Some(Frame::Resync))
        );
        assert_eq!(
            decode(r#"{"type":"io_opened","channel":4,"added_later":{"a":1}}"#),
            Ok(Some(Frame::IoOpened(IoOpened { channel: 4 })))
        );
    }

    #[test]
    fn malformed_input_is_an_error_with_a_useful_message() {
        // (input, expected `ref`, words the message must contain)
        let cases: &[(&str, Option<&str>, &str)] = &[
            ("", None, "not JSON: EOF"),
            (r#"{"type":"welcome","deployment_id":"#, None, "not JSON"),
            ("{\"type\":\"resync\"} trailing", None, "not JSON: trailing"),
            ("not json", None, "not JSON"),
            ("[1,2]", None, "not a JSON object"),
            ("5", None, "not a JSON object"),
            (r#""welcome""#, None, "not a JSON object"),
            ("null", None, "not a JSON object"),
            ("{}", None, "no string `type`"),
            (r#"{"type":5}"#, None, "no string `type`"),
            (r#"{"type":null}"#, None, "no string `type`"),
            (r#"{"kind":"welcome"}"#, None, "no string `type`"),
            (
                r#"{"type":"welcome"}"#,
                Some("welcome"),
                "missing field `deployment_id`",
            ),
            (
                r#"{"type":"welcome","deployment_id":7}"#,
                Some("welcome"),
                "invalid type: integer `7`, expected a string",
            ),
            (
                r#"{"type":"welcome","deployment_id":"d","heartbeat_interval_s":-1}"#,
                Some("welcome"),
                "invalid value: integer `-1`",
            ),
            (
                r#"{"type":"control","id":"c","action":"explode","target":{"kind":"Agent","namespace":"n","name":"a"},"actor":"x"}"#,
                Some("control"),
                "unknown variant `explode`",
            ),
            (
                r#"{"type":"control","id":"c","action":"pause","target":{"kind":"Agent"},"actor":"x"}"#,
                Some("control"),
                "missing field `namespace`",
            ),
            (
                r#"{"type":"io_open","channel":4294967296,"session_id":"s","actor":"a","target":{"namespace":"n","agent":"a"},"cols":80,"rows":24}"#,
                Some("io_open"),
                "expected u32",
            ),
            (
                r#"{"type":"io_resize","channel":1,"cols":"80","rows":24}"#,
                Some("io_resize"),
                "invalid type: string \"80\"",
            ),
            (
                r#"{"type":"io_close","channel":1,"exit_code":1.5}"#,
                Some("io_close"),
                "invalid type: floating point",
            ),
            (
                r#"{"type":"delta","seq":1,"changes":[{"op":"rename"}]}"#,
                Some("delta"),
                "unknown variant `rename`",
            ),
            (
                r#"{"type":"delta","seq":1,"changes":[{"resource":{}}]}"#,
                Some("delta"),
                "missing field `op`",
            ),
            (
                r#"{"type":"snapshot","seq":1,"resources":{}}"#,
                Some("snapshot"),
                "expected a sequence",
            ),
            (
                r#"{"type":"audit","event":{"id":"a","time":"t","action":"session.exploded","actor":"x","target":{"kind":"Agent","namespace":"n","name":"a"}}}"#,
                Some("audit"),
                "unknown variant `session.exploded`",
            ),
            (
                r#"{"type":"control_result","id":"c","ok":"yes"}"#,
                Some("control_result"),
                "expected a boolean",
            ),
            (
                r#"{"type":"error","code":"bad_frame","message":null}"#,
                Some("error"),
                "invalid type: null",
            ),
        ];
        for &(input, reference, words) in cases {
            let err = decode(input).expect_err(input);
            let message = err.to_string();
            assert!(message.contains(words), "{input}: {message}");
            assert_eq!(err.frame_type(), reference, "{input}");
            let Frame::Error(answer) = Frame::bad_frame(&err) else {
                unreachable!()
            };
            assert_eq!(answer.code, "bad_frame");
            assert_eq!(answer.message, message);
            assert_eq!(answer.reference.as_deref(), reference);
        }
    }

    #[test]
    fn oversized_input_is_refused_before_parsing() {
        let padding = " ".repeat(MAX_FRAME_BYTES);
        let huge = format!(r#"{{"type":"resync"}}{padding}"#);
        assert_eq!(
            decode(&huge),
            Err(DecodeError::TooLarge { len: huge.len() })
        );
        assert!(decode(&huge).unwrap_err().to_string().contains("limit"));

        // Just under the cap is fine.
        let fits = format!(r#"{{"type":"resync"}}{}"#, " ".repeat(MAX_FRAME_BYTES - 17));
        assert_eq!(fits.len(), MAX_FRAME_BYTES);
        assert_eq!(decode(&fits), Ok(Some(Frame::Resync)));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = format!(
            r#"{{"type":"snapshot","seq":1,"resources":[{}{}]}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let err = decode(&deep).unwrap_err();
        assert!(err.to_string().contains("recursion limit"), "{err}");
    }

    #[test]
    fn error_messages_do_not_echo_long_peer_input() {
        let long = "x".repeat(100_000);
        let input = format!(r#"{{"type":"io_resize","channel":1,"cols":"{long}","rows":1}}"#);
        let err = decode(&input).unwrap_err();
        assert!(err.to_string().len() < 2 * MAX_ERROR_MESSAGE, "{err}");
        let input = format!(r#"{{"type":"{long}é"#);
        assert!(decode(&input).unwrap_err().to_string().len() < 2 * MAX_ERROR_MESSAGE);
        // Cutting never splits a character.
        let wide = "é".repeat(MAX_ERROR_MESSAGE);
        assert!(short(wide).ends_with("é…"));
    }

    /// A peer string just under the frame limit, of `unit` repeated, shifted by `lead`
    /// ASCII bytes so the cut falls inside a multi-byte character.
    fn huge(unit: &str, lead: usize) -> String {
        let n = (MAX_FRAME_BYTES - 4096) / unit.len() / 3;
        format!("{}{}", "a".repeat(lead), unit.repeat(n))
    }

    use crate::text::assert_cut;

    #[test]
    fn peer_strings_are_bounded_at_decode() {
        for (unit, lead) in [("x", 0), ("é", 1), ("€", 1), ("€", 2), ("🦀", 3)] {
            let big = huge(unit, lead);
            let text = encode(&Frame::Control(Control {
                id: big.clone(),
                action: ControlAction::Restart,
                target: ControlTarget {
                    kind: "Agent".into(),
                    namespace: "n".into(),
                    name: big.clone(),
                },
                actor: big.clone(),
            }));
            let Some(Frame::Control(c)) = decode(&text).unwrap() else {
                panic!("a control frame");
            };
            for s in [&c.id, &c.actor, &c.target.name] {
                assert_cut(s, &big, MAX_ID_BYTES);
            }
            assert_eq!(c.target.namespace, "n");

            let text = encode(&Frame::IoOpen(IoOpen {
                channel: 1,
                session_id: big.clone(),
                actor: big.clone(),
                target: IoTarget {
                    namespace: big.clone(),
                    agent: "a".into(),
                    container: "runtime".into(),
                },
                command: vec!["sh".into()],
                tty: false,
                cols: None,
                rows: None,
            }));
            let Some(Frame::IoOpen(o)) = decode(&text).unwrap() else {
                panic!("an io_open frame");
            };
            for s in [&o.session_id, &o.actor, &o.target.namespace] {
                assert_cut(s, &big, MAX_ID_BYTES);
            }

            let text = encode(&Frame::IoClose(IoClose {
                channel: 1,
                exit_code: None,
                reason: Some(big.clone()),
            }));
            let Some(Frame::IoClose(c)) = decode(&text).unwrap() else {
                panic!("an io_close frame");
            };
            assert_cut(c.reason.as_deref().unwrap(), &big, MAX_TEXT_BYTES);

            let text = encode(&Frame::Error(ErrorFrame {
                code: big.clone(),
                message: big.clone(),
                reference: Some(big.clone()),
            }));
            let Some(Frame::Error(e)) = decode(&text).unwrap() else {
                panic!("an error frame");
            };
            assert_cut(&e.code, &big, MAX_ID_BYTES);
            assert_cut(&e.message, &big, MAX_TEXT_BYTES);
            assert_cut(e.reference.as_deref().unwrap(), &big, MAX_ID_BYTES);
        }
    }

    #[test]
    fn binary_layout_is_channel_stream_payload() {
        let bytes = encode_io(0x0102_0304, Stream::Stdout, b"hi\n");
        assert_eq!(bytes, [1, 2, 3, 4, 1, b'h', b'i', b'\n']);
        assert_eq!(
            decode_io(&bytes),
            Ok(IoChunk {
                channel: 0x0102_0304,
                stream: Stream::Stdout,
                data: b"hi\n",
            })
        );

        for (stream, byte) in [(Stream::Stdin, 0), (Stream::Stdout, 1), (Stream::Stderr, 2)] {
            for channel in [0, 1, 255, 256, u32::MAX] {
                for data in [&b""[..], b"\0\xff", &[7; 4096]] {
                    let bytes = encode_io(channel, stream, data);
                    assert_eq!(bytes.len(), IO_HEADER_LEN + data.len());
                    assert_eq!(bytes[..4], channel.to_be_bytes());
                    assert_eq!(bytes[4], byte);
                    let chunk = decode_io(&bytes).unwrap();
                    assert_eq!(
                        (chunk.channel, chunk.stream, chunk.data),
                        (channel, stream, data)
                    );
                }
            }
        }
    }

    #[test]
    fn malformed_binary_frames_are_errors() {
        for len in 0..IO_HEADER_LEN {
            let err = decode_io(&[0; IO_HEADER_LEN][..len]).unwrap_err();
            assert_eq!(err, DecodeError::IoTooShort { len });
            assert!(err.to_string().contains("shorter than its 5-byte header"));
        }
        let mut big = encode_io(1, Stream::Stdin, &vec![b'x'; MAX_IO_PAYLOAD]);
        assert_eq!(decode_io(&big).unwrap().data.len(), MAX_IO_PAYLOAD);
        big.push(b'x');
        assert_eq!(
            decode_io(&big),
            Err(DecodeError::TooLarge {
                len: MAX_MESSAGE_BYTES + 1
            })
        );
        for byte in [3, 4, 0x80, 0xff] {
            let err = decode_io(&[0, 0, 0, 1, byte, b'x']).unwrap_err();
            assert_eq!(err, DecodeError::IoStream(byte));
            assert!(err.to_string().contains(&format!("unknown stream {byte}")));
            assert_eq!(Frame::bad_frame(&err).type_name(), "error");
        }
    }
}
