// Is chd there at all: no target up (ChdTargetMissing), a target that cannot be scraped
// (ChdExporterDown), a node with accelerators and no chd (ChdNodeUnmonitored), a collector
// or the runtime that fails (ChdCollectorFailed, ChdBackendDown). Without these, a chd that
// is missing silences every other alert.
local p = import '../lib/promql.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    local a(name, summary, description, dashboard='chd-node') = p.annotations(c, name, summary, description, dashboard),
    local groupNames = std.join('', ['{{ with $externalLabels.%s }} (%s {{ . }}){{ end }}' % [l, l] for l in c.groupLabels]),
    groups+: [
      {
        name: 'chd-exporter',
        rules: [
          {
            alert: 'ChdTargetMissing',
            // up{...} == 0 needs a target to exist: a ServiceMonitor nobody selects, a
            // DaemonSet without pods, a job renamed without "chd" leave no `up` at all, and
            // every chd alert silent with it.
            expr: 'absent(up{%(chdSelector)s} == 1)\n' % c,
            'for': c['for'].targetMissing,
            labels: { severity: c.severities.default },
            annotations: a('ChdTargetMissing', 'No chd target is up.', |||
              This Prometheus%s has had no chd target up (up{%s} == 1) for %s, so no node is
              calibrated or watched and every other chd alert is silent. The scrape
              configuration may not select chd (a ServiceMonitor without the label your
              Prometheus selects, a job name that no longer matches), the DaemonSet may have
              no pods, or every chd is down.
            ||| % [groupNames, c.chdSelector, p.human(c['for'].targetMissing)], 'chd-fleet'),
          },
          {
            alert: 'ChdExporterDown',
            expr: 'up{%(chdSelector)s} == 0\n' % c,
            'for': c['for'].exporterDown,
            labels: { severity: c.severities.default },
            annotations: a('ChdExporterDown', 'Prometheus cannot scrape a chd exporter.', |||
              Prometheus has failed to scrape chd at {{ $labels.instance }} (job {{ $labels.job }})
              for %s; the node's calibration matrix, RDMA and PCIe metrics and every other chd
              alert for it are missing. From the Prometheus host, `curl -s
              http://{{ reReplaceAll ":[0-9]+$" "" $labels.instance }}:%d/healthz` tells a
              stopped chd from a network path that is closed (the shipped scrape
              configurations set `instance` to the node's name without chd's port).
            ||| % [p.human(c['for'].exporterDown), c.chdPort]),
          },
          {
            alert: 'ChdNodeUnmonitored',
            // An example of the join: nodes whose accelerator exporter is up and that have no
            // chd target. Silent until chd's targets carry the join label.
            expr: |||
              group by (%(joined)s) (up{%(acc)s} == 1)
              unless on (%(joined)s)
                group by (%(joined)s) (up{%(chd)s})
              and on (%(group)s)
                group by (%(group)s) (up{%(chd)s, %(join)s!=""})
            ||| % { joined: p.joined(c), group: p.group(c, []), acc: c.acceleratorExporterSelector, chd: c.chdSelector, join: c.nodeJoinLabel },
            'for': c['for'].nodeUnmonitored,
            labels: { severity: c.severities.default },
            annotations: a('ChdNodeUnmonitored', 'A node with accelerators has no chd target.', |||
              Node {{ $labels.%s }} has an accelerator exporter up (up{%s}) and no chd target
              for %s, so nothing calibrates its devices or watches its links and rails.
            ||| % [c.nodeJoinLabel, c.acceleratorExporterSelector, p.human(c['for'].nodeUnmonitored)], 'chd-fleet'),
          },
          {
            alert: 'ChdCollectorFailed',
            // A failed collector exports none of its series: the alerts that read them go
            // silent instead of firing.
            expr: 'chd_collector_success == 0\n',
            'for': c['for'].collectorFailed,
            labels: { severity: c.severities.default },
            annotations: a('ChdCollectorFailed', 'A chd scrape-time collector fails.', |||
              The {{ $labels.collector }} collector of chd on {{ $labels.instance }} has failed at
              every scrape for %s (chd_collector_success = 0): its series are missing, so
              {{ if eq $labels.collector "rdma" }}ChdRdmaPortDown, ChdRdmaPortErrors and
              ChdRdmaRailImbalance cannot fire for this node{{ else if eq $labels.collector "pcie" }}ChdPcieLinkDegraded
              and ChdPcieAerErrors cannot fire for this node{{ else }}its dashboard panels are
              empty{{ end }}.
            ||| % p.human(c['for'].collectorFailed)),
          },
          {
            alert: 'ChdBackendDown',
            expr: |||
              chd_backend_up == 0
              or
              (
                  chd_backend_up{backend="host", %(join)s!=""} == 1
                and on (%(joined)s)
                  group by (%(joined)s) (up{%(acc)s} == 1)
              )
            ||| % { join: c.nodeJoinLabel, joined: p.joined(c), acc: c.acceleratorExporterSelector },
            'for': c['for'].backendDown,
            labels: { severity: c.severities.default },
            annotations: a('ChdBackendDown', 'A chd exporter runs without its accelerator runtime.', |||
              chd on {{ $labels.instance }} runs the {{ $labels.backend }} backend
              {{ if eq $value 0.0 }}and its runtime does not answer (chd_backend_up = 0){{ else }}on a node
              whose accelerator exporter is up: the CUDA or ACL runtime did not load, so chd
              measures host memory copies instead of its devices{{ end }}, for %s.
            ||| % p.human(c['for'].backendDown)),
          },
        ],
      },
    ],
  },
}
