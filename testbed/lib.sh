# shellcheck shell=bash
# Shared helpers for the test-bed scripts (sourced, never executed).
#
# Everything here must work on a fresh Debian 12 machine (packages are installed
# on demand) and be cheap on a machine where everything is already present.

# Pinned Kubernetes version: the Debian source package kubernetes/bookworm is
# 1.20.5+really1.20.2 (a 1.20.2 tree); newer suites ship a kubectl-only source.
K8S_VERSION="v1.20.2"
# Used by build-k8s.sh (version ldflags).
# shellcheck disable=SC2034
K8S_MAJOR="1"
# shellcheck disable=SC2034
K8S_MINOR="20"

TESTBED_CACHE="${AUTONOMIC_TESTBED_CACHE:-${HOME:-/root}/.cache/autonomic-testbed}"
K8S_CACHE_DIR="${TESTBED_CACHE}/k8s-${K8S_VERSION}"
K8S_BIN_DIR="${K8S_CACHE_DIR}/bin"
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

# Command substitutions keep errexit too (a failed step inside $(...) fails the caller).
shopt -s inherit_errexit

log() { printf '[testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Prints the entry script's header comment block (line 2 up to the first non-comment
# line) and exits 2. BASH_SOURCE[-1] is the script that was run, not this file.
usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[-1]}" >&2
    exit 2
}

# Whether every package given is installed (dpkg's view, no network).
packages_installed() {
    local p status
    for p in "$@"; do
        status="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
        [[ "$status" == "installed" ]] || return 1
    done
}

_TESTBED_APT_UPDATED=0
apt_update_once() {
    if [[ "$_TESTBED_APT_UPDATED" == 0 ]]; then
        log "apt-get update"
        apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
        _TESTBED_APT_UPDATED=1
    fi
}

# Install missing Debian packages. A temporary policy-rc.d exiting 101 keeps
# packages such as containerd and etcd-server from starting system services
# (they would grab the default sockets/ports and are not what we run). One install at
# a time on the machine (a lock of our own, then apt's own lock waited for): two beds
# that start together on a fresh machine would otherwise both run apt-get, and the
# second fail at once on dpkg's lock (seen: etcd-server).
ensure_packages() {
    packages_installed "$@" && return 0
    [[ "$(id -u)" == 0 ]] || die "need root to install: $*"
    (
        exec 7>/var/lock/autonomic-testbed-apt.lock
        flock 7
        local missing=() p
        for p in "$@"; do
            packages_installed "$p" || missing+=("$p")
        done
        [[ ${#missing[@]} -eq 0 ]] && exit 0
        apt_update_once
        log "apt-get install ${missing[*]}"
        local prc=/usr/sbin/policy-rc.d backup=""
        if [[ -e "$prc" ]]; then
            backup="$(mktemp)"
            cp -a "$prc" "$backup"
        fi
        printf '#!/bin/sh\n# temporary, written by autonomic testbed\nexit 101\n' >"$prc"
        chmod 0755 "$prc"
        local rc=0
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends "${missing[@]}" >&2 || rc=$?
        if [[ -n "$backup" ]]; then
            mv -f "$backup" "$prc"
        else
            rm -f "$prc"
        fi
        [[ $rc -eq 0 ]] || die "apt-get install failed (rc=$rc)"
    )
}

# apt-get source needs a deb-src entry; the image only has binary entries.
ensure_deb_src() {
    local f=/etc/apt/sources.list.d/autonomic-testbed-src.sources
    if [[ ! -e "$f" ]]; then
        log "adding deb-src entries for bookworm ($f)"
        cat >"$f" <<'EOF'
# Added by autonomic testbed (testbed/lib.sh) so that `apt-get source` works.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        _TESTBED_APT_UPDATED=0
    fi
    apt_update_once
}

# Patch level of the source patches a binary carries (see build-k8s.sh). Bump a
# binary's level whenever build-k8s.sh changes a patch that affects it: its cached
# build (stamp file ${K8S_BIN_DIR}/.<binary>.patch-level, missing = 0) is then
# stale and only that binary is rebuilt.
#   kubelet 1: status manager syncPeriod 10 s -> 1 s (kubemark's hollow kubelet too)
#   kubemark 2: FakeOS's Create, Remove and RemoveAll under one lock
#   kubemark 3: the fake runtime's socket one per process (/tmp/kubelet_remote_<pid>.sock)
declare -gA K8S_PATCH_LEVEL=([kubelet]=1 [kubemark]=3)

# Whether binary $1 is built and carries the current patch level.
k8s_binary_current() {
    local b="$1" have
    [[ -x "${K8S_BIN_DIR}/${b}" ]] || return 1
    have="$(cat "${K8S_BIN_DIR}/.${b}.patch-level" 2>/dev/null || true)"
    [[ "${have:-0}" == "${K8S_PATCH_LEVEL[$b]:-0}" ]]
}

# Whether the five binaries, and any named as arguments (kubemark), are current.
k8s_binaries_present() {
    local b
    for b in "${K8S_BINARIES[@]}" "$@"; do
        k8s_binary_current "$b" || return 1
    done
}

# fill_once PATH CMD...: makes the cache entry PATH (a file or a folder) once, safe
# under concurrent first use. CMD is run with one more argument, a fresh temporary path
# beside PATH, and must create that path; on success it is renamed to PATH in one step.
# CMD runs under errexit, so call fill_once as a plain command, not in a condition (bash
# ignores errexit there), or a failing step would go unnoticed. Under PATH's lock, so a second caller waits for the first one's result and reuses it;
# nobody ever sees, or removes, a half-written entry; what a killed writer left behind
# (PATH.tmp.*) is removed by the next writer, which holds the lock.
fill_once() {
    local path="$1"
    shift
    [[ -e "$path" ]] && return 0
    mkdir -p "$(dirname "$path")"
    (
        exec 8>"${path}.lock"
        flock 8
        [[ -e "$path" ]] && exit 0
        rm -rf "${path}".tmp.*
        local tmp="${path}.tmp.$BASHPID"
        "$@" "$tmp"
        [[ -e "$tmp" ]] || die "$1 made nothing"
        mv -T "$tmp" "$path"
    )
}

# Seconds since the epoch with millisecond precision, for timings.
now_s() { date +%s.%N | cut -c1-14; }
elapsed() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }'; }
