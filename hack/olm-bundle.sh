#!/usr/bin/env bash
# Writes the OLM bundle deploy/olm/ (docs/olm.md) from the operator chart, rendered by
# `helm template` with its defaults, and the CRDs `clickhouse-operator crd` prints: the
# ClusterServiceVersion (the chart's Deployments and RBAC as its install strategy), the CRDs,
# the chart's other objects a bundle carries, metadata/annotations.yaml and bundle.Dockerfile.
# The generator is the drift test `cargo test --test olm`, which fails when the committed bundle
# differs; this runs it in its writing mode. CHOP_IMAGE_REPOSITORY names another image
# repository and CHOP_OLM_OUT another folder (a bundle for one's own registry, not committed):
#   CHOP_IMAGE_REPOSITORY=registry.example.com/team/clickhouse-operator CHOP_OLM_OUT=/tmp/bundle hack/olm-bundle.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CHOP_WRITE_OLM_BUNDLE=1 cargo test --quiet --test olm -- --exact \
  the_committed_olm_bundle_is_what_the_chart_and_the_crds_render
