"""Plans (on the H200 model of tests/planned.py, with and without its multiprocessor count, and lavapipe) of a
sweep of GroupNorm, InstanceNorm, LayerNorm and RMSNorm shapes, as JSON: run it with two builds (or two knob
settings) and compare. Usage, from the project root: python plan_sweep.py OUT.json"""
import json
import sys

sys.path.insert(0, "tests")  # tests/planned.py: the device models
from planned import H200, LAVAPIPE, H200_UNKNOWN_RESIDENCY, channels_plan, rows_plan
out = {}
devs = {"h200": H200, "h200u": H200_UNKNOWN_RESIDENCY, "lvp": LAVAPIPE}
for dn, d in devs.items():
    for fp16 in (False, True):
        for c in (4, 8, 12, 16, 32, 64, 96, 128, 256, 320, 512, 640, 960, 1280, 1920, 2560):
            for hw in (1, 7, 8, 14, 16, 28, 32, 40, 56, 64, 96, 112, 128):
                for g in (1, 2, 4, 8, 16, 32):
                    if c % g: continue
                    p = channels_plan("GroupNorm", c, hw, hw, g, fp16, d)
                    out[f"{dn} GN {c}x{hw}x{hw}/{g} {fp16}"] = p
                p = channels_plan("InstanceNorm", c, hw, hw, c, fp16, d)
                out[f"{dn} IN {c}x{hw}x{hw} {fp16}"] = p
        for r in (1, 4, 16, 64, 197, 1024, 4096):
            for cols in (64, 768, 4096, 12288, 32768):
                for op in ("LayerNorm", "RMSNorm"):
                    try: out[f"{dn} {op} {r}x{cols} {fp16}"] = rows_plan(op, r, cols, fp16, d, pack=4 if r % 4 == 0 else 1)
                    except Exception as e: out[f"{dn} {op} {r}x{cols} {fp16}"] = str(e)
json.dump({k: (v if isinstance(v, str) else {kk: vv for kk, vv in v.items() if kk != "gpu_us"}) for k, v in out.items()}, open(sys.argv[1], "w"), sort_keys=True)
print(len(out))
