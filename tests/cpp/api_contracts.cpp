// Promises of the C++ API that no example shows, each checked on the default Vulkan device; prints one
// line per check ("ok: ..." or "FAIL: ...") and exits 1 when any fails.
//   - load_param after create_pipeline(ctx) keeps the layer on ctx (it fell back to the default device);
//   - forward_inplace(Mat&) writes into the Mat's own storage, which shallow copies share, also where the
//     device needs the blob converted (pack4, float16);
//   - Mat::create refuses negative extents; blob_span_bytes refuses a size that wraps 64 bits.
#include <vknorm/norm.h>
#include <vknorm/recorder.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

int failures = 0;
void report(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  failures += !ok;
}

vknorm::Mat ramp(int c, int h, int w) {  // float32 pack1, x = channel + sin(i)
  vknorm::Mat m = vknorm::Mat::create(3, w, h, 1, c);
  for (int q = 0; q < c; ++q) {
    float* p = reinterpret_cast<float*>(m.channel(q));
    for (int i = 0; i < w * h; ++i) p[i] = float(q) + std::sin(float(i));
  }
  return m;
}

// A LayerNorm over rows of affine_size, no weights.
void load_layernorm(vknorm::Norm& ln, int affine_size) {
  vknorm::ParamDict pd;
  pd.set(0, affine_size);
  pd.set(1, 1e-5f);
  pd.set(2, 0);
  ln.load_param(pd);
}

// The max |y| over a LayerNorm of rows: each row has mean 0 and variance ~1, so |y| < sqrt(w).
bool normalized(const vknorm::Mat& m, int w) {
  for (int q = 0; q < m.c; ++q) {
    const float* p = reinterpret_cast<const float*>(m.channel(q));
    for (int r = 0; r < m.h; ++r) {
      double s = 0, ss = 0;
      for (int i = 0; i < w; ++i) s += p[r * w + i], ss += double(p[r * w + i]) * p[r * w + i];
      if (std::fabs(s / w) > 1e-4 || std::fabs(ss / w - 1) > 1e-3) return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  try {
    // ---- load_param keeps create_pipeline's device
    auto ctx = vknorm::Context::create();
    vknorm::Norm ln(vknorm::NormOp::LayerNorm);
    load_layernorm(ln, 16);
    ln.create_pipeline(ctx);
    vknorm::ParamDict pd;
    pd.set(0, 16);
    pd.set(1, 1e-6f);
    pd.set(2, 0);
    ln.load_param(pd);
    vknorm::Mat host = ramp(2, 3, 16);
    ln.forward_inplace(host);
    report(ln.context() == ctx, "load_param after create_pipeline(ctx) keeps the layer on ctx");
    vknorm::VkMat dev = vknorm::VkMat::upload(ramp(2, 3, 16), ctx);
    try {
      ln.forward_inplace(dev);
      report(true, "a VkMat on ctx runs after load_param");
    } catch (const std::exception& e) {
      report(false, std::string("a VkMat on ctx runs after load_param: ") + e.what());
    }

    // ---- forward_inplace(Mat&) through shallow copies, with and without a converted device copy
    for (int c : {6, 8}) {  // 8 channels: pack4 on the device; 6: pack1, the same bytes
      for (bool fp16 : {false, true}) {
        vknorm::Norm l(vknorm::NormOp::LayerNorm);
        load_layernorm(l, 16);
        vknorm::Mat a = ramp(c, 3, 16);
        vknorm::Mat b = a;  // a shallow copy: one storage
        vknorm::Option opt;
        opt.use_fp16_storage = fp16;
        l.forward_inplace(b, opt);
        const bool shared = a.data() == b.data();
        report(shared && (fp16 || normalized(a, 16)) && std::memcmp(a.data(), b.data(), a.bytes()) == 0,
               "forward_inplace writes through a shallow copy (c=" + std::to_string(c) + (fp16 ? ", float16 storage)" : ")"));
        if (fp16) {  // float16 storage rounds: judged with a float16 tolerance
          bool close = true;
          vknorm::Mat ref = ramp(c, 3, 16);
          vknorm::Norm l32(vknorm::NormOp::LayerNorm);
          load_layernorm(l32, 16);
          l32.forward_inplace(ref);
          for (size_t i = 0; i < a.bytes() / 4; ++i)
            close = close && std::fabs(reinterpret_cast<const float*>(a.data())[i] - reinterpret_cast<const float*>(ref.data())[i]) < 4e-3 * 4;
          report(close, "float16 storage result within the fp16 rule (c=" + std::to_string(c) + ")");
        }
      }
    }

    // ---- refused sizes
    try {
      vknorm::Mat::create(3, -4, -4, 1, 1);
      report(false, "Mat::create refuses negative extents");
    } catch (const std::invalid_argument&) {
      report(true, "Mat::create refuses negative extents");
    }
    try {
      vknorm::blob_span_bytes(3, 1, 1, 1, (1 << 30) + 1, size_t(1) << 60, 4, false);
      report(false, "blob_span_bytes refuses a size past 64 bits");
    } catch (const std::invalid_argument&) {
      report(true, "blob_span_bytes refuses a size past 64 bits");
    }
  } catch (const vknorm::VulkanUnavailable& e) {
    std::printf("no Vulkan device: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::printf("FAIL: unexpected exception: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
}
