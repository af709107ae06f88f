#!/usr/bin/env bash
# The demo: on this machine, start a real local Kubernetes (control plane built from Go modules,
# a node agent running pods as local processes), install the CRDs, run the operator, apply
# deploy/examples/cluster.yaml and show the cluster become ready and answer a query through its
# Distributed table.
#
#   hack/demo.sh        start (or reuse) everything and show the cluster
#   hack/demo.sh down   stop the operator and the local Kubernetes, leave the machine clean
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/.local/demo"
NS=demo
CLUSTER=demo
WAIT="${DEMO_WAIT_SECONDS:-600}"

stop_operator() {
  if [ -f "$DIR/operator.pid" ]; then
    kill "$(cat "$DIR/operator.pid")" 2>/dev/null || true
    rm -f "$DIR/operator.pid"
  fi
}

if [ "${1:-up}" = "down" ]; then
  stop_operator
  bash "$ROOT/hack/local-cluster.sh" down "$DIR"
  echo "demo stopped"
  exit 0
fi

bash "$ROOT/hack/setup.sh"
(cd "$ROOT" && cargo build --workspace --quiet)
mkdir -p "$DIR"
running() {
  [ -f "$DIR/env" ] && (source "$DIR/env" && kubectl get --raw /readyz >/dev/null 2>&1)
}
if ! running; then
  bash "$ROOT/hack/local-cluster.sh" down "$DIR" >/dev/null 2>&1 || true
  bash "$ROOT/hack/local-cluster.sh" up "$DIR"
fi
# shellcheck disable=SC1091
source "$DIR/env"

echo ">> installing the CRDs"
"$ROOT/target/debug/clickhouse-operator" crd | kubectl apply --server-side --force-conflicts -f - >/dev/null
for _ in $(seq 1 30); do
  kubectl wait --for condition=established crd/clickhouseclusters.clickhouse.com >/dev/null 2>&1 && break
  sleep 1
done

echo ">> starting the operator (log: $DIR/operator.log)"
stop_operator
LOG_FORMAT=text HTTP_ADDR=127.0.0.1:18080 POD_NAMESPACE=default \
  setsid "$ROOT/target/debug/clickhouse-operator" run >"$DIR/operator.log" 2>&1 </dev/null &
echo $! >"$DIR/operator.pid"

# The local node agent runs ClickHouse 18.16 for every server image, so the cluster names
# that version: a tag of 21.3 or later would start the servers beside Keeper, which 18.16
# does not survive (its ON CLUSTER queue gives up; docs/decisions.md, decision 58).
echo ">> applying deploy/examples/cluster.yaml (with the server version this machine runs, 18.16.1)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
sed 's|image: clickhouse/clickhouse-server:[^ ]*$|image: clickhouse/clickhouse-server:18.16.1|' \
  "$ROOT/deploy/examples/cluster.yaml" | kubectl apply -f -

echo ">> waiting up to ${WAIT}s for the cluster to become ready"
state=""
for _ in $(seq 1 "$((WAIT / 5))"); do
  state="$(kubectl -n "$NS" get chc "$CLUSTER" -o jsonpath='{.status.state}' 2>/dev/null || true)"
  [ "$state" = ready ] && break
  sleep 5
done
kubectl -n "$NS" get chc
kubectl -n "$NS" get pods -o wide 2>/dev/null || true
if [ "$state" != ready ]; then
  echo
  echo "The cluster is not ready (state: ${state:-none}). What the operator says:"
  kubectl -n "$NS" get chc "$CLUSTER" -o jsonpath='{.status.message}{"\n"}'
  echo "Operator log: $DIR/operator.log.  Stop everything with: hack/demo.sh down"
  exit 1
fi

echo
echo ">> a query through the cluster's Distributed table"
pod_ip() { kubectl -n "$NS" get pod "$1" -o jsonpath='{.status.podIP}'; }
first="$(kubectl -n "$NS" get pods -l clickhouse.com/cluster=$CLUSTER,app.kubernetes.io/component=server -o jsonpath='{.items[0].metadata.name}')"
ip="$(pod_ip "$first")"
user=clickhouse_operator
pass="$(kubectl -n "$NS" get secret "$CLUSTER-operator" -o jsonpath='{.data.password}' | base64 -d)"
q() { clickhouse-client --host "$ip" --user "$user" --password "$pass" --query "$1"; }
q "CREATE TABLE IF NOT EXISTS default.events ON CLUSTER '$CLUSTER' (id UInt64, at DateTime DEFAULT now()) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') ORDER BY id" >/dev/null
q "CREATE TABLE IF NOT EXISTS default.events_all ON CLUSTER '$CLUSTER' AS default.events ENGINE = Distributed('$CLUSTER', default, events, id)" >/dev/null
q "INSERT INTO default.events_all (id) SELECT number FROM system.numbers LIMIT 1000 SETTINGS insert_distributed_sync = 1"
sleep 2
echo "rows through the Distributed table: $(q 'SELECT count() FROM default.events_all')"
for p in $(kubectl -n "$NS" get pods -l clickhouse.com/cluster=$CLUSTER,app.kubernetes.io/component=server -o jsonpath='{.items[*].metadata.name}'); do
  echo "  $p (shard $(kubectl -n "$NS" get pod "$p" -o jsonpath='{.metadata.labels.clickhouse\.com/shard}')): $(clickhouse-client --host "$(pod_ip "$p")" --user "$user" --password "$pass" --query 'SELECT count() FROM default.events') rows"
done
echo
echo "The cluster is ready. Try: source $DIR/env && kubectl -n $NS get chc,sts,pods,svc"
echo "Stop everything with: hack/demo.sh down"
