// Recording rules: per-node summaries the fleet dashboard ranks nodes by, the fleet
// comparison, the rail throughput the imbalance alert reads, and the 7-day baseline of
// ChdH2DRegressed. Node-level rules aggregate `without (...)` the labels inside a node, so
// every target label (cluster, pool, ...) flows through; fleet rules keep the group labels.
// The names are those of earlier releases (dashboards and federation match them); the
// baseline's follow level:metric:operations with the source metric's name.
local p = import 'lib/promql.libsonnet';

{
  prometheusRules+:: {
    local c = $._config,
    local t = c.thresholds,
    local large = p.largeCopies(c),
    local fleet = p.group(c, ['name', 'size_bytes', 'direction']),
    local fabricFleet = p.group(c, ['op', 'size_bytes']),
    groups+: [
      {
        name: 'chd-node.rules',
        rules: [
          {
            // Worst device ratio of the node over large copies: 1.0 = every column alike,
            // 0.2 = one column at a fifth of the node's typical device.
            record: 'instance:chd_h2d_device_ratio:min',
            expr: |||
              min without (device, size_bytes, direction) (
                chd_h2d_device_ratio{%s}
              )
            ||| % large,
          },
          {
            // Devices with at least one slow column (large copies): 0 on a healthy node.
            record: 'instance:chd_h2d_slow_device_columns:count',
            expr: |||
              sum without (device) (
                min without (size_bytes, direction) (chd_h2d_device_ratio{%s}) < bool %g
              )
            ||| % [large, t.slowDeviceRatio],
          },
          {
            // (NUMA node, device) segments whose median is below half the device's median
            // over all CPUs, large copies: 0 on a healthy node.
            record: 'instance:chd_h2d_slow_numa_segments:count',
            expr: |||
              sum without (numa_node, device) (
                min without (size_bytes, direction, stat) (
                    chd_h2d_segment_bandwidth_bytes_per_second{stat="median", %s}
                  / ignoring (numa_node) group_left ()
                    chd_h2d_device_bandwidth_bytes_per_second{stat="median"}
                )
                < bool %g
              )
            ||| % [large, t.slowSegmentRatio],
          },
          {
            // Seconds since the node's last successful H2D probe window.
            record: 'instance:chd_probe_h2d_last_success:age_seconds',
            expr: |||
              time() - max without (probe) (chd_probe_last_success_timestamp_seconds{probe="h2d"})
            |||,
          },
          {
            // Scheduler ticks of the last 24 h by outcome (probed, cpu_busy, device_busy,
            // disabled): a node with only busy ticks never gets calibrated.
            record: 'instance_outcome:chd_idle_windows:increase24h',
            expr: |||
              increase(chd_idle_windows_total[24h])
            |||,
          },
          {
            // Accelerator / HCA PCIe links trained below their maximum width or speed (a
            // speed that only an idle GPU's power management lowered does not count, as in
            // ChdPcieLinkDegraded).
            record: 'instance:chd_device_pcie_degraded_links:count',
            expr: |||
              sum without (device, state) (
                  chd_device_pcie_link_width{state="current"}
                < bool ignoring (state) chd_device_pcie_link_width{state="max"}
              )
              +
              sum without (device, state) (
                  (
                      chd_device_pcie_link_speed_transfers_per_second{state="current"}
                    < bool ignoring (state) chd_device_pcie_link_speed_transfers_per_second{state="max"}
                  )
                  unless ignoring (state)
                    (
                        chd_device_pcie_link_bandwidth_bytes_per_second{state="current"}
                      >= ignoring (state)
                        chd_device_pcie_link_bandwidth_bytes_per_second{state="max"}
                    )
              )
            |||,
          },
          {
            // Throughput of each RDMA port (rail), both directions together, bytes per
            // second.
            record: 'instance_hca_port:chd_rdma_port_data_bytes:rate5m',
            expr: |||
              rate(chd_rdma_port_data_transmitted_bytes_total[5m])
              + rate(chd_rdma_port_data_received_bytes_total[5m])
            |||,
          },
          {
            // ChdH2DRegressed's baseline: the median over 7 days of the hourly medians
            // below (168 samples a series, not 7 days of raw ones).
            record: 'instance_device:chd_h2d_device_bandwidth_bytes_per_second:median7d',
            expr: |||
              quantile_over_time(0.5, instance_device:chd_h2d_device_bandwidth_bytes_per_second:median1h[7d])
            |||,
          },
        ],
      },
      {
        // Evaluated once an hour: each sample is the median of the hour before it.
        name: 'chd-baseline.rules',
        interval: '1h',
        rules: [
          {
            record: 'instance_device:chd_h2d_device_bandwidth_bytes_per_second:median1h',
            expr: |||
              quantile_over_time(0.5, chd_h2d_device_bandwidth_bytes_per_second{stat="median", %s}[1h])
            ||| % large,
          },
        ],
      },
      {
        // A node judged against the nodes of its group (groupLabels) and device model
        // (chd_device_info's `name`), so H200 nodes are compared with H200 nodes of the same
        // cluster, whatever job scrapes them.
        name: 'chd-fleet.rules',
        rules: [
          {
            // Each node's typical device per model, size and direction, large copies: the
            // median over the node's devices of each device column's median.
            record: 'instance_name:chd_h2d_device_median:median',
            expr: |||
              quantile without (device, stat) (0.5,
                  chd_h2d_device_bandwidth_bytes_per_second{stat="median", %s}
                * on (%s) group_left (name)
                  max without (kind, pci_bus_id, numa_node) (chd_device_info)
              )
            ||| % [large, p.nodeAnd(c, ['device'])],
          },
          {
            // The group's median of those typical devices, and how many nodes it is the
            // median of.
            record: 'name:chd_h2d_device_median:fleet_median',
            expr: |||
              quantile by (%s) (0.5, instance_name:chd_h2d_device_median:median)
            ||| % fleet,
          },
          {
            record: 'name:chd_h2d_device_median:fleet_nodes',
            expr: |||
              count by (%s) (instance_name:chd_h2d_device_median:median)
            ||| % fleet,
          },
          {
            // A node's typical device over its group's, for groups of at least
            // fleetMinNodes nodes (with two, the median is their mean and a slow node drags
            // it halfway down).
            record: 'instance_name:chd_h2d_device_median:fleet_ratio',
            expr: |||
              instance_name:chd_h2d_device_median:median
              / on (%s) group_left ()
                (
                    name:chd_h2d_device_median:fleet_median
                  and on (%s)
                    name:chd_h2d_device_median:fleet_nodes >= %d
                )
            ||| % [fleet, fleet, t.fleetMinNodes],
          },
        ],
      },
      {
        // Between nodes: a node's collective over all ranks of its fabric runs (chd probe
        // fabric) against the nodes of its group (groupLabels), per operation and size.
        name: 'chd-fabric.rules',
        rules: [
          {
            record: 'op_size:chd_fabric_collective_bus_gbps:fleet_median',
            expr: |||
              quantile by (%s) (0.5, chd_fabric_collective_bus_gbps)
            ||| % fabricFleet,
          },
          {
            record: 'op_size:chd_fabric_collective_bus_gbps:fleet_nodes',
            expr: |||
              count by (%s) (chd_fabric_collective_bus_gbps)
            ||| % fabricFleet,
          },
          {
            // A node's bus bandwidth over its group's median, for groups of at least
            // fleetMinNodes nodes.
            record: 'instance_op_size:chd_fabric_collective_bus_gbps:fleet_ratio',
            expr: |||
              chd_fabric_collective_bus_gbps
              / on (%s) group_left ()
                (
                    op_size:chd_fabric_collective_bus_gbps:fleet_median
                  and on (%s)
                    op_size:chd_fabric_collective_bus_gbps:fleet_nodes >= %d
                )
            ||| % [fabricFleet, fabricFleet, t.fleetMinNodes],
          },
        ],
      },
    ],
  },
}
