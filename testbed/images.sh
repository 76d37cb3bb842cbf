#!/usr/bin/env bash
# Build the test bed's container images by hand and import them into containerd.
# No registry, no Docker engine: each image is a single-layer OCI archive written
# by oci.py from a rootfs assembled here.
#
#   autonomic.test/pause:1     static C pause (pause.c), the CRI sandbox image
#   autonomic.test/busybox:1   busybox-static + applet symlinks + /etc/passwd
#   autonomic.test/agentlet:1  busybox + an entrypoint that idles until SIGTERM
#
# The archives are cached in $AUTONOMIC_TESTBED_CACHE/images/ under a hash of
# everything that goes into them, so they are rebuilt only when an input changes.
#
# Usage:
#   images.sh build                         build (or reuse) the archives, print their paths
#   images.sh import [SOCKET]               build + import all three into containerd
#   images.sh import-archive SOCKET TAR...  import any OCI/docker archive (e.g. from buildah push)
# SOCKET defaults to the test bed's containerd socket
# ($AUTONOMIC_TESTBED_DIR/containerd/containerd.sock).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "${HERE}/lib.sh"

STATE="${AUTONOMIC_TESTBED_DIR:-/tmp/autonomic-testbed}"
DEFAULT_SOCK="${STATE}/containerd/containerd.sock"
IMAGE_CACHE="${TESTBED_CACHE}/images"
IMAGES=(pause busybox agentlet)

image_name() { printf 'autonomic.test/%s:1' "$1"; }

# The agentlet's entrypoint: stays up (so the pod is Running and Ready) and
# exits 0 at once on SIGTERM/SIGINT. `sleep & wait` rather than a foreground
# sleep, because a shell runs traps only after its foreground child returns,
# whereas `wait` is interrupted by the signal immediately.
AGENTLET_SH='#!/bin/sh
# autonomic.test/agentlet:1 entrypoint (testbed/images.sh)
trap '"'"'echo "agentlet: signal, exiting"; exit 0'"'"' TERM INT
echo "agentlet: up (pid $$)"
while :; do
    sleep 1 &
    wait $!
done
'

ensure_image_tools() {
    ensure_packages busybox-static gcc libc6-dev
    command -v python3 >/dev/null 2>&1 || ensure_packages python3
}

# Hash of all inputs of one image: recipe (this script), oci.py, pause.c, the
# busybox binary and the compiler. Changing any of them gives a new archive.
inputs_hash() {
    local img="$1"
    {
        printf 'image=%s\n' "$img"
        sha256sum "${HERE}/images.sh" "${HERE}/oci.py"
        case "$img" in
            pause) sha256sum "${HERE}/pause.c"; gcc --version | head -n1 ;;
            *) sha256sum /bin/busybox ;;
        esac
    } | sha256sum | cut -c1-16
}

archive_path() { printf '%s/%s-%s.oci.tar' "$IMAGE_CACHE" "$1" "$(inputs_hash "$1")"; }

# rootfs with busybox, one symlink per applet, and minimal /etc files.
busybox_rootfs() {
    local root="$1" applet
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,root,tmp,proc,sys,dev,var/run}
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    # --list-full prints paths such as bin/sh, usr/bin/env.
    while read -r applet; do
        [[ -z "$applet" || "$applet" == "bin/busybox" ]] && continue
        mkdir -p "$root/$(dirname "$applet")"
        ln -sf /bin/busybox "$root/$applet"
    done < <(/bin/busybox --list-full)
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
}

# Prints the archive of one image, built once (fill_once: beds that start together
# share it, and nobody sees a half-written archive).
build_one() {
    local out
    out="$(archive_path "$1")"
    fill_once "$out" write_archive "$1"
    printf '%s\n' "$out"
}

# write_archive IMG OUT: the OCI archive of IMG written to OUT, from a rootfs built
# beside it (OUT.rootfs, removed after).
write_archive() {
    local img="$1" out="$2" work="$2.rootfs" arch
    arch="$(dpkg --print-architecture)"
    local args=(--name "$(image_name "$img")" --out "$out" --rootfs "$work" --arch "$arch")
    case "$img" in
        pause)
            mkdir -p "$work"
            gcc -static -O2 -Wall -o "$work/pause" "${HERE}/pause.c"
            strip "$work/pause"
            args+=(--entrypoint '["/pause"]')
            ;;
        busybox)
            busybox_rootfs "$work"
            args+=(--cmd '["sh"]')
            ;;
        agentlet)
            busybox_rootfs "$work"
            printf '%s' "$AGENTLET_SH" >"$work/agentlet.sh"
            chmod 0755 "$work/agentlet.sh"
            args+=(--entrypoint '["/agentlet.sh"]')
            ;;
        *) die "unknown image $img" ;;
    esac
    # Old archives of this image are stale once the inputs changed.
    find "$IMAGE_CACHE" -maxdepth 1 -name "$img-*.oci.tar" ! -name "$(basename "$out")*" -delete
    python3 "${HERE}/oci.py" "${args[@]}"
    rm -rf "$work"
}

build_all() {
    ensure_image_tools
    local img
    for img in "${IMAGES[@]}"; do
        build_one "$img"
    done
}

ctr_import() {
    local sock="$1" tar="$2"
    [[ -S "$sock" ]] || die "no containerd socket at $sock"
    [[ -s "$tar" ]] || die "no such archive: $tar"
    # Images for pods live in containerd's k8s.io namespace (the CRI plugin's).
    ctr -a "$sock" -n k8s.io images import "$tar" >&2
}

import_all() {
    local sock="${1:-$DEFAULT_SOCK}" tar
    ensure_image_tools
    local img
    for img in "${IMAGES[@]}"; do
        tar="$(build_one "$img")"
        ctr_import "$sock" "$tar"
    done
    log "imported: $(for img in "${IMAGES[@]}"; do printf '%s ' "$(image_name "$img")"; done)"
}

main() {
    local cmd="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$cmd" in
        build) build_all ;;
        import) import_all "$@" ;;
        import-archive)
            [[ $# -ge 2 ]] || usage
            local sock="$1" tar
            shift
            for tar in "$@"; do ctr_import "$sock" "$tar"; done
            ;;
        *) usage ;;
    esac
}

# Allow `source images.sh` to reuse the functions without running main.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
