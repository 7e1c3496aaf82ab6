// vknorm C++ example: an ncnn model run by ncnn (ncnn::Net, ncnn::Extractor) with vknorm's LayerNorm,
// RMSNorm, GroupNorm and InstanceNorm registered as the net's layers (include/vknorm/ncnn.h). In a Vulkan
// net vknorm's kernels are recorded into ncnn's own command buffer on ncnn's blobs; nothing else about
// the program changes.
//
// Usage:
//   ncnn_example MODEL.param MODEL.bin DIMS [--stock] [--fp16] [--cpu] [--fuse] [--runner] [--repeat N]
//                [--out FILE] [--dump-input FILE] [--param-bin IN,OUT [--custom-type INDEX=TYPE]...]
//
//   DIMS          the shape of the input blob "in0" in numpy order, batch dropped: W, HxW, CxHxW or
//                 CxDxHxW (e.g. 197x768 -> h=197 w=768; 32x14x14 -> c=32 h=14 w=14)
//   --stock       stock ncnn: do not register vknorm's layers
//   --fp16        float16 storage (opt.use_fp16_storage and use_fp16_packed on); default float32 storage.
//                 float16 arithmetic and bfloat16 are always off, as vknorm.graph.configure sets them.
//   --cpu         opt.use_vulkan_compute off: ncnn's CPU layers (vknorm's layers run ncnn's own CPU layers)
//   --fuse        load the .param through vknorm::ncnn::load_param_fused: add -> norm -> activation fused
//                 into vknorm's layers (not with --stock)
//   --runner      extract through a vknorm::ncnn::Runner, which keeps one command buffer for every inference
//                 (ncnn's Extractor::extract makes and destroys a command pool, buffer and fence each call)
//   --repeat N    N inferences, an extractor each (default 1); each output must equal the first bit for bit.
//                 Prints the median wall time per inference (and with --runner the command buffers it made).
//   --out FILE    write the output blob "out0" as raw little-endian float32 in numpy order
//   --dump-input FILE  write the input as raw float32 in numpy order (to check the pattern below)
//   --param-bin IN,OUT  MODEL.param is ncnn's binary params (ncnn2mem's .param.bin, net.load_param_bin), which name
//                 no blob: the input is blob IN and the output blob OUT (the .id.h's BLOB_ constants). Not with
//                 --fuse (fusion reads text params: vknorm optimize first, then ncnn2mem).
//   --custom-type INDEX=TYPE  register vknorm's layer TYPE (vknorm.LayerNorm, ...) under ncnn2mem's custom type
//                 index INDEX (its TYPEINDEX_ constants; vknorm::ncnn::register_layer): a fused model's types in
//                 binary params. Repeatable; with --param-bin, not with --stock.
//
// The input is a deterministic pattern over the flat numpy (C) order, i = 0 .. N-1:
//
//     k = (i * 7919) mod 4099          (integer arithmetic, 64-bit)
//     x[i] = float32((k - 2049) / 1000.0)     (one float64 division, correctly rounded, then one cast)
//
// i.e. numpy: x = ((np.arange(N, dtype=np.int64) * 7919 % 4099 - 2049) / 1000.0).astype(np.float32).
// Every step is either exact integer arithmetic or a single IEEE-754 float64 operation followed by a
// round-to-nearest cast to float32, so C++ and numpy give bit-identical values. (A sin() pattern would
// not be safe: libm and numpy's own SIMD sin are not guaranteed to round alike.) Values lie in
// [-2.049, 2.049], 4099 distinct levels, no two neighbours equal.
//
// Prints the device, the model, the effective options (ncnn drops float16 storage quietly on a device
// without it), one line per vknorm layer (its forwards and the pipelines it made), vknorm's counters for
// this net (vulkan_forwards, cpu_forwards, pipelines; all 0 with --stock), the output's shape and max |out|,
// then OK (with --fuse, first what vknorm::ncnn::load_param_fused fused). Exit status: 0 on success; 1 on any ncnn error (registration, load_param, load_model, input,
// extract), a Vulkan device that ncnn could not give (ncnn would fall back to the CPU quietly) or a
// non-finite output; 2 on bad arguments or unreadable/unwritable files.
#include <net.h>  // ncnn's exported include directory is <prefix>/include/ncnn
#include <gpu.h>

#include <vknorm/ncnn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string param_path, bin_path, out_path, input_path;
  std::vector<int> dims;  // numpy order
  bool stock = false, fp16 = false, cpu = false, fuse = false, runner = false;
  int repeat = 1;
  bool param_bin = false;
  int in_index = -1, out_index = -1;                    // --param-bin's blobs
  std::vector<std::pair<int, std::string>> custom_types;  // --custom-type INDEX=TYPE
};

const char* const kUsage =
    "usage: ncnn_example MODEL.param MODEL.bin DIMS [--stock] [--fuse] [--fp16] [--cpu] [--runner]"
    " [--repeat N] [--out FILE] [--dump-input FILE] [--param-bin IN,OUT [--custom-type INDEX=TYPE]...]\n"
    "  DIMS: numpy order, batch dropped, e.g. 197x768 (h, w) or 32x14x14 (c, h, w)\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "ncnn_example: " << why << "\n" << kUsage;
  std::exit(2);
}

// A non-negative int of a flag's value, all of `s`.
bool parse_index(const std::string& s, int& v) {
  char* end = nullptr;
  const long n = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || n < 0 || n > INT32_MAX) return false;
  v = int(n);
  return true;
}

std::vector<int> parse_dims(const std::string& s) {
  std::vector<int> dims;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 1 || v > (1L << 30)) usage_error("bad DIMS '" + s + "'");
    dims.push_back(int(v));
  }
  if (dims.empty() || dims.size() > 4) usage_error("DIMS needs 1 to 4 extents, got '" + s + "'");
  return dims;
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(s + " needs a value");
      return argv[++i];
    };
    if (s == "--stock") a.stock = true;
    else if (s == "--fp16") a.fp16 = true;
    else if (s == "--cpu") a.cpu = true;
    else if (s == "--fuse") a.fuse = true;
    else if (s == "--runner") a.runner = true;
    else if (s == "--repeat") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > 1000000) usage_error("--repeat needs a count from 1 to 1000000, got '" + v + "'");
      a.repeat = int(n);
    }
    else if (s == "--out") a.out_path = value();
    else if (s == "--dump-input") a.input_path = value();
    else if (s == "--param-bin") {
      const std::string v = value();
      const size_t comma = v.find(',');
      a.param_bin = true;
      if (comma == std::string::npos || !parse_index(v.substr(0, comma), a.in_index) ||
          !parse_index(v.substr(comma + 1), a.out_index))
        usage_error("--param-bin needs the input's and output's blob indexes IN,OUT, got '" + v + "'");
    } else if (s == "--custom-type") {
      const std::string v = value();
      const size_t eq = v.find('=');
      int index = -1;
      if (eq == std::string::npos || !parse_index(v.substr(0, eq), index) || eq + 1 == v.size())
        usage_error("--custom-type needs INDEX=TYPE (e.g. 256=vknorm.LayerNorm), got '" + v + "'");
      a.custom_types.emplace_back(index, v.substr(eq + 1));
    }
    else if (s == "-h" || s == "--help") { std::cout << kUsage; std::exit(0); }
    else if (s.size() > 1 && s[0] == '-') usage_error("unknown option " + s);
    else positional.push_back(s);
  }
  if (positional.size() != 3) usage_error("expected MODEL.param MODEL.bin DIMS");
  if (a.fuse && a.stock) usage_error("--fuse needs vknorm's layers (not --stock)");
  if (a.fuse && a.param_bin) usage_error("--fuse reads text params (fuse with vknorm optimize, then convert)");
  if (!a.custom_types.empty() && (!a.param_bin || a.stock))
    usage_error("--custom-type registers vknorm's layers for --param-bin (not with --stock)");
  a.param_path = positional[0];
  a.bin_path = positional[1];
  a.dims = parse_dims(positional[2]);
  return a;
}

std::string join_dims(const std::vector<int>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "x" : "") + std::to_string(d[i]);
  return s;
}

// The pattern documented at the top, over the flat numpy order.
std::vector<float> input_pattern(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = int64_t((uint64_t(i) * 7919u) % 4099u);
    const double v = double(k - 2049) / 1000.0;
    x[i] = static_cast<float>(v);
  }
  return x;
}

// numpy (w), (h, w), (c, h, w), (c, d, h, w) -> ncnn::Mat (channels start at cstep, not densely).
ncnn::Mat to_mat(const std::vector<int>& dims, const std::vector<float>& x) {
  ncnn::Mat m;
  switch (dims.size()) {
    case 1: m.create(dims[0]); break;
    case 2: m.create(dims[1], dims[0]); break;
    case 3: m.create(dims[2], dims[1], dims[0]); break;
    default: m.create(dims[3], dims[2], dims[1], dims[0]);
  }
  if (m.empty()) return m;
  const size_t plane = size_t(m.w) * m.h * m.d;
  const int channels = m.dims >= 3 ? m.c : 1;
  for (int q = 0; q < channels; ++q) std::memcpy(m.channel(q).data, x.data() + q * plane, plane * sizeof(float));
  return m;
}

// ncnn::Mat (elempack 1, float32) -> numpy order, and its numpy shape.
std::vector<float> from_mat(const ncnn::Mat& m, std::vector<int>& shape) {
  switch (m.dims) {
    case 1: shape = {m.w}; break;
    case 2: shape = {m.h, m.w}; break;
    case 3: shape = {m.c, m.h, m.w}; break;
    default: shape = {m.c, m.d, m.h, m.w};
  }
  const size_t plane = size_t(m.w) * m.h * m.d;
  const int channels = m.dims >= 3 ? m.c : 1;
  std::vector<float> out(plane * channels);
  for (int q = 0; q < channels; ++q)
    std::memcpy(out.data() + q * plane, m.channel(q).data, plane * sizeof(float));
  return out;
}

bool write_raw(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  return bool(f);
}

bool readable(const std::string& path) { return bool(std::ifstream(path, std::ios::binary)); }

// Everything that touches the net lives here, so that the net is gone before ncnn's instance is.
int run(const Args& a) {
  ncnn::Net net;
  net.opt.use_vulkan_compute = !a.cpu;
  net.opt.use_fp16_storage = a.fp16;
  net.opt.use_fp16_packed = a.fp16;
  net.opt.use_fp16_arithmetic = false;
  net.opt.use_bf16_storage = false;
  net.opt.use_bf16_packed = false;
  net.opt.use_packing_layout = true;
  net.opt.lightmode = true;

  if (!a.stock) {
    if (int r = vknorm::ncnn::register_layers(net)) {
      std::cerr << "ncnn_example: registering vknorm's layers failed (" << r << ")\n";
      return 1;
    }
    for (const auto& [index, type] : a.custom_types)
      if (int r = vknorm::ncnn::register_layer(net, index, type)) {
        std::cerr << "ncnn_example: registering " << type << " as type index " << index << " failed (" << r << ")\n";
        return 1;
      }
  }
  // --fuse: vknorm's graph rewrite (add -> norm -> activation as one vknorm layer) as the model loads.
  std::vector<vknorm::ncnn::FusedPattern> fused;
  if (int r = a.fuse        ? vknorm::ncnn::load_param_fused(net, a.param_path.c_str(), &fused)
              : a.param_bin ? net.load_param_bin(a.param_path.c_str())
                            : net.load_param(a.param_path.c_str())) {
    std::cerr << "ncnn_example: load_param " << a.param_path << " failed (" << r << ")\n";
    return 1;
  }
  if (a.fuse) {
    std::cout << "fused: " << fused.size() << "\n";
    for (const auto& f : fused) {
      std::cout << "  " << f.pattern << ":";
      for (const auto& l : f.layers) std::cout << " " << l;
      std::cout << "\n";
    }
  }
  if (int r = net.load_model(a.bin_path.c_str())) {
    std::cerr << "ncnn_example: load_model " << a.bin_path << " failed (" << r << ")\n";
    return 1;
  }
  // ncnn quietly falls back to the CPU when it has no Vulkan device: here that is an error.
  if (!a.cpu && (!net.opt.use_vulkan_compute || !net.vulkan_device())) {
    std::cerr << "ncnn_example: Vulkan compute requested but ncnn has no usable Vulkan device\n";
    return 1;
  }
  // ncnn also drops float16 storage quietly on a device without it: say what the net really uses.
  const bool fp16 = net.opt.use_fp16_storage || net.opt.use_fp16_packed;
  if (a.fp16 && !fp16) std::cerr << "ncnn_example: warning: the device has no float16 storage; float32 used\n";

  int vknorm_layers = 0;
  for (const ncnn::Layer* l : net.layers()) vknorm_layers += vknorm::ncnn::is_vknorm_layer(l) ? 1 : 0;

  if (a.cpu)
    std::cout << "device: cpu\n";
  else
    std::cout << "device: " << net.vulkan_device()->info.device_name() << " (vulkan)\n";
  std::cout << "model: " << a.param_path << ", " << net.layers().size() << " layers, " << vknorm_layers
            << " vknorm layers" << (a.stock ? " (stock ncnn)" : "") << "\n"
            << "options: vulkan " << (net.opt.use_vulkan_compute ? "on" : "off") << ", storage "
            << (fp16 ? "fp16" : "fp32") << ", fp16 arithmetic off, bf16 off, packing on\n";

  // Elements of the input, or 0 where their floats would not fit in memory's address range (nor could be allocated).
  size_t n = 1;
  for (int d : a.dims) n = n > SIZE_MAX / sizeof(float) / size_t(d) ? 0 : n * size_t(d);
  std::vector<float> x;
  try {
    if (n == 0) throw std::bad_alloc();
    x = input_pattern(n);
  } catch (const std::exception&) {  // bad_alloc, or length_error past a vector's max_size()
    std::cerr << "ncnn_example: cannot allocate the input " << join_dims(a.dims) << "\n";
    return 1;
  }
  if (!a.input_path.empty() && !write_raw(a.input_path, x)) {
    std::cerr << "ncnn_example: cannot write " << a.input_path << "\n";
    return 2;
  }
  const ncnn::Mat in = to_mat(a.dims, x);
  if (in.empty()) {
    std::cerr << "ncnn_example: cannot allocate the input " << join_dims(a.dims) << "\n";
    return 1;
  }
  // Blobs by name in text params, by index in binary ones.
  const std::string in_label = a.param_bin ? "blob " + std::to_string(a.in_index) : "in0";
  const std::string out_label = a.param_bin ? "blob " + std::to_string(a.out_index) : "out0";
  std::cout << "input " << in_label << ": " << join_dims(a.dims) << "\n";

  std::vector<int> shape;
  std::vector<float> y;
  std::optional<vknorm::ncnn::Runner> runner;
  if (a.runner) runner.emplace(net);
  std::vector<double> ms;
  for (int i = 0; i < a.repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ncnn::Extractor ex = runner ? runner->create_extractor() : net.create_extractor();
    if (int r = a.param_bin ? ex.input(a.in_index, in) : ex.input("in0", in)) {
      std::cerr << "ncnn_example: input " << in_label << " failed (" << r << ")\n";
      return 1;
    }
    ncnn::Mat out;
    const int r = a.param_bin ? (runner ? runner->extract(ex, a.out_index, out) : ex.extract(a.out_index, out))
                              : (runner ? runner->extract(ex, "out0", out) : ex.extract("out0", out));
    if (r != 0) {
      std::cerr << "ncnn_example: extract " << out_label << " failed (" << r << ")\n";
      return 1;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (out.empty() || out.elempack != 1 || out.elemsize != 4) {
      std::cerr << "ncnn_example: " << out_label << " is not an elempack-1 float32 blob (elempack " << out.elempack
                << ", elemsize " << out.elemsize << ")\n";
      return 1;
    }
    std::vector<float> yi = from_mat(out, shape);
    if (i > 0 && (yi.size() != y.size() || std::memcmp(yi.data(), y.data(), y.size() * sizeof(float)) != 0)) {
      std::cerr << "ncnn_example: inference " << i + 1 << " gave another " << out_label << " than the first\n";
      return 1;
    }
    y = std::move(yi);
  }
  if (a.repeat > 1 || runner) {
    std::sort(ms.begin(), ms.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", ms[ms.size() / 2]);
    std::cout << "inferences: " << a.repeat << ", median " << buf << " ms each, every output identical";
    if (runner) std::cout << "; runner command buffers made: " << runner->command_buffers_made();
    std::cout << "\n";
  }

  // Per layer: how it ran and the pipelines (shader variant / specialization constants) it made.
  // (binary params name no layer: "#" and its index)
  for (size_t i = 0; i < net.layers().size(); ++i) {
    const ncnn::Layer* l = net.layers()[i];
    vknorm::ncnn::LayerInfo info;
    if (!vknorm::ncnn::describe_layer(l, info)) continue;
    const std::string name = l->name.empty() ? "#" + std::to_string(i) : l->name;
    std::cout << "vknorm layer " << name << " " << info.layer_type << ": vulkan_forwards "
              << info.counters.vulkan_forwards << ", cpu_forwards " << info.counters.cpu_forwards << ", pipelines";
    for (const std::string& p : info.pipelines) std::cout << " " << p;
    std::cout << "\n";
  }
  const vknorm::ncnn::Counters c = vknorm::ncnn::counters(net);
  std::cout << "vknorm counters: vulkan_forwards " << c.vulkan_forwards << ", cpu_forwards " << c.cpu_forwards
            << ", pipelines " << c.pipelines << "\n";

  double max_abs = 0;
  bool finite = true;
  for (float v : y) {
    finite = finite && std::isfinite(v);
    max_abs = std::fmax(max_abs, std::fabs(double(v)));
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", max_abs);
  std::cout << "output " << out_label << ": " << join_dims(shape) << ", max |out| " << buf
            << (finite ? "" : " (NOT FINITE)") << "\n";
  if (!a.out_path.empty()) {
    if (!write_raw(a.out_path, y)) {
      std::cerr << "ncnn_example: cannot write " << a.out_path << "\n";
      return 2;
    }
    std::cout << "wrote " << a.out_path << " (" << y.size() << " float32, numpy order)\n";
  }
  return finite ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  for (const std::string& p : {a.param_path, a.bin_path})
    if (!readable(p)) {
      std::cerr << "ncnn_example: cannot open " << p << "\n";
      return 2;
    }
  const int rc = run(a);
  // The net is gone: release ncnn's Vulkan instance before static destruction (a no-op on the CPU).
  ncnn::destroy_gpu_instance();
  if (rc == 0) std::cout << "OK\n";
  return rc;
}
