// PromQL and annotation helpers the rules share: the size regex, the label lists of joins
// and fleet groups, and the standard annotations (static summary, templated description,
// runbook_url, dashboard_url).
{
  // A regex over a label's decimal digits that matches every integer >= n (labels are
  // strings, so `size_bytes >= 64 MiB` is written this way): more digits than n, or the
  // same number of digits and larger at the first digit that differs, or n itself.
  atLeast(n)::
    local s = std.toString(n);
    local k = std.length(s);
    local digit(i) = std.parseInt(s[i]);
    local range(a, b) = if a == b then std.toString(a) else '[%d-%d]' % [a, b];
    local any(m) = if m == 0 then '' else if m == 1 then '[0-9]' else '[0-9]{%d}' % m;
    local longer = '[1-9][0-9]{%d,}' % k;
    local same = [
      s[0:i] + range(digit(i) + 1, 9) + any(k - 1 - i)
      for i in std.range(0, k - 2)
      if digit(i) < 9
    ] + [s[0:k - 1] + range(digit(k - 1), 9)];
    std.join('|', [longer] + same),

  // The matchers of the copies the H2D rules read.
  largeCopies(c):: 'size_bytes=~"%s", direction=~"%s"' % [$.atLeast(c.largeCopyMinBytes), std.join('|', c.h2dDirections)],

  // The labels that name one chd: its group and its target.
  node(c):: std.join(', ', c.groupLabels + c.nodeLabels),
  // The same with more labels (a device, a port).
  nodeAnd(c, extra):: std.join(', ', c.groupLabels + c.nodeLabels + extra),
  // A fleet group and more labels.
  group(c, extra):: std.join(', ', c.groupLabels + extra),
  // The group and the node join label (ChdNodeUnmonitored, ChdBackendDown).
  joined(c):: std.join(', ', c.groupLabels + [c.nodeJoinLabel]),

  // Description templates read the node's other series with `query`: @SEL@ stands for the
  // node's matchers (`cluster=%q,job=%q,instance=%q`) and @ARGS@ for their values
  // (`$labels.cluster $labels.job $labels.instance`). A label the alert does not carry is ""
  // there, which matches a series without it.
  // @GSEL@ and @GARGS@ are the same for the group labels alone.
  template(c, text)::
    local sel(labels) = std.join(',', ['%s=%%q' % l for l in labels]);
    local args(labels) = std.join(' ', ['$labels.%s' % l for l in labels]);
    local node = c.groupLabels + c.nodeLabels;
    std.foldl(
      function(t, r) std.strReplace(t, r[0], r[1]),
      [['@SEL@', sel(node)], ['@ARGS@', args(node)], ['@GSEL@', sel(c.groupLabels)], ['@GARGS@', args(c.groupLabels)]],
      $.line(text)
    ),

  // A Grafana dashboard URL for the alert's node (or group): var-<label>= for every label of
  // the alert that the dashboard has as a variable.
  dashboardURL(c, uid, labels)::
    local vars = std.join('', ['{{ with $labels.%s }}&var-%s={{ . | urlquery }}{{ end }}' % [l, l] for l in labels]);
    '%s/d/%s/%s?orgId=1%s' % [c.grafanaURL, uid, uid, vars],

  // The annotations of every alert.
  annotations(c, name, summary, description, dashboard='chd-node')::
    local labels = c.groupLabels + (if dashboard == 'chd-fleet' then ['job'] else c.nodeLabels);
    {
      summary: summary,
      description: $.template(c, description),
      runbook_url: c.runbookURLPattern % std.asciiLower(name),
      dashboard_url: $.dashboardURL(c, dashboard, labels),
    },

  // A text block written over several lines, as one line (descriptions).
  line(s):: std.join(' ', [std.stripChars(l, ' ') for l in std.split(std.rstripChars(s, '\n'), '\n')]),

  // "64MiB", as humanize1024 prints the size in descriptions.
  size(bytes)::
    if bytes % 1073741824 == 0 then '%dGiB' % (bytes / 1073741824)
    else if bytes % 1048576 == 0 then '%dMiB' % (bytes / 1048576)
    else '%dB' % bytes,

  // A Prometheus duration as a description says it: '30m' -> '30 minutes', '1h' -> 'an
  // hour', '7d' -> '7 days'.
  human(d)::
    local n = std.parseInt(d[0:std.length(d) - 1]);
    local unit = { s: 'second', m: 'minute', h: 'hour', d: 'day', w: 'week' }[d[std.length(d) - 1]];
    if n == 1 then (if unit == 'hour' then 'an hour' else 'a ' + unit)
    else '%d %ss' % [n, unit],
}
