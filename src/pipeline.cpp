#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "shaders.h"
#include "vk.h"

namespace vknorm {

std::string Specialization::key() const {
  std::string k;
  for (uint32_t v : values) k += std::to_string(v) + "/";
  return k;
}

Pipeline::Pipeline(Context::Impl& ctx, const std::string& variant, const Specialization& spec) {
  const shaders::Spirv spv = shaders::find(variant.c_str());
  if (!spv.words) throw std::logic_error("vknorm: no shader variant " + variant);
  // Needed only while the pipeline is made.
  const vk::raii::ShaderModule module(ctx.device, vk::ShaderModuleCreateInfo{.codeSize = spv.count * 4, .pCode = spv.words});
  std::vector<vk::SpecializationMapEntry> entries;
  for (uint32_t i = 0; i < spec.values.size(); ++i) entries.push_back({i, 4 * i, 4});
  vk::SpecializationInfo info{.mapEntryCount = uint32_t(entries.size()), .pMapEntries = entries.data(),
                              .dataSize = spec.values.size() * 4, .pData = spec.values.data()};
  // VKNORM_SUBGROUP_SIZE (context.cpp): the subgroup variants run with the subgroup size chosen there.
  vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo size{.requiredSubgroupSize = ctx.required_subgroup_size};
  const bool sized = ctx.required_subgroup_size && variant.size() > 4 && variant.compare(variant.size() - 4, 4, "_sg1") == 0;
  vk::ComputePipelineCreateInfo ci{
      .flags = ctx.pipeline_stats ? vk::PipelineCreateFlagBits::eCaptureStatisticsKHR : vk::PipelineCreateFlags{},
      .stage = {.pNext = sized ? &size : nullptr, .stage = vk::ShaderStageFlagBits::eCompute, .module = *module,
                .pName = "main", .pSpecializationInfo = &info},
      .layout = *ctx.pipeline_layout};
  pipeline = vk::raii::Pipeline(ctx.device, ctx.pipeline_cache, ci);
  if (ctx.pipeline_stats) print_statistics(ctx, variant + "/" + spec.key());
}

void Pipeline::print_statistics(Context::Impl& ctx, const std::string& name) const {
  const auto executables = ctx.device.getPipelineExecutablePropertiesKHR(vk::PipelineInfoKHR{.pipeline = *pipeline});
  for (uint32_t i = 0; i < executables.size(); ++i) {
    std::string line = "vknorm pipeline " + name + " [" + std::string(executables[i].name.data()) + "]";
    for (const auto& st : ctx.device.getPipelineExecutableStatisticsKHR({.pipeline = *pipeline, .executableIndex = i})) {
      line += std::string(" ") + st.name.data() + "=";
      switch (st.format) {
        case vk::PipelineExecutableStatisticFormatKHR::eBool32: line += st.value.b32 ? "true" : "false"; break;
        case vk::PipelineExecutableStatisticFormatKHR::eInt64: line += std::to_string(st.value.i64); break;
        case vk::PipelineExecutableStatisticFormatKHR::eUint64: line += std::to_string(st.value.u64); break;
        case vk::PipelineExecutableStatisticFormatKHR::eFloat64: line += std::to_string(st.value.f64); break;
      }
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

std::shared_ptr<const Pipeline> Context::Impl::pipeline(const std::string& variant, const Specialization& spec) {
  std::vector<std::shared_ptr<const Pipeline>> dropped;  // destroyed after the lock is let go, unless recorded
  std::lock_guard<std::mutex> lock(pipeline_mutex);
  auto [slot, fresh] = pipelines.try_emplace(variant + "/" + spec.key());
  slot->second.last_use = ++pipeline_uses;
  if (!fresh) return slot->second.pipeline;
  try {
    slot->second.pipeline = std::make_shared<const Pipeline>(*this, variant, spec);
  } catch (...) {
    pipelines.erase(slot);
    throw;
  }
  std::shared_ptr<const Pipeline> made = slot->second.pipeline;
  // The driver's pipeline cache keeps something of every pipeline made through it (lavapipe: ~0.1 MB): a fresh one
  // now and then bounds that too, at the cost of making a dropped pipeline again from scratch.
  if (++pipelines_made % std::max<uint64_t>(4 * pipeline_cache_count, 64) == 0)
    pipeline_cache = vk::raii::PipelineCache(device, vk::PipelineCacheCreateInfo{});
  while (pipelines.size() > pipeline_cache_count) {  // the least recently used go
    auto oldest = std::min_element(pipelines.begin(), pipelines.end(),
                                   [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    dropped.push_back(std::move(oldest->second.pipeline));
    pipelines.erase(oldest);
  }
  return made;
}

namespace {

std::unique_ptr<SubmissionKit> take_kit(Context::Impl& ctx, uint32_t max_sets) {
  {
    std::lock_guard<std::mutex> lock(ctx.kit_mutex);
    for (auto it = ctx.kits.begin(); it != ctx.kits.end(); ++it)
      if ((*it)->max_sets >= max_sets) {
        auto kit = std::move(*it);
        ctx.kits.erase(it);
        return kit;
      }
  }
  auto kit = std::make_unique<SubmissionKit>();
  kit->max_sets = std::max<uint32_t>(max_sets, 4);
  kit->pool = vk::raii::CommandPool(ctx.device, vk::CommandPoolCreateInfo{.flags = vk::CommandPoolCreateFlagBits::eTransient,
                                                                         .queueFamilyIndex = ctx.queue_family});
  kit->cmd = std::move(vk::raii::CommandBuffers(ctx.device, vk::CommandBufferAllocateInfo{
                                                                .commandPool = *kit->pool,
                                                                .level = vk::CommandBufferLevel::ePrimary,
                                                                .commandBufferCount = 1})
                           .front());
  vk::DescriptorPoolSize size{.type = vk::DescriptorType::eStorageBuffer, .descriptorCount = kBindings * kit->max_sets};
  kit->descriptors = vk::raii::DescriptorPool(
      ctx.device, vk::DescriptorPoolCreateInfo{.maxSets = kit->max_sets, .poolSizeCount = 1, .pPoolSizes = &size});
  kit->fence = vk::raii::Fence(ctx.device, vk::FenceCreateInfo{});
  if (ctx.timestamp_bits)
    kit->queries.emplace(ctx.device, vk::QueryPoolCreateInfo{.queryType = vk::QueryType::eTimestamp, .queryCount = 2});
  return kit;
}

constexpr size_t kMaxIdleKits = 16;  // more idle kits than this (after a burst of threads) are freed

// Every submission starts here: in a fork()ed child, before anything touches the inherited device.
Context::Impl& same_process(Context::Impl& ctx) {
  ctx.instance->check_same_process();
  return ctx;
}
}  // namespace

Submission::Submission(Context::Impl& ctx, uint32_t max_dispatches)
    : ctx_(same_process(ctx)), kit_(take_kit(ctx_, max_dispatches)), cmd_(kit_->cmd) {
  // A kit per submission: nothing is shared between threads but the queue.
  cmd_.begin(vk::CommandBufferBeginInfo{.flags = vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
  if (kit_->queries) cmd_.resetQueryPool(**kit_->queries, 0, 2);
}

Submission::~Submission() {
  if (pending_) {
    // The wait threw. A device that is not lost (a wait may also fail for memory) still runs the submission:
    // wait again before the kit, and then the buffers this forward bound, are destroyed or cached for reuse. A
    // lost device runs nothing more. Either way the kit is destroyed rather than reused.
    try {
      (void)ctx_.device.waitForFences(*kit_->fence, VK_TRUE, UINT64_MAX);
    } catch (...) {
      try {
        std::lock_guard<std::mutex> lock(ctx_.queue_mutex);  // vkDeviceWaitIdle: every queue held
        ctx_.device.waitIdle();
      } catch (...) {
      }
    }
    return;
  }
  try {
    // Back to the initial state: command buffer, descriptor sets, fence.
    kit_->pool.reset();
    kit_->descriptors.reset();
    if (submitted_) ctx_.device.resetFences(*kit_->fence);
    std::lock_guard<std::mutex> lock(ctx_.kit_mutex);
    if (ctx_.kits.size() < kMaxIdleKits) ctx_.kits.push_back(std::move(kit_));
  } catch (...) {  // a kit that cannot be reset is dropped
  }
}

void Submission::copy(const Buffer& src, const Buffer& dst, vk::DeviceSize bytes, vk::DeviceSize src_offset,
                      vk::DeviceSize dst_offset) {
  cmd_.copyBuffer(*src.buffer, *dst.buffer, vk::BufferCopy{.srcOffset = src_offset, .dstOffset = dst_offset, .size = bytes});
}

void Submission::barrier(bool host) {
  using A = vk::AccessFlagBits;
  using S = vk::PipelineStageFlagBits;
  vk::MemoryBarrier b{.srcAccessMask = A::eShaderWrite | A::eTransferWrite,
                      .dstAccessMask = A::eShaderRead | A::eShaderWrite | A::eTransferRead | A::eTransferWrite};
  vk::PipelineStageFlags dst = S::eComputeShader | S::eTransfer;
  if (host) b.dstAccessMask |= A::eHostRead, dst |= S::eHost;
  cmd_.pipelineBarrier(S::eComputeShader | S::eTransfer, dst, {}, b, {}, {});
}

void Submission::dispatch(std::shared_ptr<const Pipeline> p, const std::array<const Buffer*, kBindings>& bindings,
                          const PushConstants& pc, uint64_t workgroups) {
  // Repeated dispatches over the same buffers (benchmarks, split passes) share one descriptor set.
  if (bindings != last_bindings_ || !last_set_) {
    last_set_ = write_set(bindings);
    last_bindings_ = bindings;
  }
  vk::DescriptorSet set = last_set_;
  const vk::Pipeline handle = *p->pipeline;
  if (std::find(pipelines_.begin(), pipelines_.end(), p) == pipelines_.end()) pipelines_.push_back(std::move(p));
  cmd_.bindPipeline(vk::PipelineBindPoint::eCompute, handle);
  cmd_.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *ctx_.pipeline_layout, 0, set, {});
  cmd_.pushConstants<PushConstants>(*ctx_.pipeline_layout, vk::ShaderStageFlagBits::eCompute, 0, pc);
  // Counts past the x limit fold into y; shaders rebuild the linear id (common.glsl).
  const Grid grid = fold_workgroups(workgroups, ctx_.info.max_workgroup_count_x);
  cmd_.dispatch(grid.x, grid.y, 1);
  ++dispatches_;
}

vk::DescriptorSet Submission::write_set(const std::array<const Buffer*, kBindings>& bindings) {
  vk::DescriptorSetLayout layout = *ctx_.set_layout;
  vk::DescriptorSet set = (*ctx_.device).allocateDescriptorSets(
      vk::DescriptorSetAllocateInfo{.descriptorPool = *kit_->descriptors, .descriptorSetCount = 1, .pSetLayouts = &layout},
      *ctx_.device.getDispatcher())[0];
  std::array<vk::DescriptorBufferInfo, kBindings> infos;
  std::array<vk::WriteDescriptorSet, kBindings> writes;
  for (uint32_t b = 0; b < kBindings; ++b) {
    infos[b] = vk::DescriptorBufferInfo{.buffer = *bindings[b]->buffer, .offset = 0, .range = VK_WHOLE_SIZE};
    writes[b] = vk::WriteDescriptorSet{.dstSet = set, .dstBinding = b, .descriptorCount = 1,
                                       .descriptorType = vk::DescriptorType::eStorageBuffer, .pBufferInfo = &infos[b]};
  }
  ctx_.device.updateDescriptorSets(writes, {});
  return set;
}

void Submission::timestamp(uint32_t slot) {
  if (kit_->queries) cmd_.writeTimestamp(vk::PipelineStageFlagBits::eComputeShader, **kit_->queries, slot);
}

void Submission::submit_and_wait() {
  // Every submission ends so: its writes visible to later submissions and to the host (a fence wait makes device
  // writes available, not visible, to the host, which reads mapped results after it).
  barrier(true);
  cmd_.end();
  vk::CommandBuffer raw = *cmd_;
  {
    std::lock_guard<std::mutex> lock(ctx_.queue_mutex);
    ctx_.queue.submit(vk::SubmitInfo{.commandBufferCount = 1, .pCommandBuffers = &raw}, *kit_->fence);
  }
  pending_ = true;
  bool done = false;
  if (ctx_.fence_spin_us) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point now = Clock::now();
    // A time longer than the clock can add to now (VKNORM_FENCE_SPIN_US takes up to 2^64 - 1) polls until done:
    // added as it is, it would wrap round to a deadline already past.
    const auto room = std::chrono::duration_cast<std::chrono::microseconds>(Clock::time_point::max() - now).count();
    const Clock::time_point until = ctx_.fence_spin_us >= uint64_t(room)
                                        ? Clock::time_point::max()
                                        : now + std::chrono::microseconds(int64_t(ctx_.fence_spin_us));
    do done = kit_->fence.getStatus() == vk::Result::eSuccess;
    while (!done && Clock::now() < until);
  }
  if (!done)
    while (ctx_.device.waitForFences(*kit_->fence, VK_TRUE, 1'000'000'000ull) == vk::Result::eTimeout) {}
  pending_ = false;
  submitted_ = true;
}

double Submission::gpu_us() const {
  if (!kit_->queries || !submitted_) return 0;
  auto [result, stamps] = kit_->queries->getResults<uint64_t>(0, 2, 2 * sizeof(uint64_t), sizeof(uint64_t),
                                                         vk::QueryResultFlagBits::e64 | vk::QueryResultFlagBits::eWait);
  uint64_t mask = ctx_.timestamp_bits >= 64 ? ~0ull : ((1ull << ctx_.timestamp_bits) - 1);
  uint64_t ticks = (stamps[1] - stamps[0]) & mask;
  return double(ticks) * ctx_.info.timestamp_period_ns / 1000.0;
}

}  // namespace vknorm
