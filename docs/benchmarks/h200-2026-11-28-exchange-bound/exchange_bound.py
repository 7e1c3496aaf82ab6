"""What a single-dispatch reduction norm can reach at a size, against the copy roof, on the first GPU.

Times, with Vulkan timestamps over back-to-back dispatches separated by barriers (as `vknorm bench` times
its norms and the copy roof; each batch right after >= 150 ms of the same work in the same submission), for
each byte count:
  copy      the copy roof (shaders/copy.comp's grid-stride copy);
  hold      every element loaded into registers before any is stored (exchange.comp MODE 0);
  reduce    + a workgroup reduction scaling the stores (MODE 1): many groups, a group per workgroup;
  exchange  + one exchange among all workgroups before the stores (MODE 2, one set);
  sets      + one exchange within each of --sets runs of workgroups (MODE 2): --sets groups spread over
            several workgroups each, as GroupNorm(32) over a GPU (the least such a group needs).
Each over workgroups of 256 or 1024 invocations, as many as the device keeps resident at once (at most 2048
invocations and 64K registers per multiprocessor), the fastest configuration kept. Needs pip `vulkan` (cffi)
and numpy. Usage:
  python exchange_bound.py --units 132 [--sets 32] [--json out.json] BYTES [BYTES ...]
"""
import argparse
import json
import os
import statistics
import struct
import sys

import numpy as np
import vulkan as vk

ffi = vk.ffi
HERE = os.path.dirname(os.path.abspath(__file__))
WARM_S, REPS, ROUNDS = float(os.environ.get("WARM_S", 0.05)), int(os.environ.get("REPS", 200)), int(os.environ.get("ROUNDS", 5))


class Gpu:
    def __init__(self):
        app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="bound",
                                   applicationVersion=1, pEngineName="bound", engineVersion=1,
                                   apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
        self.inst = vk.vkCreateInstance(vk.VkInstanceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                                                pApplicationInfo=app), None)
        rank = {vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0, vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1}
        self.pd = sorted(vk.vkEnumeratePhysicalDevices(self.inst),
                         key=lambda d: rank.get(vk.vkGetPhysicalDeviceProperties(d).deviceType, 5))[0]
        self.props = vk.vkGetPhysicalDeviceProperties(self.pd)
        self.name = self.props.deviceName if isinstance(self.props.deviceName, str) else ffi.string(self.props.deviceName).decode()
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.pd)
        qf = [i for i, q in enumerate(families) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT][0]
        qci = vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, queueFamilyIndex=qf,
                                         queueCount=1, pQueuePriorities=[1.0])
        self.dev = vk.vkCreateDevice(self.pd, vk.VkDeviceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                                                    queueCreateInfoCount=1, pQueueCreateInfos=[qci]), None)
        self.queue = vk.vkGetDeviceQueue(self.dev, qf, 0)
        self.mem = vk.vkGetPhysicalDeviceMemoryProperties(self.pd)
        self.pool = vk.vkCreateCommandPool(self.dev, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=qf), None)
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                    descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                    for i in range(4)]
        self.dsl = vk.vkCreateDescriptorSetLayout(self.dev, vk.VkDescriptorSetLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, bindingCount=4, pBindings=bindings), None)
        pcr = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=8)
        self.layout = vk.vkCreatePipelineLayout(self.dev, vk.VkPipelineLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1, pSetLayouts=[self.dsl],
            pushConstantRangeCount=1, pPushConstantRanges=[pcr]), None)
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=4)
        self.dpool = vk.vkCreateDescriptorPool(self.dev, vk.VkDescriptorPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=1, poolSizeCount=1, pPoolSizes=[size]), None)
        self.queries = vk.vkCreateQueryPool(self.dev, vk.VkQueryPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2), None)
        self.pipelines = {}

    def buffer(self, size, host=False):
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        buf = vk.vkCreateBuffer(self.dev, vk.VkBufferCreateInfo(sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=size,
                                                                usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(self.dev, buf)
        want = (vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT if host
                else vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
        kind = next(i for i in range(self.mem.memoryTypeCount)
                    if req.memoryTypeBits & (1 << i) and self.mem.memoryTypes[i].propertyFlags & want == want)
        memory = vk.vkAllocateMemory(self.dev, vk.VkMemoryAllocateInfo(sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                                                       allocationSize=req.size, memoryTypeIndex=kind), None)
        vk.vkBindBufferMemory(self.dev, buf, memory, 0)
        return buf, memory, size

    def pipeline(self, spv, wg=256, k=1, mode=0, set_size=1):
        key = (spv, wg, k, mode, set_size)
        if key not in self.pipelines:
            code = open(os.path.join(HERE, spv), "rb").read()
            module = vk.vkCreateShaderModule(self.dev, vk.VkShaderModuleCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code), pCode=code), None)
            data = ffi.new("uint32_t[]", [wg, k, mode, set_size])
            entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4) for i in range(4)]
            spec = vk.VkSpecializationInfo(mapEntryCount=4, pMapEntries=entries, dataSize=16, pData=data)
            stage = vk.VkPipelineShaderStageCreateInfo(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                       stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module,
                                                       pName="main", pSpecializationInfo=spec)
            self.pipelines[key] = vk.vkCreateComputePipelines(self.dev, None, 1, [vk.VkComputePipelineCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage, layout=self.layout)], None)[0]
        return self.pipelines[key]

    def record(self, record):
        cb = vk.vkAllocateCommandBuffers(self.dev, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        record(cb)
        vk.vkEndCommandBuffer(cb)
        return cb

    def run(self, cb):
        fence = vk.vkCreateFence(self.dev, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
        vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, commandBufferCount=1,
                                                         pCommandBuffers=[cb])], fence)
        vk.vkWaitForFences(self.dev, 1, [fence], vk.VK_TRUE, 60 * 10**9)
        vk.vkDestroyFence(self.dev, fence, None)

    def submit(self, record):
        cb = self.record(record)
        self.run(cb)
        vk.vkFreeCommandBuffers(self.dev, self.pool, 1, [cb])

    def barrier(self, cb):
        if not hasattr(self, "_barrier"):  # built once: recording thousands of dispatches is the harness's cost
            access = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
            self._stages = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
            self._barrier = [vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=access,
                                                dstAccessMask=access)]
        vk.vkCmdPipelineBarrier(cb, self._stages, self._stages, 0, 1, self._barrier, 0, None, 0, None)

    def fill(self, buf, word=0):
        self.submit(lambda cb: (vk.vkCmdFillBuffer(cb, buf[0], 0, buf[2], word), self.barrier(cb)))

    def read_u32(self, buf, n):
        staging = self.buffer(4 * n, host=True)
        self.submit(lambda cb: vk.vkCmdCopyBuffer(cb, buf[0], staging[0], 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=4 * n)]))
        ptr = vk.vkMapMemory(self.dev, staging[1], 0, 4 * n, 0)
        out = np.frombuffer(ptr, dtype=np.uint32, count=n).copy()
        vk.vkUnmapMemory(self.dev, staging[1])
        return out

    def timing(self, pipeline, dset, workgroups, push, reps, warm=0):
        """A command buffer of `reps` back-to-back dispatches, each followed by a barrier, timed, right after
        `warm` of them (NVIDIA lowers its clock within ~0.5 s of idling); time() runs it."""
        def record(cb):
            vk.vkCmdResetQueryPool(cb, self.queries, 0, 2)
            vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline)
            vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 1, [dset], 0, None)
            vk.vkCmdPushConstants(cb, self.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push), ffi.new("char[]", push))
            for _ in range(warm):
                vk.vkCmdDispatch(cb, workgroups, 1, 1)
                self.barrier(cb)
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.queries, 0)
            for _ in range(reps):
                vk.vkCmdDispatch(cb, workgroups, 1, 1)
                self.barrier(cb)
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.queries, 1)
        return self.record(record), reps

    def time(self, timing):
        """Per-dispatch us of a timing()."""
        cb, reps = timing
        self.run(cb)
        result = ffi.new("uint64_t[2]")
        vk.vkGetQueryPoolResults(self.dev, self.queries, 0, 2, 16, result, 8,
                                 vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        return (result[1] - result[0]) * self.props.limits.timestampPeriod * 1e-3 / reps

    def free(self, timing):
        vk.vkFreeCommandBuffers(self.dev, self.pool, 1, [timing[0]])


def configs(n4, units, sets):
    """(name, workgroup size, workgroups, vec4s per invocation, set size) of every resident configuration."""
    out = []
    for wg in (256, 1024):
        def fits(wgs, k):
            per_unit = -(-wgs // units)
            return k <= 16 and per_unit * wg <= 2048 and (4 * k + 32) * wg * per_unit <= 65536

        for per_unit in (1, 2, 4, 8):
            wgs = min(units * per_unit, -(-n4 // wg))
            k = -(-n4 // (wgs * wg))
            if fits(wgs, k):
                out += [("hold", wg, wgs, k, 1), ("reduce", wg, wgs, k, 1), ("exchange", wg, wgs, k, wgs)]
        for set_size in (1, 2, 4, 8, 16):
            wgs = sets * set_size
            k = -(-n4 // (wgs * wg))
            if fits(wgs, k):
                out.append(("sets", wg, wgs, k, set_size))
    return sorted(set(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, required=True, help="multiprocessors (H200: 132)")
    ap.add_argument("--sets", type=int, default=32, help="groups for the 'sets' kernel (default 32)")
    ap.add_argument("--json")
    ap.add_argument("bytes", type=int, nargs="+")
    args = ap.parse_args()
    gpu = Gpu()
    largest = max(args.bytes)
    x, y = gpu.buffer(largest), gpu.buffer(largest)
    counters = gpu.buffer(128 * (max(args.sets, 1) + 1))
    partials = gpu.buffer(8 * 8 * max(args.units * 8, args.sets * 16))
    for b in (x, y, counters, partials):
        gpu.fill(b, 0x3f800000 if b is x else 0)
    dset = vk.vkAllocateDescriptorSets(gpu.dev, vk.VkDescriptorSetAllocateInfo(
        sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=gpu.dpool, descriptorSetCount=1,
        pSetLayouts=[gpu.dsl]))[0]
    vk.vkUpdateDescriptorSets(gpu.dev, 4, [vk.VkWriteDescriptorSet(
        sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstSet=dset, dstBinding=i, descriptorCount=1,
        descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b[0], offset=0, range=b[2])])
        for i, b in enumerate((x, y, counters, partials))], 0, None)
    modes = {"hold": 0, "reduce": 1, "exchange": 2, "sets": 2}
    names = ("hold", "reduce", "exchange", "sets")
    rows = []
    print(f"device: {gpu.name}; us per dispatch, median of {ROUNDS} rounds of {REPS} after {WARM_S * 1e3:g} ms of "
          f"the same work; % of the copy roof's time; config: workgroup size x workgroups x vec4s each (/ set size)",
          flush=True)
    for nbytes in args.bytes:
        n4 = nbytes // 16
        kernels = {("copy", 256, min(65535, -(-n4 // 256)), 1, 1): None}
        for c in configs(n4, args.units, args.sets):  # one dispatch first: a wait that cannot complete is seen
            name, wg, wgs, k, set_size = c
            if modes[name] == 2:
                probe = gpu.timing(gpu.pipeline("exchange.spv", wg, k, 2, set_size), dset, wgs, struct.pack("II", n4, wgs), 1)
                gpu.time(probe)
                gpu.free(probe)
                gave_up, stale = (int(v) for v in gpu.read_u32(counters, 2))
                gpu.fill(counters, 0)
                if gave_up or stale:
                    print(f"{nbytes} bytes, {c}: workgroups not all resident: skipped")
                    continue
            kernels[c] = None
        times = {c: [] for c in kernels}
        for c in kernels:  # recorded once: warm-up dispatches for WARM_S seconds of the kernel, then REPS timed
            name, wg, wgs, k, set_size = c
            pipe = (gpu.pipeline("copy.spv", wg) if name == "copy" else
                    gpu.pipeline("exchange.spv", wg, k, modes[name], set_size))
            push = struct.pack("II", n4, wgs)
            probe = gpu.timing(pipe, dset, wgs, push, 50)
            warm = max(100, int(WARM_S / (gpu.time(probe) * 1e-6)))
            gpu.free(probe)
            kernels[c] = gpu.timing(pipe, dset, wgs, push, REPS, warm)
        for _ in range(ROUNDS):  # kernels interleaved round by round
            for c, timing in kernels.items():
                times[c].append(gpu.time(timing))
        for timing in kernels.values():
            gpu.free(timing)
        gave_up, stale = (int(v) for v in gpu.read_u32(counters, 2))
        gpu.fill(counters, 0)
        row = {"bytes": nbytes, "gave_up": gave_up, "stale_reads": stale,
               "kernels": [{"kernel": c[0], "workgroup_size": c[1], "workgroups": c[2], "vec4_per_invocation": c[3],
                            "set_size": c[4], "us": times[c]} for c in kernels]}
        copy_us = statistics.median(next(t for c, t in times.items() if c[0] == "copy"))
        row["copy_us"] = copy_us
        line = [f"{nbytes / 1e6:7.3f} MB  copy {copy_us:6.2f}"]
        for name in names:
            candidates = [c for c in kernels if c[0] == name]
            if not candidates:
                line.append(f"{name} -")
                continue
            best = min(candidates, key=lambda c: statistics.median(times[c]))
            t = statistics.median(times[best])
            label = f"{best[1]}x{best[2]}x{best[3]}" + (f"/{best[4]}" if name == "sets" else "")
            row[name] = {"config": label, "us": t, "pct_of_copy": 100 * copy_us / t}
            line.append(f"{name} {t:6.2f} ({100 * copy_us / t:3.0f} %, {label})")
        if gave_up or stale:
            line.append(f"INVALID: {gave_up} waits gave up, {stale} partials read unpublished")
        print("  ".join(line), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gpu.name, "method": f"Vulkan timestamps, {REPS} dispatches after {WARM_S * 1e3:g} ms "
                       f"of the same work in one submission, median of {ROUNDS} interleaved rounds",
                       "units": args.units, "sets": args.sets, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
