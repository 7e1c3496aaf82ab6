// vknorm's LayerNorm, RMSNorm, GroupNorm and InstanceNorm as ncnn layers. In a Vulkan net they run inside ncnn's graph: pipelines
// on the net's VulkanDevice, recorded into ncnn's VkCompute on the VkMat ncnn hands over (elempack 1 or
// 4, float32 or float16 storage as the net chose), with no host copy and no submission of their own.
// In a CPU net (or a layer ncnn keeps off Vulkan) they run ncnn's own CPU layers: the norm, then a fused
// activation; a fused add through ncnn's BinaryOp. Results and speed are stock ncnn's there.
//
//   ncnn::Net net;
//   net.opt.use_vulkan_compute = true;
//   vknorm::ncnn::register_layers(net);   // before load_param
//   net.load_param("model.param");
//   net.load_model("model.bin");
//
// Needs the library target vknorm::vknorm_ncnn (built when CMake finds ncnn, see docs/android.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "vknorm/norm.h"

#include <memory>

namespace ncnn {
class Net;
class Layer;
class Extractor;
class Mat;
class Option;
class VkCompute;
class VkAllocator;
class VulkanDevice;
}  // namespace ncnn

namespace vknorm {
// vknorm's ncnn layers, under the name the engine has: code that writes `using namespace vknorm;` names ncnn's own
// namespace ::ncnn (a plain `ncnn::` is ambiguous there).
namespace ncnn {

// Makes the net's LayerNorm, RMSNorm, GroupNorm and InstanceNorm layers vknorm's (ncnn's register_custom_layer, which replaces
// the built-in types), and registers vknorm's fused types below. Call before load_param. Returns 0, -1 after
// load_param (the net's layers are made already: none would change), or the error of the registration that
// failed. The layers write a blob of their own (not in place, unlike ncnn's): a norm on a Split's output then
// needs no copy of it. A Vulkan net with bfloat16 storage
// (opt.use_bf16_storage / use_bf16_packed) is refused: create_pipeline and every forward fail with -1, naming
// the option (vknorm's kernels read float32 or float16).
int register_layers(::ncnn::Net& net);
// Whether register_layers makes layers of ncnn type `type` vknorm's: the four norms and the fused types below.
bool is_vknorm_type(const std::string& type);

// ---- Binary params (load_param_bin; ncnn2mem's .param.bin and .mem.h) -----------------------------------------
// Binary params name each layer's type by ncnn's index: register_layers makes the four norms vknorm's there too
// (ncnn replaces the built-in types by index). A model's types that are not ncnn's own, as vknorm's fused types of a
// model vknorm optimize wrote, are numbered by ncnn2mem LayerType::CustomBit | j, j counting the types in the order
// they first appear in the .param (its TYPEINDEX_ lines and the register_custom_layer lines it prints):
//
//   vknorm::ncnn::register_layers(net);
//   vknorm::ncnn::register_layer(net, 256, "vknorm.LayerNorm");   // ncnn2mem: TYPEINDEX_vknorm.LayerNorm = 256
//   net.load_param_bin("model-opt.param.bin");                   // or load_param(const unsigned char*) of .mem.h
//
// register_layer registers vknorm's layer of `type` (is_vknorm_type) under that custom index. Returns 0, or -1 after
// load_param, for an index that is not a custom one or a type that is not vknorm's (logged), or ncnn's error.
// A fused type in binary params that register_layer did not name fails load_param (the index alone cannot say which
// it is). ncnn keeps one slot per custom index, named by the first registration by name (register_layers' fused
// types hold the first four): a slot register_layer gave another type refuses text params naming it, so load text
// params on a net without register_layer. Fusion itself reads text params (fuse_param): fuse first, then convert.
int register_layer(::ncnn::Net& net, int typeindex, const std::string& type);
// Why register_layer refuses this index and type (a custom index, 256 + j with j < 256, and a fused type, else
// "vknorm.<type>" could not mean it); "" where it takes them.
std::string register_layer_refusal(int typeindex, const std::string& type);
// ncnn's name of its built-in type `typeindex` ("LayerNorm" for LayerType::LayerNorm); "" for any other index.
std::string builtin_type_name(int typeindex);
// After load_param_bin, which leaves every name empty: names each blob a layer makes or reads and each layer by its
// index ("0", "1", ...: the numbers of ncnn2mem's .id.h) and gives each layer its type's name, ncnn's or vknorm's (a
// custom index register_layer named). Code that goes by names then works on binary params (Extractor::input("0",
// in), Runner::extract("5", out)). Names a layer or blob has already are kept, so is the type a custom layer's
// creator gave it; a custom layer of no known type stays unnamed.
void name_by_index(::ncnn::Net& net);

// ---- Fusion: a norm with the add before it and the activation after it, in one kernel -------------
// Fused layers have types of their own, "vknorm.LayerNorm", "vknorm.RMSNorm", "vknorm.GroupNorm" and
// "vknorm.InstanceNorm", so a fused model never loads as a stock one: they take the norm's params and
// weights, plus
//   9=activation_type   0 none, 1 ReLU, 2 leaky ReLU, 4 Sigmoid, 7 Swish, 8 GELU, 9 fast GELU (Activation)
//   10=activation_params  ncnn's array (-23310=1,slope): leaky ReLU's slope
//   20=residual         0 none; 1 bottom 1 is added to bottom 0 first (one top); 2 the same, and top 1 is the sum
const char* fused_name(NormOp op);
constexpr int kParamActivation = 9, kParamActivationParams = 10, kParamResidual = 20;

// What fuse_param replaced: "pattern" names the ncnn types (e.g. "BinaryOp+LayerNorm+GELU"; "BinaryOp+Split+
// LayerNorm" where the Split between add and norm is gone too, not just left one top fewer), "layers" the ncnn
// layer names, one per type, in graph order; the fused layer keeps the norm's name.
struct FusedPattern {
  std::string pattern;
  std::vector<std::string> layers;
};
struct FuseResult {
  std::string param;                  // the rewritten .param text (the .bin is unchanged: same weights, same order)
  std::vector<FusedPattern> fused;
  // The input's blob names by ncnn's blob index (in the file's order, each line's bottoms that no earlier line
  // names, then its tops): the rewrite removes blobs and so renumbers the rest; an index the caller took from
  // the unfused model names its blob here.
  std::vector<std::string> blobs;
};
// Rewrites an ncnn text .param so every norm vknorm runs takes in
//  - prologue: a two-input BinaryOp add (op_type 0, no scalar) whose output feeds the norm directly, or
//    through a Split output only the norm reads, whose other outputs are read after the norm (the fused
//    layer then writes the sum);
//  - epilogue: a ReLU (with its slope: leaky ReLU), Sigmoid, Swish or GELU that is the norm output's only
//    consumer.
// Params are read as ncnn's ParamDict reads them (an id is a number: 00=1 and +0=1 are id 0; of an id given twice
// the last wins); a layer whose params ncnn would read otherwise than as those values (a float for an int, an
// array), or not at all, a layer writing a blob name another top already took, and an add reading an input (a
// bottom no earlier layer produces) whose name a top between the add and the norm takes, are left as they are.
// Anything else is left as it is. The file is read as ncnn's load_param reads it: words across line breaks (the
// magic number and counts, each layer's type, name, counts and blob names; a word ends at a NUL), a layer's params
// the rest of its last word's line, numbers as ncnn scans them (a sign, leading zeros, at most 31 characters), the
// header's count of layers and nothing after them, and a bottom that no earlier layer produces is an input of its
// own (ncnn makes it a blob that Extractor::input fills). Throws std::invalid_argument naming the line on a
// malformed .param, on header counts ncnn refuses (outside 1..1000000), on fewer layers than the header declares,
// on a header declaring fewer blobs than the layers make (ncnn's count: one per top and one per such input), or on
// a word that starts with a NUL (an empty name to ncnn).
FuseResult fuse_param(const std::string& param_text);
// Reads `param_path`, fuses it and loads it into `net` (register_layers first). Returns ncnn's
// load_param code, -1 when the file cannot be read or parsed (logged); `fused` receives what was fused and
// `blobs` the unfused model's blob names by index (FuseResult::blobs; both empty unless the load succeeded).
int load_param_fused(::ncnn::Net& net, const char* param_path, std::vector<FusedPattern>* fused = nullptr,
                     std::vector<std::string>* blobs = nullptr);
// The same for .param text already in memory (ncnn's load_param_mem: an Android asset, an embedded model).
int load_param_mem_fused(::ncnn::Net& net, const char* param_text, std::vector<FusedPattern>* fused = nullptr,
                         std::vector<std::string>* blobs = nullptr);
// Why a net without vknorm's layers registered cannot load a model vknorm optimize wrote: its first layer of a
// fused type (vknorm.*), read as ncnn reads the .param, as "line N: layer NAME is TYPE" (characters a log line
// cannot hold written as \xNN); "" where it has none or does not read as a .param.
std::string first_fused_layer(const std::string& param_text);
std::string first_fused_layer_in_file(const char* param_path);
// Whether fuse_param may fold layers of ncnn type `type` into vknorm's fused layers (the add before a norm, a Split
// between the two, the activation after it): a net that fuses runs no other implementation of that type there.
bool fusion_folds(const std::string& type);

// How vknorm layers ran. In a Vulkan net every forward is recorded on the GPU: cpu_forwards stays 0 (no
// host round trip). pipelines counts ncnn::Pipeline objects created (a new one only for a new variant: kernel,
// team, and for the first 16 group sizes a layer meets the size, a specialization constant; later sizes, as from
// an app feeding images of any size, share the pipelines of their variant, so a layer keeps a bounded number).
struct Counters {
  uint64_t vulkan_forwards = 0;
  uint64_t cpu_forwards = 0;
  uint64_t pipelines = 0;
  // fused adds ncnn's BinaryOp ran first: inputs that differed in shape, packing or storage at run time, or a
  // float16 blob whose plan needs a float32 copy (no 16-bit storage access for the kernel it takes)
  uint64_t unfused_adds = 0;
};
Counters counters(const ::ncnn::Net& net);  // this net's vknorm layers, since load_param
Counters counters();                        // every vknorm layer of the process, since it started

// True for a layer created by register_layers.
bool is_vknorm_layer(const ::ncnn::Layer* layer);

// A vknorm layer's parameters and weights as loaded (gamma/beta: weight_count floats, or null), and its
// counters. Returns false for any other layer.
struct LayerInfo {
  std::string type;       // "LayerNorm", "RMSNorm", "GroupNorm" or "InstanceNorm"
  std::string layer_type; // the ncnn type it was loaded as: type, or fused_name(op)
  int residual = 0;       // fusion (20=, 9=, 10=)
  int activation_type = 0;
  float activation_alpha = 0.f;
  bool rmsnorm = false;
  int affine_size = 0;    // LayerNorm, RMSNorm
  int group = 1;          // GroupNorm
  int channels = 0;       // GroupNorm, InstanceNorm
  float eps = 0.f;
  int affine = 0;
  int weight_count = 0;   // floats in gamma (and beta): affine_size, or channels
  const float* gamma = nullptr;
  const float* beta = nullptr;
  Counters counters;
  std::vector<std::string> pipelines;  // "<variant>/<specialization...>" of each pipeline made
};
bool describe_layer(const ::ncnn::Layer* layer, LayerInfo& out);

// ---- Inference without a command pool per extract ---------------------------------------------------------
// ncnn's Extractor::extract(name, Mat&) on a Vulkan net makes a command pool, its command buffer and a fence for
// the call and destroys them after: 0.4-0.6 ms on an H200's driver, most of what a small model's inference costs
// there. A Runner keeps one set, reset between extracts:
//
//   vknorm::ncnn::Runner runner(net);               // one per thread, as an Extractor
//   for (...) {
//     ncnn::Extractor ex = runner.create_extractor();
//     ex.input("in0", in);
//     ncnn::Mat out;
//     int r = runner.extract(ex, "out0", out);      // what ex.extract("out0", out) gives
//   }
//
// In a CPU net (no Vulkan device) both are ncnn's own. A Runner made before load_param takes the device ncnn picks
// there at its first create_extractor or extract after it. The net must outlive the Runner, and the Runner every
// extractor it made (their blobs live in its allocators, which it hands back to the device when destroyed).
class Runner {
 public:
  explicit Runner(const ::ncnn::Net& net);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  // The net's extractor, its device blobs and staging memory from this Runner's allocators (ncnn's Extractor
  // takes a pair of its device's for each extractor).
  ::ncnn::Extractor create_extractor() const;
  // ex.extract(blob, out) recorded into the kept command buffer: out is float32, elempack 1, as ncnn's. A blob
  // computed on the host (computed_on_host: an Input's, or one no layer makes, given with input(), comes back as
  // given; a host layer's, as that layer wrote it) goes through ncnn's own extract. A blob a layer makes that the
  // caller set with ex.input() comes back as the device holds it (float16 where the net stores float16; the value
  // of an earlier extract, if one made it on the device): extract that one with ex.extract. ncnn's return codes (-1
  // for a null or unknown name); after a failure the command buffer is dropped and the next extract makes
  // another. ex gets this Runner's device allocators (an extractor of net.create_extractor() works too).
  int extract(::ncnn::Extractor& ex, const char* blob, ::ncnn::Mat& out);
  // The same by blob index (ex.extract(int, Mat&)): for binary params, which name no blob (ncnn2mem's BLOB_ constants).
  int extract(::ncnn::Extractor& ex, int blob_index, ::ncnn::Mat& out);
  // Command buffers made so far: 1 after any number of Vulkan extracts that succeeded.
  uint64_t command_buffers_made() const { return made_; }

 private:
  void give_allocators(::ncnn::Extractor& ex) const;  // this Runner's device allocators (a Vulkan net's)
  template <class Blob>
  int extract_blob(::ncnn::Extractor& ex, Blob blob, int index, ::ncnn::Mat& out);  // by name or index
  void attach() const;  // the net's device and allocators, once the net has a device
  const ::ncnn::Net& net_;
  mutable const ::ncnn::VulkanDevice* vkdev_ = nullptr;  // null in a CPU net, and until load_param
  mutable ::ncnn::VkAllocator* blob_allocator_ = nullptr;
  mutable ::ncnn::VkAllocator* staging_allocator_ = nullptr;
  std::unique_ptr<::ncnn::VkCompute> cmd_;
  uint64_t made_ = 0;
};

// What Runner::extract does with a command buffer of the caller's: ex.extract(blob, VkMat, cmd), the download
// recorded into cmd, submitted and waited for, then unpacked and cast to float32 as ncnn's extract does. cmd is
// not reset. opt: the net's options with the VkAllocators to record with (blob_vkallocator, workspace_vkallocator,
// staging_vkallocator), which ex is given too and keeps (they must outlive ex); a null blob allocator, or a null
// staging one where blobs are not
// host-visible and cached, as in the net's own opt, is -1 with a message, before anything is recorded. A blob
// ncnn holds only on the host comes from ncnn's own extract; one a host layer made that ncnn also uploaded for
// the layers after it comes back as uploaded: extract such blobs (computed_on_host) with ex.extract, as Runner does.
// Device memory running out for the download is ncnn's -100 (ncnn's own extract crashes there).
int extract_recorded(::ncnn::Extractor& ex, const char* blob, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                     const ::ncnn::Option& opt);
int extract_recorded(::ncnn::Extractor& ex, int blob_index, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                     const ::ncnn::Option& opt);  // by blob index
// The same, and the download kept in ex as ncnn's extract keeps it (Extractor::input), so that a later extract
// recomputing blobs that light mode released starts from it. Only for a blob a Vulkan layer made that ex does not
// hold on the host (not computed_on_host, nor given with input()): the kept copy replaces any the extractor held.
int extract_recorded_kept(::ncnn::Extractor& ex, const char* blob, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                          const ::ncnn::Option& opt);
int extract_recorded_kept(::ncnn::Extractor& ex, int blob_index, ::ncnn::Mat& out, ::ncnn::VkCompute& cmd,
                          const ::ncnn::Option& opt);  // by blob index

// The index of the net's blob named `name`, as ncnn's own lookup (protected in ncnn::Net) finds it: the first of
// that name, or -1 (a null name too).
int blob_index(const ::ncnn::Net& net, const char* name);

// Whether ncnn's own extract gives the blob named `name` from the host: an Input's blob, one no layer makes (a model
// input without an Input layer), or the output of a layer the loaded net runs on the host (featmask bit 4, or a
// layer without Vulkan support). A recorded extract
// (extract_recorded) would read the copy ncnn uploaded for the layers after it instead: float16 where the net
// stores float16. False for an unknown name.
bool computed_on_host(const ::ncnn::Net& net, const char* name);
bool computed_on_host(const ::ncnn::Net& net, int blob_index);  // by blob index: false outside the net's blobs

// Whether a loaded Vulkan net runs this layer on the host: ncnn keeps it off Vulkan (featmask bit 4), or it has no
// Vulkan support (after load_model such a layer is ncnn's CPU layer: ncnn recreates one for featmask bit 4 or params
// its Vulkan layer cannot take).
bool runs_on_host(const ::ncnn::Layer& layer);

}  // namespace ncnn
}  // namespace vknorm
