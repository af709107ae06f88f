#!/usr/bin/env bash
# Builds what users install, without a container daemon, into target/image/:
#   oci/                                    the operator's image as an OCI image layout folder
#   clickhouse-operator-<version>.oci.tar   the same as one archive
#   clickhouse-operator-<version>.tgz       the operator's chart, packaged, naming that image
#   onprem-clickhouse-cluster-<version>.tgz the cluster chart, packaged
#   image.env                               IMAGE (the reference), DIGEST, VERSION
#
# The version is Cargo.toml's (the charts' version and appVersion are checked equal to it by
# `cargo test --test image`); the repository is the operator chart's `image.repository`, or
# CHOP_IMAGE_REPOSITORY (e.g. registry.example.com/team/clickhouse-operator) when set, which is
# then also written into the packaged chart. Push with any OCI tool, e.g.
#   skopeo copy oci:target/image/oci:$VERSION docker://$IMAGE    crane push target/image/oci $IMAGE
#
# The binary is static (glibc, crt-static), built with --locked from Cargo.lock, with the paths
# of this machine removed and its symbols stripped; the image's labels name the Rust toolchain
# and the CA bundle's package version. hack/oci-image.py writes the image from them
# deterministically (same inputs, same digest).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT="$ROOT/target/image"
TARGET=x86_64-unknown-linux-gnu
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
CHART_REPO="$(sed -n 's/^  repository: *//p' charts/clickhouse-operator/values.yaml | head -n 1)"
REPOSITORY="${CHOP_IMAGE_REPOSITORY:-$CHART_REPO}"
[[ "$REPOSITORY" =~ ^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?$ ]] || { echo "image repository '$REPOSITORY' is not valid" >&2; exit 2; }
IMAGE="$REPOSITORY:$VERSION"

echo ">> building the static operator binary ($TARGET, release)" >&2
RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$ROOT=/src --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo" \
  cargo build --release --locked --quiet --target "$TARGET" -p clickhouse-operator --bin clickhouse-operator
mkdir -p "$OUT"
BIN="$OUT/clickhouse-operator"
strip --strip-all -o "$BIN.tmp" "$ROOT/target/$TARGET/release/clickhouse-operator"
mv "$BIN.tmp" "$BIN"
if readelf -l "$BIN" | grep -q 'program interpreter'; then
  echo "$BIN is not static" >&2
  exit 1
fi

CA=/etc/ssl/certs/ca-certificates.crt
[ -s "$CA" ] || { echo "$CA is missing: install Debian's ca-certificates" >&2; exit 1; }
CA_VERSION="$(dpkg-query -W -f '${Version}' ca-certificates 2>/dev/null || echo unknown)"
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then REVISION="$REVISION-dirty"; fi
CREATED="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
rm -f "$OUT"/*.tgz "$OUT"/*.oci.tar
DIGEST="$(python3 hack/oci-image.py --binary "$BIN" --ca-bundle "$CA" --ref "$IMAGE" \
  --version "$VERSION" --revision "$REVISION" --created "$CREATED" \
  --label "io.clickhouse-operator.rust=$(rustc --version | cut -d' ' -f2)" \
  --label "io.clickhouse-operator.ca-certificates=$CA_VERSION" \
  --out "$OUT/oci" --archive "$OUT/clickhouse-operator-$VERSION.oci.tar")"

echo ">> packaging the charts" >&2
HELM="$(bash hack/helm.sh | tail -n 1)"
rm -rf "$OUT/charts"
mkdir -p "$OUT/charts"
cp -r charts/clickhouse-operator charts/onprem-clickhouse-cluster "$OUT/charts/"
if [ "$REPOSITORY" != "$CHART_REPO" ]; then
  sed -i "0,/^  repository: .*/s||  repository: $REPOSITORY|" "$OUT/charts/clickhouse-operator/values.yaml"
fi
for c in clickhouse-operator onprem-clickhouse-cluster; do
  HELM_CONFIG_HOME="$OUT/helm-home" HELM_CACHE_HOME="$OUT/helm-home" HELM_DATA_HOME="$OUT/helm-home" \
    "$HELM" package "$OUT/charts/$c" --version "$VERSION" --app-version "$VERSION" -d "$OUT" >/dev/null
done
rm -rf "$OUT/charts" "$OUT/helm-home"
printf 'IMAGE=%s\nDIGEST=%s\nVERSION=%s\n' "$IMAGE" "$DIGEST" "$VERSION" >"$OUT/image.env"
echo ">> $IMAGE@$DIGEST" >&2
ls -1 "$OUT" >&2
