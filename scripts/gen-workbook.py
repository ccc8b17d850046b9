#!/usr/bin/env python3
"""Write ClusterHealthDetect workbooks and size-sweep files for chd's tests (never commit output).

The workbooks follow the public tool's writers (`cluster_health_detect/excel_heatmap.py`
write_xlsx, standard library only: inline-string cells, numbers `%.12g`, booleans `t="b"`,
`None` as an empty `<c r="B2"/>`, a float that is not finite as its text `nan`; sheet names
cut at 31 characters) with the sheets `matrix_excel.py` and `excel_heatmap.py` build from
their metrics: `H2D_<size>MB` (A1 `CPU core -> NPU H2D GB/s (<size> MB)`, B1.. `npu:N`, a row
per CPU with an ok sample, each cell the median), `D2D_<size>MB`, `Summary`, `Affinity`,
`Heatmap`. The metrics are made here (deterministic), odd shapes included: a CPU whose every
sample failed (no row), a cell with no ok sample (empty), a NaN sample (`nan`), a CPU that
could not be bound (Affinity `bindable` false with the reason).

The sweep files are the shapes of the tool's public reports/ (A3-180-*-sweep-*.json, the
size-sweep CSV): `{"rows": [...], "sizes": [...], "env": {...}}` as `json.dumps(indent=2)`.

  scripts/gen-workbook.py h2d OUT.xlsx | pair OUT.xlsx | numa OUT.xlsx | empty OUT.xlsx
  scripts/gen-workbook.py sweeps OUTDIR
"""

import json
import math
import sys
import zipfile
from collections import defaultdict
from pathlib import Path
from statistics import median
from xml.sax.saxutils import escape

NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
PKG = "http://schemas.openxmlformats.org/package/2006/relationships"
CT = "application/vnd.openxmlformats-officedocument.spreadsheetml"


def column(n):
    out = ""
    while n:
        n, r = divmod(n - 1, 26)
        out = chr(65 + r) + out
    return out


def cell(r, c, v):
    ref = f"{column(c)}{r}"
    if v is None:
        return f'<c r="{ref}"/>'
    if isinstance(v, bool):
        return f'<c r="{ref}" t="b"><v>{int(v)}</v></c>'
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return f'<c r="{ref}"><v>{float(v):.12g}</v></c>'
    return f'<c r="{ref}" t="inlineStr"><is><t>{escape(str(v))}</t></is></c>'


def sheet(rows):
    body = "".join(
        f'<row r="{r}">' + "".join(cell(r, c, v) for c, v in enumerate(row, 1)) + "</row>"
        for r, row in enumerate(rows, 1)
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<worksheet xmlns="{NS}">\n'
        '  <sheetViews><sheetView workbookViewId="0"><pane ySplit="1" topLeftCell="A2" '
        'activePane="bottomLeft" state="frozen"/></sheetView></sheetViews>\n'
        f"  <sheetData>{body}</sheetData>\n</worksheet>"
    )


def write(path, sheets):
    n = len(sheets)
    names = "".join(
        f'<sheet name="{escape(name[:31])}" sheetId="{i}" r:id="rId{i}"/>'
        for i, (name, _) in enumerate(sheets, 1)
    )
    rels = "".join(
        f'<Relationship Id="rId{i}" Type="{REL}/worksheet" Target="worksheets/sheet{i}.xml"/>'
        for i in range(1, n + 1)
    ) + f'<Relationship Id="rId{n + 1}" Type="{REL}/styles" Target="styles.xml"/>'
    overrides = "".join(
        f'<Override PartName="/xl/worksheets/sheet{i}.xml" ContentType="{CT}.worksheet+xml"/>'
        for i in range(1, n + 1)
    )
    head = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(
            "[Content_Types].xml",
            head + '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            f'<Override PartName="/xl/workbook.xml" ContentType="{CT}.sheet.main+xml"/>'
            f'<Override PartName="/xl/styles.xml" ContentType="{CT}.styles+xml"/>{overrides}</Types>',
        )
        z.writestr(
            "_rels/.rels",
            head + f'<Relationships xmlns="{PKG}"><Relationship Id="rId1" '
            f'Type="{REL}/officeDocument" Target="xl/workbook.xml"/></Relationships>',
        )
        z.writestr(
            "xl/workbook.xml",
            head + f'<workbook xmlns="{NS}" xmlns:r="{REL}"><sheets>{names}</sheets></workbook>',
        )
        z.writestr("xl/_rels/workbook.xml.rels", head + f'<Relationships xmlns="{PKG}">{rels}</Relationships>')
        z.writestr(
            "xl/styles.xml",
            head + f'<styleSheet xmlns="{NS}"><fonts count="1"><font><sz val="11"/></font></fonts>'
            '<fills count="1"><fill><patternFill patternType="none"/></fill></fills>'
            '<borders count="1"><border/></borders><cellStyleXfs count="1"><xf/></cellStyleXfs>'
            '<cellXfs count="1"><xf xfId="0"/></cellXfs></styleSheet>',
        )
        for i, (_, rows) in enumerate(sheets, 1):
            z.writestr(f"xl/worksheets/sheet{i}.xml", sheet(rows))


AFFINITY_HEAD = ["cpu", "numa_node", "socket_id", "core_id", "online", "allowed", "bindable", "thread_siblings", "reason"]


def affinity(cpus, failed):
    """8 CPUs on two NUMA nodes; `failed` could not be bound."""
    rows = [AFFINITY_HEAD]
    for c in range(cpus):
        bad = c in failed
        rows.append([c, c // (cpus // 2), 0, c, True, True, not bad, f"{c}", "[Errno 22] Invalid argument" if bad else None])
    return rows


def h2d_metrics():
    """8 CPUs x 4 NPUs x 16 and 64 MB, two samples each; NPU 1 slow (12 vs 58 GB/s); CPU 7's
    samples all fail; CPU 5 has no ok sample on NPU 2; CPU 6's NPU 3 samples are NaN."""
    out = []
    for size in (16, 64):
        for cpu in range(8):
            for dev in range(4):
                for rep in range(2):
                    value = (12.0 if dev == 1 else 58.0) + 0.1 * rep + 0.01 * cpu
                    status = "ok"
                    if cpu == 7 or (cpu == 5 and dev == 2):
                        status = "error"
                    if cpu == 6 and dev == 3:
                        value = float("nan")
                    out.append({"test": "core_h2d_matrix", "status": status, "host_cpu": cpu,
                                "device_id": dev, "size_mb": size, "gbps": value})
    return out


def h2d_sheets(metrics):
    grouped = defaultdict(lambda: defaultdict(list))
    for m in metrics:
        if m["status"] == "ok":
            grouped[m["size_mb"]][(m["host_cpu"], m["device_id"])].append(m["gbps"])
    sheets = []
    for size, cells in sorted(grouped.items()):
        cpus = sorted({c for c, _ in cells})
        devs = sorted({d for _, d in cells})
        rows = [[f"CPU core -> NPU H2D GB/s ({size} MB)", *[f"npu:{d}" for d in devs]]]
        for c in cpus:
            rows.append([c, *[median(cells[(c, d)]) if cells.get((c, d)) else None for d in devs]])
        sheets.append((f"H2D_{size}MB", rows))
    return sheets


def summary(metrics, key_fields, field):
    rows = [["test", "size_mb", "row", "column", "metric", "count", "min", "median", "max", "max/min"]]
    grouped = defaultdict(list)
    for m in metrics:
        if m["status"] == "ok":
            grouped[(m["test"], m["size_mb"], m[key_fields[0]], m[key_fields[1]], field)].append(m[field])
    for key, v in sorted(grouped.items()):
        lo, hi = min(v), max(v)
        rows.append([*key, len(v), lo, median(v), hi, hi / lo if lo else None])
    return rows


def main():
    kind, out = sys.argv[1], Path(sys.argv[2])
    if kind == "h2d":
        m = h2d_metrics()
        write(out, [*h2d_sheets(m), ("Summary", summary(m, ("host_cpu", "device_id"), "gbps")), ("Affinity", affinity(8, {7}))])
    elif kind == "pair":
        cells = {(a, b): [3.0 + a + 0.5 * b, 3.2 + a + 0.5 * b] for a in (0, 1, 2) for b in (4, 5, 6) if (a, b) != (2, 6)}
        rows = [["rank0 CPU -> rank1 CPU all_gather alg GB/s (8 MB)", 4, 5, 6]]
        for a in (0, 1, 2):
            rows.append([a, *[median(cells[(a, b)]) if (a, b) in cells else None for b in (4, 5, 6)]])
        write(out, [("D2D_8MB", rows), ("Summary", [["test", "size_mb", "row", "column", "metric", "count", "min", "median", "max", "max/min"]]), ("Affinity", affinity(8, set()))])
    elif kind == "numa":
        labels = ["collective|all_gather|global|1MB|alg_gbps", "h2d|copy|host_to_device|1MB|gbps"]
        data = {("none", labels[0]): [1.35, 1.37], ("none", labels[1]): [4.2, 4.5],
                ("numa:0:shard", labels[0]): [1.56, 1.57], ("numa:0:shard", labels[1]): [6.3, 6.5]}
        heat = [["policy/profile", *labels]]
        summ = [["policy/profile", "metric", "count", "min", "median", "max", "max/min"]]
        for policy in ("none", "numa:0:shard"):
            heat.append([policy, *[median(data[(policy, lab)]) for lab in labels]])
            for lab in labels:
                v = data[(policy, lab)]
                summ.append([policy, lab, len(v), min(v), median(v), max(v), max(v) / min(v)])
        write(out, [("Heatmap", heat), ("Summary", summ), ("Affinity", affinity(8, {3}))])
    elif kind == "empty":
        write(out, [("Heatmap", [["No core matrix metrics found"]]), ("Summary", [["test", "size_mb", "row", "column", "metric", "count", "min", "median", "max", "max/min"]]), ("Affinity", [AFFINITY_HEAD])])
    elif kind == "sweeps":
        out.mkdir(parents=True, exist_ok=True)
        sizes = [(1 << 17) << i for i in range(14)]
        plateau = {"h2d": 27.0, "d2d_same_device": 600.0}
        rows = []
        for op in ("h2d", "d2d_same_device"):
            for i, s in enumerate(sizes):
                g = plateau[op] * min(1.0, 2 ** (i - 9)) * (1 + 0.01 * (i % 3))
                rows.append({"operation": op, "device_id": 8, "size_bytes": s, "size_mb": s / 2**20,
                             "iters": max(1, 200 >> max(0, i - 4)), "avg_seconds": s / g / 1e9,
                             "gbps": g, "pinned": True if op == "h2d" else None, "cpu_affinity": [0]})
        (out / "copy-sweep.json").write_text(json.dumps({"rows": rows, "sizes": sizes, "device_id": 8, "note": "generated"}, indent=2))
        csv = ["series,size_mb,gbps,iters,avg_seconds"]
        for r in rows:
            csv.append(f"{r['operation']},{r['size_mb']},{r['gbps']},{r['iters']},{r['avg_seconds']}")
        # Settings: default, 32 (2 % below from 16 MiB: within the plateau scatter), 1024
        # (20 % above from 64 MiB: beyond it).
        for name, buff, factor in (("default", None, lambda i: 1.0), ("buff32", "32", lambda i: 0.98 if i >= 7 else 1.0), ("buff1024", "1024", lambda i: 1.2 if i >= 9 else 1.0)):
            rows = []
            for i, s in enumerate(sizes):
                g = 76.0 * min(1.0, 2 ** (i - 8)) * (1 + 0.03 * (i % 2)) * factor(i)
                rows.append({"rank": 0, "local_rank": 0, "device_id": 8, "operation": "hccl_all_gather",
                             "size_bytes": s, "size_mb": s / 2**20, "iters": 80, "avg_seconds": s / g / 1e9,
                             "alg_gbps": g, "rank_exchange_gbps": g, "hccl_buffsize": buff, "hccl_buffer_size": None})
                csv.append(f"hccl_{'default' if buff is None else 'buff_' + buff},{s / 2**20},{g},80,{s / g / 1e9}")
            (out / f"hccl-{name}-sweep.json").write_text(json.dumps({"rows": rows, "sizes": sizes, "env": {"HCCL_BUFFSIZE": buff, "HCCL_BUFFER_SIZE": None}}, indent=2))
        (out / "size-sweep.csv").write_text("\n".join(csv) + "\n")
    else:
        sys.exit(f"gen-workbook.py: unknown kind {kind!r} (h2d, pair, numa, empty, sweeps)")


if __name__ == "__main__":
    main()
