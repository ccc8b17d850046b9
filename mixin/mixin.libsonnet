// chd's monitoring mixin: prometheusAlerts, prometheusRules and grafanaDashboards from one
// _config (config.libsonnet). scripts/gen-mixin.py renders it into alerts/chd.rules.yml and
// dashboards/*.json; mixtool and jsonnet users import this file.
(import 'config.libsonnet')
+ (import 'alerts/alerts.libsonnet')
+ (import 'rules.libsonnet')
+ (import 'dashboards/dashboards.libsonnet')
