#!/usr/bin/env bash
# Builds SeaweedFS's `weed` (an S3-compatible object store, for the backup tests) from Go modules,
# through the wrapper module in hack/s3bin (SeaweedFS's go.mod has a replace that `go install`
# refuses), into a cache folder outside the repository keyed by the pinned version. A second run
# builds nothing. Prints the binary's path on its last line.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${CHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clickhouse-operator}"
VERSION="$(sed -n 's/^require github.com\/seaweedfs\/seaweedfs \(.*\)$/\1/p' "$HERE/s3bin/go.mod")"
BIN="$CACHE_ROOT/seaweedfs-$VERSION/weed"
if [ ! -x "$BIN" ]; then
  mkdir -p "$(dirname "$BIN")"
  echo ">> building SeaweedFS $VERSION (several minutes, once)" >&2
  t0=$SECONDS
  (cd "$HERE/s3bin" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" \
    -o "$BIN.tmp" github.com/seaweedfs/seaweedfs/weed)
  mv "$BIN.tmp" "$BIN"
  echo ">> SeaweedFS built in $((SECONDS - t0)) s" >&2
fi
echo "$BIN"
