// Promises of vknorm's ncnn layers that no example shows; prints one line per check ("ok: ..." or
// "FAIL: ...") and exits 1 when any fails.
//   - the CPU forward takes a float16 blob as ncnn hands it to a layer kept off Vulkan (featmask bit 4) inside a
//     Vulkan net on a discrete GPU (downloaded as stored; ncnn casts it only on ARM and RISC-V), and gives
//     exactly what it gives for the same values in float32 -- each norm, and the fused add.
//   - vknorm::ncnn::Runner gives what ncnn's Extractor::extract gives, bit for bit (Vulkan, float32 and float16
//     storage; CPU), from one command buffer for all its extracts; an Input blob given with input() comes back as
//     given; an unknown blob is ncnn's -1 and costs no command buffer; after a failed extract the next makes a new
//     command buffer and gives ncnn's result; an extractor of the net's own create_extractor() works too, a null
//     blob name is -1; an int8 blob comes back cast to float32, as from ncnn's extract; extract_recorded given an
//     Option without VkAllocators (the net's own, use_vulkan_compute on or off) is -1, and one with allocators
//     the extractor was not given records with them; a host layer's blob comes back as that layer wrote it
//     after its float16 upload, and light mode recomputes from what an earlier extract downloaded, as ncnn's.
//   - a bfloat16 Vulkan net that ncnn's load_model from memory left loaded: every extract is -1 (CPU devices).
//   - register_layers after load_param is -1 (the layers are made, stock), and registers after clear().
//   - a Runner made before load_param records its extracts into one command buffer, as one made after.
//   - register_layer takes vknorm's types under custom type indexes only (LayerType::CustomBit | j), before
//     load_param; an index or a type it cannot take is -1; text params naming a type whose index it gave another
//     are refused at load_param. By blob index, computed_on_host and a Runner's extract:
//     an Input's blob is computed on the host (given back as given), an index outside the net's blobs is false /
//     ncnn's -1 with no command buffer made.
//   - name_by_index names binary params' blobs and layers by their indexes and their types as ncnn's (vknorm's for
//     a custom index register_layer named); a Runner then extracts by those names what it extracts by index;
//     builtin_type_name is ncnn's name for a built-in index alone.
//   - a Vulkan forward records at most one pipeline barrier per buffer, the barrier of each blob it writes waiting
//     for the compute work before it, and an in-place one on a blob only read since its last barrier barriers it
//     and marks it written.
#include <gpu.h>
#include <layer_type.h>
#include <mat.h>
#include <net.h>
#include <vknorm/ncnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int failures = 0;
void report(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  failures += !ok;
}

::ncnn::Mat wave(int w, int h, int c, float phase) {  // 6x5x4-style float32 input, x = c + sin(i + phase)
  ::ncnn::Mat m(w, h, c);
  for (int q = 0; q < c; ++q)
    for (int i = 0; i < w * h; ++i) m.channel(q)[i] = float(q) + std::sin(float(i) + phase);
  return m;
}

bool same_bits(const ::ncnn::Mat& a, const ::ncnn::Mat& b) {
  if (a.elembits() != 32 || b.elembits() != 32 || a.w != b.w || a.h != b.h || a.c != b.c) return false;
  for (int q = 0; q < a.c; ++q)
    if (std::memcmp(a.channel(q).data, b.channel(q).data, size_t(a.w) * a.h * sizeof(float)) != 0) return false;
  return true;
}

// ncnn's own extract of `blob` from x, then `times` extracts through `runner`: whether each gave the same bits, the
// runner's return codes or-ed together, and ncnn's result.
struct RunnerRound {
  bool same = true;
  int returns = 0;
  ::ncnn::Mat want;
};
RunnerRound runner_matches_ncnn(const ::ncnn::Net& net, vknorm::ncnn::Runner& runner, const ::ncnn::Mat& x,
                                const char* blob, int times) {
  RunnerRound round;
  {
    ::ncnn::Extractor ex = net.create_extractor();
    ex.input("x", x);
    ex.extract(blob, round.want);
  }
  for (int i = 0; i < times; ++i) {
    ::ncnn::Extractor ex = runner.create_extractor();
    ex.input("x", x);
    ::ncnn::Mat got;
    round.returns |= runner.extract(ex, blob, got);
    round.same = round.same && same_bits(got, round.want);
  }
  return round;
}

// One layer (with `bottoms` inputs) from a .param line, its weights 2 x `weights` floats (gamma, beta); on the
// CPU, or on ncnn's default GPU in float32 storage.
struct OneLayer {
  ::ncnn::Net net;
  bool loaded = false;
  OneLayer(const std::string& line, int bottoms, int tops, int weights, bool vulkan = false) {
    net.opt.use_vulkan_compute = vulkan;
    if (vulkan) net.opt.use_fp16_storage = net.opt.use_fp16_packed = net.opt.use_fp16_arithmetic = false;
    vknorm::ncnn::register_layers(net);
    std::string param = "7767517\n" + std::to_string(bottoms + 1) + " " + std::to_string(bottoms + tops) + "\n";
    for (int i = 0; i < bottoms; ++i) param += "Input in" + std::to_string(i) + " 0 1 x" + std::to_string(i) + "\n";
    param += line + "\n";
    std::vector<float> w(size_t(2) * weights);
    for (size_t i = 0; i < w.size(); ++i) w[i] = i < size_t(weights) ? 0.5f + 0.1f * float(i) : 0.05f * float(i);
    const int read = net.load_param_mem(param.c_str()) == 0
                         ? net.load_model(reinterpret_cast<const unsigned char*>(w.data())) : -1;
    loaded = weights ? read > 0 : read == 0;
  }
  const ::ncnn::Layer* layer() const { return net.layers().back(); }
};

// ncnn's vkCmdPipelineBarrier, logging the buffer barriers recorded through it.
struct BufferBarrier {
  VkBuffer buffer;
  VkDeviceSize offset;
  VkPipelineStageFlags after;  // the source stages
};
PFN_vkCmdPipelineBarrier g_pipeline_barrier = nullptr;
std::vector<BufferBarrier> g_barriers;
void VKAPI_PTR logged_pipeline_barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkPipelineStageFlags dst,
                                       VkDependencyFlags flags, uint32_t memory_count, const VkMemoryBarrier* memory,
                                       uint32_t buffer_count, const VkBufferMemoryBarrier* buffers,
                                       uint32_t image_count, const VkImageMemoryBarrier* images) {
  for (uint32_t i = 0; i < buffer_count; ++i) g_barriers.push_back({buffers[i].buffer, buffers[i].offset, src});
  g_pipeline_barrier(cb, src, dst, flags, memory_count, memory, buffer_count, buffers, image_count, images);
}

// What one forward recorded: its buffer barriers (in a new command buffer, submitted: ncnn records them at
// submission where the device lacks push descriptors), the most on one buffer, and how many of the blobs it
// writes have no barrier that waits for the compute work before it. -1 barriers where recording or submitting
// failed.
struct ForwardBarriers {
  int barriers = -1, most_on_one_buffer = 0, written_not_after_compute = 0;
};
template <typename Record>
ForwardBarriers barriers_of(const ::ncnn::VulkanDevice* vkdev, const std::vector<const ::ncnn::VkMat*>& written,
                            Record record) {
  ForwardBarriers f;
  ::ncnn::VkCompute cmd(vkdev);
  g_barriers.clear();
  g_pipeline_barrier = ::ncnn::vkCmdPipelineBarrier;
  ::ncnn::vkCmdPipelineBarrier = logged_pipeline_barrier;
  const int r = record(cmd) | cmd.submit_and_wait();
  ::ncnn::vkCmdPipelineBarrier = g_pipeline_barrier;
  if (r != 0) return f;
  f.barriers = int(g_barriers.size());
  auto on = [](const BufferBarrier& b, VkBuffer buffer, VkDeviceSize offset) {
    return b.buffer == buffer && b.offset == offset;
  };
  for (const BufferBarrier& b : g_barriers)
    f.most_on_one_buffer = std::max(
        f.most_on_one_buffer,
        int(std::count_if(g_barriers.begin(), g_barriers.end(), [&](const BufferBarrier& o) {
          return on(o, b.buffer, b.offset);
        })));
  for (const ::ncnn::VkMat* m : written)
    f.written_not_after_compute += std::none_of(g_barriers.begin(), g_barriers.end(), [&](const BufferBarrier& b) {
      return on(b, m->buffer(), m->data->offset) && (b.after & VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
    });
  return f;
}

std::string described(const ForwardBarriers& f) {
  return std::to_string(f.barriers) + " buffer barriers, at most " + std::to_string(f.most_on_one_buffer) +
         " on one buffer, " + std::to_string(f.written_not_after_compute) + " written blobs not after compute";
}

// A Vulkan forward (of a one-pass plan) records at most one barrier per buffer: ncnn's record_pipeline records one
// per binding whose buffer was last written (or last touched outside a compute shader), so a buffer bound to
// several slots, or ncnn's dummy buffer in each empty one, got one per slot. The barrier of each blob it writes
// waits for the compute work before it: ncnn's for a block its pool just handed out waits for nothing, though a
// dispatch recorded before may still read that block. An in-place forward on a blob only read since its last
// barrier barriers it first (its write must wait for those reads) and marks it written, so that the next reader
// barriers too.
void barriers_once_per_buffer(const std::string& what, const std::string& line, int bottoms, int tops,
                              int weights) {
  OneLayer one(line, bottoms, tops, weights, true);
  if (!one.loaded) return report(false, what + ": the layer did not load");
  const ::ncnn::VulkanDevice* vkdev = one.net.vulkan_device();
  ::ncnn::VkAllocator* blob_allocator = vkdev->acquire_blob_allocator();
  ::ncnn::VkAllocator* staging_allocator = vkdev->acquire_staging_allocator();
  ::ncnn::Option opt = one.net.opt;
  opt.blob_vkallocator = opt.workspace_vkallocator = blob_allocator;
  opt.staging_vkallocator = staging_allocator;
  ForwardBarriers out_of_place, in_place;
  bool marked = false;
  {
    std::vector<::ncnn::VkMat> x(bottoms), y(tops);
    ::ncnn::VkCompute upload(vkdev);
    for (int i = 0; i < bottoms; ++i) upload.record_upload(wave(4, 5, 6, 0.7f * float(i)), x[i], opt);
    const bool uploaded = upload.submit_and_wait() == 0;
    const ::ncnn::Layer* layer = one.layer();
    if (uploaded) {
      std::vector<const ::ncnn::VkMat*> outputs;
      for (const ::ncnn::VkMat& m : y) outputs.push_back(&m);  // made by the forward, before the log is read
      out_of_place = barriers_of(vkdev, outputs, [&](::ncnn::VkCompute& cmd) {
        return bottoms == 1 ? layer->forward(x[0], y[0], cmd, opt) : layer->forward(x, y, cmd, opt);
      });
    }
    if (uploaded && bottoms == 1) {
      // only read by shaders since its last barrier
      x[0].data->access_flags = VK_ACCESS_SHADER_READ_BIT;
      x[0].data->stage_flags = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
      in_place = barriers_of(vkdev, {&x[0]},
                             [&](::ncnn::VkCompute& cmd) { return layer->forward_inplace(x[0], cmd, opt); });
      marked = (x[0].data->access_flags & VK_ACCESS_SHADER_WRITE_BIT) != 0;
    }
  }
  vkdev->reclaim_blob_allocator(blob_allocator);
  vkdev->reclaim_staging_allocator(staging_allocator);
  auto holds = [](const ForwardBarriers& f) {
    return f.barriers >= 1 && f.most_on_one_buffer == 1 && f.written_not_after_compute == 0;
  };
  std::string said = what + ": out of place, " + described(out_of_place);
  bool ok = holds(out_of_place);
  if (bottoms == 1) {
    said += "; in place on a blob only read since its last barrier, " + described(in_place) +
            ", the blob then marked written: " + (marked ? "yes" : "no");
    ok = ok && holds(in_place) && marked;
  }
  report(ok, said);
}

void float16_input_like_float32(const std::string& what, const std::string& line, int bottoms, int tops,
                                int weights) {
  OneLayer one(line, bottoms, tops, weights);
  if (!one.loaded) return report(false, what + ": the layer did not load");
  ::ncnn::Option opt = one.net.opt;
  std::vector<::ncnn::Mat> x16(bottoms), x32(bottoms);
  for (int i = 0; i < bottoms; ++i) {
    ::ncnn::cast_float32_to_float16(wave(4, 5, 6, 0.7f * float(i)), x16[i], opt);
    ::ncnn::cast_float16_to_float32(x16[i], x32[i], opt);  // the same values, in float32
  }
  std::vector<::ncnn::Mat> y16(one.layer()->tops.size()), y32(one.layer()->tops.size());
  int r16, r32;
  if (bottoms == 1) {
    r16 = one.layer()->forward(x16[0], y16[0], opt);
    r32 = one.layer()->forward(x32[0], y32[0], opt);
  } else {
    r16 = one.layer()->forward(x16, y16, opt);
    r32 = one.layer()->forward(x32, y32, opt);
  }
  bool ok = r16 == 0 && r32 == 0;
  for (size_t t = 0; ok && t < y16.size(); ++t) ok = same_bits(y16[t], y32[t]);
  report(ok, what + ": a float16 CPU input gives the float32 result bit for bit (returns " + std::to_string(r16) +
                 ", " + std::to_string(r32) + ")");
}

void runner_like_ncnns_extract(bool vulkan, bool fp16) {
  const std::string what = std::string("Runner, ") + (vulkan ? fp16 ? "Vulkan float16" : "Vulkan float32" : "CPU");
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = vulkan;
  net.opt.use_fp16_storage = net.opt.use_fp16_packed = fp16;
  net.opt.use_fp16_arithmetic = false;
  vknorm::ncnn::register_layers(net);
  const char* param = "7767517\n3 3\nInput in 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=1\nReLU r 1 1 y z\n";
  std::vector<float> w(8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f + 0.1f * float(i);
  if (net.load_param_mem(param) != 0 || net.load_model(reinterpret_cast<const unsigned char*>(w.data())) <= 0)
    return report(false, what + ": the net did not load");
  if (vulkan && !net.vulkan_device()) return report(false, what + ": no Vulkan device");
  const ::ncnn::Mat x = wave(4, 5, 6, 0.3f);
  vknorm::ncnn::Runner runner(net);
  const auto [same, r, want] = runner_matches_ncnn(net, runner, x, "z", 3);
  report(r == 0 && same && runner.command_buffers_made() == (vulkan ? 1u : 0u),
         what + ": three extracts give ncnn's extract bit for bit (returns " + std::to_string(r) +
             ", command buffers made " + std::to_string(runner.command_buffers_made()) + ")");
  ::ncnn::Extractor ex = runner.create_extractor();
  ex.input("x", x);
  ::ncnn::Mat given, none;
  const int r_given = runner.extract(ex, "x", given);
  const int r_none = runner.extract(ex, "no_such_blob", none);
  report(r_given == 0 && same_bits(given, x) && r_none == -1 && none.empty(),
         what + ": the given input comes back as given (returns " + std::to_string(r_given) +
             "), an unknown blob is -1 (returns " + std::to_string(r_none) + ")");

  // Neither of those used the command buffer: the next extract still runs on the first one. Then an extract
  // that fails in the recorded forward (rows of 5 where the LayerNorm's affine size is 4) drops it: the next
  // makes another, and gives ncnn's result again.
  ::ncnn::Mat after_none, after_failure, bad_out;
  int r_after_none = 0, r_bad = 0, r_after_failure = 0;
  {
    ::ncnn::Extractor e = runner.create_extractor();
    e.input("x", x);
    r_after_none = runner.extract(e, "z", after_none);
  }
  const uint64_t made_after_none = runner.command_buffers_made();
  {
    ::ncnn::Extractor e = runner.create_extractor();
    e.input("x", wave(5, 5, 6, 0.3f));
    r_bad = runner.extract(e, "z", bad_out);
  }
  {
    ::ncnn::Extractor e = runner.create_extractor();
    e.input("x", x);
    r_after_failure = runner.extract(e, "z", after_failure);
  }
  const uint64_t made = runner.command_buffers_made();
  report(r_after_none == 0 && same_bits(after_none, want) && made_after_none == (vulkan ? 1u : 0u) && r_bad != 0 &&
             r_after_failure == 0 && same_bits(after_failure, want) && made == (vulkan ? 2u : 0u),
         what + ": an unknown blob costs no command buffer (made " + std::to_string(made_after_none) +
             "), a failed extract (returns " + std::to_string(r_bad) + ") drops its one and the next extract gives "
             "ncnn's result from a new one (returns " + std::to_string(r_after_failure) + ", made " +
             std::to_string(made) + ")");

  // An extractor made by the net itself (no device allocators of its own) works through the Runner too, and a
  // null blob name is -1.
  ::ncnn::Mat from_net_extractor, null_out;
  int r_net = 0, r_null = 0;
  {
    ::ncnn::Extractor e = net.create_extractor();
    e.input("x", x);
    r_net = runner.extract(e, "z", from_net_extractor);
    r_null = runner.extract(e, nullptr, null_out);
  }
  report(r_net == 0 && same_bits(from_net_extractor, want) && r_null == -1 && null_out.empty(),
         what + ": an extractor of net.create_extractor() gives ncnn's result (returns " + std::to_string(r_net) +
             "), a null blob name is -1 (returns " + std::to_string(r_null) + ")");

  // extract_recorded given the net's own Option, whose VkAllocators are null (the extractor takes its own from the
  // device): -1 with a message, where it dereferenced them.
  if (vulkan) {
    const ::ncnn::VulkanDevice* vkdev = net.vulkan_device();
    ::ncnn::VkAllocator* blob_allocator = vkdev->acquire_blob_allocator();
    ::ncnn::VkAllocator* staging_allocator = vkdev->acquire_staging_allocator();
    int r_opt = 0;
    ::ncnn::Mat out;
    {
      ::ncnn::VkCompute cmd(vkdev);
      ::ncnn::Extractor e = net.create_extractor();
      e.set_blob_vkallocator(blob_allocator);  // ncnn's own VkMat extract needs them
      e.set_workspace_vkallocator(blob_allocator);
      e.set_staging_vkallocator(staging_allocator);
      e.input("x", x);
      r_opt = vknorm::ncnn::extract_recorded(e, "z", out, cmd, net.opt);
    }
    vkdev->reclaim_blob_allocator(blob_allocator);
    vkdev->reclaim_staging_allocator(staging_allocator);
    report(r_opt == -1 && out.empty() && !net.opt.blob_vkallocator,
           what + ": extract_recorded with the net's own opt (no VkAllocators) is -1 (returns " +
               std::to_string(r_opt) + ")");
    // ... with use_vulkan_compute off in that opt too (it skipped the check and crashed in ncnn's upload), on an
    // extractor of net.create_extractor(), which has no allocators: -1 as well
    ::ncnn::Option off = net.opt;
    off.use_vulkan_compute = false;
    int r_off = 0;
    {
      ::ncnn::VkCompute cmd(vkdev);
      ::ncnn::Extractor e = net.create_extractor();
      e.input("x", x);
      r_off = vknorm::ncnn::extract_recorded(e, "z", out, cmd, off);
    }
    // ... and an opt with allocators the extractor was not given: the extractor records with them (it crashed on
    // its own null ones), ncnn's result
    blob_allocator = vkdev->acquire_blob_allocator();
    staging_allocator = vkdev->acquire_staging_allocator();
    ::ncnn::Option given = net.opt;
    given.blob_vkallocator = given.workspace_vkallocator = blob_allocator;
    given.staging_vkallocator = staging_allocator;
    int r_given = 0;
    ::ncnn::Mat recorded;
    {
      ::ncnn::VkCompute cmd(vkdev);
      ::ncnn::Extractor e = net.create_extractor();
      e.input("x", x);
      r_given = vknorm::ncnn::extract_recorded(e, "z", recorded, cmd, given);
    }
    vkdev->reclaim_blob_allocator(blob_allocator);
    vkdev->reclaim_staging_allocator(staging_allocator);
    report(r_off == -1 && r_given == 0 && same_bits(recorded, want),
           what + ": extract_recorded, an opt with use_vulkan_compute off and no VkAllocators is -1 (returns " +
               std::to_string(r_off) + "); allocators the extractor was not given are given to it (returns " +
               std::to_string(r_given) + ", ncnn's result)");
  }
}

// A blob a layer made on the host (featmask bit 4) in a float16 Vulkan net comes back from a Runner as ncnn's
// extract gives it, float32 as that layer wrote it, also after a later extract uploaded it (float16) for the
// Vulkan layers after it; and in light mode, an extract that recomputes released blobs starts, as ncnn's does,
// from what an earlier extract downloaded (y, then out, then z).
void runner_host_blobs_and_light_mode_like_ncnns_extract() {
  const std::string what = "Runner, host layer's blob / light mode";
  for (int light = 0; light < 2; ++light) {
    ::ncnn::Net net;
    net.opt.use_vulkan_compute = true;
    net.opt.use_fp16_storage = net.opt.use_fp16_packed = true;
    net.opt.use_fp16_arithmetic = false;
    vknorm::ncnn::register_layers(net);
    const std::string param = std::string("7767517\n4 4\nInput in 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=1") +
                              (light ? "" : " 31=16") + "\nReLU r 1 1 y z\nSigmoid s 1 1 z out\n";
    std::vector<float> weights(8);
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.5f + 0.1f * float(i);
    if (net.load_param_mem(param.c_str()) != 0 || net.load_model(reinterpret_cast<const unsigned char*>(weights.data())) <= 0)
      return report(false, what + ": the net did not load");
    if (!net.vulkan_device()) return report(false, what + ": no Vulkan device");
    const ::ncnn::Mat x = wave(4, 5, 6, 0.3f);
    const char* order[] = {"y", "out", "z"};
    const char* host_order[] = {"out", "y"};
    const std::vector<const char*> names = light ? std::vector<const char*>(order, order + 3)
                                                 : std::vector<const char*>(host_order, host_order + 2);
    std::vector<::ncnn::Mat> want(names.size()), got(names.size());
    std::vector<int> r_want(names.size()), r_got(names.size());
    {
      ::ncnn::Extractor ex = net.create_extractor();
      ex.set_light_mode(light);
      ex.input("x", x);
      for (size_t i = 0; i < names.size(); ++i) r_want[i] = ex.extract(names[i], want[i]);
    }
    vknorm::ncnn::Runner runner(net);
    {
      ::ncnn::Extractor ex = runner.create_extractor();
      ex.set_light_mode(light);
      ex.input("x", x);
      for (size_t i = 0; i < names.size(); ++i) r_got[i] = runner.extract(ex, names[i], got[i]);
    }
    bool ok = true;
    std::string codes;
    for (size_t i = 0; i < names.size(); ++i) {
      ok = ok && r_want[i] == 0 && r_got[i] == 0 && same_bits(got[i], want[i]);
      codes += std::string(i ? ", " : "") + names[i] + " " + std::to_string(r_got[i]);
    }
    report(ok, what + (light ? ": light mode, y then out then z" : ": float16 net, out then the host LayerNorm's y") +
                   " as ncnn's extract gives them (Runner returns " + codes + ")");
  }
}

// An int8 blob (ncnn's Quantize runs on the host inside a Vulkan net; the blob is uploaded as int8 and downloaded as
// int8) comes back from a Runner cast to float32, as ncnn's extract gives it.
void runner_casts_int8_blobs_like_ncnns_extract() {
  const std::string what = "Runner, Vulkan int8 blob";
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = true;
  vknorm::ncnn::register_layers(net);
  const float scale = 10.f;
  if (net.load_param_mem("7767517\n2 2\nInput in 0 1 x\nQuantize q 1 1 x y 0=1\n") != 0 ||
      net.load_model(reinterpret_cast<const unsigned char*>(&scale)) <= 0)
    return report(false, what + ": the net did not load");
  if (!net.vulkan_device()) return report(false, what + ": no Vulkan device");
  const ::ncnn::Mat x = wave(8, 3, 2, 0.1f);
  ::ncnn::Mat want, got;
  {
    ::ncnn::Extractor ex = net.create_extractor();
    ex.input("x", x);
    ex.extract("y", want);
  }
  vknorm::ncnn::Runner runner(net);
  ::ncnn::Extractor ex = runner.create_extractor();
  ex.input("x", x);
  const int r = runner.extract(ex, "y", got);
  report(r == 0 && want.elemsize == 4u && same_bits(got, want) && runner.command_buffers_made() == 1u,
         what + ": float32, ncnn's extract's values bit for bit (returns " + std::to_string(r) + ", elemsize " +
             std::to_string(got.elemsize) + ")");
}

}  // namespace

// A Vulkan net with bfloat16 storage: vknorm's create_pipeline refuses it, but ncnn's load_model from memory does not
// stop there (it returns the bytes read); every forward is then -1, saying bfloat16 again (stderr), not a plan
// that was never made. Where the device keeps no bfloat16 storage, ncnn turns the option off and the net runs.
// On CPU devices only (lavapipe): on an H200 ncnn itself cannot run a bfloat16 net (its bfloat16 shaders fail to
// build there, and its extract then died of SIGILL), so nothing of vknorm's is left to check.
void bfloat16_nets_are_refused_at_every_forward() {
  if (::ncnn::get_gpu_count() < 1 || ::ncnn::get_gpu_info(::ncnn::get_default_gpu_index()).type() != 3) return;
  const std::string what = "bfloat16 storage";
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = true;
  net.opt.use_bf16_packed = true;
  vknorm::ncnn::register_layers(net);
  const float weights[8] = {1, 1, 1, 1, 0, 0, 0, 0};
  if (net.load_param_mem("7767517\n2 2\nInput in 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=1\n") != 0)
    return report(false, what + ": load_param failed");
  net.load_model(reinterpret_cast<const unsigned char*>(weights));
  ::ncnn::Mat y;
  ::ncnn::Extractor ex = net.create_extractor();
  ex.input("x", wave(4, 3, 2, 0.2f));
  const int r = ex.extract("y", y);
  const bool kept = net.opt.use_bf16_packed;
  report(kept ? r == -1 : r == 0, what + (kept ? ": every extract is -1 (returns " : ": the device keeps none, the net runs (returns ") +
                                      std::to_string(r) + ")");
}

// A null path or text is an error ncnn's own loaders would crash on: -1, and the out-params emptied.
void fused_loaders_refuse_null() {
  ::ncnn::Net net;
  vknorm::ncnn::register_layers(net);
  std::vector<vknorm::ncnn::FusedPattern> fused(1);
  std::vector<std::string> blobs(1, "stale");
  const int r = vknorm::ncnn::load_param_fused(net, nullptr, &fused, &blobs);
  report(r == -1 && fused.empty() && blobs.empty(), "load_param_fused with a null path: -1 (returns " + std::to_string(r) + ")");
}

// register_layers after load_param: -1, the layers stay stock (ncnn made them at load_param); after clear(), it
// registers and the next load_param makes vknorm's.
void register_layers_only_before_load_param() {
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = false;
  const char* param = "7767517\n2 2\nInput in0 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=0\n";
  const bool loaded = net.load_param_mem(param) == 0;
  const int late = vknorm::ncnn::register_layers(net);
  const bool stock = !vknorm::ncnn::is_vknorm_layer(net.layers().back());
  net.clear();
  const int after_clear = vknorm::ncnn::register_layers(net);
  const bool ours = net.load_param_mem(param) == 0 && vknorm::ncnn::is_vknorm_layer(net.layers().back());
  report(loaded && late == -1 && stock && after_clear == 0 && ours,
         "register_layers after load_param: -1, the layers stock (returns " + std::to_string(late) + "); after clear() "
         "it registers (" + std::to_string(after_clear) + ")");
}

// A Runner made before load_param takes the device ncnn picks there: its Vulkan extracts share one command buffer
// (it used ncnn's per-extract pool for good) and give ncnn's result.
void runner_made_before_load_param() {
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = true;
  vknorm::ncnn::register_layers(net);
  vknorm::ncnn::Runner runner(net);
  const char* param = "7767517\n2 2\nInput in 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=0\n";
  if (net.load_param_mem(param) != 0 || net.load_model(reinterpret_cast<const unsigned char*>("")) < 0)
    return report(false, "Runner made before load_param: the net did not load");
  const RunnerRound round = runner_matches_ncnn(net, runner, wave(4, 5, 6, 0.3f), "y", 2);
  report(round.returns == 0 && round.same && runner.command_buffers_made() == 1,
         "Runner made before load_param: ncnn's result from one command buffer (made " +
             std::to_string(runner.command_buffers_made()) + ")");
}

// vknorm::ncnn::register_layer's refusals, and the by-index forms of computed_on_host and Runner::extract.
void register_layer_and_blob_indexes() {
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = true;
  vknorm::ncnn::register_layers(net);
  const int custom = vknorm::ncnn::register_layer(net, 256 | 3, "vknorm.GroupNorm");
  const int builtin = vknorm::ncnn::register_layer(net, 5, "vknorm.GroupNorm");
  const int negative = vknorm::ncnn::register_layer(net, -1, "vknorm.GroupNorm");
  const int unknown = vknorm::ncnn::register_layer(net, 256, "Convolution");
  report(custom == 0 && builtin == -1 && negative == -1 && unknown == -1,
         "register_layer: a custom index 0, a built-in or negative index or a type not vknorm's -1 (returns " +
             std::to_string(custom) + " " + std::to_string(builtin) + " " + std::to_string(negative) + " " +
             std::to_string(unknown) + ")");
  // ncnn's slot 3 holds vknorm.InstanceNorm by name (register_layers' order): now a GroupNorm's, which text params
  // naming vknorm.InstanceNorm must not get
  const bool misnamed = net.load_param_mem("7767517\n2 2\nInput in 0 1 x\n"
                                           "vknorm.InstanceNorm n 1 1 x y 0=6 1=0.001 2=0\n") == -1;
  const bool kept = net.load_param_mem("7767517\n2 2\nInput in 0 1 x\n"
                                       "vknorm.GroupNorm n 1 1 x y 0=3 1=6 2=0.001 3=0\n") == 0;
  net.clear();
  report(misnamed && kept, "text params naming a type whose custom index register_layer gave another: refused at "
                           "load_param; the other types load");
  const char* param = "7767517\n2 2\nInput in 0 1 x\nLayerNorm n 1 1 x y 0=4 1=0.001 2=0\n";
  if (net.load_param_mem(param) != 0 || net.load_model(reinterpret_cast<const unsigned char*>("")) < 0)
    return report(false, "register_layer and blob indexes: the net did not load");
  const int late = vknorm::ncnn::register_layer(net, 256, "vknorm.LayerNorm");
  report(late == -1, "register_layer after load_param: -1 (returns " + std::to_string(late) + ")");
  const bool host = vknorm::ncnn::computed_on_host(net, 0) && !vknorm::ncnn::computed_on_host(net, 1) &&
                    !vknorm::ncnn::computed_on_host(net, 2) && !vknorm::ncnn::computed_on_host(net, -1);
  report(host, "computed_on_host by index: the Input's blob only (an index outside the blobs: false)");
  vknorm::ncnn::Runner runner(net);
  const ::ncnn::Mat x = wave(4, 5, 6, 0.1f);
  ::ncnn::Mat given, outside;
  int r_given = -1, r_outside = 0;
  {
    ::ncnn::Extractor ex = runner.create_extractor();
    ex.input(0, x);
    r_given = runner.extract(ex, 0, given);
    r_outside = runner.extract(ex, 2, outside);
  }
  report(r_given == 0 && same_bits(given, x) && r_outside == -1 && runner.command_buffers_made() == 0,
         "Runner::extract by index: the Input's blob as given, an index outside the blobs -1, no command buffer made "
         "(returns " + std::to_string(r_given) + " " + std::to_string(r_outside) + ", made " +
             std::to_string(runner.command_buffers_made()) + ")");
  const RunnerRound by_name = runner_matches_ncnn(net, runner, x, "y", 1);
  ::ncnn::Mat by_index;
  int r_index = -1;
  {
    ::ncnn::Extractor ex = runner.create_extractor();
    ex.input(0, x);
    r_index = runner.extract(ex, 1, by_index);
  }
  report(by_name.returns == 0 && r_index == 0 && same_bits(by_index, by_name.want) &&
             runner.command_buffers_made() == 1,
         "Runner::extract by index: ncnn's result by name, from the one command buffer");
}

// Binary params as ncnn2mem writes them (int32 words): an Input, ncnn's LayerNorm, and vknorm's fused LayerNorm
// under custom index 256.
void binary_params_named_by_index() {
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = true;
  vknorm::ncnn::register_layers(net);
  vknorm::ncnn::register_layer(net, 256, "vknorm.LayerNorm");
  float eps = 0.001f;
  int eps_bits;
  std::memcpy(&eps_bits, &eps, sizeof eps_bits);
  const int words[] = {7767517, 3, 3,
                       ::ncnn::LayerType::Input, 0, 1, 0, -233,
                       ::ncnn::LayerType::LayerNorm, 1, 1, 0, 1, 0, 4, 1, eps_bits, 2, 0, -233,
                       256, 1, 1, 1, 2, 0, 4, 1, eps_bits, 2, 0, -233};
  if (net.load_param(reinterpret_cast<const unsigned char*>(words)) != int(sizeof words) ||
      net.load_model(reinterpret_cast<const unsigned char*>("")) < 0)
    return report(false, "binary params named by index: the net did not load");
  vknorm::ncnn::name_by_index(net);
  std::string names;
  for (const ::ncnn::Layer* l : net.layers()) names += l->name + ":" + l->type + " ";
  for (const ::ncnn::Blob& b : net.blobs()) names += b.name + " ";
  report(names == "0:Input 1:LayerNorm 2:vknorm.LayerNorm 0 1 2 ",
         "name_by_index: layers and blobs by index, types ncnn's and vknorm's (" + names + ")");
  vknorm::ncnn::Runner runner(net);
  const ::ncnn::Mat x = wave(4, 5, 6, 0.2f);
  ::ncnn::Mat by_name, by_index;
  int r_name = -1, r_index = -1;
  {
    ::ncnn::Extractor ex = runner.create_extractor();
    ex.input("0", x);
    r_name = runner.extract(ex, "2", by_name);
  }
  {
    ::ncnn::Extractor ex = runner.create_extractor();
    ex.input(0, x);
    r_index = runner.extract(ex, 2, by_index);
  }
  report(r_name == 0 && r_index == 0 && same_bits(by_name, by_index),
         "binary params named by index: a Runner's extract by those names gives what it gives by index");
  const bool builtin = vknorm::ncnn::builtin_type_name(::ncnn::LayerType::GroupNorm) == "GroupNorm" &&
                       vknorm::ncnn::builtin_type_name(::ncnn::LayerType::Input) == "Input" &&
                       vknorm::ncnn::builtin_type_name(-1).empty() && vknorm::ncnn::builtin_type_name(256).empty();
  report(builtin, "builtin_type_name: ncnn's names of its built-in indexes, \"\" for others");
}

// A model input no Input layer declares (a bottom no layer makes: ncnn's input to fill) is the host's, as an Input's
// blob is: the Runner gives it back as given, not as the float16 copy a float16 net uploaded for its layers.
void runner_gives_an_input_without_an_input_layer_as_given() {
  const std::string what = "Runner, Vulkan float16: an input without an Input layer";
  ::ncnn::Net net;
  net.opt.use_vulkan_compute = true;
  net.opt.use_fp16_storage = net.opt.use_fp16_packed = true;
  net.opt.use_fp16_arithmetic = false;
  vknorm::ncnn::register_layers(net);
  if (net.load_param_mem("7767517\n2 3\nLayerNorm n 1 1 x y 0=4 1=0.001 2=0\nReLU r 1 1 y z\n") != 0 ||
      net.load_model(reinterpret_cast<const unsigned char*>("")) < 0)
    return report(false, what + ": the net did not load");
  if (!net.vulkan_device()) return report(false, what + ": no Vulkan device");
  const ::ncnn::Mat x = wave(4, 5, 6, 0.3f);
  vknorm::ncnn::Runner runner(net);
  ::ncnn::Extractor ex = runner.create_extractor();
  ex.input("x", x);
  ::ncnn::Mat z, given;
  const int r_x = runner.extract(ex, "x", given);
  const int r_z = runner.extract(ex, "z", z);
  report(r_x == 0 && r_z == 0 && same_bits(given, x) && vknorm::ncnn::computed_on_host(net, "x"),
         what + " comes back as given, and the forward runs from it (returns " + std::to_string(r_x) + ", " +
             std::to_string(r_z) + ")");
}

int main() {
  binary_params_named_by_index();
  fused_loaders_refuse_null();
  register_layer_and_blob_indexes();
  runner_made_before_load_param();
  register_layers_only_before_load_param();
  float16_input_like_float32("LayerNorm", "LayerNorm n 1 1 x0 y 0=4 1=0.001 2=1", 1, 1, 4);
  float16_input_like_float32("RMSNorm", "RMSNorm n 1 1 x0 y 0=4 1=0.001 2=1", 1, 1, 4);
  float16_input_like_float32("GroupNorm", "GroupNorm n 1 1 x0 y 0=3 1=6 2=0.001 3=1", 1, 1, 6);
  float16_input_like_float32("InstanceNorm", "InstanceNorm n 1 1 x0 y 0=6 1=0.001 2=1", 1, 1, 6);
  float16_input_like_float32("fused add + LayerNorm + GELU, sum written",
                             "vknorm.LayerNorm n 2 2 x0 x1 y s 0=4 1=0.001 2=1 9=8 20=2", 2, 2, 4);
  barriers_once_per_buffer("LayerNorm", "LayerNorm n 1 1 x0 y 0=4 1=0.001 2=1", 1, 1, 4);
  barriers_once_per_buffer("RMSNorm without weights", "RMSNorm n 1 1 x0 y 0=4 1=0.001 2=0", 1, 1, 0);
  barriers_once_per_buffer("fused add + LayerNorm + GELU, sum written",
                           "vknorm.LayerNorm n 2 2 x0 x1 y s 0=4 1=0.001 2=1 9=8 20=2", 2, 2, 4);
  runner_like_ncnns_extract(true, false);
  runner_like_ncnns_extract(true, true);
  runner_like_ncnns_extract(false, false);
  runner_gives_an_input_without_an_input_layer_as_given();
  runner_casts_int8_blobs_like_ncnns_extract();
  runner_host_blobs_and_light_mode_like_ncnns_extract();
  bfloat16_nets_are_refused_at_every_forward();
  ::ncnn::destroy_gpu_instance();  // the nets are gone: before static destruction
  return failures ? 1 : 0;
}
