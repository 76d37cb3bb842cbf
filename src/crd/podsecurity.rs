//! The Pod Security Standards level of a namespace (TRUST.md §1): what the label
//! `autonomic.sh/pod-security` and `AUTONOMIC_POD_SECURITY` say. Here, below the
//! configuration and the store, so both read it; the rules are in
//! `reconcile::podsecurity`.

use std::collections::BTreeMap;

/// The namespace label that sets the level of the pods the manager creates there.
pub const POD_SECURITY_LABEL: &str = "autonomic.sh/pod-security";

/// A Pod Security Standards level, least to most restrictive: a level enforces its own
/// rules and those of the levels below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum PodSecurityLevel {
    /// No rule.
    Privileged,
    /// No known privilege escalation: no host namespaces, paths or ports, no privileged
    /// containers, no capabilities beyond the default set, no unconfined profiles.
    Baseline,
    /// Baseline, and hardened: non-root, no privilege escalation, every capability
    /// dropped (`NET_BIND_SERVICE` may be added back), a seccomp profile, a short list
    /// of volume types. The default.
    #[default]
    Restricted,
}

impl PodSecurityLevel {
    pub const ALL: [PodSecurityLevel; 3] = [
        PodSecurityLevel::Privileged,
        PodSecurityLevel::Baseline,
        PodSecurityLevel::Restricted,
    ];

    /// The name, as the label, the variable and the Pod Security Standards spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }

    /// `privileged`, `baseline` or `restricted`, exactly (as Pod Security Admission reads
    /// its own labels).
    pub fn parse(s: &str) -> Option<PodSecurityLevel> {
        PodSecurityLevel::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// The level of a namespace with these labels: its `autonomic.sh/pod-security` if
    /// that names a level, else `default` (`AUTONOMIC_POD_SECURITY`). A value that names
    /// no level counts as no label: the admin's default holds, never a guess.
    pub fn of_namespace(
        labels: Option<&BTreeMap<String, String>>,
        default: PodSecurityLevel,
    ) -> PodSecurityLevel {
        labels
            .and_then(|l| l.get(POD_SECURITY_LABEL))
            .and_then(|v| PodSecurityLevel::parse(v))
            .unwrap_or(default)
    }
}

impl std::fmt::Display for PodSecurityLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::PodSecurityLevel::*;
    use super::*;

    #[test]
    fn levels_parse_exactly_and_order_by_strictness() {
        for l in PodSecurityLevel::ALL {
            assert_eq!(PodSecurityLevel::parse(l.as_str()), Some(l));
            assert_eq!(l.to_string(), l.as_str());
        }
        for bad in ["", "Restricted", " baseline", "root", "privileged "] {
            assert_eq!(PodSecurityLevel::parse(bad), None, "{bad:?}");
        }
        assert!(Privileged < Baseline && Baseline < Restricted);
        assert_eq!(PodSecurityLevel::default(), Restricted);
    }

    #[test]
    fn a_namespace_label_wins_over_the_default_when_it_names_a_level() {
        let labels = |v: &str| BTreeMap::from([(POD_SECURITY_LABEL.to_owned(), v.to_owned())]);
        assert_eq!(PodSecurityLevel::of_namespace(None, Baseline), Baseline);
        let other = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        assert_eq!(
            PodSecurityLevel::of_namespace(Some(&other), Restricted),
            Restricted
        );
        assert_eq!(
            PodSecurityLevel::of_namespace(Some(&labels("privileged")), Restricted),
            Privileged
        );
        assert_eq!(
            PodSecurityLevel::of_namespace(Some(&labels("restricted")), Privileged),
            Restricted
        );
        // A value that names no level: the configured default, not the laxest.
        assert_eq!(
            PodSecurityLevel::of_namespace(Some(&labels("off")), Restricted),
            Restricted
        );
    }
}
