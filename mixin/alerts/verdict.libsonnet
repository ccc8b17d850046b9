// The node's own verdict (chd_node_verdict, the one `chd check` and the NFD feature file
// give): confirmed over schedule.verdict_confirm_windows windows and cleared after
// schedule.verdict_clear_windows, so it needs only a short `for`.
local p = import '../lib/promql.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    groups+: [
      {
        name: 'chd-verdict',
        rules: [
          {
            alert: 'ChdNodeVerdictFailed',
            expr: 'chd_node_verdict{verdict="failed"} == 1\n',
            'for': c['for'].verdictFailed,
            labels: { severity: c.severities.verdictFailed },
            annotations: p.annotations(c, 'ChdNodeVerdictFailed', 'A node failed chd\'s checks.', |||
              chd on {{ $labels.instance }} judges the node failed for %s ({{ with printf
              `chd_node_verdict_causes{@SEL@}` @ARGS@ | query }}{{ . | first | value }}
              finding(s){{ else }}its findings{{ end }}: a device column slow from every CPU, a
              device whose every cell fails, or a device its telemetry reports lost). `chd
              check` on the node prints the causes and exits non-zero; jobs placed on its
              devices run slow or fail.
            ||| % p.human(c['for'].verdictFailed)),
          },
          // Issue 27's repeat-offender alert (chd_node_verdict_changes_total: a node whose
          // verdict keeps flipping) belongs here, in this group, with its thresholds in
          // config.libsonnet (`for`, severity) and its section in docs/runbook.md.
        ],
      },
    ],
  },
}
