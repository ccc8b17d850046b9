#!/usr/bin/env python3
"""Write a large ClusterHealthDetect recording, for measuring chd's readers (scripts/bench.sh).

The file is what the public tool writes (`benchmark.py:write_json`:
`json.dumps(payload, indent=2, sort_keys=True)`, Python's own encoder, so `NaN` and
`Infinity` appear where a float is one), with the row keys of `core_h2d_matrix.py` and
`core_pair_d2d_matrix.py` as in tests/fixtures/cluster-health/. Rows are generated while
they are written (the payload is never built whole), so memory stays small.

  scripts/gen-recording.py pair --cpus 640 OUT.json   # 640 x 640 CPU pairs, pair [0, 5], 8 MiB
  scripts/gen-recording.py h2d --cpus 640 --devices 16 --sizes 16,64,256 OUT.json

Every 997th cell is a failed sample (`status: error`) and every 10,007th an ok row whose
bandwidth is NaN or Infinity (Python writes them bare; chd rejects such rows by reason), so
the reader's failure and rejection paths run at scale too. Deterministic: the same arguments
give the same bytes. Writes only OUT; never commit its output.
"""

import argparse
import json
import math
import sys


class Rows(list):
    """A list the encoder iterates without holding: `json`'s pure-Python encoder (the one
    `indent` selects) checks truthiness and iterates, nothing else."""

    def __init__(self, count, make):
        super().__init__()
        self.count = count
        self.make = make

    def __bool__(self):
        return self.count > 0

    def __len__(self):
        return self.count

    def __iter__(self):
        return (self.make(i) for i in range(self.count))


def affinity_summary(cpus, numa_of, host):
    nodes = {}
    for c in cpus:
        nodes.setdefault(numa_of(c), []).append(c)

    def cpulist(ids):
        return f"{ids[0]}-{ids[-1]}" if ids else ""

    return {
        "allowed_count": len(cpus),
        "allowed_cpus": cpus,
        "allowed_cpus_list": cpulist(cpus),
        "bindable_count": len(cpus),
        "cpu_count": len(cpus),
        "errors": [],
        "host": host,
        "numa_nodes": {
            str(n): {
                "allowed_count": len(ids),
                "allowed_cpus": ids,
                "allowed_cpus_list": cpulist(ids),
                "bindable_count": len(ids),
                "bindable_cpus": ids,
                "bindable_cpus_list": cpulist(ids),
                "cpu_count": len(ids),
                "cpus": ids,
                "cpus_list": cpulist(ids),
            }
            for n, ids in sorted(nodes.items())
        },
        "online_count": len(cpus),
        "pid": 4711,
        "platform": "Linux-5.10.0-aarch64-with-glibc2.34",
        "unavailable_count": 0,
    }


def torch_stack(devices):
    return {
        "cuda_available": False,
        "cuda_count": 0,
        "cuda_version": None,
        "npu_available": True,
        "npu_count": devices,
        "torch_distributed_available": True,
        "torch_error": None,
        "torch_npu_error": None,
        "torch_npu_ok": True,
        "torch_npu_version": "2.1.0.post6",
        "torch_ok": True,
        "torch_version": "2.1.0",
    }


def ts(i):
    s = i % 86400
    return f"2026-07-08T{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}+00:00"


def odd_bandwidth(i):
    """NaN, Infinity or a plain value: what a zero or failed timing turns into."""
    if i % 10007 == 5:
        return math.nan
    if i % 10007 == 6:
        return math.inf
    return None


def pair(args):
    cpus = list(range(args.cpus))
    numa_of = lambda c: c * args.numa // args.cpus
    size_mb = args.sizes[0]
    host = "a3-node-180"

    def row(i):
        cpu0, cpu1 = divmod(i, args.cpus)
        base = {
            "device": "npu:0",
            "host": host,
            "local_rank": 0,
            "local_world_size": 2,
            "pid": 5000,
            "rank": 0,
            "rank0_cpu": cpu0,
            "rank1_cpu": cpu1,
            "repeat": 0,
            "size_mb": size_mb,
            "target_cpu": cpu0,
            "test": "core_pair_d2d_matrix",
            "ts": ts(i),
            "world_size": 2,
        }
        if i % 997 == 3:
            base.update(
                error="RuntimeError('HCCL function error: hcclAllGather, error code is 9')",
                operation="all_gather",
                status="error",
            )
            return base
        gbps = 13.75 - (cpu0 * 7 + cpu1 * 3) % 40 / 16
        odd = odd_bandwidth(i)
        gbps = gbps if odd is None else odd
        seconds = size_mb * (1 << 20) / (gbps * 1e9) if math.isfinite(gbps) else gbps
        base.update(
            alg_gbps=gbps,
            avg_seconds=seconds / 20,
            backend="hccl",
            bind_actual_cpus=[cpu0],
            bind_actual_cpus_list=str(cpu0),
            device_kind="npu",
            device_pair=[0, 5],
            dtype="float16",
            iterations=20,
            operation="all_gather",
            rank_exchange_gbps=gbps,
            seconds=seconds,
            status="ok",
        )
        return base

    meta = {
        "affinity_summary": affinity_summary(cpus, numa_of, host),
        "argv": ["core_pair_d2d_matrix.py", "--device-pair", "0,5", "--sizes-mb",
                 str(size_mb), "--record-ranks", "rank0"],
        "created_at": "2026-07-08T06:00:00+00:00",
        "device_kind": "npu",
        "device_pair": [0, 5],
        "env": {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "2"},
        "finished_at": "2026-07-09T06:10:00+00:00",
        "rank0_cpus": cpus,
        "rank1_cpus": cpus,
        "rank_info": {"host": host, "local_rank": 0, "local_world_size": 2, "pid": 5000,
                      "rank": 0, "world_size": 2},
        "record_ranks": "rank0",
        "sizes_mb": [size_mb],
        "torch_stack": torch_stack(16),
    }
    return {"meta": meta, "metrics": Rows(args.cpus * args.cpus, row)}


def h2d(args):
    cpus = list(range(args.cpus))
    numa_of = lambda c: c * args.numa // args.cpus
    devices = list(range(args.devices))
    per_cpu = len(args.sizes) * args.devices

    def row(i):
        cpu, rest = divmod(i, per_cpu)
        size_mb, device = args.sizes[rest // args.devices], rest % args.devices
        if i % 997 == 3:
            return {
                "bind_actual_cpus": [cpu],
                "bind_actual_cpus_list": str(cpu),
                "device_id": device,
                "device_kind": "npu",
                "error": "RuntimeError('ACL stream synchronize failed, error code is 507013')",
                "host_cpu": cpu,
                "operation": "copy",
                "repeat": 0,
                "size_mb": size_mb,
                "status": "error",
                "test": "core_h2d_matrix",
                "ts": ts(i),
            }
        near = numa_of(cpu) == device * args.numa // args.devices
        gbps = (58.4 if near else 31.2) - (cpu * 5 + device) % 23 / 10
        odd = odd_bandwidth(i)
        gbps = gbps if odd is None else odd
        return {
            "bind_actual_cpus": [cpu],
            "bind_actual_cpus_list": str(cpu),
            "device": f"npu:{device}",
            "device_id": device,
            "direction": "host_to_device",
            "dtype": "float16",
            "gbps": gbps,
            "host_cpu": cpu,
            "iterations": 20,
            "operation": "copy",
            "pinned": True,
            "repeat": 0,
            "seconds": size_mb * (1 << 20) * 20 / (gbps * 1e9) if math.isfinite(gbps) else gbps,
            "size_mb": size_mb,
            "status": "ok",
            "test": "core_h2d_matrix",
            "ts": ts(i),
        }

    meta = {
        "affinity_summary": affinity_summary(cpus, numa_of, "a3-node-180"),
        "argv": ["/usr/lib/python3/cluster_health_detect/core_h2d_matrix.py", "--cpus",
                 f"0-{args.cpus - 1}", "--sizes-mb", ",".join(map(str, args.sizes))],
        "cpu_ids": cpus,
        "created_at": "2026-07-08T03:00:00+00:00",
        "device_ids": devices,
        "device_kind": "npu",
        "env": {"ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, devices))},
        "finished_at": "2026-07-08T09:00:00+00:00",
        "sizes_mb": args.sizes,
        "torch_stack": torch_stack(args.devices),
    }
    return {"meta": meta, "metrics": Rows(args.cpus * per_cpu, row)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=["pair", "h2d"])
    p.add_argument("out")
    p.add_argument("--cpus", type=int, default=640)
    p.add_argument("--devices", type=int, default=16)
    p.add_argument("--numa", type=int, default=8, help="NUMA nodes the CPUs are split into")
    p.add_argument("--sizes", default=None, help="MiB, comma-separated (pair: the first)")
    args = p.parse_args()
    args.sizes = [int(s) for s in (args.sizes or ("8" if args.kind == "pair" else "16,64,256")).split(",")]
    if args.cpus < 1 or args.devices < 1 or args.numa < 1:
        sys.exit("gen-recording.py: --cpus, --devices and --numa must be positive")
    payload = pair(args) if args.kind == "pair" else h2d(args)
    with open(args.out, "w") as f:
        # benchmark.py:write_json's call, streamed (json.dump writes the chunks of iterencode).
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
