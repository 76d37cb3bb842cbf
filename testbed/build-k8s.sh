#!/usr/bin/env bash
# Build the Kubernetes v1.20.2 server binaries from the Debian source package
# kubernetes/bookworm, offline, into
#   ${AUTONOMIC_TESTBED_CACHE:-$HOME/.cache/autonomic-testbed}/k8s-v1.20.2/bin/
# Skips everything when all five binaries are already there at their current patch
# level (K8S_PATCH_LEVEL in lib.sh); otherwise builds only the missing/stale ones.
#   build-k8s.sh [kubemark]   kubemark too: hollow nodes for the benchmark's burst
#                             (cluster.sh hollow); the test suite does not need it
#
# Why each unusual step is needed is recorded in shared/testbed-facts.md:
#  - GOPATH mode (module mode with -mod=vendor fails on the Debian tree),
#  - the OpenAPI definitions must be generated (the tarball lacks them),
#  - vendored reflect2 v1.0.1 crashes under Go 1.19 -> replaced by Debian's v1.0.2,
#  - cAdvisor's docker retry (5 x 1 s at every kubelet start) is shortened,
#  - kubelet's status-manager sync tick is cut from 10 s to 1 s (a deleted pod's
#    object went away only on that tick, 5-12 s after its containers exited),
#  - kubemark's fake OS gets a lock (a hollow kubelet crashed on concurrent map writes),
#  - kubemark's fake runtime listens on a socket of its own process's, not one fixed
#    path that every hollow kubelet of the machine took over from the one before.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "${HERE}/lib.sh"

# Debian's source version of kubernetes in bookworm (a 1.20.2 tree despite the name).
DEB_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"

EXTRA=("$@")
for b in "${EXTRA[@]+"${EXTRA[@]}"}"; do
    [[ "$b" == kubemark ]] || die "build-k8s.sh: unknown extra binary '$b' (only kubemark)"
done
if k8s_binaries_present "${EXTRA[@]+"${EXTRA[@]}"}"; then
    log "k8s ${K8S_VERSION} binaries already built in ${K8S_BIN_DIR}"
    exit 0
fi
# Test beds with different state dirs share this cache: one build at a time.
mkdir -p "${K8S_CACHE_DIR}"
exec 9>"${K8S_CACHE_DIR}/.build.lock"
if ! flock -n 9; then
    log "waiting for another build-k8s.sh (${K8S_CACHE_DIR}/.build.lock)"
    flock 9
fi
if k8s_binaries_present "${EXTRA[@]+"${EXTRA[@]}"}"; then
    log "k8s ${K8S_VERSION} binaries already built in ${K8S_BIN_DIR}"
    exit 0
fi

T0="$(now_s)"
ensure_packages golang-go dpkg-dev golang-github-modern-go-reflect2-dev ca-certificates
ensure_deb_src
log "packages ready ($(elapsed "$T0") s)"

GOPATH_DIR="${K8S_CACHE_DIR}/gopath"
SRC="${GOPATH_DIR}/src/k8s.io/kubernetes"
export GOPATH="${GOPATH_DIR}"
# Keep Go's build cache with the other cached artefacts (~1.5 GB); a rebuild after
# deleting bin/ then takes about a minute instead of ~5.
export GOCACHE="${K8S_CACHE_DIR}/go-build-cache"
export GO111MODULE=off CGO_ENABLED=0 GOFLAGS=""
export GOTOOLCHAIN=local

# ---------------------------------------------------------------- source
# The unpacked tree is kept; a marker tells that it was fully prepared (unpacked,
# patched, openapi generated), so an interrupted run starts the tree over.
if [[ ! -e "${SRC}/.testbed-prepared" ]]; then
    T="$(now_s)"
    rm -rf "${SRC}" "${K8S_CACHE_DIR}/debsrc"
    mkdir -p "${K8S_CACHE_DIR}/debsrc" "$(dirname "${SRC}")"
    log "apt-get source kubernetes=${DEB_SRC_VERSION}"
    # Pin the exact version: bookworm's source still has the server code
    # (34 MB with vendor/); later suites do not.
    (cd "${K8S_CACHE_DIR}/debsrc" && apt-get source -qq "kubernetes=${DEB_SRC_VERSION}" >&2)
    unpacked="$(find "${K8S_CACHE_DIR}/debsrc" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)"
    [[ -n "$unpacked" && -d "$unpacked/cmd/kube-apiserver" ]] || die "apt-get source gave no kubernetes tree"
    # GOPATH mode: the tree must live at $GOPATH/src/k8s.io/kubernetes so that its
    # vendor/ directory is used for k8s.io/kubernetes/... imports.
    mv "$unpacked" "${SRC}"
    rm -rf "${K8S_CACHE_DIR}/debsrc"
    log "source unpacked ($(elapsed "$T") s)"

    # reflect2 v1.0.1 (vendored) faults under Go 1.19 on the first CR create.
    rm -rf "${SRC}/vendor/github.com/modern-go/reflect2"
    mkdir -p "${SRC}/vendor/github.com/modern-go/reflect2"
    cp -a /usr/share/gocode/src/github.com/modern-go/reflect2/. "${SRC}/vendor/github.com/modern-go/reflect2/"
    # Debian's copy may carry its own go.mod/tests; harmless in GOPATH mode, but
    # test files would only slow `go list`.
    find "${SRC}/vendor/github.com/modern-go/reflect2" -name '*_test.go' -delete

    # Optional speed-up: kubelet's cAdvisor waits 5 x 1 s for a Docker daemon.
    factory="${SRC}/vendor/github.com/google/cadvisor/container/docker/factory.go"
    # (v1.20.2 vendors: `const rootDirRetryPeriod time.Duration = 1000 * time.Millisecond`)
    if grep -q '^const rootDirRetryPeriod time.Duration = ' "$factory"; then
        sed -i 's/^\(const rootDirRetryPeriod time.Duration = \).*/\110 * time.Millisecond/' "$factory"
    else
        log "note: cadvisor rootDirRetryPeriod not found, docker retry not shortened"
    fi

    # -------------------------------------------------------- openapi
    T="$(now_s)"
    log "generating pkg/generated/openapi"
    mkdir -p "${K8S_CACHE_DIR}/tools"
    (cd "${SRC}" && go build -o "${K8S_CACHE_DIR}/tools/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen)
    # Every package directory whose Go files carry a +k8s:openapi-gen= tag.
    # staging/src/k8s.io/X is what vendor/k8s.io/X points at; in GOPATH mode the
    # import path is k8s.io/kubernetes/vendor/k8s.io/X.
    input_dirs="$(
        cd "${SRC}" &&
            grep -rl --include='*.go' --exclude='*_test.go' '+k8s:openapi-gen=' \
                --exclude-dir=vendor --exclude-dir=_output --exclude-dir=.git --exclude-dir=testdata . |
            xargs -n1 dirname | sed 's,^\./,,' | LC_ALL=C sort -u |
            grep -v -e '^staging/src/k8s.io/code-generator' -e '^staging/src/k8s.io/sample-apiserver' |
            sed -e 's,^staging/src/,k8s.io/kubernetes/vendor/,' -e 't' -e 's,^,k8s.io/kubernetes/,' |
            paste -sd, -
    )"
    [[ -n "$input_dirs" ]] || die "no +k8s:openapi-gen packages found"
    mkdir -p "${K8S_CACHE_DIR}/tools/out"
    (cd "${SRC}" && "${K8S_CACHE_DIR}/tools/openapi-gen" \
        --input-dirs "$input_dirs" \
        --output-base "${GOPATH_DIR}/src" \
        --output-package k8s.io/kubernetes/pkg/generated/openapi \
        -O zz_generated.openapi \
        --go-header-file "${SRC}/vendor/k8s.io/code-generator/hack/boilerplate.go.txt" \
        --report-filename "${K8S_CACHE_DIR}/tools/out/violations.report" >&2)
    [[ -s "${SRC}/pkg/generated/openapi/zz_generated.openapi.go" ]] || die "openapi-gen wrote nothing"
    if [[ -f "${SRC}/api/api-rules/violation_exceptions.list" ]] &&
        ! diff -q "${SRC}/api/api-rules/violation_exceptions.list" "${K8S_CACHE_DIR}/tools/out/violations.report" >/dev/null; then
        log "note: openapi violation report differs from api/api-rules/violation_exceptions.list (not fatal)"
    fi
    log "openapi generated ($(elapsed "$T") s)"
    touch "${SRC}/.testbed-prepared"
fi

# ------------------------------------------------- patches on every build
# Applied outside the one-time preparation so that trees prepared before a patch
# existed get it too; each is idempotent and fails loudly if its pattern is gone.
# Changing one here means bumping K8S_PATCH_LEVEL in lib.sh for the affected binaries.

# kubelet's status manager deletes a terminated pod's API object (once its volumes and
# cgroups are gone) only on its batch sync tick, every 10 s: `kubectl delete pod` took
# 6-9 s even when the container exited at once. 1 s costs one cheap scan of the
# node's pod statuses per second.
sm="${SRC}/pkg/kubelet/status/status_manager.go"
if grep -qx 'const syncPeriod = 10 \* time\.Second' "$sm"; then
    sed -i 's/^const syncPeriod = 10 \* time\.Second$/const syncPeriod = 1 * time.Second/' "$sm"
fi
grep -qx 'const syncPeriod = 1 \* time\.Second' "$sm" ||
    die "kubelet status manager patch failed: no 'const syncPeriod = 10 * time.Second' in $sm"

# kubemark's hollow kubelet runs the kubelet's pod workers over a fake OS whose Create,
# Remove and RemoveAll write a map and slices unguarded: two containers starting at
# once on one hollow node crashed it ("fatal error: concurrent map writes", in
# FakeOS.Create from makeMounts) 10 minutes into a burst of 1 000, and its pods'
# containers went to CrashLoopBackOff. One lock for the three, as upstream later did.
fake_os="${SRC}/pkg/kubelet/container/testing/os.go"
if ! grep -q 'fakeOSLock.Lock()' "$fake_os"; then
    printf 'package testing\n\nimport "sync"\n\n// fakeOSLock guards FakeOS: the hollow kubelet calls it from many goroutines.\nvar fakeOSLock sync.Mutex\n' \
        >"${SRC}/pkg/kubelet/container/testing/os_lock.go"
    for f in 'Remove(path string) error' 'RemoveAll(path string) error' 'Create(path string) (\*os.File, error)'; do
        sed -i "s/^func (f \*FakeOS) ${f} {\$/&\n\tfakeOSLock.Lock()\n\tdefer fakeOSLock.Unlock()/" "$fake_os"
    done
fi
[[ "$(grep -c 'fakeOSLock.Lock()' "$fake_os")" == 3 && -f "${SRC}/pkg/kubelet/container/testing/os_lock.go" ]] ||
    die "FakeOS lock patch failed: Create, Remove and RemoveAll of $fake_os not as expected"

# kubemark's hollow kubelet serves its fake container runtime on a unix socket and dials
# it; the socket's path is fixed (/tmp/kubelet_remote.sock), as upstream runs one hollow
# node per pod. Twelve on one machine each removed the file and listened anew, so a
# kubelet that dialled (or redialled) after the next one started talked to that one's
# runtime: its sandboxes were another node's, its own were "not found in pod's
# containers", and its pods crash-looped (2 to 5 of 12 nodes in the bench's bursts);
# one that dialled between a remove and a listen exited at start ("no such file").
# One socket per process: /tmp/kubelet_remote_<pid>.sock.
endpoint="${SRC}/pkg/kubelet/cri/remote/fake/endpoint.go"
if grep -q 'defaultUnixEndpoint = "unix:///tmp/kubelet_remote.sock"' "$endpoint"; then
    sed -n '1,/^package fake$/p' "$endpoint" >"${endpoint}.new"
    cat >>"${endpoint}.new" <<'GO'

import (
	"fmt"
	"os"
)

// GenerateEndpoint returns the unix socket the fake runtime serves on: one per process
// (patched by autonomic's testbed/build-k8s.sh; upstream's is one fixed path).
func GenerateEndpoint() (string, error) {
	return fmt.Sprintf("unix:///tmp/kubelet_remote_%d.sock", os.Getpid()), nil
}
GO
    mv -f "${endpoint}.new" "$endpoint"
fi
grep -q 'kubelet_remote_%d.sock' "$endpoint" ||
    die "fake runtime endpoint patch failed: $endpoint not as expected"

# ---------------------------------------------------------------- build
ldflags="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
    ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
    ldflags+=" -X ${pkg}.gitMajor=${K8S_MAJOR}"
    ldflags+=" -X ${pkg}.gitMinor=${K8S_MINOR}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
    ldflags+=" -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

mkdir -p "${K8S_BIN_DIR}"
# Largest first: kube-apiserver warms most of the cache for the others.
for b in kube-apiserver kube-controller-manager kubelet kube-scheduler kube-proxy "${EXTRA[@]+"${EXTRA[@]}"}"; do
    k8s_binary_current "$b" && continue
    T="$(now_s)"
    if [[ -x "${K8S_BIN_DIR}/${b}" ]]; then
        log "go build ${b} (cached build is not at patch level ${K8S_PATCH_LEVEL[$b]:-0})"
    else
        log "go build ${b}"
    fi
    (cd "${SRC}" && go build -tags 'selinux notest' -ldflags "$ldflags" \
        -o "${K8S_BIN_DIR}/${b}.tmp" "./cmd/${b}")
    # Replacing by rename: a kubelet already running from the old file keeps it.
    mv -f "${K8S_BIN_DIR}/${b}.tmp" "${K8S_BIN_DIR}/${b}"
    echo "${K8S_PATCH_LEVEL[$b]:-0}" >"${K8S_BIN_DIR}/.${b}.patch-level"
    log "built ${b} in $(elapsed "$T") s ($(du -m "${K8S_BIN_DIR}/${b}" | cut -f1) MiB)"
done

"${K8S_BIN_DIR}/kube-apiserver" --version >&2
log "all binaries in ${K8S_BIN_DIR} (total $(elapsed "$T0") s)"
