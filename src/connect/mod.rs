//! Managed mode: the one outbound connection to the control plane (PROTOCOL.md).

pub mod backoff;
pub mod frame;
