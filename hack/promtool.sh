#!/usr/bin/env bash
# Builds promtool (Prometheus module v$PROMETHEUS_VERSION, hack/versions.env) from Go modules
# with `go install`, into a cache folder outside the repository keyed by version, like
# hack/helm.sh. The chart's alert rules are checked and unit-tested with it
# (tests/helm/monitoring.rs). A second run builds nothing (about 7 minutes on 2 cores the first
# time, downloads included).
# Prints the path of the promtool binary on its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/versions.env"
CACHE_ROOT="${CHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clickhouse-operator}"
DIR="$CACHE_ROOT/promtool-v${PROMETHEUS_VERSION}"
if [ ! -x "$DIR/promtool" ]; then
  command -v go >/dev/null 2>&1 || { echo "go is missing: promtool is built from Go modules; install Go >= 1.25" >&2; exit 1; }
  echo ">> building promtool (go install github.com/prometheus/prometheus/cmd/promtool@v$PROMETHEUS_VERSION)" >&2
  t0=$SECONDS
  mkdir -p "$DIR"
  tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOBIN="$tmp" go install -trimpath -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@v$PROMETHEUS_VERSION"
  mv "$tmp/promtool" "$DIR/promtool"
  echo ">> promtool built in $((SECONDS - t0)) s" >&2
fi
echo "$DIR/promtool"
