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
          // A repeat offender: the node's held verdict turned failed at least twice in a
          // day, so it failed, recovered and failed again. Slurm's drain (chd check --slurm)
          // and the NPD condition follow the verdict and undo themselves when it recovers;
          // this alert is for the person who decides whether the node stays out. increase()
          // takes chd restarts in its stride, and chd does not count the verdict settling
          // after a start as a change.
          {
            alert: 'ChdNodeFailedAgain',
            expr: 'sum without (from) (increase(chd_node_verdict_changes_total{to="failed"}[%s])) >= %d\n' % [c.failedAgainWindow, c.failedAgainTimes],
            labels: { severity: c.severities.default },
            annotations: p.annotations(c, 'ChdNodeFailedAgain', 'A node failed, recovered and failed again.', |||
              chd's verdict of {{ $labels.instance }} turned failed {{ $value | humanize }}
              times within %s (chd_node_verdict_changes_total{to="failed"}), recovering in
              between; now it is {{ with printf `chd_node_verdict{@SEL@} == 1` @ARGS@ | query
              }}{{ . | first | label "verdict" }}{{ else }}unknown{{ end }}. A fault that comes
              and goes (a device falling off the bus, a link retraining, a flaky riser) is
              drained and resumed automatically each time, and keeps failing jobs in between.
            ||| % p.human(c.failedAgainWindow)),
          },
        ],
      },
    ],
  },
}
