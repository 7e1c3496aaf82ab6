// vknorm C++ example: one norm layer (ncnn's layer interface: LayerNorm, RMSNorm, GroupNorm or
// InstanceNorm) on a host Mat and on a device VkMat, each compared with the CPU reference
// (forward_inplace_cpu, ncnn's own algorithm).
//
// Usage:
//   layernorm_example [options] [MODEL.param MODEL.bin]
//
//   MODEL.param  an ncnn .param file (or just one layer line); the first norm line is used:
//                  LayerNorm ln0 1 1 in0 out0 0=64 1=1.000000e-05 2=1
//                  GroupNorm gn0 1 1 in0 out0 0=32 1=320 2=1.000000e-05 3=1
//                (ncnn's param ids per type). A missing key takes ncnn's default.
//   MODEL.bin    raw little-endian float32: gamma then beta (all but RMSNorm), affine_size or channels
//                values each (what ncnn's load_model reads; with affine=0 nothing is read), read from its
//                first byte: that layer's weights alone, not a whole model's .bin (whose earlier layers'
//                weights come first).
//   Without files: LayerNorm, affine_size 64, eps 1e-5, affine 1 and pseudo-random weights.
//
//   --h N, --c N      input shape (c, h, w) in numpy order, a dims-3 Mat; defaults 16 and 4; w is
//                     affine_size (LayerNorm/RMSNorm), else --w N (default 16); GroupNorm and
//                     InstanceNorm take c from their channels
//   --fp16            float16 storage on the device (tolerance 4e-3 instead of 1e-5)
//   --no-packing      keep elempack 1 on the device (default: pack4 where the channels divide by 4)
//   --path P          auto | subgroup | workgroup | split | cooperative (default auto)
//   --device N        Vulkan device index (default: VKNORM_DEVICE, else the best device)
//   --tol X           error bound relative to max(1, max|y|) (default 1e-5, or 4e-3 with --fp16)
//
// Prints the device, the shape and the max abs error of each run; exits 1 when an error exceeds the
// tolerance (or, with VKNORM_VALIDATION=1, when the validation layer reported anything) or the device
// fails, 2 on bad arguments, files or a layer that cannot take its input, 3 when Vulkan is unavailable.
#include <vknorm/vknorm.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string param_path, bin_path;
  int h = 16, c = 4, w = 16, device = -1;
  bool fp16 = false, packing = true;
  std::string path = "auto";
  double tol = -1;
};

const char* const kUsage =
    "usage: layernorm_example [--h N] [--c N] [--w N] [--fp16] [--no-packing] [--path P] [--device N] [--tol X]"
    " [MODEL.param MODEL.bin]\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "layernorm_example: " << why << "\n" << kUsage;
  std::exit(2);
}

// A flag's number, the whole of its text (std::stoi alone takes "5x" as 5).
int whole_int(const std::string& flag, const std::string& v) {
  size_t used = 0;
  const int n = std::stoi(v, &used);
  if (used != v.size()) usage_error("bad value for " + flag + ": '" + v + "'");
  return n;
}
double whole_double(const std::string& flag, const std::string& v) {
  size_t used = 0;
  const double x = std::stod(v, &used);
  if (used != v.size()) usage_error("bad value for " + flag + ": '" + v + "'");
  return x;
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::vector<std::string> files;
  bool tol_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(s + " needs a value");
      return argv[++i];
    };
    try {
      if (s == "--h") a.h = whole_int(s, value());
      else if (s == "--c") a.c = whole_int(s, value());
      else if (s == "--w") a.w = whole_int(s, value());
      else if (s == "--device") a.device = whole_int(s, value());
      else if (s == "--tol") a.tol = whole_double(s, value()), tol_given = true;
      else if (s == "--path") a.path = value();
      else if (s == "--fp16") a.fp16 = true;
      else if (s == "--no-packing") a.packing = false;
      else if (s == "-h" || s == "--help") { std::cout << kUsage; std::exit(0); }
      else if (!s.empty() && s[0] == '-') usage_error("unknown option " + s);
      else files.push_back(s);
    } catch (const std::logic_error&) {  // stoi/stod
      usage_error("bad value for " + s);
    }
  }
  if (files.size() == 2) a.param_path = files[0], a.bin_path = files[1];
  else if (!files.empty()) usage_error("give both MODEL.param and MODEL.bin, or neither");
  if (a.h < 1 || a.c < 1 || a.w < 1) usage_error("--h, --c and --w must be >= 1");
  if (a.device < -1) usage_error("--device must be a device index >= 0");
  if (tol_given && !(a.tol > 0 && a.tol < 1e300)) usage_error("--tol must be a positive number");
  if (!tol_given) a.tol = a.fp16 ? 4e-3 : 1e-5;
  return a;
}

// The first norm line of an ncnn .param file -> its type and ParamDict (other lines are ignored).
struct NormLine {
  vknorm::NormOp op;
  vknorm::ParamDict pd;
};
NormLine read_param(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open");
  const std::pair<const char*, vknorm::NormOp> types[] = {
      {"LayerNorm", vknorm::NormOp::LayerNorm}, {"RMSNorm", vknorm::NormOp::RMSNorm},
      {"GroupNorm", vknorm::NormOp::GroupNorm}, {"InstanceNorm", vknorm::NormOp::InstanceNorm}};
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string type, name;
    int n_in = 0, n_out = 0;
    if (!(in >> type)) continue;
    const auto* t = std::find_if(std::begin(types), std::end(types), [&](const auto& p) { return type == p.first; });
    if (t == std::end(types)) continue;
    if (!(in >> name >> n_in >> n_out) || n_in < 0 || n_out < 0)
      throw std::runtime_error(path + ": malformed layer line: " + line);
    std::string blob;
    for (int i = 0; i < n_in + n_out; ++i)
      if (!(in >> blob)) throw std::runtime_error(path + ": layer line lists fewer blobs than it declares: " + line);
    NormLine out{t->second, {}};
    std::string kv;
    while (in >> kv) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) throw std::runtime_error(path + ": expected id=value, got '" + kv + "'");
      const std::string key = kv.substr(0, eq), v = kv.substr(eq + 1);
      // ncnn's rule: a value with '.' or 'e' is a float, otherwise an int. The whole text must be the number.
      const bool is_float = v.find_first_of(".eE") != std::string::npos;
      char* end = nullptr;
      errno = 0;
      const long id = std::strtol(key.c_str(), &end, 10);
      const bool id_ok = !key.empty() && *end == '\0' && errno == 0 && id >= 0 && id < 32;
      end = nullptr;
      errno = 0;
      const float f = is_float ? std::strtof(v.c_str(), &end) : 0.f;
      const long i = is_float ? 0 : std::strtol(v.c_str(), &end, 10);
      if (!id_ok || v.empty() || *end != '\0' || errno != 0 || i < INT32_MIN || i > INT32_MAX)
        throw std::runtime_error(path + ": bad " + (id_ok ? "value" : "id") + " in '" + kv + "' (id=value: an id 0-31, " +
                                 "an int or a float) on the line: " + line);
      if (is_float) out.pd.set(int(id), f);
      else out.pd.set(int(id), int(i));
    }
    return out;
  }
  throw std::runtime_error(path + ": no LayerNorm, RMSNorm, GroupNorm or InstanceNorm layer line");
}

std::vector<float> read_floats(std::ifstream& f, size_t n, const std::string& path, const char* what) {
  std::vector<float> v(n);
  if (n && !f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(float))))
    throw std::runtime_error(path + ": too short for " + what + " (" + std::to_string(n) + " float32)");
  return v;
}

// Deterministic uniform values in [-1.2, 1.2), as ncnn's RandomMat range.
struct Lcg {
  uint32_t s;
  float next() {
    s = s * 1664525u + 1013904223u;
    return float(s >> 8) / float(1u << 24) * 2.4f - 1.2f;
  }
};

// Every unpacked float of a dims-3 fp32 elempack-1 Mat, in (c, h, w) order.
std::vector<float> values(const vknorm::Mat& m) {
  std::vector<float> out;
  for (int q = 0; q < m.c; ++q) {
    const float* p = reinterpret_cast<const float*>(m.channel(q));
    out.insert(out.end(), p, p + size_t(m.w) * m.h);
  }
  return out;
}

double max_abs_err(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= e)) e = d;  // NaN propagates
  }
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);

  std::unique_ptr<vknorm::Norm> layer;
  try {
    std::vector<float> gamma, beta;
    if (!args.param_path.empty()) {
      NormLine nl = read_param(args.param_path);
      layer = std::make_unique<vknorm::Norm>(nl.op);
      layer->load_param(nl.pd);
      if (layer->affine) {
        std::ifstream bin(args.bin_path, std::ios::binary);
        if (!bin) throw std::runtime_error(args.bin_path + ": cannot open");
        gamma = read_floats(bin, layer->weight_count(), args.bin_path, "gamma");
        if (layer->op != vknorm::NormOp::RMSNorm) beta = read_floats(bin, layer->weight_count(), args.bin_path, "beta");
      }
    } else {
      layer = std::make_unique<vknorm::LayerNorm>();
      vknorm::ParamDict pd;
      pd.set(0, 64);
      pd.set(1, 1e-5f);
      pd.set(2, 1);
      layer->load_param(pd);
      Lcg rng{1234};
      for (int i = 0; i < layer->affine_size; ++i) gamma.push_back(rng.next()), beta.push_back(rng.next());
    }
    const bool by_row = layer->op == vknorm::NormOp::LayerNorm || layer->op == vknorm::NormOp::RMSNorm;
    if (by_row && layer->affine_size < 1) throw std::runtime_error("affine_size (0=) must be >= 1: it is the row width here");
    layer->load_model(gamma, beta);  // affine=0: both empty
  } catch (const std::exception& e) {
    std::cerr << "layernorm_example: " << e.what() << "\n";
    return 2;
  }
  // Everything below may throw too: the shape the CPU reference refuses (std::invalid_argument: a bad layer or
  // input, exit 2), Vulkan missing (exit 3), or a device that fails (out of memory, lost: exit 1).
  try {
    vknorm::Norm& ln = *layer;
    const bool by_row = ln.op == vknorm::NormOp::LayerNorm || ln.op == vknorm::NormOp::RMSNorm;

    // Input: c channels of h rows of w. LayerNorm/RMSNorm: w = affine_size, normalized row by row (ncnn:
    // affine_size == w); GroupNorm/InstanceNorm: the layer's channels.
    const int w = by_row ? ln.affine_size : args.w;
    const int c = !by_row && ln.channels > 0 ? ln.channels : args.c;
    vknorm::Mat x = vknorm::Mat::create(3, w, args.h, 1, c);
    Lcg rng{7767517};
    for (int q = 0; q < x.c; ++q) {
      float* p = reinterpret_cast<float*>(x.channel(q));
      // Channel offsets; kept small for GroupNorm/InstanceNorm, whose groups span channels: ncnn's
      // float32 sums (the CPU reference) lose digits on large means, the Vulkan kernels do not.
      const float offset = 0.5f * float(by_row ? q : q % 4);
      for (int i = 0; i < w * args.h; ++i) p[i] = rng.next() + offset;
    }
    // fp16 storage: the device holds float16, so the reference starts from the same rounded input.
    vknorm::Mat x_ref = args.fp16 ? vknorm::cast_fp32(vknorm::cast_fp16(x)) : x.clone();
    ln.forward_inplace_cpu(x_ref);
    const std::vector<float> ref = values(x_ref);
    double ymax = 1;
    for (float v : ref) ymax = std::max(ymax, double(std::fabs(v)));
    const double bound = args.tol * ymax;

    auto ctx = vknorm::Context::create(args.device);
    vknorm::Option opt;
    opt.use_fp16_storage = args.fp16;
    opt.use_packing_layout = args.packing;
    opt.path = vknorm::parse_path(args.path);
    ln.create_pipeline(ctx, opt);
    const auto& dev = ctx->info();
    std::printf("device: %s (%s, Vulkan %s, subgroup size %u)\n", dev.name.c_str(), dev.type.c_str(),
                dev.api_version.c_str(), dev.subgroup_size);
    std::string params = by_row ? "affine_size=" + std::to_string(ln.affine_size) : "channels=" + std::to_string(ln.channels);
    if (ln.op == vknorm::NormOp::GroupNorm) params = "group=" + std::to_string(ln.group) + " " + params;
    std::printf("layer: %s %s eps=%g affine=%d; input c=%d h=%d w=%d; %s storage, packing %s\n", vknorm::op_name(ln.op),
                params.c_str(), double(ln.eps), ln.affine, c, args.h, w, args.fp16 ? "fp16" : "fp32",
                args.packing ? "on" : "off");

    // 1. Host Mat: upload, normalize, download in one submission.
    vknorm::Mat y_host = x.clone();
    ln.forward_inplace(y_host, opt);
    const vknorm::DispatchInfo host_run = ln.last_dispatch();
    const double err_host = max_abs_err(values(y_host), ref);

    // 2. Device VkMat: the blob stays on the device (as between consecutive layers); download once.
    vknorm::VkMat v = vknorm::VkMat::upload(x, ctx, opt);
    ln.forward_inplace(v, opt);
    const vknorm::DispatchInfo dev_run = ln.last_dispatch();
    const vknorm::Mat y_dev = vknorm::cast_fp32(vknorm::convert_packing(v.download(), 1));
    const double err_dev = max_abs_err(values(y_dev), ref);

    std::printf("host Mat:   path %-9s %d dispatch(es), max abs error vs CPU reference %.3e\n",
                vknorm::path_name(host_run.path), host_run.dispatches, err_host);
    std::printf("device Mat: path %-9s %d dispatch(es), max abs error vs CPU reference %.3e\n",
                vknorm::path_name(dev_run.path), dev_run.dispatches, err_dev);
    bool ok = err_host <= bound && err_dev <= bound;
    if (vknorm::validation_enabled()) {  // VKNORM_VALIDATION=1: the Khronos layer watched every call
      const auto messages = vknorm::validation_messages();
      std::printf("validation messages: %zu\n", messages.size());
      for (const auto& m : messages) std::printf("  %s\n", m.c_str());
      ok = ok && messages.empty();
    }
    std::printf("%s (tolerance %.3e)\n", ok ? "OK" : "FAIL", bound);
    return ok ? 0 : 1;
  } catch (const vknorm::VulkanUnavailable& e) {
    std::cerr << "layernorm_example: " << e.what() << "\n";
    return 3;
  } catch (const std::invalid_argument& e) {
    std::cerr << "layernorm_example: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "layernorm_example: the run failed: " << e.what() << "\n";
    return 1;
  }
}
