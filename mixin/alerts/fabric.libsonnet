// Between nodes: what `chd probe fabric` measured, as each node's chd serve publishes it
// (chd_fabric_*). A rail is judged against the node's other rails to the same peer, so a
// slow peer or a busy fabric moves every rail alike and pages nothing; one rail alone does.
local p = import '../lib/promql.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    local t = c.thresholds,
    local a(name, summary, description) = p.annotations(c, name, summary, description),
    groups+: [
      {
        name: 'chd-fabric',
        rules: [
          {
            alert: 'ChdFabricRailSlow',
            // analysis::fabric::RAIL_SLOW_RATIO: the rail's median over the last runs of
            // its per-run ratio to the median of the node's other rails, same peer, same
            // direction. A rail that carried nothing counts 0.
            expr: |||
              chd_fabric_rail_ratio < %g
            ||| % t.fabricRailSlowRatio,
            'for': c['for'].fabricRailSlow,
            labels: { severity: c.severities.default },
            annotations: a('ChdFabricRailSlow', 'One rail of a node carries much less than its other rails.', |||
              Rail {{ $labels.rail }} of {{ $labels.instance }} carries {{ $value |
              humanizePercentage }} of the node's other rails to the same peers ({{
              $labels.direction }}, chd_fabric_rail_ratio), slowest to {{ with printf
              `chd_fabric_rail_slowest_peer_gbps{@SEL@,rail=%q,direction=%q}` @ARGS@
              $labels.rail $labels.direction | query }}{{ . | first | label "peer" }} at {{ .
              | first | value | printf "%.2f" }} GB/s{{ else }}an unknown peer{{ end }}. The
              same peers over the other rails are fine, so the rail itself is the suspect: its
              NIC or HCA port, cable, switch port or the link's negotiated speed.
            |||),
          },
          {
            alert: 'ChdFabricNodeBelowFleet',
            // A node's collective over all ranks of its fabric runs below fleetRatio x the
            // median of its group's nodes, groups of fleetMinNodes or more (the recording
            // rule leaves smaller groups out): one alert per node, at its worst op and size.
            expr: |||
              min without (op, size_bytes) (
                instance_op_size:chd_fabric_collective_bus_gbps:fleet_ratio
              )
              < %g
            ||| % t.fleetRatio,
            'for': c['for'].fabricRailSlow,
            labels: { severity: c.severities.default },
            annotations: a('ChdFabricNodeBelowFleet', 'A node\'s collectives between nodes are much slower than the other nodes\'.', |||
              The collectives of {{ $labels.instance }}'s fabric runs reach {{ $value |
              humanizePercentage }} of the median node of its group at their worst operation and
              size (instance_op_size:chd_fabric_collective_bus_gbps:fleet_ratio, bus bandwidth as
              nccl-tests defines it). With its rails fine against each other (no
              ChdFabricRailSlow), the node as a whole is slow between nodes: its NICs' PCIe
              links, the CPUs its ranks ran on, or its uplinks; its fabric result files name the
              peers of each run.
            |||),
          },
          {
            alert: 'ChdFabricStale',
            // The newest successful fabric run of a node that has run the fabric probe is
            // too old, or every run the node keeps failed (its rails are unmeasured). Nodes
            // that never ran it have no series and stay silent.
            expr: |||
              (time() - chd_fabric_last_run_timestamp_seconds{outcome="ok"} > %d)
              or
              (
                time() - chd_fabric_last_run_timestamp_seconds{outcome="failed"}
                unless on (job, instance) chd_fabric_last_run_timestamp_seconds{outcome="ok"}
              )
            ||| % t.fabricStaleSeconds,
            labels: { severity: c.severities.default },
            annotations: a('ChdFabricStale', 'A node\'s fabric calibration is out of date.', |||
              {{ if eq $labels.outcome "ok" }}The newest successful fabric run of {{ $labels.instance }}
              finished {{ $value | humanizeDuration }} ago
              (chd_fabric_last_run_timestamp_seconds{outcome="ok"}), so its rail figures describe
              the past.{{ else }}Every fabric run {{ $labels.instance }} keeps failed (the newest
              {{ $value | humanizeDuration }} ago), so its rails are unmeasured: the errors are in
              its fabric result files and on the runs' stderr.{{ end }} The schedule that
              launches chd probe fabric (the sbatch round or the CronJob) has stopped reaching
              the node, or its runs fail (chd_fabric_runs{outcome="failed"}).
            |||),
          },
        ],
      },
    ],
  },
}
