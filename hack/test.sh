#!/usr/bin/env bash
# Runs every test: unit tests, tests against real ClickHouse and ZooKeeper servers, and the
# end-to-end tests on the real local Kubernetes (started and stopped by the tests themselves).
# Ends with one line that adds up every test binary's results.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash hack/setup.sh
# the operator's image and packaged charts (target/image/): the image tests read them, and the
# local Kubernetes of the end-to-end tests runs the operator's pods from that image
bash hack/image.sh
cargo build --workspace --quiet
bash hack/next-operator.sh >/dev/null
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed=$(grep -oE 'test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -E 'test result:' "$log" | grep -oE '[0-9]+ failed' | awk '{s += $1} END {print s + 0}')
echo "total: $passed passed, $failed failed"
exit "$status"
