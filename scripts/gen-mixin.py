#!/usr/bin/env python3
"""Render the jsonnet mixin (mixin/) into the files this repository ships.

    scripts/gen-mixin.py          write alerts/chd.rules.yml and dashboards/*.json, then
                                  deploy/kubernetes/base/prometheusrule.yaml (through
                                  deploy/kubernetes/gen-prometheusrule.sh, which needs cargo)
    scripts/gen-mixin.py --check  write nothing; exit 1 naming every file that differs
    scripts/gen-mixin.py --rules-with 'CONFIG'
                                  print the rule file rendered with _config+:: CONFIG (a
                                  jsonnet object, e.g. "{ groupLabels: ['cluster', 'pool'] }")

The jsonnet implementation is PyPI's `jsonnet` (the C++ one, as the `_jsonnet` module),
version pinned in scripts/test.sh. tests/rules/mixin.rs runs --check.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JSONNET_VERSION = "0.22.0"

RULES = "alerts/chd.rules.yml"
RULES_HEADER = """\
# GENERATED from mixin/ by scripts/gen-mixin.py: do not edit; change mixin/ (its _config is
# mixin/config.libsonnet) and run the script. tests/rules/mixin.rs fails when this file and the
# mixin differ.
#
# chd's alerting and recording rules: the alerts of docs/METRICS.md (one section each in
# docs/runbook.md), with the recording rules the dashboards and the fleet and rail alerts
# read. Load with `rule_files:`; every alert has promtool unit tests in alerts/tests/.
"""

# Key order in the YAML, as people read rules (jsonnet sorts keys).
ORDER = ["name", "interval", "rules", "alert", "record", "expr", "for", "labels", "annotations"]

PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*|[0-9]+[smhdwy]")
RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def scalar(value, indent):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if "\n" in value and not value.startswith((" ", "\n")) and not re.search(r" \n|\t", value):
        body = value[:-1] if value.endswith("\n") else value
        head = "|" if value.endswith("\n") and not value.endswith("\n\n") else "|-"
        pad = " " * indent
        return head + "\n" + "\n".join(pad + line if line else "" for line in body.split("\n"))
    if PLAIN.fullmatch(value) and value.lower() not in RESERVED:
        return value
    return json.dumps(value, ensure_ascii=False)


def keys(mapping):
    return sorted(mapping, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))


def emit(value, indent=0):
    """YAML lines for a mapping or a list of mappings, block style."""
    pad = " " * indent
    lines = []
    if isinstance(value, dict):
        for k in keys(value):
            v = value[k]
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines.extend(emit(v, indent + 2))
            elif isinstance(v, (dict, list)):
                lines.append(f"{pad}{k}: {'{}' if isinstance(v, dict) else '[]'}")
            else:
                lines.append(f"{pad}{k}: {scalar(v, indent + 2)}")
    else:
        for item in value:
            sub = emit(item, indent + 2)
            lines.append(pad + "- " + sub[0][indent + 2:])
            lines.extend(sub[1:])
    return lines


def render(config="{}"):
    try:
        import _jsonnet
    except ImportError:
        sys.exit(
            f"gen-mixin.py: the jsonnet module is missing: "
            f"python3 -m pip install 'jsonnet=={JSONNET_VERSION}' (scripts/test.sh does)"
        )
    snippet = """
      local m = (import 'mixin/mixin.libsonnet') + { _config+:: %s };
      { rules: m.prometheusRules.groups + m.prometheusAlerts.groups,
        dashboards: if std.objectHasAll(m, 'grafanaDashboards') then m.grafanaDashboards else {} }
    """
    out = json.loads(_jsonnet.evaluate_snippet("gen-mixin", snippet % config, jpathdir=[ROOT]))
    files = {RULES: RULES_HEADER + "\n".join(emit({"groups": out["rules"]})) + "\n"}
    for name, dashboard in out["dashboards"].items():
        files["dashboards/" + name] = json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"
    return files


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--rules-with":
        sys.stdout.write(render(sys.argv[2])[RULES])
        return
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit(__doc__)
    files = render()
    differ = []
    for path, text in files.items():
        full = os.path.join(ROOT, path)
        try:
            with open(full, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if same:
            continue
        differ.append(path)
        if not check:
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
    if check:
        if differ:
            print(
                "generated from mixin/ and not up to date: " + ", ".join(differ)
                + "\nrun scripts/gen-mixin.py to regenerate them, and commit the result",
                file=sys.stderr,
            )
            sys.exit(1)
        return
    for path in differ:
        print(f"wrote {path}")
    if RULES in differ:
        subprocess.run([os.path.join(ROOT, "deploy/kubernetes/gen-prometheusrule.sh")], check=True)


if __name__ == "__main__":
    main()
