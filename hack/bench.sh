#!/usr/bin/env bash
# Runs a benchmark and prints its figures (benchmarks are not tests: nothing is asserted about
# time). Usage: hack/bench.sh backup|exporter|scale|lifecycle
#   backup    backup and restore throughput of a table of at least 1 GiB (BENCH_GIB, default 1)
#             to and from a real S3 server, beside a plain copy of the same parts
#   exporter  the metrics exporter's scrape time and memory for 2, 20 and 100 hosts (the two
#             servers of a real cluster, asked several times each)
#   scale     the operator from its chart in front of N single-replica clusters
#             (BENCH_CLUSTERS, default "1 20"; the first BENCH_REAL, default 50, real 18.16
#             servers, the rest hollow servers of the local kubelet's light mode): its memory
#             before any cluster, time to ready, idle API requests per minute and cluster
#             (audit log), CPU, memory, idle checks and the share ending at a glance, idle pass
#             latency, status lag; BENCH_CONCURRENCY sets the chart's maxConcurrentReconciles
#   lifecycle a 2×2 cluster with 3 Keeper members under the operator from its chart: create, add
#             a shard, roll every server, scale in (BENCH_ROUNDS, default 1; BENCH_DEBUG_LOG=1
#             keeps the operator's debug log, in target/e2e-cluster-<pid>/logs/pods); the
#             operator's requests per step, its writes by resource and verb, and those that
#             changed nothing (the audit log records every write with its answer)
# BENCH_RELEASE=1 runs the operator and the local kubelet as release builds (the figures a user
# sees); the default is the debug builds the tests use.
# The local Kubernetes is started and stopped by the benchmark itself (or set CHOP_KUBECONFIG).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${1:-}" in
  backup) filter=backup::throughput::benchmark_backup_and_restore_throughput ;;
  exporter) filter=exporter::benchmark_exporter_scrape_of_20_and_100_hosts ;;
  scale) filter=benchmarks::scale::benchmark_idle_cost_and_status_lag_of_n_clusters ;;
  lifecycle)
    filter=benchmarks::lifecycle::benchmark_lifecycle_of_a_two_by_two_cluster
    # every write with its answer in the audit log: the writes per step that changed nothing
    export LOCAL_CLUSTER_AUDIT="${LOCAL_CLUSTER_AUDIT:-writes}" ;;
  *) echo "usage: $0 backup|exporter|scale|lifecycle" >&2; exit 2 ;;
esac
bash hack/setup.sh
# room for a thousand pods on the local kubelet's one node (a kubelet's default is 110)
export LOCAL_KUBELET_MAX_PODS="${LOCAL_KUBELET_MAX_PODS:-2500}"
cargo build --workspace --quiet
if [ "${BENCH_RELEASE:-}" = 1 ]; then
  cargo build --release --quiet -p clickhouse-operator -p local-kubelet
  target="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  export CLICKHOUSE_OPERATOR_BIN="$target/release/clickhouse-operator"
  export LOCAL_KUBELET_BIN="$target/release/local-kubelet"
fi
cargo test --test e2e "$filter" -- --ignored --nocapture --exact 2>&1 \
  | grep -vE '^\s*$|DEBUG|INFO' 
