#!/usr/bin/env bash
# Builds the operator as its next patch version (CLICKHOUSE_OPERATOR_VERSION set at build time)
# into <target>/next-operator/clickhouse-operator, then the usual binary again, for the test that
# swaps one operator build for the next (tests/e2e/upgrade.rs). Run before `cargo test`: cargo
# keeps its build folder locked while tests run. Prints the path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
next="${version%.*}.$(( ${version##*.} + 1 ))"
CLICKHOUSE_OPERATOR_VERSION="$next" cargo build --quiet --bin clickhouse-operator
mkdir -p "$target/next-operator"
cp "$target/debug/clickhouse-operator" "$target/next-operator/clickhouse-operator"
cargo build --quiet --bin clickhouse-operator
echo "$target/next-operator/clickhouse-operator"
