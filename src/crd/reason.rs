//! The closed set of reasons of the `Ready` condition (and of the manager's Events):
//! the cause of the state, not the phase's name again. CamelCase, as the Kubernetes API
//! conventions ask; `docs/operations.md`, "Condition and Event reasons", lists them.

/// Defines [`Reason`] from its variants, each name written once: the enum, `ALL` and
/// `as_str` (the name itself, as the API shows it).
macro_rules! reasons {
    ($($(#[$m:meta])* $v:ident,)+) => {
        /// Why an object is in its phase. A reason is part of the API: renaming one breaks
        /// users' alerts and `kubectl wait --for=condition` scripts, so add, never rename.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
        pub enum Reason {
            $($(#[$m])* $v,)+
        }

        impl Reason {
            /// Every reason, for the documentation test.
            pub const ALL: &[Reason] = &[$(Reason::$v,)+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$v => stringify!($v),)+
                }
            }
        }
    };
}

reasons! {
    // Ready (condition True).
    /// Agent: its pod runs and every container is ready.
    Running,
    /// Tool: its pod runs and accepts connections.
    Serving,
    /// Runtime: a usable template.
    Valid,
    /// Memory: its Secret is written.
    Bound,

    // On the way, or at rest (condition False, Normal Events).
    /// The manager is creating the pod.
    Creating,
    /// The pod exists and waits for a node.
    Scheduling,
    /// The scheduler found no node for the pod.
    Unschedulable,
    /// A container is being created (image pull, volumes, init containers).
    ContainerCreating,
    /// A container runs but is not ready yet.
    ContainersNotReady,
    /// The pod was built from another spec: the manager deleted it to recreate it.
    Recreating,
    /// The pod was built from another spec and waits for its turn to be recreated
    /// (at most `AUTONOMIC_ROLL_MAX` Agents roll at once); the pod keeps running.
    WaitingToRoll,
    /// The previous pod is still terminating.
    PodTerminating,
    /// The pod ended although `restartPolicy` is `Always` (e.g. evicted): replaced.
    Replacing,
    /// `spec.paused`.
    Paused,
    /// Tool `spec.disabled`.
    Disabled,
    /// Tool: no Agent uses it and no pod runs.
    Idle,
    /// Every container exited 0 (`restartPolicy` not `Always`).
    Completed,
    /// Memory: the Secret its `secretRef` names does not exist (yet). No longer set:
    /// a missing Secret and one not offered now both give `SecretNotAllowed` (TRUST.md
    /// §2); kept, as reasons are never removed.
    SecretNotFound,
    /// The object is being deleted (condition Unknown).
    Deleting,

    // Errors (condition False, Warning Events).
    /// A name that cannot be a label value or a Service name.
    InvalidName,
    /// A spec the schema lets through but the manager cannot use.
    InvalidSpec,
    /// Runtime without an image.
    NoImage,
    RuntimeNotFound,
    RuntimeInvalid,
    ToolNotFound,
    MemoryNotFound,
    /// Agent: neither it nor its Runtime names a runtime image.
    NoRuntimeImage,
    /// Agent: no agentlet image, and no default on the manager.
    NoAgentletImage,
    /// Memory: the referenced Secret lacks the key, or its value is not text.
    SecretInvalid,
    /// A same-named object exists that the manager does not own: never taken over.
    PodNotOwned,
    SecretNotOwned,
    ServiceNotOwned,
    /// The API server refused the object the manager built (a quantity, a quota, an
    /// admission policy).
    PodRejected,
    SecretRejected,
    ServiceRejected,
    /// The pod's name is the one another custom resource's pod has (an Agent `x-tool`
    /// and a Tool `x`): whoever has it keeps it.
    PodNameTaken,
    /// The pod would break the Pod Security Standards level of its namespace
    /// (TRUST.md §1): not created; the message names the container and the field.
    PodSecurityViolation,
    /// Agent: the ServiceAccount it names is not offered to agents (label
    /// `autonomic.sh/agents: allowed`), or is the manager's own (TRUST.md §2).
    ServiceAccountNotAllowed,
    /// A Secret referenced (an env `secretKeyRef`, a Memory's `secretRef`) is missing or
    /// not offered to agents: the same answer for both (TRUST.md §2).
    SecretNotAllowed,
    /// The object's spec is larger as JSON than `AUTONOMIC_MAX_SPEC_BYTES`, or an Agent
    /// references a Runtime, Tool or Memory whose spec is (TRUST.md §3): not reconciled,
    /// a pod already running left as it is.
    SpecTooLarge,
    // A container's waiting reason, as the kubelet says it.
    ImagePullBackOff,
    ErrImagePull,
    InvalidImageName,
    CrashLoopBackOff,
    CreateContainerConfigError,
    CreateContainerError,
    /// The pod failed (a container exited non-zero, `restartPolicy` not `Always`).
    PodFailed,
    /// The kubelet evicted the pod.
    Evicted,
}

impl Reason {
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == s)
    }

    /// Whether the reason says something is wrong or stuck: every error's cause, and
    /// `Unschedulable` (the phase is still `Pending`, but it will not move on its own).
    /// Such a cause is news when it appears (a Warning Event), whatever the phase.
    pub fn is_trouble(self) -> bool {
        use Reason::*;
        !matches!(
            self,
            Running
                | Serving
                | Valid
                | Bound
                | Creating
                | Scheduling
                | ContainerCreating
                | ContainersNotReady
                | Recreating
                | WaitingToRoll
                | PodTerminating
                | Replacing
                | Paused
                | Disabled
                | Idle
                | Completed
                | SecretNotFound
                | Deleting
        )
    }

    /// The same cause for an Event's purpose: the kubelet flips a pull failure between
    /// `ErrImagePull` and `ImagePullBackOff` at every retry, which is not news.
    pub fn same_cause(self, other: Reason) -> bool {
        use Reason::*;
        let family = |r| match r {
            ErrImagePull | ImagePullBackOff => ImagePullBackOff,
            r => r,
        };
        family(self) == family(other)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
