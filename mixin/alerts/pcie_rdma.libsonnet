// Links and rails: a PCIe link trained low or reporting AER errors, an RDMA port that went
// down, one that keeps counting errors, a rail that carries less than the others.
local p = import '../lib/promql.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    local t = c.thresholds,
    local a(name, summary, description) = p.annotations(c, name, summary, description),
    local port = p.nodeAnd(c, ['hca', 'port']),
    local step = c.rdmaPortLookbackStep,
    // A port that was ACTIVE (4) within the lookback and is not now: a port never ACTIVE
    // in it (never cabled, unused) is not down, it was never up.
    local wasActive = |||
      chd_rdma_port_state != 4
      and on (%s)
        max_over_time(chd_rdma_port_state[%s:%s]) >= 4
    ||| % [port, t.rdmaPortLookback, step],
    local carriedTraffic = |||
      max_over_time(instance_hca_port:chd_rdma_port_data_bytes:rate5m[%s:%s]) > %g
    ||| % [t.rdmaPortLookback, step, t.rdmaPortTrafficBytesPerSecond],
    local portDown(severity, op, adjective) = {
      alert: 'ChdRdmaPortDown',
      expr: wasActive + '%s on (%s)\n  ' % [op, port] + carriedTraffic,
      'for': c['for'].rdmaPortDown,
      labels: { severity: severity },
      annotations: a('ChdRdmaPortDown', 'An RDMA port that was ACTIVE is down.', |||
        Port {{ $labels.port }} of {{ $labels.hca }} on {{ $labels.instance }} has been in state
        {{ $value }} (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE) for %s after being ACTIVE within %s;
        it %s. Physical state now: {{ with printf
        `chd_rdma_port_physical_state{@SEL@,hca=%%q,port=%%q}` @ARGS@ $labels.hca $labels.port |
        query }}{{ . | first | value }}{{ else }}unknown{{ end }} (2 Polling: cable or peer gone,
        3 Disabled, 5 LinkUp).
      ||| % [p.human(c['for'].rdmaPortDown), p.human(t.rdmaPortLookback), adjective]),
    },
    // The IB PortCounters error counters except VL15_dropped (subnet-management packets
    // dropped on a busy port, harmless), and the driver's retry-exhaustion counters.
    local errors(range) = |||
      increase(chd_rdma_port_errors_total{counter!="VL15_dropped"}[%s])
      or
      increase(chd_rdma_hw_counters_total{counter=~".*retries_exceeded|.*retry_exceeded.*|rnr_nak_retry_err|local_ack_timeout_err"}[%s])
    ||| % [range, range],
    groups+: [
      {
        name: 'chd-pcie-rdma',
        rules: [
          {
            alert: 'ChdPcieLinkDegraded',
            // Width and speed are two alerts per device (label `link`), each with
            // current/max. An idle NVIDIA GPU lowers its link speed (power management) and
            // raises it under load: a device whose link chd read right after its copies at
            // full speed (chd_device_pcie_link_bandwidth_bytes_per_second current = max) is
            // not degraded in speed, whatever sysfs says at scrape time.
            expr: |||
              label_replace(
                  chd_device_pcie_link_width{state="current"}
                / ignoring (state) chd_device_pcie_link_width{state="max"}
                < 1,
                "link", "width", "", ""
              )
              or
              label_replace(
                  chd_device_pcie_link_speed_transfers_per_second{state="current"}
                / ignoring (state) chd_device_pcie_link_speed_transfers_per_second{state="max"}
                < 1
                unless on (%s)
                  (
                      chd_device_pcie_link_bandwidth_bytes_per_second{state="current"}
                    >= ignoring (state)
                      chd_device_pcie_link_bandwidth_bytes_per_second{state="max"}
                  ),
                "link", "speed", "", ""
              )
            ||| % p.nodeAnd(c, ['device']),
            'for': c['for'].pcieLink,
            labels: { severity: c.severities.default },
            annotations: a('ChdPcieLinkDegraded', 'A PCIe link trained below its maximum width or speed.', |||
              The PCIe link of device {{ $labels.device }} on {{ $labels.instance }} trained at {{
              $value | humanizePercentage }} of its maximum {{ $labels.link }}
              (current_link_{{ $labels.link }} / max_link_{{ $labels.link }} in sysfs) for %s.
              Every copy to or from the device is capped by it (a Gen5 x8 link tops out near 25
              GB/s). Now: PCIe link {{ with printf
              `chd_device_pcie_link_width{@SEL@,device=%%q,state="current"}` @ARGS@ $labels.device |
              query }}x{{ . | first | value }}{{ else }}unknown{{ end }} of {{ with printf
              `chd_device_pcie_link_width{@SEL@,device=%%q,state="max"}` @ARGS@ $labels.device | query
              }}x{{ . | first | value }}{{ else }}unknown{{ end }} at {{ with printf
              `chd_device_pcie_link_speed_transfers_per_second{@SEL@,device=%%q,state="current"}`
              @ARGS@ $labels.device | query }}{{ . | first | value | humanize }}T/s{{ else }}unknown{{
              end }} of {{ with printf
              `chd_device_pcie_link_speed_transfers_per_second{@SEL@,device=%%q,state="max"}` @ARGS@
              $labels.device | query }}{{ . | first | value | humanize }}T/s{{ else }}unknown{{ end }}.
            ||| % p.human(c['for'].pcieLink)),
          },
          {
            alert: 'ChdPcieAerErrors',
            // `severity` is the metric's label (correctable, nonfatal, fatal) and would
            // clash with the alert's: the alert says `aer` instead. Any uncorrectable error
            // counts; correctable ones only at a sustained rate (a healthy link logs a few).
            expr: |||
              label_replace(
                sum without (severity) (increase(chd_device_pcie_aer_errors_total{severity=~"nonfatal|fatal"}[30m])) > 0,
                "aer", "uncorrectable", "", ""
              )
              or
              label_replace(
                sum without (severity) (rate(chd_device_pcie_aer_errors_total{severity="correctable"}[30m])) * 60 > %g,
                "aer", "correctable", "", ""
              )
            ||| % t.aerCorrectablePerMinute,
            'for': c['for'].aerErrors,
            labels: { severity: c.severities.default },
            annotations: a('ChdPcieAerErrors', 'A PCIe link reports AER errors.', |||
              The PCIe link of device {{ $labels.device }} on {{ $labels.instance }} reports {{ if
              eq $labels.aer "uncorrectable" }}{{ $value | humanize }} uncorrectable (nonfatal or
              fatal) AER errors in the last 30 minutes: the device or its link lost
              transactions{{ else }}{{ $value | humanize }} correctable AER errors a minute over
              the last 30 minutes, more than %g: the link replays or retrains, and its
              bandwidth suffers{{ end }} (chd_device_pcie_aer_errors_total).
            ||| % t.aerCorrectablePerMinute),
          },
          portDown(c.severities.rdmaPortDownWithTraffic, 'and', 'carried traffic within that time: collectives on this rail fail or fall back to the other rails'),
          portDown(c.severities.default, 'unless', 'carried no traffic within that time, so no job used it yet'),
          {
            alert: 'ChdRdmaPortErrors',
            // Errors that keep coming: some in every 15 minutes for 30 minutes. One burst
            // (a cable reseated, a switch reboot) stays silent. One alert per port, whatever
            // the counters.
            expr: |||
              sum without (counter) (
                %s) > 0
            ||| % std.rstripChars(errors('15m'), '\n'),
            'for': c['for'].rdmaErrors,
            labels: { severity: c.severities.default },
            annotations: a('ChdRdmaPortErrors', 'An RDMA port keeps counting errors.', |||
              Port {{ $labels.port }} of {{ $labels.hca }} on {{ $labels.instance }} counted {{ $value
              | humanize }} errors in the last 15 minutes, and errors have kept coming for %s: {{
              range $i, $s := printf `increase(chd_rdma_port_errors_total{@SEL@,hca=%%q,port=%%q,counter!="VL15_dropped"}[15m]) > 0
              or increase(chd_rdma_hw_counters_total{@SEL@,hca=%%q,port=%%q,counter=~".*retries_exceeded|.*retry_exceeded.*|rnr_nak_retry_err|local_ack_timeout_err"}[15m]) > 0`
              @ARGS@ $labels.hca $labels.port @ARGS@ $labels.hca $labels.port | query | sortByLabel
              "counter" }}{{ if $i }}, {{ end }}{{ $s.Labels.counter }} +{{ $s.Value | humanize }}{{ end }}.
            ||| % p.human(c['for'].rdmaErrors)),
          },
          {
            alert: 'ChdRdmaRailImbalance',
            // Each rail against the mean of the node's other rails (so a node needs two
            // rails), only while the node moves more than 1 GB/s in all.
            expr: |||
              (
                  instance_hca_port:chd_rdma_port_data_bytes:rate5m
                / (
                      (
                          sum without (hca, port) (instance_hca_port:chd_rdma_port_data_bytes:rate5m)
                        - ignoring (hca, port) group_right ()
                          instance_hca_port:chd_rdma_port_data_bytes:rate5m
                      )
                    / ignoring (hca, port) group_left ()
                      (count without (hca, port) (instance_hca_port:chd_rdma_port_data_bytes:rate5m) - 1)
                  )
              )
              < %g
              and ignoring (hca, port)
                count without (hca, port) (instance_hca_port:chd_rdma_port_data_bytes:rate5m) > 1
              and ignoring (hca, port)
                sum without (hca, port) (instance_hca_port:chd_rdma_port_data_bytes:rate5m) > %g
            ||| % [t.railImbalanceRatio, t.railMinNodeBytesPerSecond],
            'for': c['for'].railImbalance,
            labels: { severity: c.severities.default },
            annotations: a('ChdRdmaRailImbalance', 'An RDMA rail carries much less traffic than the other rails of its node.', |||
              Port {{ $labels.port }} of {{ $labels.hca }} on {{ $labels.instance }} moved {{ $value |
              humanizePercentage }} of the mean of the node's other rails (transmit + receive,
              5-minute rate) for %s while the node moved more than %s in all.
            ||| % [p.human(c['for'].railImbalance), '%g GB/s' % (t.railMinNodeBytesPerSecond / 1e9)]),
          },
        ],
      },
    ],
  },
}
