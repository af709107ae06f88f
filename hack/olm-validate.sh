#!/usr/bin/env bash
# Builds hack/olm-validate (a small Go main around operator-framework's validation library,
# github.com/operator-framework/api, the version its go.mod pins) with `go build` from the Go
# module proxy, into a cache folder outside the repository keyed by the hash of its sources,
# like hack/helm.sh. A second run builds nothing. Prints the path of the binary on its last
# line; run it as `olm-validate deploy/olm`.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$HERE/olm-validate"
CACHE_ROOT="${CHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clickhouse-operator}"
KEY="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)"
DIR="$CACHE_ROOT/olm-validate-$KEY"
if [ ! -x "$DIR/olm-validate" ]; then
  command -v go >/dev/null 2>&1 || { echo "go is missing: the OLM validator is built from Go modules; install Go >= 1.26" >&2; exit 1; }
  echo ">> building the OLM validator (github.com/operator-framework/api, $(grep -o 'operator-framework/api v[^ ]*' "$SRC/go.mod"))" >&2
  t0=$SECONDS
  mkdir -p "$DIR"
  tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$SRC" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" go build -trimpath -ldflags "-s -w" -o "$tmp/olm-validate" .)
  mv "$tmp/olm-validate" "$DIR/olm-validate"
  echo ">> the OLM validator built in $((SECONDS - t0)) s" >&2
fi
echo "$DIR/olm-validate"
