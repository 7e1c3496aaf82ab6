"""Tables from timeline_probe.py's JSON (a build with probe.patch applied): per shape, the median over 12
forwards of each workgroup phase's median, in us. Usage: python3 analyze.py timeline_head.json.gz"""
import gzip
import json
import sys

import numpy as np


def us(cycles, ghz):
    return cycles / ghz / 1e3


def phases(case):
    coop = case["plan"]["path"] == "cooperative"
    rows = []
    for rep in case["reps"]:
        r = np.array(rep["recs"], dtype=np.int64)  # workgroups x 5 x 4 (uint32 words)
        rt0 = r[:, 1, 0]
        t0 = rt0.min()
        rt_end = r[:, 1, 3] if coop else r[:, 1, 1]
        row = {"kernel": rep["gpu_us"], "in workgroups": (rt_end.max() - t0) / 1e3,
               "start spread": (rt0.max() - t0) / 1e3}
        if coop:
            c = r[:, 2:4, :].reshape(len(r), 8)  # ticket, mean, M2, published, waited, barrier, merged, stored
            ghz = np.median(c[:, 7] / np.maximum(rt_end - rt0, 1))
            names = ["ticket", "loads + mean", "M2", "publish", "wait", "fence + count", "merge", "normalize + stores"]
            prev = np.zeros(len(r), dtype=np.int64)
            for k, name in enumerate(names):
                row[name] = us(np.median(c[:, k] - prev), ghz)
                prev = c[:, k]
        else:
            c = r[:, 2, :3]  # loads, reductions, stored
            ghz = np.median(c[:, 2] / np.maximum(rt_end - rt0, 1))
            prev = np.zeros(len(r), dtype=np.int64)
            for k, name in enumerate(["loads", "reductions", "normalize + stores"]):
                row[name] = us(np.median(c[:, k] - prev), ghz)
                prev = c[:, k]
        row["workgroup"] = us(np.median(c[:, -1]), ghz)
        rows.append(row)
    return {k: float(np.median([row[k] for row in rows])) for k in rows[0]}


def main(path):
    data = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
    for coop in (True, False):
        cases = [c for c in data if (c["plan"]["path"] == "cooperative") == coop]
        if not cases:
            continue
        cols = list(phases(cases[0]))
        print("| shape (plan) | " + " | ".join(cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for case in cases:
            op, c, h, w, g, path = case["case"]
            p = case["plan"]
            label = f"{'GroupNorm' if op == 'gn' else 'InstanceNorm'} {c}x{h}x{w}" + (f"/{g}" if op == "gn" else "")
            label += f" ({'forced ' if path != 'auto' else ''}{p['path']} {p['workgroup_size']} x {p['items']})"
            ph = phases(case)
            print(f"| {label} | " + " | ".join(f"{ph[k]:.2f}" for k in cols) + " |")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
