#!/usr/bin/env bash
# Runs every test: unit tests, tests against real ClickHouse and ZooKeeper servers, and the
# end-to-end tests on the real local Kubernetes (started and stopped by the tests themselves).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash hack/setup.sh
cargo build --workspace --quiet
exec cargo test --workspace --no-fail-fast "$@"
