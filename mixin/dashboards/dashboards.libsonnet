// The Grafana dashboards: the panels are in chd-*.json beside this file (Grafana's own JSON,
// as its editor exports it); this file applies the mixin's _config to them, the same way for
// all three:
// - a variable per fleet group label (`cluster` by default) after the data source, and every
//   selector that reads `job=~"$job"` also reads `cluster=~"$cluster"`; aggregations and
//   joins `(job, instance` keep the group labels too;
// - the job variable is the linter's kind (multi, All = .+), every query variable refreshes
//   on time range change;
// - links between dashboards keep the variables and the time range, and data links to a
//   dashboard carry ${__url_time_range} and the group variables;
// - tokens in the JSON: __LARGE_SIZES__ (the size regex of largeCopyMinBytes), __GROUP__
//   (the group matchers alone), __NODE_ON__ (the labels that name a node).
local p = import '../lib/promql.libsonnet';

{
  grafanaDashboards+:: {
    local c = $._config,
    local ds = { type: 'prometheus', uid: '${datasource}' },
    local groupMatchers = std.join(', ', ['%s=~"$%s"' % [l, l] for l in c.groupLabels]),
    local rewrite(s) = std.foldl(
      function(t, r) std.strReplace(t, r[0], r[1]),
      [
        ['job=~"$job"', std.join(', ', ['%s=~"$%s"' % [l, l] for l in c.groupLabels] + ['job=~"$job"'])],
        ['(job, instance', '(' + std.join(', ', c.groupLabels + ['job', 'instance'])],
        ['__NODE_ON__', p.node(c)],
        ['__GROUP__', groupMatchers],
        ['__LARGE_SIZES__', p.atLeast(c.largeCopyMinBytes)],
      ],
      s
    ),
    local groupVariable(l) = {
      name: l,
      label: std.asciiUpper(l[0]) + l[1:],
      description: 'Target label %s (a fleet group): every panel shows the nodes of the selected ones. All matches nodes without the label too.' % l,
      type: 'query',
      datasource: ds,
      definition: 'label_values(chd_build_info, %s)' % l,
      query: { query: 'label_values(chd_build_info, %s)' % l, refId: 'PrometheusVariableQueryEditor-VariableQuery' },
      current: {},
      hide: 0,
      includeAll: true,
      allValue: '.*',
      multi: true,
      options: [],
      refresh: 2,
      regex: '',
      skipUrlSync: false,
      sort: 1,
    },
    local variable(v) =
      if v.type != 'query' then v
      else v {
        refresh: 2,
        definition: rewrite(v.definition),
        query: v.query { query: rewrite(v.query.query) },
      } + (if v.name == 'job' then { multi: true, includeAll: true, allValue: '.+' } else {}),
    local dataLink(l) =
      if std.startsWith(l.url, '/d/') then
        l { url: super.url + '&${__url_time_range}' + std.join('', ['&${%s:queryparam}' % g for g in c.groupLabels]) }
      else l,
    local panel(x) = x
      + (if std.objectHas(x, 'targets') then { targets: [t { expr: rewrite(t.expr) } for t in x.targets] } else {})
      + (if std.objectHas(x, 'panels') then { panels: [panel(q) for q in x.panels] } else {})
      + (if std.objectHas(x, 'fieldConfig') && std.objectHas(x.fieldConfig, 'defaults') && std.objectHas(x.fieldConfig.defaults, 'links') then {
           fieldConfig+: { defaults+: { links: [dataLink(l) for l in x.fieldConfig.defaults.links] } },
         } else {}),
    local dashboard(d) = d {
      tags: c.dashboardTags,
      timezone: c.dashboardTimezone,
      refresh: c.dashboardRefresh,
      links: [l { includeVars: true, keepTime: true } for l in d.links],
      panels: [panel(x) for x in d.panels],
      templating: {
        list: std.flattenArrays([
          if v.type == 'datasource' then [v] + [groupVariable(l) for l in c.groupLabels] else [variable(v)]
          for v in d.templating.list
        ]),
      },
    },

    'chd-node.json': dashboard(import 'chd-node.json'),
    'chd-fleet.json': dashboard(import 'chd-fleet.json'),
    'chd-rdma-numa.json': dashboard(import 'chd-rdma-numa.json'),
  },
}
