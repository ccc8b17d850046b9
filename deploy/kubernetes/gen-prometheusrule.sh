#!/usr/bin/env bash
# Regenerates deploy/kubernetes/base/prometheusrule.yaml from the rule files in alerts/
# (every top-level alerts/*.yml or *.yaml with a `groups:` key, in file-name order).
# The generator is the test that checks them: tests/deploy/prometheus_rule.rs, which fails whenever the two
# differ. Run this after changing alerts/, and commit both.
set -euo pipefail
cd "$(dirname "$0")/../.."
CHD_REGENERATE=1 cargo test --locked --quiet --test deploy -- --exact prometheus_rule::prometheus_rule_is_generated_from_alerts
echo "deploy/kubernetes/base/prometheusrule.yaml regenerated from alerts/"
