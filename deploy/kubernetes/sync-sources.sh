#!/usr/bin/env bash
# Copies the two source files that kustomize generators read into the kustomization roots.
#
# kustomize refuses files outside a kustomization's own folder (its default load restrictor, which
# `kubectl apply -k` cannot turn off), and it refuses symlinks that point outside too. So the
# generators read in-tree copies, and tests/deploy/test_kustomize.py fails when a copy drifts from
# its source. Run this after editing either source:
#
#   billing/pricebooks/default.yaml  -> deploy/kubernetes/base/pricebook/default.yaml
#   deploy/alertmanager/alertmanager.yml -> deploy/kubernetes/alertmanager-example/alertmanager.yaml
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cp "$root/billing/pricebooks/default.yaml" "$here/base/pricebook/default.yaml"
cp "$root/deploy/alertmanager/alertmanager.yml" "$here/alertmanager-example/alertmanager.yaml"
echo "synced price book and Alertmanager example into deploy/kubernetes/"
