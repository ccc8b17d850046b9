// Is the node being calibrated: a stale matrix, an unreadable idle gate, a state file that
// cannot be saved, a node never idle, probe cells that keep failing.
local p = import '../lib/promql.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    local t = c.thresholds,
    local node = p.node(c),
    local a(name, summary, description) = p.annotations(c, name, summary, description),
    local stale = 'A node\'s calibration is out of date.',
    groups+: [
      {
        name: 'chd-calibration',
        rules: [
          {
            alert: 'ChdProbeStale',
            // The last successful H2D window is too old.
            expr: |||
              time() - chd_probe_last_success_timestamp_seconds{probe="h2d"} > %d
              unless on (%s) chd_idle_windows_total{outcome="disabled"} > 0
            ||| % [t.probeStaleSeconds, node],
            labels: { severity: c.severities.default, reason: 'too_old' },
            annotations: a('ChdProbeStale', stale, |||
              chd on {{ $labels.instance }} last measured H2D cells {{ $value | humanizeDuration }}
              ago (chd_probe_last_success_timestamp_seconds), so its matrix and alerts describe
              the past.
            |||),
          },
          {
            alert: 'ChdProbeStale',
            // Up for the `for` without any successful H2D window since it started.
            expr: |||
              max without (version, backend) (chd_build_info)
              unless on (%s) chd_probe_last_success_timestamp_seconds{probe="h2d"}
              unless on (%s) chd_idle_windows_total{outcome="disabled"} > 0
            ||| % [node, node],
            'for': c['for'].probeStale,
            labels: { severity: c.severities.default, reason: 'never_succeeded' },
            annotations: a('ChdProbeStale', stale, |||
              chd on {{ $labels.instance }} has been up for %s without one successful H2D probe
              window (no chd_probe_last_success_timestamp_seconds), so its matrix is empty or
              restored from an old state file.
            ||| % p.human(c['for'].probeStale)),
          },
          {
            alert: 'ChdIdleGateUnreadable',
            // The gate fails closed: a tick whose inputs (/proc/stat, chd's /proc/self/stat,
            // device utilization or processes) cannot be read is skipped as gate_error. A
            // blip costs a tick; 30 minutes of them means the node is not being calibrated.
            expr: |||
              sum without (outcome) (increase(chd_idle_windows_total{outcome="gate_error"}[15m])) > 0
            |||,
            'for': c['for'].gateUnreadable,
            labels: { severity: c.severities.default },
            annotations: a('ChdIdleGateUnreadable', 'The idle gate of chd cannot read its inputs.', |||
              For %s chd on {{ $labels.instance }} skipped its probe windows because it could not
              read what its idle gate needs (chd_idle_windows_total{outcome="gate_error"}: {{
              $value | humanize }} ticks in the last 15 minutes). chd does not probe when it
              cannot tell whether the node is idle, so calibration has stopped.
            ||| % p.human(c['for'].gateUnreadable)),
          },
          {
            alert: 'ChdStateNotSaved',
            // chd saves state.json after every probed window. A failed save costs nothing
            // while chd runs (the next good save writes everything), but a restart would
            // lose what was measured since the last good one. One failed save stays quiet.
            expr: |||
              increase(chd_state_save_errors_total[15m]) > 0
            |||,
            'for': c['for'].stateNotSaved,
            labels: { severity: c.severities.default },
            annotations: a('ChdStateNotSaved', 'The state file of chd cannot be saved.', |||
              For %s chd on {{ $labels.instance }} has failed to write state.json ({{
              $labels.reason }}: {{ $value | humanize }} failed saves in the last 15 minutes,
              chd_state_save_errors_total). Probing goes on with the matrix in memory, but a
              restart now loses everything measured since the last successful save.
            ||| % p.human(c['for'].stateNotSaved)),
          },
          {
            alert: 'ChdNoIdleWindow',
            // Busy ticks and no probed tick in 24 h, on a node monitored for at least 23 h
            // (the `offset` guard keeps a freshly added node quiet).
            expr: |||
              sum without (outcome) (instance_outcome:chd_idle_windows:increase24h{outcome=~"cpu_busy|device_busy"}) > 0
              unless on (%s)
                instance_outcome:chd_idle_windows:increase24h{outcome="probed"} > 0
              and on (%s)
                chd_idle_windows_total{outcome="probed"} offset 23h
            ||| % [node, node],
            labels: { severity: c.severities.noIdleWindow },
            annotations: a('ChdNoIdleWindow', 'A node was never idle enough to calibrate in 24 hours.', |||
              All {{ $value | humanize }} scheduler ticks of chd on {{ $labels.instance }} in the
              last 24 hours were skipped because CPUs or devices were busy
              (chd_idle_windows_total); calibration cannot run, so slow columns or cores on this
              node go unnoticed.
            |||),
          },
          {
            alert: 'ChdProbeErrors',
            // Errors that keep coming: some in every 30 minutes, for 30 minutes. A counter
            // series appears at its first error, which `increase` cannot see, so a series
            // absent 30 minutes ago counts too, but only on a node that was scraped then (a
            // node scraped for the first time, or after a gap, with old errors stays
            // silent). One failed cell stays silent.
            expr: |||
              increase(chd_probe_errors_total[30m]) > 0
              or
              sum without () (
                  (chd_probe_errors_total unless chd_probe_errors_total offset 30m)
                and on (%s)
                  chd_build_info offset 30m
              ) > 0
            ||| % node,
            'for': c['for'].probeErrors,
            labels: { severity: c.severities.default },
            annotations: a('ChdProbeErrors', 'Probe cells keep failing on a node.', |||
              {{ $value | humanize }} {{ $labels.probe }} probe cells on device {{ $labels.device }}
              of {{ $labels.instance }} failed with reason {{ $labels.reason }} in the last 30
              minutes, and failures have kept coming for %s (chd_probe_errors_total); those cells
              keep their old values or stay unmeasured.
            ||| % p.human(c['for'].probeErrors)),
          },
        ],
      },
    ],
  },
}
