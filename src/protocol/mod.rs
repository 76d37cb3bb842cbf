//! The control plane's language (PROTOCOL.md), pure: the frame codec (`frame`) and the
//! wire form of the cached objects (`wire`). Nothing here dials, waits or writes to the
//! cluster; the connection that carries it is `connect`.

pub mod frame;
pub mod wire;
