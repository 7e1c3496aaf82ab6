// The ncnn executor: vknorm's LayerNorm, RMSNorm, GroupNorm and InstanceNorm as ncnn layers. The Vulkan forward records the
// dispatcher's plan (plan_forward) into ncnn's VkCompute with ncnn::Pipeline objects made from vknorm's
// embedded SPIR-V; ncnn orders the passes with its own barriers. The CPU forward runs ncnn's own CPU layers.
#include "vknorm/ncnn.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <ncnn/command.h>
#include <ncnn/gpu.h>
#include <ncnn/layer.h>
#include <ncnn/layer_type.h>
#include <ncnn/modelbin.h>
#include <ncnn/net.h>
#include <ncnn/pipeline.h>

#include "dispatch.h"
#include "shaders.h"

namespace vknorm {
namespace ncnn {
namespace {

std::atomic<uint64_t> g_vulkan_forwards{0}, g_cpu_forwards{0}, g_pipelines{0}, g_unfused_adds{0};

// A dispatch's bindings as ncnn's record_pipeline should see them. It records a pipeline barrier for each binding
// whose buffer was last written or last touched outside a compute shader (by a copy, the host, or nothing yet),
// then marks that buffer written: a buffer bound to several slots of one dispatch gets a barrier per slot, and
// ncnn's shared dummy buffer (what it binds for an empty slot) one every time. Each costs the GPU time between
// layers (about 3 us a layer on an H200 for the four redundant ones a LayerNorm's dispatch had: docs/benchmarks).
// So an empty slot binds slot 0's buffer (the blob read; only read-only slots may be empty) and a buffer's every
// slot after its first binds a view of it that ncnn takes as read by compute already: no
// barrier of its own (the first slot's covers the dispatch), no mark. The views' memory records live here; ncnn
// keeps no pointer to them past its recording calls.
class DispatchBindings {
 public:
  DispatchBindings(const std::vector<::ncnn::VkMat>& slots, std::initializer_list<size_t> writable)
      : mats_(slots), views_(slots.size()) {
    std::vector<::ncnn::VkBufferMemory*> buffers;  // each slot's own
    for (size_t i = 0; i < mats_.size(); ++i) {
      ::ncnn::VkMat& m = mats_[i];
      if (m.empty()) m = slots[0];
      buffers.push_back(m.data);
      if (std::find(buffers.begin(), buffers.end() - 1, m.data) == buffers.end() - 1) continue;
      views_[i] = *m.data;
      views_[i].access_flags = VK_ACCESS_SHADER_READ_BIT;
      views_[i].stage_flags = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
      m.data = &views_[i];  // the same buffer range, shape and reference count
      m.allocator = nullptr;  // which frees nothing: the slot's owner keeps the buffer
    }
    // A buffer the dispatch writes gets its barrier from every compute and transfer access before it: ncnn's
    // would wait for nothing on a block its pool just handed out (marked unused, though a dispatch recorded before
    // may still read it: a write-after-read race once no other binding's barrier waits for compute), and none at
    // all for a buffer only read by compute since its last barrier (nor mark it written).
    for (size_t i : writable) {
      ::ncnn::VkBufferMemory& b = *buffers[i];
      b.stage_flags |= VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
      b.access_flags |= VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    }
  }
  DispatchBindings(const DispatchBindings&) = delete;
  DispatchBindings& operator=(const DispatchBindings&) = delete;
  const std::vector<::ncnn::VkMat>& mats() const { return mats_; }

 private:
  std::vector<::ncnn::VkMat> mats_;
  std::vector<::ncnn::VkBufferMemory> views_;
};

bool subgroup_reduce(const ::ncnn::VulkanDevice& dev) {
  const uint32_t need = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_BIT;
  const uint32_t size = dev.info.subgroup_size();
  return (dev.info.support_subgroup_ops() & need) == need && size >= 4 && size <= 128;
}

// What the planner needs to know of ncnn's device, from ncnn's own description of it, with vknorm's capability
// profile applied (VKNORM_NO_SUBGROUP, VKNORM_NO_FP16_STORAGE, ...: dispatch.h). subgroup_compute here: the
// subgroup reductions vknorm uses (ncnn enables 16-bit storage on its device wherever the device has it).
DeviceInfo device_info(const ::ncnn::VulkanDevice& dev) {
  const ::ncnn::GpuInfo& gi = dev.info;
  DeviceInfo info;
  const char* types[] = {"discrete", "integrated", "virtual", "cpu"};
  info.type = gi.type() >= 0 && gi.type() <= 3 ? types[gi.type()] : "other";
  info.name = gi.device_name();
  info.subgroup_size = gi.subgroup_size();
  info.max_shared_memory = gi.max_shared_memory_size();
  info.max_workgroup_invocations = gi.max_workgroup_invocations();
  info.max_workgroup_size_x = gi.max_workgroup_size_x();
  info.max_workgroup_count_x = gi.max_workgroup_count_x();
  // Multiprocessors (VK_NV_shader_sm_builtins), declared here: ncnn's Vulkan header may predate the extension.
  struct SmBuiltinsProperties {
    VkStructureType sType;
    void* pNext;
    uint32_t shaderSMCount, shaderWarpsPerSM;
  };
  for (const VkExtensionProperties& e : gi.deviceExtensionProperties())
    if (std::strcmp(e.extensionName, "VK_NV_shader_sm_builtins") == 0 && ::ncnn::vkGetPhysicalDeviceProperties2KHR) {
      SmBuiltinsProperties sm{VkStructureType(1000154001), nullptr, 0, 0};  // ..._SHADER_SM_BUILTINS_PROPERTIES_NV
      VkPhysicalDeviceProperties2 props{};
      props.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
      props.pNext = &sm;
      ::ncnn::vkGetPhysicalDeviceProperties2KHR(gi.physicalDevice(), &props);
      info.compute_units = sm.shaderSMCount;
    }
  info.subgroup_compute = subgroup_reduce(dev);
  info.storage_16bit = dev.info.support_fp16_storage();
  apply_capability_profile(info);
  return info;
}

class NormLayer : public ::ncnn::Layer {
 public:
  // fused: vknorm's own type ("vknorm.LayerNorm", ...), which also takes the fusion params (ncnn.h).
  NormLayer(NormOp op, bool fused, bool by_index) : fused_type_(fused), by_index_(by_index) {
    p_.op = op;
    one_blob_only = true;
    // Out of place: in place, ncnn would first copy a shared input (Split -> norm, as in every pre-norm
    // block) with a transfer whose destination it does not synchronize with the shader writes a recycled
    // block last saw. Reading x and writing a new blob moves the same bytes as in place, without the copy.
    support_inplace = false;
    support_vulkan = true;
    support_vulkan_packing = true;  // elempack 1 and 4 are read as they are: no repacking dispatch
  }

  Counters counters() const { return {vulkan_forwards_, cpu_forwards_, pipelines_made_, unfused_adds_}; }
  LayerInfo describe() const {
    LayerInfo i;
    i.type = op_name(p_.op);
    i.layer_type = type_name();
    i.residual = fusion_.residual;
    i.activation_type = int(fusion_.activation);
    i.activation_alpha = fusion_.alpha;
    i.rmsnorm = p_.op == NormOp::RMSNorm;
    i.affine_size = p_.affine_size, i.group = p_.group, i.channels = p_.channels, i.eps = p_.eps, i.affine = p_.affine;
    i.weight_count = int(p_.weight_count());
    i.gamma = p_.affine && !gamma_.empty() ? static_cast<const float*>(gamma_.data) : nullptr;
    i.beta = p_.affine && !beta_.empty() ? static_cast<const float*>(beta_.data) : nullptr;
    i.counters = counters();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& kv : pipelines_) i.pipelines.push_back(kv.first);
    return i;
  }

  // The ncnn type it was made as: a built-in norm's name, or vknorm's fused type's.
  const char* type_name() const { return fused_type_ ? fused_name(p_.op) : op_name(p_.op); }

  // ncnn's param ids and validation (NormParams, shared with vknorm's own layer).
  int load_param(const ::ncnn::ParamDict& pd) override {
    // ncnn keeps a custom type's name and index in one slot: register_layers' fused types hold slots by name, in its
    // order, and register_layer replaces a slot's layer, not its name. So binary params (the index alone) may reach
    // a slot register_layer did not name, and text params (the name) one it gave another type: refused, not run as
    // the type that happens to be there.
    if (fused_type_ && type.empty() && !by_index_) {
      NCNN_LOGE("vknorm: binary params name a layer's type by index %d alone, which this net gives a fused type of "
                "vknorm's by name: for a model vknorm optimize fused, register its type there first, "
                "vknorm::ncnn::register_layer(net, %d, \"vknorm.<type>\") (Python: Net.register_layer) as ncnn2mem's "
                "TYPEINDEX_ says; a type of your own needs a net without vknorm's fused types (Python: "
                "Net(vknorm=False)), or registering by that index", typeindex, typeindex);
      return -1;
    }
    if (!type.empty() && type != type_name()) {
      NCNN_LOGE("vknorm %s %s: this net made a %s for it: register_layer gave that custom type index another type; "
                "load text params on a net without register_layer", type.c_str(), name.c_str(), type_name());
      return -1;
    }
    try {
      p_ = NormParams::read(p_.op, pd);
      fusion_ = Fusion{};
      if (fused_type_) {
        // ncnn reads anything but an integer (9=1.0, 9=leaky, an array) for an int param as not given: refused
        // rather than run as 0.
        for (const int id : {kParamActivation, kParamResidual}) {
          const int type = pd.type(id);
          if (type != 0 && type != 1 && type != 2)
            throw std::invalid_argument(std::to_string(id) + "= takes an integer, got " +
                                        (type == 3 ? "a float" : type == 7 ? "a string" : "an array"));
        }
        fusion_.activation = activation_from_int(pd.get(kParamActivation, 0));
        const ::ncnn::Mat params = pd.get(kParamActivationParams, ::ncnn::Mat());
        if (fusion_.activation == Activation::LeakyReLU) {
          if (params.w < 1)
            throw std::invalid_argument("activation_type=2 (leaky ReLU) needs its slope as the array 10= (-23310=1,0.1)");
          // an array of integers (-23310=1,1) holds ints: their value, not their bits
          fusion_.alpha = pd.type(kParamActivationParams) == 5 ? float(static_cast<const int*>(params.data)[0])
                                                                : static_cast<const float*>(params.data)[0];
        }
        fusion_.residual = pd.get(kParamResidual, 0);
        if (fusion_.residual < Fusion::None || fusion_.residual > Fusion::AddWriteSum)
          throw std::invalid_argument("residual=" + std::to_string(fusion_.residual) +
                                      ": expected 0 none, 1 add the second input, 2 add and output the sum");
      }
    } catch (const std::exception& e) {
      log_error(e);
      return -1;
    }
    // On the CPU the norm and a fused activation are ncnn's own CPU layers (their SIMD and threads, their
    // results): vknorm's speed is on Vulkan.
    if (make_cpu_layers(pd) != 0) return -1;
    // A fused add reads two blobs and writes new ones (its inputs may be shared through a Split). ncnn names
    // them before load_param: a line whose counts do not fit its residual is refused at load, not at its forward.
    one_blob_only = fusion_.residual == Fusion::None;
    if (fused_type_ && !bottoms.empty() && check_blob_counts(bottoms.size(), tops.size())) return -1;
    // featmask (param 31) bit 4 puts this layer on the CPU inside a Vulkan net. ncnn sets featmask before
    // load_param and then makes a CPU layer of the same type, which is this class again: it must say it has
    // no Vulkan path, or ncnn records its Vulkan forward with no pipelines (a crash).
    support_vulkan = !(featmask & (1 << 4));
    return 0;
  }

  int load_model(const ::ncnn::ModelBin& mb) override {
    if (int r = load_weights(mb)) return r;
    const ::ncnn::Mat weights[2] = {gamma_, beta_};
    return cpu_norm_->load_model(::ncnn::ModelBinFromMatArray(weights));
  }

  int load_weights(const ::ncnn::ModelBin& mb) {
    if (!p_.affine) return 0;
    if (weight_count() <= 0) {  // ncnn reads a float such as 0=8.0 as an int param not given: 0
      NCNN_LOGE("vknorm %s %s: affine with %s %d: no weights to read (an int param written as a float, 0=8.0, reads "
                "as 0 in ncnn)", type_name(), name.c_str(), p_.op == NormOp::LayerNorm || p_.op == NormOp::RMSNorm ?
                "affine_size" : "channels", weight_count());
      return -100;
    }
    gamma_ = mb.load(weight_count(), 1);
    if (gamma_.empty()) {
      NCNN_LOGE("vknorm %s %s: the model file ends before its %d gamma values", type_name(), name.c_str(), weight_count());
      return -100;
    }
    if (centres(p_.op)) {
      beta_ = mb.load(weight_count(), 1);
      if (beta_.empty()) {
        NCNN_LOGE("vknorm %s %s: the model file ends before its %d beta values", type_name(), name.c_str(), weight_count());
        return -100;
      }
    }
    return 0;
  }

  int create_pipeline(const ::ncnn::Option& opt) override {
    // Inputs of different shapes at run time (a broadcasting add) are left unfused: ncnn's own
    // BinaryOp adds them, then this layer normalizes the sum.
    if (fusion_.residual != Fusion::None && make_fallback(opt) != 0) return -1;
    if (cpu_norm_->create_pipeline(cpu_option(opt)) != 0 ||
        (cpu_activation_ && cpu_activation_->create_pipeline(cpu_option(opt)) != 0)) {
      NCNN_LOGE("vknorm %s %s: ncnn's CPU layers failed to create their pipelines", type_name(), name.c_str());
      return -1;
    }
    // On the CPU, blobs come packed as ncnn's graph packs them where any CPU layer used takes that (the
    // CPU forward unpacks for one that does not); the fused add's BinaryOp reads them as given.
    support_packing = (cpu_norm_->support_packing || (cpu_activation_ && cpu_activation_->support_packing)) &&
                      (!add_cpu_ || add_cpu_->support_packing);
    if (!vkdev || !opt.use_vulkan_compute) return 0;  // a CPU net
    if (opt.use_bf16_storage || opt.use_bf16_packed) {
      log_bf16_refusal();
      return -1;
    }
    try {
      info_ = device_info(*vkdev);
    } catch (const std::exception& e) {  // a capability-profile variable it cannot read
      log_error(e);
      return -1;
    }
    // The plan for the shape in the param file's hints, with the storage and packing this net gives
    // blobs; other shapes get their pipelines when first met.
    if (!bottom_shapes.empty() && bottom_shapes[0].dims > 0) {
      const ::ncnn::Mat& s = bottom_shapes[0];
      // ncnn hands a layer that takes packed blobs its hint packed already (w, h or c divided by elempack).
      const int hint_pack = std::max(1, s.elempack);
      const int64_t outer_hint = s.dims == 1 ? s.w : s.dims == 2 ? s.h : s.c;
      if (outer_hint * hint_pack > INT_MAX) return 0;  // no such blob runs: nothing to prepare
      const int w = s.dims == 1 ? s.w * hint_pack : s.w;
      const int h = s.dims == 2 ? s.h * hint_pack : s.h;
      const int c = s.dims >= 3 ? s.c * hint_pack : s.c;
      // ncnn's graph packs by 4 whenever the outer extent divides; a dims-1 blob is read unpacked.
      const int outer = s.dims == 1 ? w : s.dims == 2 ? h : c;
      const bool fp16 = opt.use_fp16_storage || (opt.use_fp16_packed && outer % 4 == 0);
      const int pack = s.dims >= 2 && outer % 4 == 0 ? 4 : 1;
      Blob b{s.dims, w, s.dims == 2 ? h / pack : h, s.d, s.dims >= 3 ? c / pack : c, 0, pack, fp16};
      b.cstep = ncnn_cstep(b.dims, b.w, b.h, b.d, size_t(fp16 ? 2 : 4) * pack);
      // the variant the forward records: the fused add's, else out of place (support_inplace is off)
      b.residual = fusion_.residual != Fusion::None ? fusion_.residual : Fusion::OutOfPlace;
      // A hint is a hint: one the layer's params refuse (ncnn itself never checks hints) leaves planning to the
      // first forward, which reports a real mismatch with the blob it meets.
      if (hint_fits_params(b) && !prepared(b, opt)) return -1;
    }
    return 0;
  }

  int destroy_pipeline(const ::ncnn::Option& opt) override {
    if (cpu_norm_) cpu_norm_->destroy_pipeline(cpu_option(opt));
    if (cpu_activation_) cpu_activation_->destroy_pipeline(cpu_option(opt));
    if (add_cpu_) add_cpu_->destroy_pipeline(opt);
    if (add_vk_) add_vk_->destroy_pipeline(opt);
    add_cpu_.reset(), add_vk_.reset();
    std::lock_guard<std::mutex> lock(mutex_);
    prepared_.clear();
    pipelines_.clear();
    specialized_.clear();
    scratch_.clear(), retired_.clear();  // (ncnn destroys pipelines with no forward in flight)
    scratch_allocator_.reset();
    return 0;
  }

  int upload_model(::ncnn::VkTransfer& cmd, const ::ncnn::Option& opt) override {
    if (!p_.affine) return 0;
    // The kernels read float32 weights whatever the blob's storage.
    ::ncnn::Option fp32 = opt;
    fp32.use_fp16_storage = fp32.use_fp16_packed = fp32.use_bf16_storage = fp32.use_bf16_packed = false;
    // Whole vec4s: kernels reading per-channel weights as vec4s may touch the last one whole.
    auto padded = [&](const ::ncnn::Mat& m) {
      ::ncnn::Mat out((m.w + 3) / 4 * 4);
      out.fill(0.f);
      std::memcpy(out.data, m.data, sizeof(float) * size_t(m.w));
      return out;
    };
    cmd.record_upload(padded(gamma_), gamma_gpu_, fp32);
    if (centres(p_.op)) cmd.record_upload(padded(beta_), beta_gpu_, fp32);
    return 0;
  }

  // A float32 copy of a CPU input. A layer kept off Vulkan (featmask bit 4) inside a Vulkan net on a discrete GPU
  // gets its input downloaded as stored, float16, and ncnn casts it on ARM and RISC-V only.
  static ::ncnn::Mat as_float32(const ::ncnn::Mat& m, const ::ncnn::Option& opt) {
    if (m.elembits() != 16) return m.clone(opt.blob_allocator);
    ::ncnn::Mat f32;
    ::ncnn::cast_float16_to_float32(m, f32, opt);
    return f32;
  }

  // CPU: ncnn hands float32 blobs, packed as its graph packs them, to a layer without fp16 / bf16 support
  // (float16 from a discrete GPU's download is cast first, as_float32).
  int forward_inplace(::ncnn::Mat& m, const ::ncnn::Option& opt) const override {
    if (m.elembits() != 32) {
      NCNN_LOGE("vknorm %s: CPU forward needs a float32 blob", type_name());
      return -1;
    }
    try {
      // The layer's params against the blob (unpacked), as on Vulkan: a clear refusal where ncnn's layer would
      // misread it.
      const int p = m.elempack;
      const int w = m.dims == 1 ? m.w * p : m.w, h = m.dims == 2 ? m.h * p : m.h, c = m.dims >= 3 ? m.c * p : m.c;
      p_.layout(m.dims, w, h, m.d, c, m.dims <= 2 ? size_t(w) * h : size_t(w) * h * m.d, 1);
      // Each of ncnn's layers at the packing ncnn's graph would give it: the packing it handed this layer
      // where that layer takes packed blobs, elempack 1 where not (ncnn's InstanceNorm), as in a stock net.
      const ::ncnn::Option cpu = cpu_option(opt);
      const int graph_pack = m.elempack;
      auto run = [&](::ncnn::Layer* l) {
        const int pack = l->support_packing ? graph_pack : 1;
        if (m.elempack != pack) {
          ::ncnn::Mat repacked;
          ::ncnn::convert_packing(m, repacked, pack, cpu);
          if (repacked.empty()) return -100;
          m = repacked;
        }
        return l->forward_inplace(m, cpu);
      };
      if (int r = run(cpu_norm_.get())) return r;
      if (cpu_activation_)
        if (int r = run(cpu_activation_.get())) return r;
    } catch (const std::exception& e) {
      log_error(e);
      return -1;
    }
    ++cpu_forwards_;
    ++g_cpu_forwards;
    return 0;
  }

  int forward(const ::ncnn::Mat& bottom, ::ncnn::Mat& top, const ::ncnn::Option& opt) const override {
    top = as_float32(bottom, opt);
    if (top.empty()) return -100;
    return forward_inplace(top, opt);
  }

  // CPU, fused add: ncnn's BinaryOp add (its own layer, also when the shapes differ), then the norm on a copy.
  int forward(const std::vector<::ncnn::Mat>& bottoms, std::vector<::ncnn::Mat>& tops, const ::ncnn::Option& opt) const override {
    if (int r = check_blob_counts(bottoms.size(), tops.size())) return r;
    std::vector<::ncnn::Mat> inputs(bottoms.size());
    for (size_t i = 0; i < bottoms.size(); ++i)
      if ((inputs[i] = bottoms[i].elembits() == 16 ? as_float32(bottoms[i], opt) : bottoms[i]).empty()) return -100;
    std::vector<::ncnn::Mat> sum(1);
    if (int r = add_cpu_->forward(inputs, sum, opt)) return r;
    if (fusion_.residual == Fusion::AddWriteSum) {  // the sum is an output too: the norm gets a copy
      tops[1] = sum[0];
      tops[0] = sum[0].clone(opt.blob_allocator);
      if (tops[0].empty()) return -100;
    } else {
      tops[0] = sum[0];
    }
    return forward_inplace(tops[0], opt);
  }

  int forward_inplace(::ncnn::VkMat& blob, ::ncnn::VkCompute& cmd, const ::ncnn::Option& opt) const override {
    return record_forward(blob, nullptr, cmd, opt);
  }

  // Vulkan, what ncnn calls: one kernel reads `bottom` and writes `top`.
  int forward(const ::ncnn::VkMat& bottom, ::ncnn::VkMat& top, ::ncnn::VkCompute& cmd, const ::ncnn::Option& opt) const override {
    if (bottom.empty()) return -100;  // what ncnn's own layers return for a blob light mode already released
    const Prepared* prep = prepared_for(bottom, Fusion::OutOfPlace, opt);
    if (!prep) return -1;
    if (prep->via_float32) {  // converted copies anyway: the float32 one is normalized in place
      top = bottom;
      return record_via_float32(*prep, top, cmd, opt);
    }
    top.create_like(bottom, opt.blob_vkallocator);
    if (top.empty()) return -100;
    const AddMats out{::ncnn::VkMat(), top, ::ncnn::VkMat()};
    return record(*prep, bottom, &out, cmd);
  }

  // Vulkan, fused add: one kernel reads both inputs and writes the output (and the sum). Inputs that
  // differ in shape, packing or storage go through ncnn's BinaryOp first, then this layer: in place on the
  // sum, or from it into a blob of its own where the sum is an output too.
  int forward(const std::vector<::ncnn::VkMat>& bottoms, std::vector<::ncnn::VkMat>& tops, ::ncnn::VkCompute& cmd,
              const ::ncnn::Option& opt) const override {
    if (int r = check_blob_counts(bottoms.size(), tops.size())) return r;
    const ::ncnn::VkMat& a = bottoms[0];
    const ::ncnn::VkMat& b = bottoms[1];
    if (a.empty() || b.empty()) return -100;
    const bool write_sum = fusion_.residual == Fusion::AddWriteSum;
    const bool same = a.dims == b.dims && a.w == b.w && a.h == b.h && a.d == b.d && a.c == b.c &&
                      a.elempack == b.elempack && a.elemsize == b.elemsize && a.cstep == b.cstep;
    // A plan that must convert the blob to float32 first (see record_forward) runs unfused as well.
    const Prepared* prep = same ? prepared_for(a, fusion_.residual, opt) : nullptr;
    if (same && !prep) return -1;
    if (same && !prep->via_float32) {
      tops[0].create_like(a, opt.blob_vkallocator);
      if (write_sum) tops[1].create_like(a, opt.blob_vkallocator);
      if (tops[0].empty() || (write_sum && tops[1].empty())) return -100;
      const AddMats add{b, tops[0], write_sum ? tops[1] : ::ncnn::VkMat()};
      return record(*prep, a, &add, cmd);
    }
    ++unfused_adds_;
    ++g_unfused_adds;
    std::vector<::ncnn::VkMat> sum(1);
    if (int r = add_vk_->forward(bottoms, sum, cmd, opt)) return r;
    if (write_sum) {  // not a copy of the sum normalized in place: ncnn's copy into a recycled block does not
      tops[1] = sum[0];  // wait for that block's last shader writes
      return forward(sum[0], tops[0], cmd, opt);
    }
    tops[0] = sum[0];
    return record_forward(tops[0], nullptr, cmd, opt);
  }

 private:
  struct Blob {
    int dims, w, h, d, c;
    size_t cstep;
    int elempack;
    bool fp16;
    int residual = Fusion::None;  // the fused add this forward runs (none on the unfused fallback)
    auto key(bool subgroup_ops) const {
      return std::make_tuple(dims, w, h, d, c, cstep, elempack, fp16, subgroup_ops, residual);
    }
  };
  // A fused add's other blobs: the second input, the output, the sum (empty: not written).
  struct AddMats {
    ::ncnn::VkMat residual, out, sum;
  };

  // The param line's blob counts against its residual: 1 and 1 without one (a second input read by nothing), 2 and 1
  // for an add, 2 and 2 for an add that writes its sum.
  int check_blob_counts(size_t bottoms, size_t tops) const {
    const bool add = fusion_.residual != Fusion::None;
    const size_t want_bottoms = add ? 2 : 1, want_tops = fusion_.residual == Fusion::AddWriteSum ? 2 : 1;
    if (bottoms == want_bottoms && tops == want_tops) return 0;
    NCNN_LOGE("vknorm %s %s: residual=%d takes %zu input%s and gives %zu output%s; the param line has %zu and %zu",
              type_name(), name.c_str(), fusion_.residual, want_bottoms, add ? "s" : "", want_tops, add ? "s" : "",
              bottoms, tops);
    return -1;
  }

  // Everything a forward records for one blob format, worked out once per format: a graph meets the
  // same shapes on every inference, so planning and pipeline lookups leave the per-inference path.
  struct Prepared {
    ForwardPlan plan;
    bool via_float32 = false;  // the plan is for the blob converted to float32 elempack 1 (record_via_float32)
    std::vector<const ::ncnn::Pipeline*> pipelines;
    std::vector<std::vector<::ncnn::vk_constant_type>> constants;
    std::vector<::ncnn::VkMat> dispatchers;
  };

  // The prepared plan for `blob` (in place) or for a fused add over it (residual), null after logging.
  const Prepared* prepared_for(const ::ncnn::VkMat& blob, int residual, const ::ncnn::Option& opt) const {
    // create_pipeline refused these; a net that went on anyway (ncnn's load_model from memory does not stop at a
    // layer's refusal) hears the same reason here, not one about a plan that was never made.
    if (opt.use_bf16_storage || opt.use_bf16_packed) {
      log_bf16_refusal();
      return nullptr;
    }
    Blob b{blob.dims, blob.w, blob.h, blob.d, blob.c, blob.cstep, blob.elempack, blob.elemsize == 2u * blob.elempack};
    if (b.dims == 1 && !unpack_dims1(b.w, b.cstep, b.elempack)) {
      NCNN_LOGE("vknorm %s %s: a dims-1 blob of %d elements of %d: past 32-bit element counts", type_name(),
                name.c_str(), b.w, b.elempack);
      return nullptr;
    }
    if ((b.elempack != 1 && b.elempack != 4) || (blob.elemsize != 4u * blob.elempack && !b.fp16)) {
      NCNN_LOGE("vknorm %s %s: unsupported blob elempack=%d elemsize=%zu (an input of another shape than the "
                "model's?)", type_name(), name.c_str(), blob.elempack, blob.elemsize);
      return nullptr;
    }
    b.residual = residual;
    return prepared(b, opt);
  }

  // Records this layer's plan over `blob` (in place; `blob` may be replaced), or with `add` over
  // blob + add->residual into add->out.
  int record_forward(::ncnn::VkMat& blob, const AddMats* add, ::ncnn::VkCompute& cmd, const ::ncnn::Option& opt) const {
    if (blob.empty()) return -100;
    const Prepared* prep = prepared_for(blob, add ? fusion_.residual : Fusion::None, opt);
    if (!prep) return -1;
    if (!prep->via_float32 || add) return record(*prep, blob, add, cmd);
    return record_via_float32(*prep, blob, cmd, opt);
  }

  // A float16 blob whose plan reads single float16 values, where vknorm may not (no storageBuffer16BitAccess,
  // or the capability profile hides it): a dims-1 blob too large for the fused kernel, or an elempack-1 one.
  // ncnn's own packing turns it into an elempack-1 float32 blob and back around the float32 plan, which
  // runs in place on that copy; `blob` is replaced by the converted-back one.
  int record_via_float32(const Prepared& prep, ::ncnn::VkMat& blob, ::ncnn::VkCompute& cmd, const ::ncnn::Option& opt) const {
    ::ncnn::VkMat fp32, back;
    vkdev->convert_packing(blob, fp32, 1, 1 /* to float32 */, cmd, opt);
    if (fp32.empty()) return -100;
    if (int r = record(prep, fp32, nullptr, cmd)) return r;
    vkdev->convert_packing(fp32, back, blob.elempack, 2 /* to float16 */, cmd, opt);
    if (back.empty()) return -100;
    blob = back;
    return 0;
  }

  // ncnn's own BinaryOp add (CPU, and Vulkan in a Vulkan net) for inputs the fused kernel does not take.
  int make_fallback(const ::ncnn::Option& opt) {
    ::ncnn::ParamDict pd;
    pd.set(0, 0);  // op_type add
    add_cpu_.reset(::ncnn::create_layer_cpu("BinaryOp"));
    add_vk_.reset(vkdev && opt.use_vulkan_compute ? ::ncnn::create_layer_vulkan("BinaryOp") : nullptr);
    for (::ncnn::Layer* l : {add_cpu_.get(), add_vk_.get()}) {
      if (!l) continue;
      l->vkdev = vkdev;
      if (l->load_param(pd) != 0 || l->create_pipeline(opt) != 0) {
        NCNN_LOGE("vknorm %s %s: creating ncnn's BinaryOp for unfused inputs failed", type_name(), name.c_str());
        return -1;
      }
    }
    if (!add_cpu_ || (vkdev && opt.use_vulkan_compute && !add_vk_)) return -1;
    return 0;
  }
  int make_cpu_layers(const ::ncnn::ParamDict& pd) {
    cpu_activation_.reset();
    cpu_norm_.reset(::ncnn::create_layer_cpu(op_name(p_.op)));
    if (!cpu_norm_ || cpu_norm_->load_param(pd) != 0) {
      NCNN_LOGE("vknorm %s %s: creating ncnn's CPU %s failed", type_name(), name.c_str(), op_name(p_.op));
      return -1;
    }
    if (fusion_.activation == Activation::None) return 0;
    ::ncnn::ParamDict apd;  // ncnn's ReLU: 0=slope; GELU: 0=fast_gelu
    const char* type = "ReLU";
    switch (fusion_.activation) {
      case Activation::LeakyReLU: apd.set(0, fusion_.alpha); break;
      case Activation::Sigmoid: type = "Sigmoid"; break;
      case Activation::Swish: type = "Swish"; break;
      case Activation::GELU: type = "GELU"; break;
      case Activation::FastGELU: type = "GELU", apd.set(0, 1); break;
      default: break;
    }
    cpu_activation_.reset(::ncnn::create_layer_cpu(type));
    if (!cpu_activation_ || cpu_activation_->load_param(apd) != 0) {
      NCNN_LOGE("vknorm %s %s: creating ncnn's CPU %s failed", type_name(), name.c_str(), type);
      return -1;
    }
    return 0;
  }

  void log_bf16_refusal() const {
    NCNN_LOGE("vknorm %s %s: bfloat16 storage is not supported; turn off opt.use_bf16_storage/use_bf16_packed",
              type_name(), name.c_str());
  }

  // ncnn's CPU layers are handed float32 blobs here (support_fp16_storage is off: ncnn casts for this layer).
  static ::ncnn::Option cpu_option(const ::ncnn::Option& opt) {
    ::ncnn::Option cpu = opt;
    cpu.use_vulkan_compute = false;
    cpu.use_fp16_storage = cpu.use_fp16_packed = cpu.use_fp16_arithmetic = false;
    cpu.use_bf16_storage = cpu.use_bf16_packed = false;
    return cpu;
  }
  bool hint_fits_params(const Blob& b) const {
    try {
      p_.layout(b.dims, b.w, b.h, b.d, b.c, b.cstep, b.elempack);
      return true;
    } catch (const std::invalid_argument&) {
      return false;
    }
  }

  const Prepared* prepared(const Blob& b, const ::ncnn::Option& opt) const {
    const auto key = b.key(opt.use_subgroup_ops);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = prepared_.find(key); it != prepared_.end()) return &it->second;
    }
    Prepared p;
    try {
      p.plan = plan(b, opt);
      if (!info_.storage_16bit && needs_16bit_storage(p.plan)) {
        // ncnn gives elempack-1 blobs float16 storage only on devices with 16-bit storage, but a dims-1 blob
        // vknorm itself reads unpacked has it anywhere, and the capability profile (VKNORM_NO_FP16_STORAGE,
        // VKNORM_VULKAN_API=1.0) hides the feature from vknorm alone: such a blob runs converted to float32.
        Blob b32 = b;
        b32.fp16 = false;
        b32.cstep = ncnn_cstep(b.dims, b.w, b.h, b.d, size_t(4) * b.elempack);  // ncnn's float32 copy's
        b32.residual = Fusion::None;  // in place on ncnn's float32 copy (record_via_float32)
        p.plan = plan(b32, opt);
        p.via_float32 = true;
      }
    } catch (const std::exception& e) {
      log_error(e);
      return nullptr;
    }
    for (const Pass& pass : p.plan.passes) {
      const ::ncnn::Pipeline* pipeline = pipeline_for(pass);
      if (!pipeline) return nullptr;
      // ncnn runs every pipeline with its local size rounded up to a multiple of the subgroup size (it rewrites
      // the shader's): a plan of smaller workgroups would run invocations the kernel does not count. Only a
      // shared-memory cap below a subgroup's worth plans them (VKNORM_MAX_SHARED_MEMORY).
      if (uint32_t(pipeline->local_size_x()) != pass.workgroup_size) {
        NCNN_LOGE("vknorm %s %s: kernel %s plans workgroups of %u invocations, fewer than the %d that ncnn runs it "
                  "with (its subgroup size); allow more shared memory per workgroup (VKNORM_MAX_SHARED_MEMORY)",
                  type_name(), name.c_str(), pass.variant.c_str(), pass.workgroup_size, pipeline->local_size_x());
        return nullptr;
      }
      p.pipelines.push_back(pipeline);
      std::vector<::ncnn::vk_constant_type> constants(sizeof(PushConstants) / 4);
      std::memcpy(constants.data(), &pass.push, sizeof(PushConstants));
      p.constants.push_back(std::move(constants));
      // ncnn divides the dispatcher by the pipeline's local size: hand it invocations, not workgroups.
      const Grid grid = fold_workgroups(pass.workgroups, info_.max_workgroup_count_x);
      ::ncnn::VkMat dispatcher;
      dispatcher.w = int(grid.x * pass.workgroup_size);
      dispatcher.h = int(grid.y);
      dispatcher.c = 1;
      p.dispatchers.push_back(dispatcher);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return &prepared_.emplace(key, std::move(p)).first->second;
  }

  // Records the prepared passes over `blob` (in the prepared format) into ncnn's command buffer.
  int record(const Prepared& prep, const ::ncnn::VkMat& blob, const AddMats* add, ::ncnn::VkCompute& cmd) const {
    const ForwardPlan& fp = prep.plan;
    const Scratch* scratch = scratch_for(fp);
    if (!scratch) return -100;
    const ::ncnn::VkMat& partials = scratch->partials;
    const ::ncnn::VkMat& coefs = scratch->coefs;
    // Unused writable slots hold the blob this forward writes (in place: the blob; else the output), not
    // ncnn's dummy buffer, which every layer shares: the kernels declare slots 3, 4, 6 and 7 writable, and
    // synchronization validation takes that for a write of whatever is bound there. Unused read-only slots
    // (the weights, the residual) bind the blob read (DispatchBindings).
    const ::ncnn::VkMat& written = add ? add->out : blob;
    auto or_written = [&](const ::ncnn::VkMat& m) -> const ::ncnn::VkMat& { return m.empty() ? written : m; };
    const ::ncnn::VkMat residual = add ? add->residual : ::ncnn::VkMat();
    const ::ncnn::VkMat& sum = add ? or_written(add->sum) : written;
    const DispatchBindings bindings(
        {blob, gamma_gpu_, beta_gpu_, or_written(partials), or_written(coefs), residual, written, sum}, {3, 4, 6, 7});
    for (size_t i = 0; i < fp.passes.size(); ++i)
      cmd.record_pipeline(prep.pipelines[i], bindings.mats(), prep.constants[i], prep.dispatchers[i]);
    ++vulkan_forwards_;
    ++g_vulkan_forwards;
    return 0;
  }

  // The split and cooperative kernels' scratch (statistics, coefficients, counters), one set per recording thread,
  // kept until the pipelines are destroyed. Memory given back to ncnn's pool once the layer has recorded could be
  // handed out again in the same command buffer, where ncnn records no barrier for a fresh block: a copy into it
  // would race the kernels' last writes (the cooperative kernel writes its counters last). ncnn's extracts (and
  // vknorm.graph's) submit and wait on the thread that recorded, so a thread has one forward of this layer in
  // flight at a time, and within one command buffer the kept Mats' access flags give ncnn's own barriers. (Command
  // buffers one thread records and others submit at once would share it.) Null when device memory runs out; the
  // set held before stays usable then.
  struct Scratch {
    ::ncnn::VkMat partials, coefs;
  };
  const Scratch* scratch_for(const ForwardPlan& fp) const {
    std::lock_guard<std::mutex> lock(mutex_);
    Scratch& s = scratch_[std::this_thread::get_id()];
    auto fit = [&](::ncnn::VkMat& m, size_t bytes) {
      if (!bytes || (!m.empty() && m.total() * m.elemsize >= bytes)) return true;
      if (!scratch_allocator_) scratch_allocator_ = std::make_unique<::ncnn::VkBlobAllocator>(vkdev, 64 * 1024);
      ::ncnn::VkMat larger;
      larger.create(int((bytes + 3) / 4), 4u, scratch_allocator_.get());
      if (larger.empty()) return false;
      if (!m.empty()) retired_.push_back(m);  // never handed out again while a command buffer may still use it
      m = larger;
      return true;
    };
    return fit(s.partials, fp.partials_bytes) && fit(s.coefs, fp.coefs_bytes) ? &s : nullptr;
  }

  // "vknorm <type> <name>: <what>", without the type a message may already start with.
  void log_error(const std::exception& e) const {
    std::string what = e.what();
    // (a fused type's messages from the norm's checks start with the norm's name: "InstanceNorm: ...")
    for (const std::string prefix : {std::string(type_name()) + ": ", std::string(op_name(p_.op)) + ": "})
      if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
    NCNN_LOGE("vknorm %s %s: %s", type_name(), name.c_str(), what.c_str());
  }
  int weight_count() const { return int(p_.weight_count()); }

  ForwardPlan plan(const Blob& b, const ::ncnn::Option& opt) const {
    const GroupLayout g = p_.layout(b.dims, b.w, b.h, b.d, b.c, b.cstep, b.elempack);
    Option vo;
    vo.use_fp16_storage = b.fp16;
    vo.use_packing_layout = b.elempack == 4;
    vo.use_subgroup_ops = opt.use_subgroup_ops;
    Fusion f = fusion_;
    f.residual = b.residual;
    const DeviceCaps caps = specialized_.admit(device_caps(info_, info_.subgroup_compute, vo), g.group_size);
    return plan_forward(p_.op, p_.affine != 0, p_.eps, g, b.fp16, caps, vo, f);
  }

  // One ncnn::Pipeline per (variant, specialization), made on first use and kept until destroy_pipeline.
  const ::ncnn::Pipeline* pipeline_for(const Pass& pass) const {
    std::string key = pass.variant;
    for (uint32_t v : pass.specialization) key += "/" + std::to_string(v);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = pipelines_[key];
    if (slot) return slot.get();
    const shaders::Spirv spv = shaders::find(pass.variant.c_str());
    if (!spv.words) {
      NCNN_LOGE("vknorm %s: no shader variant %s", type_name(), pass.variant.c_str());
      pipelines_.erase(key);
      return nullptr;
    }
    auto p = std::make_unique<::ncnn::Pipeline>(vkdev);
    p->set_local_size_xyz(int(pass.workgroup_size), 1, 1);
    std::vector<::ncnn::vk_specialization_type> spec(pass.specialization.size());
    for (size_t i = 0; i < spec.size(); ++i) spec[i].u32 = pass.specialization[i];
    if (p->create(spv.words, spv.count * 4, spec) != 0) {
      NCNN_LOGE("vknorm %s: creating pipeline %s failed", type_name(), key.c_str());
      pipelines_.erase(key);
      return nullptr;
    }
    ++pipelines_made_;
    ++g_pipelines;
    slot = std::move(p);
    return slot.get();
  }

  NormParams p_;
  bool fused_type_ = false;
  bool by_index_ = false;  // made by register_layer's creator (a binary params' custom type index)
  Fusion fusion_;
  std::unique_ptr<::ncnn::Layer> add_cpu_, add_vk_;  // the unfused fallback's BinaryOp (create_pipeline)
  mutable std::atomic<uint64_t> unfused_adds_{0};
  ::ncnn::Mat gamma_, beta_;
  ::ncnn::VkMat gamma_gpu_, beta_gpu_;
  DeviceInfo info_;  // ncnn's device as the planner sees it (capability profile applied; device_info)
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::unique_ptr<::ncnn::Pipeline>> pipelines_;
  mutable std::map<std::tuple<int, int, int, int, int, size_t, int, bool, bool, int>, Prepared> prepared_;
  mutable SpecializedSizes specialized_;  // the group sizes its plans take as a constant
  mutable std::unique_ptr<::ncnn::VkBlobAllocator> scratch_allocator_;  // (declared before what it allocates)
  mutable std::map<std::thread::id, Scratch> scratch_;
  mutable std::vector<::ncnn::VkMat> retired_;  // scratch outgrown, released with the rest
  mutable std::atomic<uint64_t> vulkan_forwards_{0}, cpu_forwards_{0}, pipelines_made_{0};
  std::unique_ptr<::ncnn::Layer> cpu_norm_;        // ncnn's own CPU layer of this op, for the CPU forward
  std::unique_ptr<::ncnn::Layer> cpu_activation_;  // and of the fused activation
};

// userdata: kByIndex from register_layer, null from register_layers
char by_index_marker;
void* const kByIndex = &by_index_marker;
template <NormOp op, bool fused>
::ncnn::Layer* create_layer(void* userdata) { return new NormLayer(op, fused, userdata == kByIndex); }
void destroy_layer(::ncnn::Layer* layer, void*) { delete layer; }

}  // namespace

const char* fused_name(NormOp op) {
  switch (op) {
    case NormOp::LayerNorm: return "vknorm.LayerNorm";
    case NormOp::RMSNorm: return "vknorm.RMSNorm";
    case NormOp::GroupNorm: return "vknorm.GroupNorm";
    default: return "vknorm.InstanceNorm";
  }
}

// The types register_layers makes vknorm's, with their creators.
const std::pair<const char*, ::ncnn::layer_creator_func> kVknormTypes[] = {
    {"LayerNorm", create_layer<NormOp::LayerNorm, false>},
    {"RMSNorm", create_layer<NormOp::RMSNorm, false>},
    {"GroupNorm", create_layer<NormOp::GroupNorm, false>},
    {"InstanceNorm", create_layer<NormOp::InstanceNorm, false>},
    {fused_name(NormOp::LayerNorm), create_layer<NormOp::LayerNorm, true>},
    {fused_name(NormOp::RMSNorm), create_layer<NormOp::RMSNorm, true>},
    {fused_name(NormOp::GroupNorm), create_layer<NormOp::GroupNorm, true>},
    {fused_name(NormOp::InstanceNorm), create_layer<NormOp::InstanceNorm, true>},
};

int register_layers(::ncnn::Net& net) {
  if (!net.layers().empty()) {  // made at load_param, stock: registering now would change none of them
    NCNN_LOGE("vknorm::ncnn::register_layers: the net's layers are made already (load_param ran): call it before "
              "load_param, or on a net that has been clear()ed");
    return -1;
  }
  for (const auto& [type, creator] : kVknormTypes)
    if (int r = net.register_custom_layer(type, creator, destroy_layer)) return r;
  return 0;
}

std::string register_layer_refusal(int typeindex, const std::string& type) {
  // Built-in indexes are register_layers' (by name); a custom one is what ncnn2mem numbers a model's own types by,
  // j below 256 (past it an index aliases another's).
  constexpr int kCustom = ::ncnn::LayerType::CustomBit;
  if (typeindex < kCustom || typeindex >= 2 * kCustom)
    return "type index " + std::to_string(typeindex) + " is not a custom one: the index is a custom type's, 256 + j "
           "(LayerType::CustomBit | j, j < 256: ncnn2mem's TYPEINDEX_ of a type ncnn does not know); ncnn's own types "
           "are register_layers'";
  if (is_vknorm_type(type) && ::ncnn::layer_to_index(type.c_str()) == -1) return "";  // a fused type
  return type + " is not one of vknorm's layer types a custom index takes: the type is one of vknorm's fused types "
         "(vknorm.LayerNorm, vknorm.RMSNorm, vknorm.GroupNorm, vknorm.InstanceNorm)";
}

int register_layer(::ncnn::Net& net, int typeindex, const std::string& type) {
  if (!net.layers().empty()) {
    NCNN_LOGE("vknorm::ncnn::register_layer: the net's layers are made already (load_param ran): call it before "
              "load_param_bin, or on a net that has been clear()ed");
    return -1;
  }
  if (const std::string why = register_layer_refusal(typeindex, type); !why.empty()) {
    NCNN_LOGE("vknorm::ncnn::register_layer: %s", why.c_str());
    return -1;
  }
  for (const auto& [name, creator] : kVknormTypes)
    if (type == name) return net.register_custom_layer(typeindex, creator, destroy_layer, kByIndex);
  return -1;  // (not reached: register_layer_refusal takes kVknormTypes' types alone)
}

bool is_vknorm_type(const std::string& type) {
  for (const auto& entry : kVknormTypes)
    if (type == entry.first) return true;
  return false;
}

bool is_vknorm_layer(const ::ncnn::Layer* layer) { return dynamic_cast<const NormLayer*>(layer) != nullptr; }

bool describe_layer(const ::ncnn::Layer* layer, LayerInfo& out) {
  const auto* n = dynamic_cast<const NormLayer*>(layer);
  if (!n) return false;
  out = n->describe();
  return true;
}

namespace {
struct BuiltinType {
  int index;
  const char* name;
};
const BuiltinType kBuiltinTypes[] = {
#include "ncnn_type_names.inc"
};
}  // namespace

std::string builtin_type_name(int typeindex) {
  for (const BuiltinType& t : kBuiltinTypes)
    if (t.index == typeindex) return t.name;
  return "";
}

void name_by_index(::ncnn::Net& net) {
  const std::vector<::ncnn::Layer*>& layers = net.layers();
  std::vector<::ncnn::Blob>& blobs = net.mutable_blobs();
  for (size_t i = 0; i < layers.size(); ++i) {
    ::ncnn::Layer* layer = layers[i];
    if (layer->name.empty()) layer->name = std::to_string(i);
    if (layer->type.empty()) {
      const auto* norm = dynamic_cast<const NormLayer*>(layer);
      layer->type = norm ? norm->type_name() : builtin_type_name(layer->typeindex);
    }
    for (const std::vector<int>* list : {&layer->bottoms, &layer->tops})
      for (const int b : *list)
        if (b >= 0 && size_t(b) < blobs.size() && blobs[size_t(b)].name.empty())
          blobs[size_t(b)].name = std::to_string(b);
  }
}

Counters counters(const ::ncnn::Net& net) {
  Counters total;
  for (const ::ncnn::Layer* layer : net.layers())
    if (auto* n = dynamic_cast<const NormLayer*>(layer)) {
      const Counters c = n->counters();
      total.vulkan_forwards += c.vulkan_forwards, total.cpu_forwards += c.cpu_forwards, total.pipelines += c.pipelines;
      total.unfused_adds += c.unfused_adds;
    }
  return total;
}

Counters counters() { return {g_vulkan_forwards, g_cpu_forwards, g_pipelines, g_unfused_adds}; }

}  // namespace ncnn
}  // namespace vknorm
