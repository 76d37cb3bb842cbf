#!/usr/bin/env bash
# A real single-node Kubernetes v1.20.2 test bed, offline, from Debian packages.
#
#   cluster.sh up [--apiserver-only]   start (after a `down`); last stdout line is
#                                      `export KUBECONFIG=$STATE/kubeconfig`
#   cluster.sh down                    stop everything, clean up, remove $STATE
#   cluster.sh status                  exit 0 if the apiserver of $STATE answers
#   cluster.sh import TAR...           import image archives (docker-archive or OCI)
#                                      into the test bed's containerd (full mode)
#   cluster.sh stop-apiserver [NAME]   stop the bed's kube-apiserver (or the extra one
#                                      NAME) and wait until it is gone; etcd stays up
#   cluster.sh start-apiserver [NAME PORT]  start it again (with the flags `up` used),
#                                      or an extra one NAME on PORT (same etcd, an HA
#                                      pair); returns when it answers /readyz
#   cluster.sh restart-apiserver       stop-apiserver, then start-apiserver
#   cluster.sh compact                 compact etcd at its current revision; prints it
#   cluster.sh hollow N                full mode: add N hollow nodes (kubemark's kubelet
#                                      on a fake container runtime, 110 pods each);
#                                      returns when all are Ready
#   cluster.sh unhollow                stop the hollow nodes and delete their Nodes
# The four above are for a test's own apiserver-only bed (faults: restarts, 410 Gone):
# never point them at a shared bed other tests use.
#
# Modes: full (default) = etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd, kubelet, kube-proxy and a CNI bridge; the node is
# Ready and untainted and the `default` ServiceAccount exists when `up` returns.
# --apiserver-only = etcd + kube-apiserver, like controller-runtime's envtest.
# With KUBEBUILDER_ASSETS set, etcd/kube-apiserver/kubectl come from that dir and
# the mode is always apiserver-only.
#
# Environment (defaults in brackets):
#   AUTONOMIC_TESTBED_DIR            state dir [/tmp/autonomic-testbed]
#   AUTONOMIC_TESTBED_CACHE          build/image/PKI cache [~/.cache/autonomic-testbed]
#   AUTONOMIC_TESTBED_APISERVER_PORT [16443]   AUTONOMIC_TESTBED_ETCD_PORT [12379]
#   AUTONOMIC_TESTBED_ETCD_PEER_PORT [12380]   AUTONOMIC_TESTBED_KUBELET_PORT [20250]
#   AUTONOMIC_TESTBED_NODE_NAME      [testbed-node]
#   AUTONOMIC_TESTBED_NODE_IP        [source address of the default route]
#   AUTONOMIC_TESTBED_POD_CIDR       [10.241.0.0/24]  AUTONOMIC_TESTBED_SERVICE_CIDR [10.242.0.0/24]
#   AUTONOMIC_TESTBED_TIMEOUT        seconds to wait for readiness [120]
#   AUTONOMIC_TESTBED_ETCD_QUOTA_BYTES  etcd's backend quota [etcd's own, 2 GiB]
#   AUTONOMIC_TESTBED_KEEP_ON_FAILURE=1  leave components running after a failed up
#   AUTONOMIC_TESTBED_APISERVER_ARGS extra kube-apiserver flags, space-separated
#   KUBEBUILDER_ASSETS               dir with etcd, kube-apiserver (and kubectl)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "${HERE}/lib.sh"

STATE="${AUTONOMIC_TESTBED_DIR:-/tmp/autonomic-testbed}"
APISERVER_PORT="${AUTONOMIC_TESTBED_APISERVER_PORT:-16443}"
ETCD_PORT="${AUTONOMIC_TESTBED_ETCD_PORT:-12379}"
ETCD_PEER_PORT="${AUTONOMIC_TESTBED_ETCD_PEER_PORT:-12380}"
KUBELET_PORT="${AUTONOMIC_TESTBED_KUBELET_PORT:-20250}"
# Health/metrics ports of the other components, kept off their well-known
# defaults (10248-10259) so a system Kubernetes on the machine does not clash.
KUBELET_HEALTHZ_PORT="${AUTONOMIC_TESTBED_KUBELET_HEALTHZ_PORT:-20248}"
PROXY_METRICS_PORT="${AUTONOMIC_TESTBED_PROXY_METRICS_PORT:-20249}"
PROXY_HEALTHZ_PORT="${AUTONOMIC_TESTBED_PROXY_HEALTHZ_PORT:-20256}"
CM_PORT="${AUTONOMIC_TESTBED_CONTROLLER_MANAGER_PORT:-20257}"
SCHED_PORT="${AUTONOMIC_TESTBED_SCHEDULER_PORT:-20259}"
NODE_NAME="${AUTONOMIC_TESTBED_NODE_NAME:-testbed-node}"
POD_CIDR="${AUTONOMIC_TESTBED_POD_CIDR:-10.241.0.0/24}"
SERVICE_CIDR="${AUTONOMIC_TESTBED_SERVICE_CIDR:-10.242.0.0/24}"
BRIDGE="${AUTONOMIC_TESTBED_BRIDGE:-autonomic-tb0}"
DUMMY_IF="autonomic-tbd0"
TIMEOUT="${AUTONOMIC_TESTBED_TIMEOUT:-120}"
ETCD_QUOTA_BYTES="${AUTONOMIC_TESTBED_ETCD_QUOTA_BYTES:-}"

PKI="${STATE}/pki"
LOGS="${STATE}/logs"
PIDS="${STATE}/pids"
CTRD="${STATE}/containerd"
CTRD_SOCK="${CTRD}/containerd.sock"
SANDBOX_IMAGE="autonomic.test/pause:1"

API_URL="https://127.0.0.1:${APISERVER_PORT}"

# ======================================================================= helpers

# Whether PID runs (a zombie does not count: killed daemons are reparented and
# may stay zombies until their new parent reaps them).
pid_alive() {
    local st
    [[ -n "${1:-}" ]] || return 1
    st="$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true)"
    [[ -n "$st" && "$st" != Z ]]
}

# PID recorded for a component, if that process still runs the expected binary
# (guards against signalling an unrelated process that reused the PID).
recorded_pid() {
    local name="$1" f="${PIDS}/$1.pid" pid exe
    [[ -s "$f" ]] || return 1
    pid="$(cat "$f")"
    pid_alive "$pid" || return 1
    exe="$(readlink "/proc/${pid}/exe" 2>/dev/null || true)"
    exe="${exe% (deleted)}" # the binary may have been rebuilt since
    [[ -s "${PIDS}/$1.exe" && "$exe" == "$(cat "${PIDS}/$1.exe")" ]] || {
        log "pid ${pid} of ${name} now runs '${exe}', not touching it"
        return 1
    }
    printf '%s\n' "$pid"
}

# Start a component detached (own session, so it survives the calling shell and
# its process group), log to $LOGS/<name>.log, record PID and executable.
start_proc() {
    local name="$1" bin="$2"
    shift 2
    log "starting ${name}"
    # 9>&-: the daemons must not inherit (and hold forever) the state lock.
    setsid "$bin" "$@" >"${LOGS}/${name}.log" 2>&1 </dev/null 9>&- &
    local pid=$!
    printf '%s\n' "$pid" >"${PIDS}/${name}.pid"
    readlink -f "$bin" >"${PIDS}/${name}.exe"
}

tail_log() {
    local name="$1" f="${LOGS}/$1.log"
    if [[ -s "$f" ]]; then
        printf '\n----- last lines of %s -----\n' "$f" >&2
        tail -n 40 "$f" >&2
        printf -- '----- end of %s -----\n\n' "$f" >&2
    fi
}

# Component whose log is shown if `up` fails now.
CURRENT=""

# wait_for NAME TIMEOUT CMD...: poll CMD every 0.2 s; fail fast if NAME's process died.
wait_for() {
    local name="$1" timeout="$2"
    shift 2
    CURRENT="$name"
    local deadline=$((SECONDS + timeout)) pid
    while ! "$@" >/dev/null 2>&1; do
        if [[ -s "${PIDS}/${name}.pid" ]]; then
            pid="$(cat "${PIDS}/${name}.pid")"
            pid_alive "$pid" || die "${name} exited (see ${LOGS}/${name}.log)"
        fi
        ((SECONDS < deadline)) || die "timed out after ${timeout} s waiting for ${name}: $*"
        sleep 0.2
    done
}

api_get() {
    curl -fsS --max-time 5 --cacert "${PKI}/ca.crt" --cert "${PKI}/admin.crt" --key "${PKI}/admin.key" \
        "${API_URL}$1"
}

api_ready() { [[ "$(api_get /readyz)" == "ok" ]]; }

# The node is Ready and carries no taints: the node-lifecycle controller removes
# node.kubernetes.io/not-ready a moment after Ready, and pods created before
# that would stay Pending for a while.
node_ready() {
    api_get "/api/v1/nodes/${NODE_NAME}" | python3 -c '
import json, sys
n = json.load(sys.stdin)
conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
sys.exit(0 if conds.get("Ready") == "True" and not n.get("spec", {}).get("taints") else 1)'
}

default_sa_exists() { api_get /api/v1/namespaces/default/serviceaccounts/default; }

first_ip() { python3 -c 'import ipaddress, sys; print(next(ipaddress.ip_network(sys.argv[1]).hosts()))' "$1"; }

has_cap_sys_resource() {
    local capeff
    capeff="$(awk '/^CapEff:/ { print $2 }' /proc/self/status)"
    (((0x${capeff} >> 24) & 1))
}

# Node IP: the source address the kernel would use for the default route.
# `ip route get` only consults the routing table, nothing is sent.
# Without a default route we put an address of our own on a dummy interface:
# pods must reach the apiserver (via the `kubernetes` Service -> node IP) from
# their network namespace, which 127.0.0.1 cannot offer (loopback is per
# namespace and the kernel drops routed packets to 127/8). Only if even that
# fails does the node use 127.0.0.1 (then in-pod API access does not work).
detect_node_ip() {
    if [[ -n "${AUTONOMIC_TESTBED_NODE_IP:-}" ]]; then
        printf '%s\n' "$AUTONOMIC_TESTBED_NODE_IP"
        return
    fi
    local ip
    ip="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n1)"
    if [[ -n "$ip" ]]; then
        printf '%s\n' "$ip"
        return
    fi
    local dummy_ip="10.243.255.254"
    if ip link show "$DUMMY_IF" >/dev/null 2>&1 ||
        { ip link add "$DUMMY_IF" type dummy && ip link set "$DUMMY_IF" up &&
            ip addr add "${dummy_ip}/32" dev "$DUMMY_IF"; } >/dev/null 2>&1; then
        log "no default route: using ${dummy_ip} on dummy interface ${DUMMY_IF} as node IP"
        printf '%s\n' "$dummy_ip"
    else
        log "no default route and no dummy interface: node IP 127.0.0.1 (pods cannot reach the apiserver)"
        printf '127.0.0.1\n'
    fi
}

# ======================================================================= PKI

# sign NAME SUBJECT EXT: key + certificate signed by the CA in $1's dir.
pki_sign() {
    local dir="$1" name="$2" subj="$3" ext="$4"
    openssl genrsa -out "${dir}/${name}.key" 2048 2>/dev/null
    openssl req -new -key "${dir}/${name}.key" -subj "$subj" -out "${dir}/${name}.csr" 2>/dev/null
    printf '%s\n' "$ext" >"${dir}/${name}.ext"
    openssl x509 -req -in "${dir}/${name}.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
        -set_serial "0x$(openssl rand -hex 12)" -days 3650 -sha256 \
        -extfile "${dir}/${name}.ext" -out "${dir}/${name}.crt" 2>/dev/null
    rm -f "${dir}/${name}.csr" "${dir}/${name}.ext"
}

client_ext() { printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n'; }
server_ext() { printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$1"; }

# Generate (or reuse from the cache) the PKI. RSA key generation is the slow
# part (~1-2 s for a dozen keys), so it is cached per node name/IP/service IP,
# filled once under a lock (fill_once): beds that start together share one.
make_pki() {
    local node_ip="$1" svc_ip="$2" key dir
    key="$(printf 'pki-v2 %s %s %s' "$NODE_NAME" "$node_ip" "$svc_ip" | sha256sum | cut -c1-16)"
    dir="${TESTBED_CACHE}/pki/${key}"
    fill_once "$dir" generate_pki "$node_ip" "$svc_ip"
    mkdir -p "$PKI"
    cp -a "${dir}/." "$PKI/"
}

# generate_pki NODE_IP SVC_IP DIR: a new CA, service-account key pair and the
# components' certificates in DIR (which must not exist).
generate_pki() {
    local node_ip="$1" svc_ip="$2" dir="$3"
    log "generating PKI in ${dir}"
    mkdir -p "$dir"
    chmod 700 "$dir"
    openssl genrsa -out "${dir}/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "${dir}/ca.key" -subj "/CN=autonomic-testbed-ca" -days 3650 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
        -out "${dir}/ca.crt" 2>/dev/null
    # Service-account token signing pair.
    openssl genrsa -out "${dir}/sa.key" 2048 2>/dev/null
    openssl rsa -in "${dir}/sa.key" -pubout -out "${dir}/sa.pub" 2>/dev/null
    local san="DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    san+=",DNS:kubernetes.default.svc.cluster.local,DNS:${NODE_NAME},IP:127.0.0.1,IP:${svc_ip},IP:${node_ip}"
    pki_sign "$dir" apiserver "/CN=kube-apiserver" "$(server_ext "$san")"
    pki_sign "$dir" kubelet-serving "/CN=${NODE_NAME}" \
        "$(server_ext "DNS:${NODE_NAME},DNS:localhost,IP:127.0.0.1,IP:${node_ip}")"
    pki_sign "$dir" admin "/O=system:masters/CN=autonomic-testbed-admin" "$(client_ext)"
    pki_sign "$dir" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$(client_ext)"
    pki_sign "$dir" controller-manager "/CN=system:kube-controller-manager" "$(client_ext)"
    pki_sign "$dir" scheduler "/CN=system:kube-scheduler" "$(client_ext)"
    pki_sign "$dir" kubelet "/O=system:nodes/CN=system:node:${NODE_NAME}" "$(client_ext)"
    pki_sign "$dir" kube-proxy "/CN=system:kube-proxy" "$(client_ext)"
    pki_sign "$dir" front-proxy-client "/CN=front-proxy-client" "$(client_ext)"
}

# write_kubeconfig FILE CERTNAME: kubeconfig with embedded CA/cert/key, so the
# file stays usable when copied elsewhere.
write_kubeconfig() {
    local file="$1" cert="$2"
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: autonomic-testbed
  cluster:
    server: ${API_URL}
    certificate-authority-data: $(base64 -w0 "${PKI}/ca.crt")
users:
- name: ${cert}
  user:
    client-certificate-data: $(base64 -w0 "${PKI}/${cert}.crt")
    client-key-data: $(base64 -w0 "${PKI}/${cert}.key")
contexts:
- name: autonomic-testbed
  context:
    cluster: autonomic-testbed
    user: ${cert}
current-context: autonomic-testbed
EOF
    chmod 600 "$file"
}

# ======================================================================= binaries

# Sets ETCD_BIN, APISERVER_BIN, KUBECTL_BIN and, in full mode, the others.
resolve_binaries() {
    local full="$1"
    mkdir -p "${STATE}/bin"
    if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
        ETCD_BIN="${KUBEBUILDER_ASSETS}/etcd"
        APISERVER_BIN="${KUBEBUILDER_ASSETS}/kube-apiserver"
        [[ -x "$ETCD_BIN" && -x "$APISERVER_BIN" ]] || die "KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS} lacks etcd/kube-apiserver"
        if [[ -x "${KUBEBUILDER_ASSETS}/kubectl" ]]; then KUBECTL_BIN="${KUBEBUILDER_ASSETS}/kubectl"; fi
    else
        ETCD_BIN="$(command -v etcd || true)"
        [[ -n "$ETCD_BIN" ]] || die "etcd not found after installing etcd-server"
        "${HERE}/build-k8s.sh"
        APISERVER_BIN="${K8S_BIN_DIR}/kube-apiserver"
        if [[ "$full" == 1 ]]; then
            CM_BIN="${K8S_BIN_DIR}/kube-controller-manager"
            SCHED_BIN="${K8S_BIN_DIR}/kube-scheduler"
            KUBELET_BIN="${K8S_BIN_DIR}/kubelet"
            PROXY_BIN="${K8S_BIN_DIR}/kube-proxy"
        fi
    fi
    if [[ -z "${KUBECTL_BIN:-}" ]]; then
        # kubectl v1.32 is on the image; Debian's kubernetes-client (1.20.2) otherwise.
        command -v kubectl >/dev/null 2>&1 || ensure_packages kubernetes-client
        KUBECTL_BIN="$(command -v kubectl)"
    fi
    # $STATE/bin shows which binaries this test bed runs.
    local b
    for b in ETCD_BIN APISERVER_BIN KUBECTL_BIN CM_BIN SCHED_BIN KUBELET_BIN PROXY_BIN; do
        [[ -n "${!b:-}" ]] && ln -sf "${!b}" "${STATE}/bin/$(basename "${!b}")"
    done
    return 0
}

# Minor version of a kube-apiserver binary (flags differ across versions).
apiserver_minor() {
    "$1" --version 2>/dev/null | sed -n 's/^Kubernetes v[0-9]*\.\([0-9]*\).*/\1/p'
}

# ======================================================================= start

start_etcd() {
    mkdir -p "${STATE}/etcd"
    chmod 700 "${STATE}/etcd"
    start_proc etcd "$ETCD_BIN" \
        --name testbed \
        --data-dir "${STATE}/etcd" \
        --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" \
        --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
        --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
        --initial-cluster "testbed=http://127.0.0.1:${ETCD_PEER_PORT}" \
        --initial-cluster-state new \
        ${ETCD_QUOTA_BYTES:+--quota-backend-bytes "$ETCD_QUOTA_BYTES"} \
        --log-level warn
}

start_apiserver() {
    local full="$1" node_ip="$2" name="${3:-kube-apiserver}" minor
    minor="$(apiserver_minor "$APISERVER_BIN")"
    local args=(
        --etcd-servers "http://127.0.0.1:${ETCD_PORT}"
        --secure-port "${APISERVER_PORT}"
        --tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key"
        --client-ca-file "${PKI}/ca.crt"
        --service-account-key-file "${PKI}/sa.pub"
        --service-account-signing-key-file "${PKI}/sa.key"
        --service-account-issuer "https://kubernetes.default.svc.cluster.local"
        --service-cluster-ip-range "${SERVICE_CIDR}"
        --authorization-mode "Node,RBAC"
        --enable-admission-plugins NodeRestriction
        --allow-privileged=true
        --kubelet-client-certificate "${PKI}/apiserver-kubelet-client.crt"
        --kubelet-client-key "${PKI}/apiserver-kubelet-client.key"
        --kubelet-certificate-authority "${PKI}/ca.crt"
        --kubelet-preferred-address-types InternalIP
        # Front-proxy/requestheader settings: not used by the tests, but without
        # them the apiserver logs errors about a missing requestheader CA.
        --requestheader-client-ca-file "${PKI}/ca.crt"
        --requestheader-allowed-names front-proxy-client
        --requestheader-extra-headers-prefix X-Remote-Extra-
        --requestheader-group-headers X-Remote-Group
        --requestheader-username-headers X-Remote-User
        --proxy-client-cert-file "${PKI}/front-proxy-client.crt"
        --proxy-client-key-file "${PKI}/front-proxy-client.key"
    )
    # --insecure-port was removed in 1.24 (only matters with KUBEBUILDER_ASSETS).
    if [[ -n "$minor" && "$minor" -lt 24 ]]; then args+=(--insecure-port 0); fi
    if [[ "$full" == 1 ]]; then
        # 0.0.0.0 so pods reach it at the node IP through the `kubernetes` Service.
        args+=(--bind-address 0.0.0.0 --advertise-address "$node_ip")
    else
        # Like envtest: no controller-manager creates ServiceAccounts/tokens.
        args+=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1
            --disable-admission-plugins ServiceAccount)
    fi
    # Extra flags, for a private bed (tests/deploy.rs adds PodSecurityPolicy admission).
    if [[ -n "${AUTONOMIC_TESTBED_APISERVER_ARGS:-}" ]]; then
        local extra
        read -ra extra <<<"$AUTONOMIC_TESTBED_APISERVER_ARGS"
        args+=("${extra[@]}")
    fi
    start_proc "$name" "$APISERVER_BIN" "${args[@]}"
}

# overlayfs works on this VM's disk; fall back to `native` where it does not
# (e.g. a state dir on overlayfs/tmpfs without support).
pick_snapshotter() {
    local t="${STATE}/.overlay-probe" ok=native
    mkdir -p "$t"/{l,u,w,m}
    if mount -t overlay overlay -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w" "$t/m" 2>/dev/null; then
        umount "$t/m"
        ok=overlayfs
    fi
    rm -rf "$t"
    printf '%s\n' "$ok"
}

start_containerd() {
    local snapshotter restrict_oom=false
    snapshotter="$(pick_snapshotter)"
    # Without CAP_SYS_RESOURCE (bit 24 of CapEff) root cannot lower
    # oom_score_adj, and runc fails every sandbox with "can't get final child's
    # PID from pipe: EOF" unless the CRI plugin restricts oom_score_adj.
    has_cap_sys_resource || restrict_oom=true
    mkdir -p "${CTRD}"/{root,state,opt} "${STATE}/runc" "${STATE}/cni/net.d" "${STATE}/cni/ipam"
    cat >"${STATE}/cni/net.d/10-autonomic-testbed.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "autonomic-testbed",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "${STATE}/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
    # The pods' gateway exists from the start, not from the first pod's sandbox: a test
    # that hands pods an address of this host (tests/helm.rs) may run before any pod.
    # The bridge plugin adopts a bridge that already carries its gateway address.
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$(first_ip "$POD_CIDR")/${POD_CIDR#*/}" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    mkdir -p "${CTRD}/certs.d/autonomic.test"
    # (containerd 1.6 rejects a hosts.toml without a [host] table.)
    printf 'server = "http://127.0.0.1:1"\n\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n' \
        >"${CTRD}/certs.d/autonomic.test/hosts.toml"
    # Own root/state/socket/runc root so nothing is shared with a system
    # containerd; everything lives under $STATE and goes away with `down`.
    cat >"${CTRD}/config.toml" <<EOF
version = 2
root = "${CTRD}/root"
state = "${CTRD}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "${CTRD_SOCK}"

[ttrpc]
  address = "${CTRD_SOCK}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "${CTRD}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # The kubelet's --pod-infra-container-image is ignored for remote runtimes.
  sandbox_image = "${SANDBOX_IMAGE}"
  restrict_oom_score_adj = ${restrict_oom}
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "${snapshotter}"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${STATE}/runc"

  # Pulls from autonomic.test (the test bed's own image names) go to a closed
  # port on 127.0.0.1 and fail at once, instead of a DNS query for
  # autonomic.test: tests of "image not found" stay on the machine.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "${CTRD}/certs.d"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "${STATE}/cni/net.d"
EOF
    start_proc containerd "$(command -v containerd)" --config "${CTRD}/config.toml" --log-level warn
}

start_controller_manager() {
    write_kubeconfig "${STATE}/controller-manager.kubeconfig" controller-manager
    start_proc kube-controller-manager "$CM_BIN" \
        --kubeconfig "${STATE}/controller-manager.kubeconfig" \
        --authentication-kubeconfig "${STATE}/controller-manager.kubeconfig" \
        --authorization-kubeconfig "${STATE}/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "${CM_PORT}" --port 0 \
        --leader-elect=false \
        --service-account-private-key-file "${PKI}/sa.key" \
        --root-ca-file "${PKI}/ca.crt" \
        --use-service-account-credentials=true \
        --cluster-signing-cert-file "${PKI}/ca.crt" --cluster-signing-key-file "${PKI}/ca.key" \
        --service-cluster-ip-range "${SERVICE_CIDR}" \
        --allocate-node-cidrs=false
}

start_scheduler() {
    write_kubeconfig "${STATE}/scheduler.kubeconfig" scheduler
    start_proc kube-scheduler "$SCHED_BIN" \
        --kubeconfig "${STATE}/scheduler.kubeconfig" \
        --authentication-kubeconfig "${STATE}/scheduler.kubeconfig" \
        --authorization-kubeconfig "${STATE}/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "${SCHED_PORT}" --port 0 \
        --leader-elect=false
}

start_kubelet() {
    local node_ip="$1" kdir="${STATE}/kubelet"
    mkdir -p "${kdir}/pki"
    write_kubeconfig "${STATE}/kubelet.kubeconfig" kubelet
    cat >"${STATE}/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${node_ip}
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: ${PKI}/ca.crt
authorization:
  mode: AlwaysAllow
tlsCertFile: ${PKI}/kubelet-serving.crt
tlsPrivateKeyFile: ${PKI}/kubelet-serving.key
cgroupDriver: cgroupfs
failSwapOn: false
# Report node status every 2 s: the node turns Ready ~8 s sooner.
nodeStatusUpdateFrequency: 2s
clusterDomain: cluster.local
# Small test disks: never evict for disk pressure, never GC images (our images
# cannot be pulled back).
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
    start_proc kubelet "$KUBELET_BIN" \
        --config "${STATE}/kubelet-config.yaml" \
        --kubeconfig "${STATE}/kubelet.kubeconfig" \
        --container-runtime remote \
        --container-runtime-endpoint "unix://${CTRD_SOCK}" \
        --image-service-endpoint "unix://${CTRD_SOCK}" \
        --runtime-request-timeout 2m \
        --hostname-override "${NODE_NAME}" \
        --node-ip "${node_ip}" \
        --root-dir "${kdir}" \
        --cert-dir "${kdir}/pki" \
        --v 1
}

start_kube_proxy() {
    write_kubeconfig "${STATE}/kube-proxy.kubeconfig" kube-proxy
    cat >"${STATE}/kube-proxy-config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ${STATE}/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: ${NODE_NAME}
clusterCIDR: ${POD_CIDR}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:${PROXY_HEALTHZ_PORT}
metricsBindAddress: 127.0.0.1:${PROXY_METRICS_PORT}
# 0 = leave the host's conntrack sysctls alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
    start_proc kube-proxy "$PROXY_BIN" --config "${STATE}/kube-proxy-config.yaml"
}

# Forwarding between the bridge and the host, and iptables seeing bridged
# traffic (needed for Service DNAT between pods on the same bridge).
host_sysctls() {
    echo 1 >/proc/sys/net/ipv4/ip_forward || log "warning: cannot enable ip_forward"
    if [[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
        modprobe br_netfilter 2>/dev/null || true
    fi
    if [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
        echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables || true
    else
        log "warning: br_netfilter unavailable; pod->Service->pod on the same bridge may fail"
    fi
}

# On a failed `up`: show the relevant log, stop what was started (keep $STATE
# for the logs; the next up/down removes it).
on_up_exit() {
    local rc=$?
    [[ $rc -eq 0 ]] && return 0
    log "up failed (rc=${rc})"
    [[ -n "$CURRENT" ]] && tail_log "$CURRENT"
    if [[ "${AUTONOMIC_TESTBED_KEEP_ON_FAILURE:-0}" != 1 ]]; then
        stop_all >/dev/null 2>&1 || true
        log "stopped the started components; logs kept in ${LOGS}"
    fi
    exit "$rc"
}

cmd_up() {
    local full=1
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --apiserver-only) full=0 ;;
            *) die "unknown option for up: $1" ;;
        esac
        shift
    done
    if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
        log "KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS}: using its etcd/kube-apiserver, apiserver-only mode"
        full=0
    fi
    local t0
    t0="$(now_s)"

    # Packages (a no-op when installed: dpkg-query only).
    local pkgs=(openssl curl iproute2 python3 util-linux)
    [[ -z "${KUBEBUILDER_ASSETS:-}" ]] && pkgs+=(etcd-server)
    [[ "$full" == 1 ]] && pkgs+=(containerd runc containernetworking-plugins iptables conntrack
        busybox-static gcc libc6-dev)
    ensure_packages "${pkgs[@]}"

    # Fresh state every time (fresh etcd data in particular).
    UP_MODE="$([[ "$full" == 1 ]] && echo full || echo apiserver-only)" cmd_down
    # Something else on our ports (another bed's API server) would answer our health
    # checks, and this bed would report ready while the caller writes into the other.
    local port tries
    for port in "$APISERVER_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT"; do
        for tries in 1 2 3 4 5 6; do
            (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null || continue 2
            sleep 0.5
        done
        die "port ${port} is in use (another test bed?): set AUTONOMIC_TESTBED_APISERVER_PORT / _ETCD_PORT / _ETCD_PEER_PORT"
    done
    mkdir -p "$STATE" "$LOGS" "$PIDS"
    printf '%s\n' "$([[ "$full" == 1 ]] && echo full || echo apiserver-only)" >"${STATE}/mode"
    trap on_up_exit EXIT

    resolve_binaries "$full"

    local node_ip=127.0.0.1 svc_ip
    [[ "$full" == 1 ]] && node_ip="$(detect_node_ip)"
    printf '%s\n' "$node_ip" >"${STATE}/node-ip"
    svc_ip="$(first_ip "$SERVICE_CIDR")"
    make_pki "$node_ip" "$svc_ip"
    write_kubeconfig "${STATE}/kubeconfig" admin

    start_etcd
    if [[ "$full" == 1 ]]; then
        host_sysctls
        snapshot_pod_logs
        start_containerd
    fi
    wait_for etcd 30 curl -fsS --max-time 2 "http://127.0.0.1:${ETCD_PORT}/health"
    start_apiserver "$full" "$node_ip"

    if [[ "$full" == 1 ]]; then
        # Images are imported while the apiserver boots (3-4 s).
        wait_for containerd 30 ctr -a "$CTRD_SOCK" version
        CURRENT=containerd
        "${HERE}/images.sh" import "$CTRD_SOCK"
    fi
    wait_for kube-apiserver 60 api_ready
    log "apiserver ready after $(elapsed "$t0") s"

    if [[ "$full" == 1 ]]; then
        start_controller_manager
        start_scheduler
        start_kube_proxy
        start_kubelet "$node_ip"
        wait_for kubelet "$TIMEOUT" node_ready
        wait_for kube-controller-manager "$TIMEOUT" default_sa_exists
        # Give the scheduler/proxy a last check: they must still be running.
        local c
        for c in kube-scheduler kube-proxy; do
            pid_alive "$(cat "${PIDS}/${c}.pid")" || { CURRENT="$c"; die "${c} exited"; }
        done
        log "node ${NODE_NAME} (${node_ip}) Ready after $(elapsed "$t0") s"
    fi
    trap - EXIT
    log "test bed up ($(cat "${STATE}/mode")) in $(elapsed "$t0") s; kubectl: ${STATE}/bin/$(basename "$KUBECTL_BIN")"
    printf 'export KUBECONFIG=%s/kubeconfig\n' "$STATE"
}

# ======================================================================= stop

# kill_wait TIMEOUT PIDS...: TERM, wait up to the timeout, then KILL.
kill_wait() {
    local timeout="$1" pid
    shift
    [[ $# -eq 0 ]] && return 0
    kill -TERM "$@" 2>/dev/null || true
    local deadline=$((SECONDS + timeout))
    for pid in "$@"; do
        while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
        if pid_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
}

# PIDs of the processes whose parent is $1 (field 4 of /proc/PID/stat; the
# command name in field 2 may contain spaces, hence the cut at the last ')').
children_of() {
    awk -v parent="$1" '{ sub(/.*\) /, ""); if ($2 == parent) { split(FILENAME, f, "/"); print f[3] } }' \
        /proc/[0-9]*/stat 2>/dev/null || true
}

# containerd-shim-runc-v2 processes serving this test bed's containerd: found by
# their `-address <our socket>` argument. (containerd 1.6.20 writes no
# shim.pid here, and the shims outlive containerd, so /proc is the reliable source.)
our_shims() {
    local p cmd
    for p in /proc/[0-9]*; do
        cmd="$(tr '\0' ' ' 2>/dev/null <"${p}/cmdline" || true)"
        [[ "$cmd" == *containerd-shim* && "$cmd" == *"-address ${CTRD_SOCK} "* ]] && printf '%s\n' "${p#/proc/}"
    done
    return 0
}

# Kill the pods' containers and their shims. Each container's init is a child
# of its shim; SIGKILL on a PID namespace's init ends every process in it.
stop_containers() {
    local shims=() shim init sockets=() addr f
    mapfile -t shims < <(our_shims)
    # Shim sockets (in /run/containerd/s), to remove once the shims are gone.
    for f in "${CTRD}"/state/io.containerd.runtime.v2.task/*/*/address; do
        [[ -f "$f" ]] || continue
        addr="$(cat "$f")"
        [[ "$addr" == unix://* ]] && sockets+=("${addr#unix://}")
    done
    [[ ${#shims[@]} -eq 0 ]] && return 0
    for shim in "${shims[@]}"; do
        for init in $(children_of "$shim"); do kill -KILL "$init" 2>/dev/null || true; done
    done
    kill -KILL "${shims[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + 5))
    for shim in "${shims[@]}"; do
        while pid_alive "$shim" && ((SECONDS < deadline)); do sleep 0.05; done
    done
    local s
    for s in "${sockets[@]+"${sockets[@]}"}"; do rm -f "$s"; done
}

# Stop every recorded component. Order: the kubelet first (it would restart
# containers), then the containers/shims, containerd, control plane, etcd.
stop_all() {
    [[ -d "$PIDS" ]] || return 0
    local name pid pids=()
    for name in kubelet kube-proxy kube-scheduler kube-controller-manager; do
        pid="$(recorded_pid "$name" || true)"
        [[ -n "$pid" ]] && pids+=("$pid")
    done
    for name in $(hollow_pids); do
        pid="$(recorded_pid "$name" || true)"
        [[ -n "$pid" ]] && pids+=("$pid")
    done
    kill_wait 5 "${pids[@]+"${pids[@]}"}"
    hollow_remove_dirs
    stop_containers
    local extra
    for extra in "${PIDS}"/kube-apiserver-*.pid; do
        [[ -f "$extra" ]] || continue
        name="$(basename "$extra" .pid)"
        pid="$(recorded_pid "$name" || true)"
        [[ -n "$pid" ]] && kill_wait 10 "$pid"
    done
    for name in containerd kube-apiserver etcd; do
        pid="$(recorded_pid "$name" || true)"
        [[ -n "$pid" ]] && kill_wait 10 "$pid"
    done
    rm -f "${PIDS}"/*.pid
}

# Mount points under $STATE, deepest first (mountinfo field 5, octal-escaped).
state_mounts() {
    local m
    awk '{ print $5 }' /proc/self/mountinfo | while read -r m; do
        m="$(printf '%b' "$m")"
        [[ "$m" == "${STATE}" || "$m" == "${STATE}/"* ]] && printf '%s\n' "$m"
    done | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-
}

unmount_state() {
    local m
    for _ in 1 2 3; do
        [[ -z "$(state_mounts)" ]] && return 0
        while IFS= read -r m; do
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        done < <(state_mounts)
    done
    [[ -z "$(state_mounts)" ]]
}

# Remove KUBE-* chains (kubelet, kube-proxy) and the portmap plugin's CNI-HOSTPORT-*/CNI-DN-*
# chains: first the rules in other chains that jump to them, then flush, then delete.
clean_iptables() {
    local ipt table rule chain pattern='^(KUBE-|CNI-HOSTPORT-|CNI-DN-)'
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null 2>&1 || continue
        for table in filter nat mangle; do
            "$ipt" -t "$table" -S >/dev/null 2>&1 || continue
            while IFS= read -r rule; do
                # -S output quotes arguments with spaces, hence eval.
                eval "$ipt -w -t $table -D ${rule#-A }" 2>/dev/null || true
            done < <("$ipt" -t "$table" -S | awk -v p="$pattern" '
                $1 == "-A" && $2 !~ p { for (i = 3; i <= NF; i++) if ($i == "-j" && $(i+1) ~ p) { print; next } }')
            local chains=()
            mapfile -t chains < <("$ipt" -t "$table" -S | awk -v p="$pattern" '$1 == "-N" && $2 ~ p { print $2 }')
            for chain in "${chains[@]+"${chains[@]}"}"; do "$ipt" -w -t "$table" -F "$chain" 2>/dev/null || true; done
            for chain in "${chains[@]+"${chains[@]}"}"; do "$ipt" -w -t "$table" -X "$chain" 2>/dev/null || true; done
        done
    done
}

# The kubelet writes container logs to the fixed /var/log/pods and
# /var/log/containers. `up` records which pod log dirs existed before; `down`
# removes the others (this test bed's pods, including already deleted ones
# whose logs the kubelet had not collected yet) and dangling symlinks.
snapshot_pod_logs() {
    find /var/log/pods -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null >"${STATE}/preexisting-pod-logs" || true
}

clean_pod_logs() {
    [[ -f "${STATE}/preexisting-pod-logs" && -d /var/log/pods ]] || return 0
    local d l
    for d in /var/log/pods/*/; do
        [[ -d "$d" ]] || continue
        grep -qxF "$(basename "$d")" "${STATE}/preexisting-pod-logs" || rm -rf "$d"
    done
    for l in /var/log/containers/*.log; do
        [[ -L "$l" && ! -e "$l" ]] && rm -f "$l"
    done
    return 0
}

# Empty pod cgroups left by killed containers (cgroupfs driver: kubepods/...).
clean_cgroups() {
    local root
    for root in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
        [[ -d "$root" ]] || continue
        find "$root" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
}

# PIDs of running kubelet/kube-proxy processes built by build-k8s.sh. A process's exe
# is its binary's real path: the build's folder may be reached through a link (a
# rehearsal's cache links this machine's build), so compare real paths.
testbed_node_pids() {
    local p exe bin
    bin="$(readlink -f "$K8S_BIN_DIR" 2>/dev/null || echo "$K8S_BIN_DIR")"
    for p in /proc/[0-9]*; do
        exe="$(readlink "${p}/exe" 2>/dev/null || true)"
        exe="${exe% (deleted)}"
        if [[ "$exe" == "${bin}/kubelet" || "$exe" == "${bin}/kube-proxy" ]] && pid_alive "${p#/proc/}"; then
            printf '%s\n' "${p#/proc/}"
        fi
    done
    return 0
}

cmd_down() {
    local t0
    t0="$(now_s)"
    # An apiserver-only bed made no bridge, iptables chain or pod cgroup: its `down`
    # touches nothing outside its state dir (another bed on the machine may own them).
    # A state dir without a mode (none yet: `up` cleans before it starts) is taken for
    # the mode `up` is about to start (UP_MODE), never for a node's: an apiserver-only
    # bed's first `up` must not tear down the shared bed's bridge.
    local mode="${UP_MODE:-}"
    [[ -f "${STATE}/mode" ]] && mode="$(cat "${STATE}/mode")"
    # A state dir holding our files is recognised by the pids/ dir or the mode file.
    if [[ -d "$STATE" ]]; then
        stop_all
        clean_pod_logs
        unmount_state || die "mounts left under ${STATE}; not removing it: $(state_mounts | head -n3 | tr '\n' ' ')"
    fi
    # Host-wide leftovers (bridge, iptables chains, pod cgroups) are shared by
    # every test bed on the machine: clean them only when no test-bed node
    # (ours is stopped by now) still runs, e.g. one with another state dir.
    local other
    other="$(testbed_node_pids)"
    if [[ "$mode" != full && -n "$mode" ]]; then
        :
    elif [[ -z "$other" ]]; then
        if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" || true; fi
        if ip link show "$DUMMY_IF" >/dev/null 2>&1; then ip link del "$DUMMY_IF" || true; fi
        clean_iptables
        clean_cgroups
    else
        log "another test-bed node runs (pids ${other//$'\n'/ }): leaving bridge/iptables/cgroups alone"
    fi
    if [[ -d "$STATE" ]]; then
        rm -rf --one-file-system "$STATE"
    fi
    log "down ($(elapsed "$t0") s)"
}

# ================================================== apiserver restarts, compaction

# The mode `up` recorded; refuses a dir that holds no bed.
bed_mode() {
    [[ -s "${STATE}/mode" ]] || die "no test bed in ${STATE}"
    cat "${STATE}/mode"
}

cmd_stop_apiserver() {
    local name="${1:-kube-apiserver}" pid
    bed_mode >/dev/null
    pid="$(recorded_pid "$name" || true)"
    [[ -n "$pid" ]] || die "no running ${name} recorded in ${PIDS}"
    kill_wait 10 "$pid"
    rm -f "${PIDS}/${name}.pid"
    log "${name} (pid ${pid}) stopped"
}

cmd_start_apiserver() {
    local name="${1:-kube-apiserver}" full=0 t0
    if [[ $# -ge 2 ]]; then
        APISERVER_PORT="$2"
        API_URL="https://127.0.0.1:${APISERVER_PORT}"
    fi
    [[ "$name" == kube-apiserver || "$name" == kube-apiserver-* ]] ||
        die "an extra API server's name starts with kube-apiserver-: ${name}"
    [[ "$(bed_mode)" == full ]] && full=1
    t0="$(now_s)"
    [[ -z "$(recorded_pid "$name" || true)" ]] || die "${name} is running already"
    resolve_binaries "$full"
    start_apiserver "$full" "$(cat "${STATE}/node-ip")" "$name"
    wait_for "$name" 60 api_ready
    log "${name} ready on ${APISERVER_PORT} after $(elapsed "$t0") s"
}

# etcd's own HTTP gateway (JSON, no etcdctl needed): the revision from a range header,
# then a physical compaction at it (returns once the old revisions are gone).
cmd_compact() {
    local etcd="http://127.0.0.1:${ETCD_PORT}" rev
    bed_mode >/dev/null
    rev="$(curl -fsS --max-time 5 -X POST "${etcd}/v3/kv/range" -d '{"key":"AA==","limit":1}' |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["header"]["revision"])')"
    curl -fsS --max-time 30 -X POST "${etcd}/v3/kv/compaction" \
        -d "{\"revision\":\"${rev}\",\"physical\":true}" >/dev/null
    log "etcd compacted at revision ${rev}"
    printf '%s\n' "$rev"
}

# ================================================================= hollow nodes
# kubemark's hollow kubelet: the real kubelet's code (pod workers, status manager,
# volume manager, the same 1 s status patch) over a fake CRI runtime, so a pod reaches
# Running without a process. Upstream's own scale tests run nodes like these; here the
# benchmark's burst of 1 000 Agents does, which the one real node (110 pods, about one
# start a second) cannot hold. Each reports 1 core and 3.75 GiB.

hollow_pids() { ls "${PIDS}"/hollow-*.pid 2>/dev/null | sed 's|.*/\(hollow-[0-9]*\)\.pid$|\1|'; }

# Each hollow node's Ready condition and taints, one line each.
hollow_states() {
    api_get "/api/v1/nodes?labelSelector=autonomic.test/hollow%3Dtrue" | python3 -c '
import json, sys
for n in json.load(sys.stdin)["items"]:
    ready = {c["type"]: c["status"] for c in n["status"].get("conditions", [])}.get("Ready")
    taints = [t["key"] for t in n["spec"].get("taints", [])]
    print(n["metadata"]["name"], "Ready=%s" % ready, "taints=%s" % ",".join(taints))'
}

# At least $1 hollow nodes Ready and untainted (the node-lifecycle controller removes
# the not-ready taint once a node is Ready).
hollow_ready() {
    [[ "$(hollow_states | grep -c ' Ready=True taints=$')" -ge "$1" ]]
}

# Each hollow kubelet made a root dir for its pods' volumes in /tmp (fixed there, no
# mounts: its mounter is a fake) and its fake runtime's socket, both named in its log.
# Called once they are stopped.
hollow_remove_dirs() {
    local logs=("${LOGS}"/hollow-*.log)
    [[ -e "${logs[0]}" ]] || return 0
    sed -n -e 's/.*Using \(\/tmp\/hollow-kubelet\.[0-9]*\) as root dir.*/\1/p' \
        -e 's/.*\(\/tmp\/kubelet_remote_[0-9]*\.sock\).*/\1/p' "${logs[@]}" |
        sort -u | xargs -r rm -rf
    rm -f "${logs[@]}"
}

cmd_hollow() {
    local n="${1:-}" i t0 bin
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: cluster.sh hollow N"
    [[ "$(bed_mode)" == full ]] || die "hollow nodes need a full bed (a scheduler and a controller manager)"
    [[ -z "$(hollow_pids)" ]] || die "hollow nodes are running already (cluster.sh unhollow first)"
    "${HERE}/build-k8s.sh" kubemark
    bin="${K8S_BIN_DIR}/kubemark"
    t0="$(now_s)"
    for ((i = 0; i < n; i++)); do
        start_proc "hollow-${i}" "$bin" --morph=kubelet \
            --name="hollow-${i}" --kubeconfig="${STATE}/kubeconfig" \
            --kubelet-port=$((KUBELET_PORT + 100 + i)) --kubelet-read-only-port=0 \
            --node-labels=autonomic.test/hollow=true
    done
    # Every hollow kubelet watched, not only the first: one that exits is named, with
    # the end of its log (unhollow deletes the logs).
    local deadline=$((SECONDS + TIMEOUT)) name
    until hollow_ready "$n" >/dev/null 2>&1; do
        for name in $(hollow_pids); do
            pid_alive "$(cat "${PIDS}/${name}.pid")" && continue
            tail_log "$name"
            die "${name} exited (see ${LOGS}/${name}.log)"
        done
        if ((SECONDS >= deadline)); then
            hollow_states >&2 || true
            die "timed out after ${TIMEOUT} s waiting for ${n} hollow nodes Ready and untainted"
        fi
        sleep 0.2
    done
    log "${n} hollow nodes Ready after $(elapsed "$t0") s"
}

cmd_unhollow() {
    local name pid pids=()
    bed_mode >/dev/null
    for name in $(hollow_pids); do
        pid="$(recorded_pid "$name" || true)"
        [[ -n "$pid" ]] && pids+=("$pid")
        rm -f "${PIDS}/${name}.pid"
    done
    kill_wait 10 "${pids[@]+"${pids[@]}"}"
    hollow_remove_dirs
    # Their pods go with their Nodes (the pod GC controller deletes the orphans).
    curl -fsS --max-time 30 -X DELETE --cacert "${PKI}/ca.crt" --cert "${PKI}/admin.crt" \
        --key "${PKI}/admin.key" "${API_URL}/api/v1/nodes?labelSelector=autonomic.test/hollow%3Dtrue" \
        >/dev/null || log "could not delete the hollow Nodes"
    log "hollow nodes stopped (${#pids[@]})"
}

# ======================================================================= misc

cmd_status() {
    if [[ -s "${PKI}/admin.key" ]] && api_ready 2>/dev/null; then
        log "apiserver ${API_URL} ready ($(cat "${STATE}/mode" 2>/dev/null || echo '?') mode); export KUBECONFIG=${STATE}/kubeconfig"
        return 0
    fi
    log "no test bed answering in ${STATE}"
    return 1
}

cmd_import() {
    [[ $# -ge 1 ]] || die "usage: cluster.sh import <docker-archive.tar>..."
    [[ -S "$CTRD_SOCK" ]] || die "no containerd in ${STATE} (is the test bed up in full mode?)"
    "${HERE}/images.sh" import-archive "$CTRD_SOCK" "$@"
}

main() {
    local cmd="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$cmd" in
        up | down)
            # One up/down at a time per state dir (the lock file sits beside
            # the state dir, which `down` removes).
            exec 9>"${STATE%/}.lock"
            flock -w 300 9 || die "another up/down holds ${STATE%/}.lock"
            ;;
    esac
    case "$cmd" in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        import) cmd_import "$@" ;;
        stop-apiserver) cmd_stop_apiserver "$@" ;;
        start-apiserver) cmd_start_apiserver "$@" ;;
        restart-apiserver)
            cmd_stop_apiserver
            cmd_start_apiserver
            ;;
        compact) cmd_compact ;;
        hollow) cmd_hollow "$@" ;;
        unhollow) cmd_unhollow ;;
        -h | --help | help) usage ;;
        *) usage ;;
    esac
}

main "$@"
