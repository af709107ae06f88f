#!/usr/bin/env bash
# A real local Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler (built from Go modules by hack/build-control-plane.sh) and local-kubelet node
# agents (Node `node-1`, or node-1..node-N with LOCAL_CLUSTER_NODES=N) that run pods as local
# processes, each in its own network namespace on a bridge; Services get ClusterIPs from
# 198.19.0.0/16.
#
# Several clusters may run at once, each on its own node network ("slot" k = 0..7): bridge chbr<k>,
# pods in 198.18.<32k>.0/19 (gateway and Node InternalIP 198.18.<32k>.1), ClusterIPs in
# 198.19.<32k>.0/19 (the kubernetes Service at 198.19.<32k>.1). The first cluster gets slot 0:
# chbr0, 198.18.0.1, 198.19.0.1. DIR/network records the values.
#
#   hack/local-cluster.sh up DIR     start everything into DIR; exits 0 once ready
#   hack/local-cluster.sh down DIR   stop everything started into DIR, leave the machine clean
#   hack/local-cluster.sh status DIR print which processes of DIR are alive
#   hack/local-cluster.sh node-stop DIR NODE   stop one node's agent (its pods stop, the Node
#                                    goes NotReady once the node controller notices)
#   hack/local-cluster.sh node-start DIR NODE  start it again (its pods start again)
#
# After `up`:  source DIR/env   (KUBECONFIG=DIR/kubeconfig, PATH with kubectl 1.37)
# Environment (optional):
#   LOCAL_KUBELET_BIN       use this local-kubelet binary instead of `cargo build -p local-kubelet`
#   CLICKHOUSE_OPERATOR_BIN binary the agent runs for *clickhouse-operator* images
#                           (default: <target dir>/debug/clickhouse-operator)
#   LOCAL_KUBELET_IMAGE_STORE an OCI image layout folder (hack/image.sh writes target/image/oci):
#                           pods whose image is in it run from the image's own root filesystem
#   LOCAL_CLUSTER_TIMEOUT   seconds to wait for readiness (default 120)
#   NODE_NAME               Node name of the agent of a one-node cluster (default node-1)
#   LOCAL_CLUSTER_NODES     number of nodes, 1 to 7 (default 1). With more than one, a
#                           `local-kubelet network` process owns the bridge and ClusterIPs, node i
#                           has address 198.18.<32k>.i, pods from 198.18.<32k+4i>.0/22 and zone
#                           zone-a, zone-b, zone-c, zone-a, …; leases are renewed every 2 s and
#                           the node controller's grace period is 10 s
#   LOCAL_CLUSTER_NODE_GRACE  the controller-manager's --node-monitor-grace-period
#                           (default: 10s with several nodes, the controller's own default with one)
#   LOCAL_CLUSTER_NETWORK_POLICIES  `enforce` or `ignore` NetworkPolicies (default: enforce with
#                           several nodes, ignore with one, as the one-node tests were written)
#   LOCAL_CLUSTER_TOLERATION_SECONDS  the API server's default tolerationSeconds for the
#                           not-ready/unreachable NoExecute taints (default 300, Kubernetes' own)
#   LOCAL_CLUSTER_AUDIT     `writes`: the audit log (DIR/audit.log) records every write (create,
#                           update, patch, delete) with its request and response bodies, once it
#                           completed, so that a write that changed nothing shows (its answer's
#                           resourceVersion is one an earlier write returned); default: the
#                           metadata of every request only
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
SLOTS=8
lock_file() { if [ "$1" = 0 ]; then echo /run/local-cluster.owner; else echo "/run/local-cluster.owner.$1"; fi; }
dir_slot() { cat "$DIR/slot" 2>/dev/null || echo 0; }
NODE_NAME="${NODE_NAME:-node-1}"
TIMEOUT="${LOCAL_CLUSTER_TIMEOUT:-120}"
# reverse start order: the agents go first so that they stop pods and remove what they created,
# then the network process (several nodes), then the control plane
PROCS_STOP=(agent network kube-scheduler kube-controller-manager kube-apiserver etcd)

log() { echo "local-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

usage() { echo "usage: $0 up|down|status DIR | node-stop|node-start DIR NODE" >&2; exit 2; }
[ $# -ge 2 ] || usage
CMD="$1"
case "$CMD" in
  node-stop | node-start) [ $# -eq 3 ] || usage; NODE_ARG="$3" ;;
  *) [ $# -eq 2 ] || usage ;;
esac
if [ "$CMD" = up ]; then mkdir -p "$2" 2>/dev/null || true; fi
if [ ! -d "$2" ]; then
  [ "$CMD" = up ] && die "cannot create $2"
  log "$2 does not exist: nothing to do"
  exit 0
fi
DIR="$(cd "$2" && pwd)"

# the binary name whose process a pid file must point at (guards against pid reuse)
proc_binary() {
  case "$1" in
    agent | agent-* | network) basename "$(cat "$DIR/agent.bin" 2>/dev/null || echo local-kubelet)" ;;
    *) echo "$1" ;;
  esac
}

pid_of() { # name -> pid if that process is alive and is what we started
  local f="$DIR/pids/$1.pid" pid
  [ -f "$f" ] || return 1
  pid="$(cat "$f" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ -d "/proc/$pid" ] || return 1
  local exe
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  case "$exe" in
    */"$(proc_binary "$1")"|*/"$(proc_binary "$1")"" (deleted)") echo "$pid" ;;
    *) return 1 ;;
  esac
}

stop_one() { # name grace-seconds
  local name="$1" grace="$2" pid i
  pid="$(pid_of "$name")" || { rm -f "$DIR/pids/$name.pid"; return 0; }
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    [ -d "/proc/$pid" ] || break
    # a zombie whose parent is gone counts as stopped
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && break
    sleep 0.1
  done
  if [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; then
    log "$name did not stop within ${grace}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  fi
  rm -f "$DIR/pids/$name.pid"
}

# a slot is busy while its owner's `up` script or agent runs
slot_busy() { # slot
  local f; f="$(lock_file "$1")"
  [ -f "$f" ] || return 1
  local owner uppid
  owner="$(sed -n 1p "$f" 2>/dev/null)"
  uppid="$(sed -n 2p "$f" 2>/dev/null)"
  [ "$owner" = "$DIR" ] && return 1
  if [ -n "$uppid" ] && [ -d "/proc/$uppid" ] && grep -q local-cluster "/proc/$uppid/cmdline" 2>/dev/null; then
    return 0
  fi
  [ -n "$owner" ] || return 1
  local f
  for f in "$owner"/pids/agent.pid "$owner"/pids/agent-*.pid "$owner"/pids/network.pid; do
    [ -f "$f" ] && [ -d "/proc/$(cat "$f" 2>/dev/null || echo x)" ] && return 0
  done
  return 1
}

# the nodes of DIR, one a line: name zone ip cidr proc data-dir (written by `up`)
nodes() { cat "$DIR/nodes" 2>/dev/null || true; }
node_count() { nodes | grep -c . || true; }

agent_cleanup() {
  # removes what a (possibly crashed) agent left: pod processes, netns, veths, ClusterIPs, bridge,
  # mount points it created. Only when this DIR owns its node network (or nobody does). Under
  # the lock an `up` picks its slot with: else a cluster coming up at the same moment could write
  # its claim on the slot between our look and our removal of the claim, lose it, and share its
  # bridge with the next cluster to come up.
  exec 9<"$HERE/local-cluster.sh"
  flock 9
  agent_cleanup_locked
  flock -u 9
  exec 9<&-
}

agent_cleanup_locked() {
  local slot lock
  slot="$(dir_slot)"
  lock="$(lock_file "$slot")"
  slot_busy "$slot" && return 0
  local bin=""
  [ -f "$DIR/agent.bin" ] && bin="$(cat "$DIR/agent.bin")"
  if [ -n "$bin" ] && [ -x "$bin" ]; then
    # the further nodes' own leftovers (mount points, pod folders) first; then node-1's cleanup
    # takes the whole node network: every pod link of the slot and the bridge
    local name zone ip cidr proc ddir
    while read -r name zone ip cidr proc ddir; do
      [ "$proc" = agent ] && continue
      [ -d "$ddir" ] || continue
      "$bin" cleanup --data-dir "$ddir" --bridge "chbr$slot" --pod-cidr "198.18.$((32 * slot)).0/19" \
        --node-cidr "$cidr" --node-ip "$ip" --network external \
        >>"$DIR/logs/agent-cleanup.log" 2>&1 || log "agent cleanup of $name failed: see $DIR/logs/agent-cleanup.log"
    done < <(nodes)
    if [ -d "$DIR/agent" ]; then
      "$bin" cleanup --data-dir "$DIR/agent" --bridge "chbr$slot" --pod-cidr "198.18.$((32 * slot)).0/19" \
        >>"$DIR/logs/agent-cleanup.log" 2>&1 || log "agent cleanup failed: see $DIR/logs/agent-cleanup.log"
    fi
  fi
  local owner=""
  [ -f "$lock" ] && owner="$(sed -n 1p "$lock" 2>/dev/null)"
  if [ -z "$owner" ] || [ "$owner" = "$DIR" ]; then rm -f "$lock"; fi
}

do_down() {
  [ -d "$DIR/pids" ] || { agent_cleanup; return 0; }
  for p in "${PROCS_STOP[@]}"; do
    case "$p" in
      agent)
        # every node at once: each stops its pods (waiting for these stops only: the
        # processes `up` started are jobs of this shell too)
        local f n stops=()
        for f in "$DIR"/pids/agent.pid "$DIR"/pids/agent-*.pid; do
          [ -f "$f" ] || continue
          n="$(basename "$f" .pid)"
          stop_one "$n" 120 &
          stops+=($!)
        done
        [ ${#stops[@]} -eq 0 ] || wait "${stops[@]}"
        ;;
      network) stop_one network 20; agent_cleanup ;;
      kube-apiserver) stop_one "$p" 20 ;;
      *) stop_one "$p" 15 ;;
    esac
  done
  log "down: $DIR"
}

do_status() {
  local procs=(etcd kube-apiserver kube-controller-manager kube-scheduler) name zone ip cidr proc ddir
  [ "$(node_count)" -gt 1 ] && procs+=(network)
  while read -r name zone ip cidr proc ddir; do procs+=("$proc"); done < <(nodes)
  [ -f "$DIR/nodes" ] || procs+=(agent)
  for p in "${procs[@]}"; do
    if pid="$(pid_of "$p")"; then echo "$p running (pid $pid)"; else echo "$p stopped"; fi
  done
}

# the agent of node NAME, with the arguments `up` recorded for it
start_agent() { # name
  local f="$DIR/nodes.d/$1.args"
  [ -f "$f" ] || die "no node $1 in $DIR"
  local agent_args agent_proc agent_log_level
  # shellcheck disable=SC1090
  source "$f"
  RUST_LOG="$agent_log_level" start_proc "$agent_proc" "${agent_args[@]}"
}

node_line() { # name -> "name zone ip cidr proc data-dir"
  local l
  l="$(nodes | awk -v n="$1" '$1 == n')"
  [ -n "$l" ] || die "no node $1 in $DIR (nodes: $(nodes | awk '{print $1}' | tr '\n' ' '))"
  echo "$l"
}

do_node_stop() {
  [ "$(node_count)" -gt 1 ] || die "a cluster of one node: its agent owns the node network; start it with LOCAL_CLUSTER_NODES=2 or more"
  local name zone ip cidr proc ddir
  read -r name zone ip cidr proc ddir <<<"$(node_line "$NODE_ARG")"
  stop_one "$proc" 120
  # what a killed agent left behind (its pods' processes and links, its address)
  local slot bin
  slot="$(dir_slot)"
  bin="$(cat "$DIR/agent.bin")"
  "$bin" cleanup --data-dir "$ddir" --bridge "chbr$slot" --pod-cidr "198.18.$((32 * slot)).0/19" \
    --node-cidr "$cidr" --node-ip "$ip" --network external >>"$DIR/logs/agent-cleanup.log" 2>&1 ||
    log "cleanup of $name failed: see $DIR/logs/agent-cleanup.log"
  log "node $name stopped"
}

do_node_start() {
  local name zone ip cidr proc ddir
  read -r name zone ip cidr proc ddir <<<"$(node_line "$NODE_ARG")"
  if pid_of "$proc" >/dev/null; then log "node $name is running"; return 0; fi
  pid_of network >/dev/null || die "the network process of $DIR is not running"
  BIN="$(sed -n 's/^export PATH=\(.*\):\$PATH$/\1/p' "$DIR/env")"
  start_agent "$name"
  local deadline=$(($(date +%s) + TIMEOUT))
  NODES_TO_WAIT="$name"
  wait_for "Node $name Ready" "$DIR/logs/$proc.log" "$deadline" "$proc" node_ready
  log "node $name started"
}

ensure_packages() {
  local missing=() p
  for p in clickhouse-server clickhouse-client zookeeper openssl iproute2 util-linux nftables; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # several clusters come up at once (the test suites): each waits for the others' apt-get
    local wait=(-o DPkg::Lock::Timeout=300)
    apt-get "${wait[@]}" install -y --no-install-recommends "${missing[@]}" >&2 ||
      { apt-get "${wait[@]}" update >&2 &&
        apt-get "${wait[@]}" install -y --no-install-recommends "${missing[@]}" >&2; }
  fi
}

PICKED=" "
# the ports that other live local clusters have recorded (called under the slot lock)
reserve_others_ports() {
  local k f owner p
  for ((k = 0; k < SLOTS; k++)); do
    f="$(lock_file "$k")"
    [ -f "$f" ] && slot_busy "$k" || continue
    owner="$(sed -n 1p "$f" 2>/dev/null)"
    [ -n "$owner" ] && [ -f "$owner/ports" ] || continue
    for p in $(cut -d= -f2 "$owner/ports"); do PICKED="$PICKED$p "; done
  done
}
# a port that nothing listens on and no other local cluster has picked: picked under the slot
# lock and recorded before it is released, so that two `up`s starting together (tests run
# several clusters at once) cannot both pick a port that neither binds until seconds later
pick_port() { # variable: sets it (not `$(pick_port)`: a subshell would not keep PICKED)
  local p
  while :; do
    p=$((20000 + RANDOM % 10000)) # below the NodePort (30000-) and ephemeral (32768-) ranges
    case "$PICKED" in *" $p "*) continue ;; esac
    if [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ]; then
      PICKED="$PICKED$p "
      printf -v "$1" '%s' "$p"
      return
    fi
  done
}

start_proc() { # name binary args...
  local name="$1"; shift
  # setsid: own session, no controlling terminal; stdin/stdout/stderr detached from the caller
  setsid "$@" </dev/null >>"$DIR/logs/$name.log" 2>&1 &
  echo $! >"$DIR/pids/$name.pid"
}

FAILED_LOG=""
fail_up() {
  log "$1"
  if [ -n "$FAILED_LOG" ] && [ -f "$FAILED_LOG" ]; then
    log "---- last lines of $FAILED_LOG ----"
    tail -n 40 "$FAILED_LOG" >&2 || true
  fi
  do_down || true
  exit 1
}

starting() { # name -> the process started as name exists and has not run its binary yet
  local pid exe
  pid="$(cat "$DIR/pids/$1.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] || return 1
  # between the fork and its exec the process is still this shell or setsid (a busy machine
  # can make that last long enough to be seen)
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  case "$exe" in */bash | */setsid | "") return 0 ;; esac
  return 1
}

wait_for() { # description log-file deadline-epoch process-name command...
  local what="$1" logf="$2" deadline="$3" proc="$4"; shift 4
  FAILED_LOG="$logf"
  until "$@" >/dev/null 2>&1; do
    if [ -n "$proc" ] && ! pid_of "$proc" >/dev/null && ! starting "$proc"; then
      fail_up "$proc exited while waiting for $what"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || fail_up "timed out waiting for $what"
    sleep 0.3
  done
}

NODES_TO_WAIT=""
node_ready() {
  local n
  for n in $NODES_TO_WAIT; do
    [ "$("$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" get node "$n" \
      -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ] || return 1
  done
}
default_sc() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" get storageclass \
    -o 'jsonpath={range .items[*]}{.metadata.annotations.storageclass\.kubernetes\.io/is-default-class}{"\n"}{end}' |
    grep -qx true
}
default_sa() { "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" -n default get serviceaccount default; }

do_up() {
  [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, bridge, mounts)"
  for p in "${PROCS_STOP[@]}"; do
    if pid_of "$p" >/dev/null; then die "$DIR is already up ($p running); run: $0 down $DIR"; fi
  done
  local NODES="${LOCAL_CLUSTER_NODES:-1}"
  [[ "$NODES" =~ ^[1-7]$ ]] || die "LOCAL_CLUSTER_NODES must be 1 to 7, not '$NODES'"
  local POLICIES="${LOCAL_CLUSTER_NETWORK_POLICIES:-}"
  if [ -z "$POLICIES" ]; then
    if [ "$NODES" -gt 1 ]; then POLICIES=enforce; else POLICIES=ignore; fi
  fi
  case "$POLICIES" in enforce | ignore) ;; *) die "LOCAL_CLUSTER_NETWORK_POLICIES must be enforce or ignore, not '$POLICIES'" ;; esac
  if [ "$NODES" -gt 1 ] && [ "$NODE_NAME" != node-1 ]; then
    die "NODE_NAME applies to a cluster of one node (the nodes of $NODES are node-1..node-$NODES)"
  fi
  local t_start=$SECONDS
  ensure_packages
  BIN="$(bash "$HERE/build-control-plane.sh" | tail -n 1)"
  [ -x "$BIN/kube-apiserver" ] || die "no control plane binaries in '$BIN'"
  local target="${CARGO_TARGET_DIR:-$ROOT/target}"
  local kubelet="${LOCAL_KUBELET_BIN:-}"
  if [ -z "$kubelet" ]; then
    kubelet="$target/debug/local-kubelet"
    # rebuild only when a source is newer than the binary (also avoids waiting for the build lock
    # of a `cargo test` that runs this script)
    if [ ! -x "$kubelet" ] || [ -n "$(find "$ROOT/local-kubelet" "$ROOT/Cargo.lock" "$ROOT/Cargo.toml" \
      -newer "$kubelet" -not -path '*/tests/*' -print -quit 2>/dev/null)" ]; then
      (cd "$ROOT" && cargo build -q -p local-kubelet >&2) || die "cargo build -p local-kubelet failed"
    fi
  fi
  [ -x "$kubelet" ] || die "local-kubelet binary $kubelet not found"
  kubelet="$(readlink -f "$kubelet")"
  local operator="${CLICKHOUSE_OPERATOR_BIN:-$target/debug/clickhouse-operator}"

  # fresh DIR (anything left from an earlier run is stopped and removed first)
  do_down >/dev/null 2>&1 || true
  rm -rf "${DIR:?}"/{pki,etcd,logs,pids,agent,kubeconfig,env,audit.log,audit-policy.yaml,tokens.csv,agent.bin,ports,slot,network,network.d,nodes,nodes.d} "${DIR:?}"/agent-*/
  mkdir -p "$DIR"/{pki,etcd,logs,pids,agent}
  # a node network of our own (serialised with other `up`s by a lock)
  local SLOT="" k
  exec 8<"$HERE/local-cluster.sh"
  flock 8
  for ((k = 0; k < SLOTS; k++)); do
    if ! slot_busy "$k"; then SLOT=$k; break; fi
  done
  if [ -z "$SLOT" ]; then
    flock -u 8
    die "all $SLOTS node networks are in use by other local clusters ($(cat /run/local-cluster.owner* 2>/dev/null | grep / | tr '\n' ' '))"
  fi
  printf '%s\n%s\n' "$DIR" "$$" >"$(lock_file "$SLOT")"
  local ETCD_PORT ETCD_PEER API_PORT KCM_PORT SCHED_PORT
  reserve_others_ports
  pick_port ETCD_PORT; pick_port ETCD_PEER; pick_port API_PORT
  pick_port KCM_PORT; pick_port SCHED_PORT
  printf 'etcd=%s\netcd-peer=%s\napiserver=%s\nkube-controller-manager=%s\nkube-scheduler=%s\n' \
    "$ETCD_PORT" "$ETCD_PEER" "$API_PORT" "$KCM_PORT" "$SCHED_PORT" >"$DIR/ports"
  flock -u 8
  exec 8>&-
  echo "$SLOT" >"$DIR/slot"
  local BRIDGE="chbr$SLOT" POD_CIDR="198.18.$((32 * SLOT)).0/19" GW="198.18.$((32 * SLOT)).1"
  local SVC_CIDR="198.19.$((32 * SLOT)).0/19" KSVC="198.19.$((32 * SLOT)).1"
  printf 'BRIDGE=%s\nPOD_CIDR=%s\nGATEWAY=%s\nSERVICE_CIDR=%s\nKUBERNETES_SERVICE_IP=%s\nNETWORK_POLICIES=%s\n' \
    "$BRIDGE" "$POD_CIDR" "$GW" "$SVC_CIDR" "$KSVC" "$POLICIES" >"$DIR/network"
  # the nodes: name zone ip cidr proc data-dir. One node is the agent of old (the whole pod
  # CIDR, the gateway address); several share the bridge, each with an address and a /22 of its own
  local zones=(zone-a zone-b zone-c) i
  : >"$DIR/nodes"
  if [ "$NODES" = 1 ]; then
    echo "$NODE_NAME zone-a $GW $POD_CIDR agent $DIR/agent" >>"$DIR/nodes"
  else
    for ((i = 1; i <= NODES; i++)); do
      local nproc=agent ndir="$DIR/agent"
      if [ "$i" -gt 1 ]; then nproc="agent-node-$i"; ndir="$DIR/agent-node-$i"; fi
      echo "node-$i ${zones[$(((i - 1) % 3))]} 198.18.$((32 * SLOT)).$i 198.18.$((32 * SLOT + 4 * i)).0/22 $nproc $ndir" >>"$DIR/nodes"
    done
  fi
  NODES_TO_WAIT="$(awk '{print $1}' "$DIR/nodes" | tr '\n' ' ')"
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    log "bridge $BRIDGE exists without a running owner: the agent removes it as a leftover"
  fi
  echo "$kubelet" >"$DIR/agent.bin"
  trap 'fail_up "interrupted"' INT TERM


  # certificates: a CA, the apiserver serving certificate, the service-account key pair
  local P="$DIR/pki"
  (
    cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=local-cluster-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    printf '%s\n' "subjectAltName=IP:127.0.0.1,IP:$GW,IP:$KSVC,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
      "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt \
      -days 3650 -extfile apiserver.ext 2>/dev/null
    # each agent's kubelet API (kubectl logs) and the apiserver's client certificate for it:
    # kubelet.crt for node-1 (or NODE_NAME), kubelet-<node>.crt for the others
    local name zone ip cidr proc ddir kc
    while read -r name zone ip cidr proc ddir; do
      kc=kubelet
      [ "$proc" = agent ] || kc="kubelet-$name"
      openssl req -newkey rsa:2048 -nodes -keyout "$kc.key" -out "$kc.csr" -subj "/CN=$name" 2>/dev/null
      printf '%s\n' "subjectAltName=IP:$ip,DNS:$name" "basicConstraints=CA:FALSE" \
        "keyUsage=digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" >"$kc.ext"
      openssl x509 -req -in "$kc.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$kc.crt" \
        -days 3650 -extfile "$kc.ext" 2>/dev/null
    done <"$DIR/nodes"
    openssl req -newkey rsa:2048 -nodes -keyout apiserver-kubelet-client.key -out apiserver-kubelet-client.csr \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
      "extendedKeyUsage=clientAuth" >client.ext
    openssl x509 -req -in apiserver-kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out apiserver-kubelet-client.crt -days 3650 -extfile client.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || die "openssl failed"
  local TOKEN
  TOKEN="$(openssl rand -hex 24)"
  echo "$TOKEN,admin,admin,system:masters" >"$DIR/tokens.csv"
  chmod 600 "$DIR/tokens.csv" "$P"/*.key
  cat >"$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$P/ca.crt")
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: local
  context:
    cluster: local
    user: admin
    namespace: default
current-context: local
EOF
  chmod 600 "$DIR/kubeconfig"
  {
    printf 'apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n'
    if [ "${LOCAL_CLUSTER_AUDIT:-}" = writes ]; then
      printf -- '- level: RequestResponse\n  verbs: ["create", "update", "patch", "delete", "deletecollection"]\n  omitStages: ["RequestReceived"]\n'
    fi
    printf -- '- level: Metadata\n'
  } >"$DIR/audit-policy.yaml"
  cat >"$DIR/env" <<EOF
export KUBECONFIG=$DIR/kubeconfig
export PATH=$BIN:\$PATH
EOF

  local deadline=$(($(date +%s) + TIMEOUT))
  local t_cp=$SECONDS
  start_proc etcd "$BIN/etcd" --name default --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER" --unsafe-no-fsync --listen-metrics-urls ""
  start_proc kube-apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --service-cluster-ip-range="$SVC_CIDR" --authorization-mode=RBAC --token-auth-file="$DIR/tokens.csv" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$P/sa.pub" \
    --service-account-signing-key-file="$P/sa.key" --allow-privileged=true --shutdown-delay-duration=0s \
    --endpoint-reconciler-type=none --audit-log-path="$DIR/audit.log" \
    --audit-policy-file="$DIR/audit-policy.yaml" --audit-log-maxsize=200 --audit-log-maxbackup=1 --profiling=false \
    --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$P/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP \
    ${LOCAL_CLUSTER_TOLERATION_SECONDS:+--default-not-ready-toleration-seconds=$LOCAL_CLUSTER_TOLERATION_SECONDS} \
    ${LOCAL_CLUSTER_TOLERATION_SECONDS:+--default-unreachable-toleration-seconds=$LOCAL_CLUSTER_TOLERATION_SECONDS}
  wait_for "kube-apiserver /readyz" "$DIR/logs/kube-apiserver.log" "$deadline" kube-apiserver \
    "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" get --raw /readyz
  local K="$DIR/kubeconfig"
  # several nodes: a stopped node is noticed within seconds (leases renewed every 2 s)
  local node_monitor=() grace="${LOCAL_CLUSTER_NODE_GRACE:-}" lease=10
  if [ "$NODES" -gt 1 ]; then grace="${grace:-10s}"; lease=2; fi
  [ -n "$grace" ] && node_monitor=(--node-monitor-grace-period="$grace" --node-monitor-period=1s)
  start_proc kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$K" \
    --authentication-kubeconfig="$K" --authorization-kubeconfig="$K" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --service-account-private-key-file="$P/sa.key" \
    --root-ca-file="$P/ca.crt" --use-service-account-credentials=true --controllers='*' \
    --service-cluster-ip-range="$SVC_CIDR" --profiling=false "${node_monitor[@]}"
  start_proc kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$K" --authentication-kubeconfig="$K" \
    --authorization-kubeconfig="$K" --leader-elect=false --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
    --profiling=false
  if [ "$NODES" -gt 1 ]; then
    # the bridge and the ClusterIP proxy, for every node
    RUST_LOG="${RUST_LOG:-info}" start_proc network "$kubelet" network --kubeconfig "$K" \
      --data-dir "$DIR/network.d" --ca-file "$P/ca.crt" --bridge "$BRIDGE" --pod-cidr "$POD_CIDR" \
      --service-cidr "$SVC_CIDR" --network-policies "$POLICIES"
    wait_for "bridge $BRIDGE" "$DIR/logs/network.log" "$deadline" network ip link show "$BRIDGE"
  fi
  mkdir -p "$DIR/nodes.d"
  local name zone ip cidr proc ddir kc
  while read -r name zone ip cidr proc ddir; do
    kc=kubelet
    [ "$proc" = agent ] || kc="kubelet-$name"
    local agent_args=("$kubelet" run --kubeconfig "$K" --node-name "$name" --data-dir "$ddir"
      --ca-file "$P/ca.crt" --operator-binary "$operator" --log-dir "$DIR/logs/pods"
      --tls-cert-file "$P/$kc.crt" --tls-private-key-file "$P/$kc.key"
      --bridge "$BRIDGE" --pod-cidr "$POD_CIDR" --service-cidr "$SVC_CIDR" --zone "$zone"
      --lease-renew-seconds "$lease" --network-policies "$POLICIES")
    if [ "$NODES" -gt 1 ]; then agent_args+=(--node-cidr "$cidr" --node-ip "$ip" --network external); fi
    # what `node-start` needs to start this agent again (the environment the agent reads too)
    {
      declare -p agent_args
      echo "agent_proc=$proc"
      echo "agent_log_level=${RUST_LOG:-info}"
      local v
      for v in LOCAL_KUBELET_IMAGE_STORE LOCAL_KUBELET_IMAGE_VOLUMES LOCAL_KUBELET_MAX_PODS CLICKHOUSE_OPERATOR_BIN; do
        [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
      done
    } >"$DIR/nodes.d/$name.args"
    start_agent "$name"
  done <"$DIR/nodes"
  wait_for "Nodes $NODES_TO_WAIT Ready" "$DIR/logs/agent.log" "$deadline" agent node_ready
  wait_for "a default StorageClass" "$DIR/logs/agent.log" "$deadline" agent default_sc
  wait_for "ServiceAccount default/default" "$DIR/logs/kube-controller-manager.log" "$deadline" \
    kube-controller-manager default_sa
  local must=(etcd kube-apiserver kube-controller-manager kube-scheduler)
  [ "$NODES" -gt 1 ] && must+=(network)
  while read -r name zone ip cidr proc ddir; do must+=("$proc"); done <"$DIR/nodes"
  for p in "${must[@]}"; do
    pid_of "$p" >/dev/null || { FAILED_LOG="$DIR/logs/$p.log"; fail_up "$p is not running"; }
  done
  trap - INT TERM
  # the slot stays ours while the agent runs
  printf '%s\n' "$DIR" >"$(lock_file "$SLOT")"
  log "up in $((SECONDS - t_start)) s (control plane and $NODES node(s) ready $((SECONDS - t_cp)) s after start): source $DIR/env"
}

case "$CMD" in
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
  node-stop) do_node_stop ;;
  node-start) do_node_start ;;
  *) usage ;;
esac
