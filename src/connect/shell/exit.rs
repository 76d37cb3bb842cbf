//! How a session ended: the exit status Kubernetes reports for an exec.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The process's exit status, when known.
    pub code: Option<i32>,
    pub reason: String,
}

pub(super) fn failed(reason: String) -> Exit {
    Exit { code: None, reason }
}
/// The exit code in an exec's final status: `Success` is 0, a failure carries it as
/// the cause `ExitCode`.
pub fn exit_code(s: &Status) -> Option<i32> {
    if s.status.as_deref() == Some("Success") {
        return Some(0);
    }
    s.details
        .as_ref()?
        .causes
        .as_ref()?
        .iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))?
        .message
        .as_deref()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[test]
    fn exit_codes_from_the_exec_status() {
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(&ok), Some(0));
        let three = Status {
            status: Some("Failure".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(&three), Some(3));
        let other = Status {
            status: Some("Failure".into()),
            message: Some("container not found".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(&other), None);
    }
}
