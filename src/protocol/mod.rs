//! The control plane's language (PROTOCOL.md), pure: the frame codec (`frame`), the
//! wire form of the cached objects (`wire`) and the frames of a report's answer
//! (`elements`). Nothing here dials, waits or writes to the cluster; the connection
//! that carries it is `connect`.

pub mod elements;
pub mod frame;
pub mod wire;
