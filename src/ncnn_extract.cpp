// Extracting from a Vulkan ncnn net into a command buffer that is kept (include/vknorm/ncnn.h: Runner,
// extract_recorded).
#include <ncnn/command.h>
#include <ncnn/gpu.h>
#include <ncnn/layer_type.h>
#include <ncnn/net.h>

#include <string>

#include "vknorm/ncnn.h"

namespace vknorm {
namespace ncnn {

namespace {

// A blob as a log line names it: by name, or by index (binary params name no blob).
std::string label(const char* blob) { return blob ? blob : "null"; }
std::string label(int blob) { return "blob " + std::to_string(blob); }

// Where record_download puts a download (blobs host-visible and cached: the blob allocator, else staging); null
// where opt lacks it, logged. A net's own Option has no VkAllocators (an extractor takes its own from the device).
::ncnn::VkAllocator* download_allocator(const ::ncnn::Option& opt, const std::string& blob) {
  const ::ncnn::VkAllocator* b = opt.blob_vkallocator;
  ::ncnn::VkAllocator* dst = b && b->mappable && b->cached ? opt.blob_vkallocator : opt.staging_vkallocator;
  if (!b || !dst)
    NCNN_LOGE("vknorm: extract_recorded(%s): opt.%s is null: pass the net's options with the VkAllocators the "
              "extractor was given (ex.set_blob_vkallocator / set_staging_vkallocator), as vknorm::ncnn::Runner does",
              blob.c_str(), b ? "staging_vkallocator" : "blob_vkallocator");
  return b ? dst : nullptr;
}

// extract_recorded, and with `keep` the download kept in ex (extract_recorded_kept); the blob by name or index.
template <class Blob>
int extract_recorded_keeping(::ncnn::Extractor& ex, Blob blob, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                             const ::ncnn::Option& opt, bool keep) {
  // Refused before the extract, which would record the forward into cmd and leave the extractor holding blobs
  // that never ran; whatever opt.use_vulkan_compute says, as the extractor records on its net's device either way.
  if (!download_allocator(opt, label(blob))) return -1;
  // The extractor records with opt's allocators too: ncnn's recorded extract dereferences an extractor's own,
  // which one of net.create_extractor() does not have (a crash in its upload), nor one given others.
  ex.set_blob_vkallocator(opt.blob_vkallocator);
  ex.set_workspace_vkallocator(opt.workspace_vkallocator ? opt.workspace_vkallocator : opt.blob_vkallocator);
  ex.set_staging_vkallocator(opt.staging_vkallocator ? opt.staging_vkallocator : opt.blob_vkallocator);
  ::ncnn::VkMat gpu;
  if (int r = ex.extract(blob, gpu, cmd)) return r;
  if (gpu.empty()) return ex.extract(blob, out);  // not a Vulkan blob: ncnn's own path
  ::ncnn::VkAllocator* dst_allocator = download_allocator(opt, label(blob));
  if (!dst_allocator) return -1;
  // record_download's destination: elempack 4 where the packing option allows, cast to float32 on all but
  // discrete GPUs, int8 kept as int8; from the staging allocator unless blobs are host-visible and cached.
  // ncnn allocates it inside record_download and dereferences a failed allocation (a crash on a discrete GPU,
  // where every output goes through staging): allocated and freed here first, into the allocator that keeps
  // it and hands it back to record_download, running out is -100 instead.
  const ::ncnn::VulkanDevice* vkdev = opt.blob_vkallocator->vkdev;
  const int outer = gpu.dims == 1 ? gpu.w : gpu.dims == 2 ? gpu.h : gpu.c;
  const int pack = opt.use_packing_layout && (outer * gpu.elempack) % 4 == 0 ? 4 : 1;
  size_t elemsize = gpu.elemsize / gpu.elempack * pack;
  if (vkdev->info.type() != 0 && gpu.elemsize != size_t(gpu.elempack)) elemsize = 4u * pack;
  {
    ::ncnn::VkMat reserve;
    const int n = outer * gpu.elempack / pack;
    if (gpu.dims == 1) reserve.create(n, elemsize, pack, dst_allocator);
    if (gpu.dims == 2) reserve.create(gpu.w, n, elemsize, pack, dst_allocator);
    if (gpu.dims == 3) reserve.create(gpu.w, gpu.h, n, elemsize, pack, dst_allocator);
    if (gpu.dims == 4) reserve.create(gpu.w, gpu.h, gpu.d, n, elemsize, pack, dst_allocator);
    if (reserve.empty()) {
      NCNN_LOGE("vknorm: out of device memory downloading %s (%zu bytes)", label(blob).c_str(),
                gpu.total() * gpu.elemsize);
      return -100;
    }
  }
  ::ncnn::Mat host;
  cmd.record_download(gpu, host, opt);
  if (int r = cmd.submit_and_wait()) return r;
  // Kept in the extractor as ncnn's extract keeps its download: a later extract that recomputes blobs light mode
  // released starts from it (without it, one whose inputs were released is -100 where ncnn's gives the blob).
  if (keep && !host.empty()) ex.input(blob, host);
  // What ncnn's extract does to the downloaded Mat: unpacking, bfloat16 and int8 casts.
  if (opt.use_packing_layout && host.elempack != 1) {
    ::ncnn::Mat unpacked;
    ::ncnn::convert_packing(host, unpacked, 1, opt);
    host = unpacked;
  }
  if (opt.use_bf16_storage && host.elembits() == 16) {
    ::ncnn::Mat f32;
    ::ncnn::cast_bfloat16_to_float32(host, f32, opt);
    host = f32;
  } else if (host.elembits() == 8) {
    ::ncnn::Mat f32;
    ::ncnn::cast_int8_to_float32(host, f32, opt);
    host = f32;
  }
  if (host.empty()) return -100;
  out = host;
  return 0;
}

}  // namespace

int extract_recorded(::ncnn::Extractor& ex, const char* blob, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                     const ::ncnn::Option& opt) {
  return extract_recorded_keeping(ex, blob, out, cmd, opt, false);
}

int extract_recorded(::ncnn::Extractor& ex, int blob_index, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                     const ::ncnn::Option& opt) {
  return extract_recorded_keeping(ex, blob_index, out, cmd, opt, false);
}

int extract_recorded_kept(::ncnn::Extractor& ex, const char* blob, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                          const ::ncnn::Option& opt) {
  return extract_recorded_keeping(ex, blob, out, cmd, opt, true);
}

int extract_recorded_kept(::ncnn::Extractor& ex, int blob_index, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                          const ::ncnn::Option& opt) {
  return extract_recorded_keeping(ex, blob_index, out, cmd, opt, true);
}

int blob_index(const ::ncnn::Net& net, const char* name) {
  if (!name) return -1;
  const std::vector<::ncnn::Blob>& blobs = net.blobs();
  for (size_t i = 0; i < blobs.size(); ++i)
    if (blobs[i].name == name) return int(i);
  return -1;
}

bool computed_on_host(const ::ncnn::Net& net, const char* name) { return computed_on_host(net, blob_index(net, name)); }

bool computed_on_host(const ::ncnn::Net& net, int blob_index) {
  if (blob_index < 0 || blob_index >= int(net.blobs().size())) return false;
  const ::ncnn::Blob& blob = net.blobs()[size_t(blob_index)];
  const int producer = blob.producer;
  // a model input with no Input layer (a bottom no layer makes): only input() gives it, on the host. (A blob no
  // layer makes or reads is a header's count past the layers' blobs.)
  if (producer == -1 && blob.consumer >= 0) return true;
  if (producer < 0 || producer >= int(net.layers().size())) return false;
  const ::ncnn::Layer* layer = net.layers()[size_t(producer)];
  // by index: binary params leave a layer's type name empty
  return layer->typeindex == ::ncnn::LayerType::Input || runs_on_host(*layer);
}

bool runs_on_host(const ::ncnn::Layer& layer) { return !layer.support_vulkan || (layer.featmask & (1 << 4)); }

Runner::Runner(const ::ncnn::Net& net) : net_(net) { attach(); }

// ncnn picks a Vulkan net's device at load_param: a Runner made before that takes it at its first use after.
void Runner::attach() const {
  if (vkdev_ || !net_.opt.use_vulkan_compute || !net_.vulkan_device()) return;
  vkdev_ = net_.vulkan_device();
  blob_allocator_ = vkdev_->acquire_blob_allocator();
  staging_allocator_ = vkdev_->acquire_staging_allocator();
}

Runner::~Runner() {
  cmd_.reset();  // before its memory's allocators go back
  if (!vkdev_) return;
  vkdev_->reclaim_blob_allocator(blob_allocator_);
  vkdev_->reclaim_staging_allocator(staging_allocator_);
}

void Runner::give_allocators(::ncnn::Extractor& ex) const {
  attach();
  if (!vkdev_) return;
  ex.set_blob_vkallocator(blob_allocator_);
  ex.set_workspace_vkallocator(blob_allocator_);
  ex.set_staging_vkallocator(staging_allocator_);
}

::ncnn::Extractor Runner::create_extractor() const {
  ::ncnn::Extractor ex = net_.create_extractor();
  give_allocators(ex);
  return ex;
}

int Runner::extract(::ncnn::Extractor& ex, const char* blob, ::ncnn::Mat& out) {
  if (!blob) {
    NCNN_LOGE("vknorm: Runner::extract: the blob name is null");
    return -1;
  }
  return extract_blob(ex, blob, blob_index(net_, blob), out);
}

int Runner::extract(::ncnn::Extractor& ex, int blob_index, ::ncnn::Mat& out) {
  return extract_blob(ex, blob_index, blob_index, out);
}

template <class Blob>
int Runner::extract_blob(::ncnn::Extractor& ex, Blob blob, int index, ::ncnn::Mat& out) {
  attach();
  // ncnn's own: no recording (or its error for an unknown name or index)
  if (!vkdev_ || index < 0 || index >= int(net_.blobs().size()) || computed_on_host(net_, index))
    return ex.extract(blob, out);
  if (!cmd_) {
    cmd_ = std::make_unique<::ncnn::VkCompute>(vkdev_);
    ++made_;
  }
  // The device memory comes from this Runner's allocators whatever made the extractor (extract_recorded gives
  // them to ex: one of net's own create_extractor() has none).
  ::ncnn::Option opt = net_.opt;
  opt.blob_vkallocator = opt.workspace_vkallocator = blob_allocator_;
  opt.staging_vkallocator = staging_allocator_;
  const int r = extract_recorded_kept(ex, blob, out, *cmd_, opt);
  // After a failure it may be half recorded, or pending on a lost device: not reused.
  if (r != 0 || cmd_->reset() != 0) cmd_.reset();
  return r;
}

}  // namespace ncnn
}  // namespace vknorm
