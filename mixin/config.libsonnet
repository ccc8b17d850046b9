// The one object a user tunes: selectors, the labels that name a node and a fleet group,
// thresholds, the copy sizes that count, severities and where the runbook and dashboards
// live. Override fields in your own file:
//
//   (import 'chd/mixin/mixin.libsonnet') + { _config+:: { groupLabels: ['cluster', 'pool'] } }
//
// scripts/gen-mixin.py renders this repository's copy (alerts/chd.rules.yml, dashboards/)
// with these defaults.
{
  _config+:: {
    // Selects chd's scrape targets. ChdExporterDown and ChdTargetMissing read `up` with it;
    // the shipped scrape configs (deploy/) name their jobs chd*.
    chdSelector: 'job=~".*chd.*"',
    // chd's port (server.listen), for the commands descriptions suggest.
    chdPort: 9863,

    // Target labels that group nodes into fleets (a cluster, a node pool): every recording
    // rule and fleet comparison keeps them, so a node is judged against the nodes of its own
    // group. A label your targets do not carry is harmless (one group for all).
    groupLabels: ['cluster'],
    // Target labels that tell one chd from another inside a group. Joins between a node's
    // series use groupLabels + nodeLabels; aggregations use `without (...)`, so any other
    // target label flows through as well.
    nodeLabels: ['job', 'instance'],

    // Nodes that carry accelerators, as another exporter sees them (ChdNodeUnmonitored,
    // ChdBackendDown): its targets, and a label that holds the node's name on both its
    // targets and chd's. The shipped scrape configs do not set it; add it to both jobs
    // (on Kubernetes: relabel __meta_kubernetes_pod_node_name to `node`) to turn the two
    // joins on. While chd's targets lack it, both stay silent.
    acceleratorExporterSelector: 'job=~".*(dcgm|npu)-exporter.*"',
    nodeJoinLabel: 'node',

    // Copies of this size and up count for the H2D alerts and recording rules; smaller ones
    // are dominated by launch latency and too noisy to page on.
    largeCopyMinBytes: 67108864,
    // The copy directions the H2D rules read.
    h2dDirections: ['h2d', 'd2h'],

    thresholds: {
      // analysis::SLOW_DEVICE_RATIO: a device column below this share of the node's typical
      // column is slow.
      slowDeviceRatio: 0.5,
      // analysis::SLOW_SEGMENT_RATIO (of the device's median over all CPUs).
      slowSegmentRatio: 0.5,
      // analysis::SLOW_CPU_RATIO.
      slowCpuRatio: 0.7,
      // analysis::SLOW_D2D_DEVICE_RATIO.
      slowD2dDeviceRatio: 0.6,
      // A peer copy pair below this x the median of its PCIe path class's pairs on the node
      // (ChdP2PPairSlow); analysis::p2p::SLOW_PAIR_RATIO.
      slowP2pPairRatio: 0.7,
      // A column's median below this share of the payload its PCIe link carries.
      linkEfficiencyRatio: 0.5,
      // A column's median below this share of its own 7-day baseline.
      regressionRatio: 0.8,
      // A node's typical device below this share of its fleet's.
      fleetRatio: 0.7,
      // Fleet groups smaller than this are not judged (with two, the median is their mean).
      fleetMinNodes: 3,
      // A rail below this share of the node's other rails' mean ...
      railImbalanceRatio: 0.5,
      // ... while the node moves more than this in all, bytes per second.
      railMinNodeBytesPerSecond: 1e9,
      // A port that moved more than this (bytes per second, 5-minute rate) within
      // rdmaPortLookback carried traffic: its going down is critical.
      rdmaPortTrafficBytesPerSecond: 1e6,
      // Ports that were ACTIVE within this long count for ChdRdmaPortDown; ports never
      // ACTIVE in it (never cabled, unused) stay silent.
      rdmaPortLookback: '7d',
      // Correctable PCIe AER errors a minute (30-minute rate) above which a link is
      // flaky; any uncorrectable (nonfatal, fatal) error counts.
      aerCorrectablePerMinute: 1,
      // Calibration older than this, seconds.
      probeStaleSeconds: 6 * 3600,
      // analysis::fabric::RAIL_SLOW_RATIO: a rail below this share of the median of the
      // node's other rails to the same peers.
      fabricRailSlowRatio: 0.7,
      // A node's newest successful fabric run older than this, seconds (a round-robin
      // schedule over the fleet takes n-1 rounds: allow a full cycle).
      fabricStaleSeconds: 7 * 86400,
    },

    // The resolution of the lookback over port states and traffic (a subquery step): a
    // port ACTIVE, or busy, for less than this may be missed.
    rdmaPortLookbackStep: '1h',

    // ChdNodeFailedAgain: this many changes of the verdict to failed within this window.
    failedAgainTimes: 2,
    failedAgainWindow: '1d',

    // How long a condition must hold (or errors keep coming) before it alerts.
    'for': {
      targetMissing: '15m',
      exporterDown: '5m',
      nodeUnmonitored: '30m',
      collectorFailed: '15m',
      backendDown: '15m',
      verdictFailed: '5m',
      column: '30m',
      regression: '2h',
      fleet: '1h',
      cpuNotBindable: '10m',
      pcieLink: '10m',
      aerErrors: '15m',
      rdmaPortDown: '5m',
      rdmaErrors: '30m',
      railImbalance: '15m',
      probeErrors: '30m',
      gateUnreadable: '30m',
      stateNotSaved: '30m',
      probeStale: '6h',
      // Fabric results change only when a run lands: a short hold is enough.
      fabricRailSlow: '5m',
    },

    severities: {
      default: 'warning',
      // A node chd judges unfit for jobs (chd_node_verdict failed), and a rail that carried
      // traffic going down: both break the jobs on the node now.
      verdictFailed: 'critical',
      rdmaPortDownWithTraffic: 'critical',
      noIdleWindow: 'info',
    },

    // Where docs/runbook.md is served: %s is the alert's name in lower case (the section's
    // anchor). Point it at your copy (a Git forge renders the anchors).
    runbookURLPattern: 'https://chd.example.com/docs/runbook.md#%s',
    // Grafana's base URL, for each alert's dashboard_url.
    grafanaURL: 'https://grafana.example.com',

    dashboardTags: ['chd'],
    // Dashboards' time zone and refresh.
    dashboardTimezone: 'browser',
    dashboardRefresh: '1m',
  },
}
