#!/usr/bin/env bash
# Runs every test: unit tests, tests against real ClickHouse and ZooKeeper servers, the image
# tests, and the end-to-end and Helm tests on the real local Kubernetes (started and stopped by
# the tests themselves). Ends with one line that adds up every test binary's results. The
# amd64 image is built first; the arm64 half of the image beside the end-to-end tests.
#
# The end-to-end and the Helm tests wait on pods and servers far more than they compute: they
# run beside each other, each on a local Kubernetes of its own, the end-to-end tests
# E2E_THREADS (default 4) at a time on CHOP_E2E_NODES nodes (default 3, in three zones,
# NetworkPolicies not enforced; 1 for one node); the node tests (`nodes::`, `node_failures::`: they stop, drain and cut off
# nodes of a three-node local Kubernetes that enforces NetworkPolicies, so they run one at a
# time) in a process of their own beside them; then the rest. Arguments go to every test
# binary (a name filter, `--ignored`, ...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash hack/setup.sh
# the operator's amd64 image and packaged charts (target/image/): the local Kubernetes of the
# end-to-end and Helm tests runs the operator's pods from that image
CHOP_IMAGE_PLATFORMS=amd64 bash hack/image.sh
cargo build --workspace --tests --quiet
bash hack/next-operator.sh >/dev/null
log="$(mktemp)"
helm_log="$(mktemp)"
nodes_log="$(mktemp)"
image_log="$(mktemp)"
trap 'rm -f "$log" "$helm_log" "$nodes_log" "$image_log"' EXIT
# the whole image (amd64 and arm64, what the image tests read) is built beside the end-to-end
# tests, at the lowest priority (they mostly wait), into a folder of its own, and put in place
# once they are over
full_image="$PWD/target/image-all"
rm -rf "$full_image"
CHOP_IMAGE_OUT="$full_image" nice -n 19 bash hack/image.sh >"$image_log" 2>&1 &
image_pid=$!
# every other test target of the workspace, by name
others=()
for f in tests/*.rs local-kubelet/tests/*.rs; do
  n="$(basename "$f" .rs)"
  [ "$n" = helm ] || others+=(--test "$n")
done
for f in tests/*/main.rs; do
  n="$(basename "$(dirname "$f")")"
  [ "$n" = e2e ] || others+=(--test "$n")
done
export CHOP_E2E_NODES="${CHOP_E2E_NODES:-3}"
set +e
cargo test --test helm --no-fail-fast -- "$@" >"$helm_log" 2>&1 &
helm_pid=$!
# with a name filter (arguments), everything it selects runs in one process, node tests too
split=()
nodes_pid=
if [ "$#" -eq 0 ]; then
  split=(--skip nodes:: --skip node_failures::)
  cargo test --test e2e --no-fail-fast -- --test-threads=1 nodes:: node_failures:: \
    >"$nodes_log" 2>&1 &
  nodes_pid=$!
fi
cargo test --test e2e --no-fail-fast -- --test-threads="${E2E_THREADS:-4}" "${split[@]}" "$@" \
  2>&1 | tee "$log"
e2e_status=${PIPESTATUS[0]}
nodes_status=0
if [ -n "$nodes_pid" ]; then
  wait "$nodes_pid"
  nodes_status=$?
  cat "$nodes_log" | tee -a "$log"
fi
wait "$helm_pid"
helm_status=$?
cat "$helm_log" | tee -a "$log"
wait "$image_pid"
image_status=$?
if [ "$image_status" -eq 0 ]; then
  rm -rf target/image && mv "$full_image" target/image
else
  cat "$image_log"
  echo "hack/image.sh (amd64 and arm64) failed" | tee -a "$log"
fi
cargo test --workspace --no-fail-fast --lib --bins "${others[@]}" -- "$@" 2>&1 | tee -a "$log"
rest_status=${PIPESTATUS[0]}
set -e
passed=$(grep -oE 'test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -E 'test result:' "$log" | grep -oE '[0-9]+ failed' | awk '{s += $1} END {print s + 0}')
echo "total: $passed passed, $failed failed"
[ "$e2e_status" -eq 0 ] && [ "$nodes_status" -eq 0 ] && [ "$helm_status" -eq 0 ] &&
  [ "$image_status" -eq 0 ] && [ "$rest_status" -eq 0 ]
