import time, statistics, numpy as np
def med(f, n=30):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        a=time.perf_counter(); f(); ts.append(time.perf_counter()-a)
    return statistics.median(ts)*1e3
import vknorm
from vknorm import _core
ctx=_core.Context.create(0)
x=np.random.default_rng(0).standard_normal((1024,4096)).astype(np.float32)
m=_core.Mat.from_numpy(x); p4=m.convert_packing(4)
o1=vknorm.Option(use_packing_layout=False)
ln=vknorm.LayerNorm(affine_size=4096, eps=1e-5, device=ctx); ln.load_model(np.ones(4096,np.float32), np.zeros(4096,np.float32))
v=vknorm.to_device(x, device=ctx); v1=vknorm.to_device(x, o1, device=ctx)
r={}
r['np.copy']=med(lambda: x.copy())
r['from_numpy']=med(lambda: _core.Mat.from_numpy(x))
r['convert_packing(4)']=med(lambda: m.convert_packing(4))
r['upload pack1 Mat']=med(lambda: _core.VkMat.upload(m, ctx, vknorm.Option._of(o1)))
r['upload pack4 from pack4 Mat']=med(lambda: _core.VkMat.upload(p4, ctx, vknorm.Option._of(vknorm.Option())))
r['to_device numpy pack4']=med(lambda: vknorm.to_device(x, device=ctx))
r['download pack1']=med(lambda: v1.download())
r['download pack4']=med(lambda: v.download())
r['v1.numpy()']=med(lambda: v1.numpy())
r['v.numpy()']=med(lambda: v.numpy())
r['numpy forward pack4']=med(lambda: ln(x))
r['numpy forward pack1']=med(lambda: ln(x, option=o1))
import torch
xt=torch.from_numpy(x); xp=xt.pin_memory(); g=xt.cuda()
r['torch .cuda()']=med(lambda: xt.cuda())
r['torch pinned .cuda()']=med(lambda: xp.cuda())
r['torch .cpu()']=med(lambda: g.cpu())
r['torch layer_norm round trip']=med(lambda: torch.nn.functional.layer_norm(xt.cuda(),(4096,)).cpu())
for k,val in r.items(): print(f"{k:35s} {val:7.3f} ms")
