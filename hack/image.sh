#!/usr/bin/env bash
# Builds what users install, without a container daemon, into target/image/:
#   oci/                                    the operator's image as an OCI image layout folder: an
#                                           image index of linux/amd64 and linux/arm64
#   clickhouse-operator-<version>.oci.tar   the same as one archive
#   clickhouse-operator-<version>.spdx.json its SBOM (SPDX 2.3): every package of Cargo.lock
#   clickhouse-operator-<version>.provenance.json  its provenance (an in-toto Statement with a
#                                           SLSA v1 predicate): inputs, toolchain, subject digests
#   clickhouse-operator-<version>.tgz       the operator's chart, packaged, naming that image
#   onprem-clickhouse-cluster-<version>.tgz the cluster chart, packaged
#   image.env                               IMAGE (the reference), DIGEST (the index's), VERSION,
#                                           DIGEST_AMD64 and DIGEST_ARM64 (each platform's manifest)
#
# The version is Cargo.toml's (the charts' version and appVersion are checked equal to it by
# `cargo test --test image`); the repository is the operator chart's `image.repository`, or
# CHOP_IMAGE_REPOSITORY (e.g. registry.example.com/team/clickhouse-operator) when set, which is
# then also written into the packaged chart. Push with any OCI tool, both platforms at once, e.g.
#   skopeo copy --all oci:target/image/oci:$VERSION docker://$IMAGE    crane push target/image/oci $IMAGE
#
# Each binary is static (glibc, crt-static), built with --locked from Cargo.lock for its Rust
# target (x86_64-unknown-linux-gnu; aarch64-unknown-linux-gnu cross-compiled with Debian's
# gcc-aarch64-linux-gnu and libc6-dev-arm64-cross, which hack/setup.sh installs), with the paths
# of this machine removed and its symbols stripped; the image's labels name the Rust toolchain
# and the CA bundle's package version. hack/oci-image.py writes the image from them
# deterministically (same inputs, same digests); hack/attestations.py the SBOM and provenance.
# The SBOM and provenance are files next to the layout, not referrers inside it (see
# docs/operations.md, "The image").
#
# CHOP_IMAGE_OUT writes into another folder; CHOP_IMAGE_PLATFORMS=amd64 builds the amd64 image
# alone (what the local Kubernetes of the tests runs; hack/test.sh builds the whole image beside
# the end-to-end tests and puts it in place before the image tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT="${CHOP_IMAGE_OUT:-$ROOT/target/image}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
CHART_REPO="$(sed -n 's/^  repository: *//p' charts/clickhouse-operator/values.yaml | head -n 1)"
REPOSITORY="${CHOP_IMAGE_REPOSITORY:-$CHART_REPO}"
[[ "$REPOSITORY" =~ ^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?$ ]] || { echo "image repository '$REPOSITORY' is not valid" >&2; exit 2; }
IMAGE="$REPOSITORY:$VERSION"

# Rust target, OCI architecture, the binutils prefix of its toolchain
PLATFORMS=(x86_64-unknown-linux-gnu:amd64: aarch64-unknown-linux-gnu:arm64:aarch64-linux-gnu-)
case "${CHOP_IMAGE_PLATFORMS:-amd64,arm64}" in
  amd64,arm64) ;;
  amd64) PLATFORMS=("${PLATFORMS[0]}") ;;
  *) echo "CHOP_IMAGE_PLATFORMS is amd64,arm64 (the default) or amd64" >&2; exit 2 ;;
esac
RUSTFLAGS_IMAGE="-C target-feature=+crt-static --remap-path-prefix=$ROOT=/src --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
mkdir -p "$OUT"
binaries=()
for p in "${PLATFORMS[@]}"; do
  IFS=: read -r target arch prefix <<<"$p"
  if [ -n "$prefix" ]; then
    command -v "${prefix}gcc" >/dev/null || { echo "${prefix}gcc is missing: run hack/setup.sh (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross)" >&2; exit 1; }
    upper="$(echo "$target" | tr 'a-z-' 'A-Z_')"
    export "CARGO_TARGET_${upper}_LINKER=${prefix}gcc" "CC_${target//-/_}=${prefix}gcc" "AR_${target//-/_}=${prefix}ar"
  fi
  echo ">> building the static operator binary ($target, release)" >&2
  t0=$SECONDS
  RUSTFLAGS="$RUSTFLAGS_IMAGE" \
    cargo build --release --locked --quiet --target "$target" -p clickhouse-operator --bin clickhouse-operator
  echo ">> $target: $((SECONDS - t0)) s" >&2
  BIN="$OUT/clickhouse-operator-linux-$arch"
  "${prefix}strip" --strip-all -o "$BIN.tmp" "$ROOT/target/$target/release/clickhouse-operator"
  mv "$BIN.tmp" "$BIN"
  if readelf -l "$BIN" | grep -q 'program interpreter'; then
    echo "$BIN is not static" >&2
    exit 1
  fi
  binaries+=(--binary "$arch=$BIN")
done
rm -f "$OUT/clickhouse-operator"
[ "${#PLATFORMS[@]}" -eq 1 ] && rm -f "$OUT/clickhouse-operator-linux-arm64"

CA=/etc/ssl/certs/ca-certificates.crt
[ -s "$CA" ] || { echo "$CA is missing: install Debian's ca-certificates" >&2; exit 1; }
CA_VERSION="$(dpkg-query -W -f '${Version}' ca-certificates 2>/dev/null || echo unknown)"
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then REVISION="$REVISION-dirty"; fi
CREATED="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
rm -f "$OUT"/*.tgz "$OUT"/*.oci.tar "$OUT"/*.spdx.json "$OUT"/*.provenance.json
ARCHIVE="$OUT/clickhouse-operator-$VERSION.oci.tar"
written="$(python3 hack/oci-image.py "${binaries[@]}" --ca-bundle "$CA" --ref "$IMAGE" \
  --version "$VERSION" --revision "$REVISION" --created "$CREATED" \
  --label "io.clickhouse-operator.rust=$(rustc --version | cut -d' ' -f2)" \
  --label "io.clickhouse-operator.ca-certificates=$CA_VERSION" \
  --out "$OUT/oci" --archive "$ARCHIVE")"
DIGEST="$(head -n 1 <<<"$written")"
DIGEST_AMD64="$(sed -n 's/^amd64 //p' <<<"$written")"
DIGEST_ARM64="$(sed -n 's/^arm64 //p' <<<"$written")"

echo ">> writing the SBOM and the provenance" >&2
meta="$(mktemp)"; resolve="$(mktemp)"
trap 'rm -f "$meta" "$resolve"' EXIT
cargo metadata --format-version 1 --locked >"$meta"
cargo metadata --format-version 1 --locked --filter-platform x86_64-unknown-linux-gnu \
  --filter-platform aarch64-unknown-linux-gnu >"$resolve"
python3 hack/attestations.py sbom --lock Cargo.lock --metadata "$meta" --resolve "$resolve" \
  --name clickhouse-operator --version "$VERSION" --image-digest "$DIGEST" --created "$CREATED" \
  --out "$OUT/clickhouse-operator-$VERSION.spdx.json"
arm64_subject=() arm64_byproduct=() platforms=linux/amd64
if [ -n "$DIGEST_ARM64" ]; then
  arm64_subject=(--subject "$IMAGE linux/arm64=$DIGEST_ARM64")
  arm64_byproduct=(--byproduct "clickhouse-operator linux/arm64=$OUT/clickhouse-operator-linux-arm64")
  platforms=linux/amd64,linux/arm64
fi
deb_version() { dpkg-query -W -f '${Version}' "$1" 2>/dev/null || echo unknown; }
python3 hack/attestations.py provenance \
  --subject "$IMAGE=$DIGEST" \
  --subject "$IMAGE linux/amd64=$DIGEST_AMD64" \
  "${arm64_subject[@]}" \
  --subject "$(basename "$ARCHIVE")=sha256:$(sha256sum "$ARCHIVE" | cut -d' ' -f1)" \
  --byproduct "clickhouse-operator linux/amd64=$OUT/clickhouse-operator-linux-amd64" \
  "${arm64_byproduct[@]}" \
  --param "version=$VERSION" --param "imageRepository=$REPOSITORY" \
  --param "platforms=$platforms" \
  --internal "cargo=cargo build --release --locked -p clickhouse-operator --bin clickhouse-operator" \
  --internal "rustflags=-C target-feature=+crt-static --remap-path-prefix=<repo>=/src --remap-path-prefix=<cargo home>=/cargo" \
  --internal "sourceDateEpoch=$CREATED" \
  --dependency "source=git:$REVISION" \
  --dependency "Cargo.lock=sha256:$(sha256sum Cargo.lock | cut -d' ' -f1)" \
  --dependency "rustc=$(rustc --version)" \
  --dependency "cargo=$(cargo --version)" \
  --dependency "ca-certificates.crt=sha256:$(sha256sum "$CA" | cut -d' ' -f1)" \
  --dependency "ca-certificates=$CA_VERSION" \
  --dependency "libc6-dev=$(deb_version libc6-dev)" \
  --dependency "gcc-aarch64-linux-gnu=$(deb_version gcc-aarch64-linux-gnu)" \
  --dependency "libc6-dev-arm64-cross=$(deb_version libc6-dev-arm64-cross)" \
  --out "$OUT/clickhouse-operator-$VERSION.provenance.json"

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
printf 'IMAGE=%s\nDIGEST=%s\nVERSION=%s\nDIGEST_AMD64=%s\nDIGEST_ARM64=%s\n' "$IMAGE" "$DIGEST" "$VERSION" \
  "$DIGEST_AMD64" "$DIGEST_ARM64" >"$OUT/image.env"
echo ">> $IMAGE@$DIGEST" >&2
ls -1 "$OUT" >&2
