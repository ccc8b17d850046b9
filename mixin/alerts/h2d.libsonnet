// The calibration's findings: a slow device column, device memory, the link, the device's
// own history, the node's fleet, a NUMA segment, slow or unbindable cores. One alert per
// device (or segment, or node): a finding seen at several copy sizes and in both directions
// is one problem, and so is a set of slow cores (their CPUs are listed in the description).
local p = import '../lib/promql.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    local t = c.thresholds,
    local large = p.largeCopies(c),
    local size = p.size(c.largeCopyMinBytes),
    local a(name, summary, description) = p.annotations(c, name, summary, description),
    // What chd knows of a device's slowness, from the node's own series.
    local cause = std.rstripChars(|||
      What chd knows of the cause: PCIe link {{ with printf
      `chd_device_pcie_link_width{@SEL@,device=%q,state="current"}` @ARGS@ $labels.device | query
      }}x{{ . | first | value }}{{ else }}unknown{{ end }} of {{ with printf
      `chd_device_pcie_link_width{@SEL@,device=%q,state="max"}` @ARGS@ $labels.device | query
      }}x{{ . | first | value }}{{ else }}unknown{{ end }} at {{ with printf
      `chd_device_pcie_link_speed_transfers_per_second{@SEL@,device=%q,state="current"}` @ARGS@
      $labels.device | query }}{{ . | first | value | humanize }}T/s{{ else }}unknown{{ end }} of
      {{ with printf `chd_device_pcie_link_speed_transfers_per_second{@SEL@,device=%q,state="max"}`
      @ARGS@ $labels.device | query }}{{ . | first | value | humanize }}T/s{{ else }}unknown{{ end
      }}; NUMA node {{ with printf `chd_device_info{@SEL@,device=%q}` @ARGS@ $labels.device | query
      }}{{ . | first | label "numa_node" }}{{ else }}unknown{{ end }} declared by sysfs, {{ with
      printf `chd_device_measured_numa_node{@SEL@,device=%q}` @ARGS@ $labels.device | query }}{{ .
      | first | value }}{{ else }}unknown{{ end }} measured best; device utilization now {{ with
      printf `chd_device_utilization_ratio{@SEL@,device=%q}` @ARGS@ $labels.device | query }}{{ . |
      first | value | humanizePercentage }}{{ else }}unknown{{ end }}
    |||, '\n'),
    groups+: [
      {
        name: 'chd-h2d',
        rules: [
          {
            alert: 'ChdH2DSlowDeviceColumn',
            // The ratio compares the column with the node's typical column, so a node whose
            // devices are all equally slow (a slow host) stays silent here.
            expr: |||
              min without (size_bytes, direction) (
                chd_h2d_device_ratio{%s}
              )
              < %g
            ||| % [large, t.slowDeviceRatio],
            'for': c['for'].column,
            labels: { severity: c.severities.default },
            annotations: a('ChdH2DSlowDeviceColumn', 'A device is fed much slower than the other devices of its node.', |||
              Device {{ $labels.device }} on {{ $labels.instance }} moves copies of %s and more
              at {{ $value | humanizePercentage }} of the node's typical device (the lowest
              chd_h2d_device_ratio over its sizes and directions) from every CPU, for %s. The
              other devices of the node are fine, so the device's own path is slow, not the
              host.
            ||| % [size, p.human(c['for'].column)] + cause + ' (chd probes only while the device is idle).'),
          },
          {
            alert: 'ChdD2DDeviceSlow',
            // Same-device copies (HBM to HBM) never leave the device, so neither the host nor
            // the PCIe link is in them: a device far below the node's median device is weak
            // itself. Idle devices of one node spread to 0.73 of their median in the
            // calibration runs.
            expr: |||
              min without (size_bytes) (chd_d2d_device_ratio) < %g
            ||| % t.slowD2dDeviceRatio,
            'for': c['for'].column,
            labels: { severity: c.severities.default },
            annotations: a('ChdD2DDeviceSlow', 'A device copies within its own memory much slower than its peers.', |||
              Device {{ $labels.device }} on {{ $labels.instance }} copies within its own memory at
              {{ $value | humanizePercentage }} of the median device of the node
              (chd_d2d_device_ratio), {{ with printf
              `min(chd_d2d_bandwidth_bytes_per_second{@SEL@,device=%%q})` @ARGS@ $labels.device |
              query }}{{ . | first | value | humanize }}B/s{{ else }}unknown{{ end }}, for %s. The
              copy never leaves the device, so the host and the PCIe link are not the cause:
              the device's memory or its clocks are.
            ||| % p.human(c['for'].column)),
          },
          {
            alert: 'ChdP2PPairSlow',
            // A peer copy is judged against the pairs of its own PCIe path class on the node
            // (PIX pairs against PIX pairs, SYS against SYS): a pair far below them is slower
            // than its place in the PCI tree promises (a degraded switch port or link,
            // peer access refused and the copies staged through the host).
            // The class median is the median of the node's measured pairs of the same path
            // (quantile 0.5, as analysis::p2p's median), so no ratio series is exported: one
            // per ordered pair would add 240 series at 16 devices to the node's budget.
            expr: |||
              chd_p2p_bandwidth_bytes_per_second
                / ignoring (src, dst) group_left
                  quantile without (src, dst) (0.5, chd_p2p_bandwidth_bytes_per_second)
              < %g
            ||| % t.slowP2pPairRatio,
            'for': c['for'].column,
            labels: { severity: c.severities.default },
            annotations: a('ChdP2PPairSlow', 'Peer copies between two devices are much slower than their path class.', |||
              Peer copies from device {{ $labels.src }} to device {{ $labels.dst }} on
              {{ $labels.instance }} run at {{ $value | humanizePercentage }} of the median of
              the node's {{ $labels.path }} pairs, {{ with printf
              `min(chd_p2p_bandwidth_bytes_per_second{@SEL@,src=%%q,dst=%%q})` @ARGS@ $labels.src
              $labels.dst | query }}{{ . | first | value | humanize }}B/s{{ else }}unknown{{ end }},
              for %s. Pairs of one path class cross the same kind of PCIe path, so the slow one's
              own path is: a switch port or link trained low, or peer access refused
              (chd_pair_probe_info method copy-staged).
            ||| % p.human(c['for'].column)),
          },
          {
            alert: 'ChdH2DBelowLink',
            // Physics: the column's median over the payload its PCIe link carries (as read
            // right after chd's copies). A node whose every device is slow for one reason
            // (IOMMU, BIOS, a runtime setting) has ratios near 1, so the column rule is blind
            // to it; a link that trained below its maximum is ChdPcieLinkDegraded's case.
            expr: |||
              min without (size_bytes, direction) (
                chd_h2d_link_efficiency_ratio{%s}
              )
              < %g
              unless on (%s)
                (
                    chd_device_pcie_link_bandwidth_bytes_per_second{state="current"}
                  < ignoring (state)
                    chd_device_pcie_link_bandwidth_bytes_per_second{state="max"}
                )
            ||| % [large, t.linkEfficiencyRatio, p.nodeAnd(c, ['device'])],
            'for': c['for'].column,
            labels: { severity: c.severities.default },
            annotations: a('ChdH2DBelowLink', 'Copies to a device reach a small share of its PCIe link.', |||
              Copies of %s and more to and from device {{ $labels.device }} on {{ $labels.instance }}
              reach {{ $value | humanizePercentage }} of the payload its PCIe link carries ({{ with
              printf `chd_device_pcie_link_bandwidth_bytes_per_second{@SEL@,device=%%q,state="current"}`
              @ARGS@ $labels.device | query }}{{ . | first | value | humanize }}B/s{{ end }}, the lowest
              chd_h2d_link_efficiency_ratio over sizes and directions), for %s, though the link
              trained at its maximum width and speed. Copies over a healthy link reach 0.8-0.9
              of it.
            ||| % [size, p.human(c['for'].column)]),
          },
          {
            alert: 'ChdH2DRegressed',
            // History: the column's median below 0.8 x its 7-day baseline (the median of its
            // hourly medians, recorded), for 2 hours, for a device with at least a day of
            // history (while a new node's matrix fills in, its medians move). A device that
            // was always slow keeps its ratio to itself at 1 (the column rule's case); one
            // bad day leaves the 7-day median where it was.
            expr: |||
              min without (size_bytes, direction, stat) (
                  chd_h2d_device_bandwidth_bytes_per_second{stat="median", %s}
                /
                  instance_device:chd_h2d_device_bandwidth_bytes_per_second:median7d
              )
              < %g
              and on (%s)
                chd_h2d_device_bandwidth_bytes_per_second{stat="median"} offset 1d
            ||| % [large, t.regressionRatio, p.nodeAnd(c, ['device'])],
            'for': c['for'].regression,
            labels: { severity: c.severities.default },
            annotations: a('ChdH2DRegressed', 'A device is fed slower than it used to be.', |||
              The column median of device {{ $labels.device }} on {{ $labels.instance }} (copies
              of %s and more) is at {{ $value | humanizePercentage }} of its own median over the
              last 7 days (instance_device:chd_h2d_device_bandwidth_bytes_per_second:median7d,
              the median of hourly medians), below %g, for %s: it used to be faster.
            ||| % [size, t.regressionRatio, p.human(c['for'].regression)]),
          },
          {
            alert: 'ChdH2DNodeBelowFleet',
            // Peers: the node's typical device (median of its device columns) below 0.7 x
            // the median of its fleet group's typical devices of the same model, for an
            // hour, in groups of 3 nodes or more (the recording rule leaves smaller groups
            // out). One alert per node and model, at its worst size and direction.
            expr: |||
              min without (size_bytes, direction) (
                instance_name:chd_h2d_device_median:fleet_ratio
              )
              < %g
            ||| % t.fleetRatio,
            'for': c['for'].fleet,
            labels: { severity: c.severities.default },
            annotations: a('ChdH2DNodeBelowFleet', 'A node feeds its devices much slower than the other nodes of its fleet.', |||
              {{ $size := "" }}{{ $dir := "" }}{{ with printf
              `bottomk(1, instance_name:chd_h2d_device_median:fleet_ratio{@SEL@,name=%%q})` @ARGS@
              $labels.name | query }}{{ with first . }}{{ $size = .Labels.size_bytes }}{{ $dir =
              .Labels.direction }}{{ end }}{{ end }}The typical {{ $labels.name }} device of {{
              $labels.instance }} moves {{ $size | humanize1024 }}B {{ $dir }} copies at {{ with
              printf
              `instance_name:chd_h2d_device_median:median{@SEL@,name=%%q,size_bytes=%%q,direction=%%q}`
              @ARGS@ $labels.name $size $dir | query }}{{ . | first | value | humanize }}B/s{{ end }}
              against a fleet median of {{ with printf
              `name:chd_h2d_device_median:fleet_median{@GSEL@,name=%%q,size_bytes=%%q,direction=%%q}`
              @GARGS@ $labels.name $size $dir | query }}{{ . | first | value | humanize }}B/s{{ end }}
              ({{ $value | humanizePercentage }}), for %s. Its links: {{ with printf `min
              without (device, state) (chd_device_pcie_link_width{@SEL@,state="current"})` @ARGS@ |
              query }}x{{ . | first | value }}{{ else }}unknown{{ end }} at {{ with printf `min without (device,
              state) (chd_device_pcie_link_speed_transfers_per_second{@SEL@,state="current"})` @ARGS@
              | query }}{{ . | first | value | humanize }}T/s{{ else }}unknown{{ end }}, {{ with printf `min without
              (device, state)
              (chd_device_pcie_link_bandwidth_bytes_per_second{@SEL@,state="current"})` @ARGS@ |
              query }}{{ . | first | value | humanize }}B/s{{ else }}unknown{{ end }} of payload, {{ with printf
              `min without (name, size_bytes, direction)
              (instance_name:chd_h2d_device_median:median{@SEL@,name=%%q,size_bytes=%%q,direction=%%q})
              / ignoring () min without (device, state)
              (chd_device_pcie_link_bandwidth_bytes_per_second{@SEL@,state="current"})` @ARGS@
              $labels.name $size $dir @ARGS@ | query }}{{ . | first | value | printf "%%.2f" }}{{ else }}an
              unknown share{{ end }} of the link: near 0.8 or more, the slot limits the node (narrower or slower links
              than its peers); far below, the host or its software does.
            ||| % p.human(c['for'].fleet)),
          },
          {
            alert: 'ChdH2DSlowNumaSegment',
            // Segment median over the device's median over all CPUs: the device itself may
            // be fine (its column ratio normal) while the CPUs of one NUMA node feed it
            // slowly.
            expr: |||
              min without (size_bytes, direction, stat) (
                  chd_h2d_segment_bandwidth_bytes_per_second{stat="median", %s}
                / ignoring (numa_node) group_left ()
                  chd_h2d_device_bandwidth_bytes_per_second{stat="median"}
              )
              < %g
            ||| % [large, t.slowSegmentRatio],
            'for': c['for'].column,
            labels: { severity: c.severities.default },
            annotations: a('ChdH2DSlowNumaSegment', 'The CPUs of one NUMA node feed a device slowly.', |||
              Copies of %s and more to or from device {{ $labels.device }} on {{ $labels.instance }}
              from the CPUs of NUMA node {{ $labels.numa_node }} run at {{ $value |
              humanizePercentage }} of that device's median over all CPUs, for %s. Ranks launched
              on those cores stage their data slowly.
            ||| % [size, p.human(c['for'].column)] + cause + '.'),
          },
          {
            alert: 'ChdPairCpuSlow',
            // One alert per node: the slow cores of every pair and rank are one problem of
            // the host (background load, IRQs), listed in the description.
            expr: |||
              min without (pair, rank, cpu) (chd_pair_cpu_ratio) < %g
            ||| % t.slowCpuRatio,
            'for': c['for'].column,
            labels: { severity: c.severities.default },
            annotations: a('ChdPairCpuSlow', 'Some CPUs slow the allgather of a device pair.', |||
              Allgather between the devices of a pair on {{ $labels.instance }} runs below %g of
              the pair matrix median whenever one rank is bound to these CPUs (chd_pair_cpu_ratio,
              the worst at {{ $value | humanizePercentage }}), for %s: {{ range $i, $s := printf
              `chd_pair_cpu_ratio{@SEL@} < %g` @ARGS@ | query | sortByLabel "cpu" }}{{ if $i }};
              {{ end }}CPU {{ $s.Labels.cpu }} (pair {{ $s.Labels.pair }}, rank {{ $s.Labels.rank
              }}, {{ $s.Value | humanizePercentage }}){{ end }}.
            ||| % [t.slowCpuRatio, p.human(c['for'].column), t.slowCpuRatio]),
          },
          {
            alert: 'ChdCpuNotBindable',
            // One alert per node, however many CPUs: a cpuset that leaves 640 CPUs out is one
            // problem.
            expr: |||
              count without (cpu) (chd_cpu_bindable == 0)
            |||,
            'for': c['for'].cpuNotBindable,
            labels: { severity: c.severities.default },
            annotations: a('ChdCpuNotBindable', 'CPUs of a node cannot be bound.', |||
              {{ $value }} CPU(s) of {{ $labels.instance }} cannot be bound (chd_cpu_bindable = 0:
              binding a thread to exactly that CPU failed or read back as another) for %s: {{
              range $i, $s := printf `chd_cpu_bindable{@SEL@} == 0` @ARGS@ | query | sortByLabel
              "cpu" }}{{ if $i }},{{ end }}{{ $s.Labels.cpu }}{{ end }}. A launcher that pins a
              rank there gets an error or a different core.
            ||| % p.human(c['for'].cpuNotBindable)),
          },
        ],
      },
    ],
  },
}
