//! autonomic-manager: the in-cluster operator of the autonomic.sh platform.
#![forbid(unsafe_code)]

pub mod config;
pub mod crd;
