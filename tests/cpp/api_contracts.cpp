// Promises of the C++ API that no example shows, each checked on the default Vulkan device; prints one
// line per check ("ok: ..." or "FAIL: ...") and exits 1 when any fails.
//   - load_param after create_pipeline(ctx) keeps the layer on ctx (it fell back to the default device);
//   - forward_inplace(Mat&) writes into the Mat's own storage, which shallow copies share, also where the
//     device needs the blob converted (pack4, float16);
//   - forward_inplace_cpu(Mat&) writes into the Mat's own storage as well (pack4, float16), a Mat::external's
//     at its own cstep too;
//   - forward(bottom, top) leaves bottom as it was and gives forward_inplace's result; top is allocated when
//     it does not fit and written where it lies when it does (a Mat::external over dense memory);
//   - forward(bottom, top) that throws leaves a top it would have replaced as it was;
//   - a dims 1-2 Mat::external over a dense array (ncnn's Mat(w, h, data)) is written no further than its last
//     element by forward_inplace, forward and download;
//   - forward(VkMat bottom, VkMat& top) leaves bottom as it was and gives forward_inplace's result, in a top of
//     bottom's layout where it lies, else (top empty, or sharing bottom's buffer) in a buffer of its own;
//   - download(Mat&) converts into the caller's Mat (float16 pack4 on the device, float32 pack1 out);
//   - a host Mat without memory (a Mat::layout), or whose fields were edited past its memory, is refused by
//     forward, forward_inplace, forward_inplace_cpu and upload, not read (forward(m, m) included: top names
//     bottom there);
//   - forward(bottom, top) with top over bottom's memory at another cstep gives forward_inplace's result,
//     in one piece and in pieces;
//   - forward_add's sum may name x or the residual (x = x + r);
//   - forward_add on host Mats gives the VkMat forward_add's result and sum (float32 and float16 storage),
//     writes outputs that are its inputs where they lie, and refuses a top and sum sharing memory (one Mat
//     named as both included, also where it is empty);
//   - public fields written directly after a forward (gamma_data, activation, eps) take effect at the
//     next forward, checked as load_param checks them (a wrong weight count named, an Activation value
//     that is none of the enum's refused);
//   - a VkMat whose public fields were edited to describe more than its buffer is refused, not run past it;
//   - a VkMat whose buffer is not its context's (assembled field by field, or given another context's buffer) is
//     refused by forward_inplace, forward_add, forward and download;
//   - the conversions (cast_fp16, cast_fp32, convert_packing, converted, convert_into) refuse a Mat without memory
//     or with fields past it, as the layers do; extents edited negative (a product that wraps to a small size) and
//     elempack 4 on a dims-1 Mat are refused;
//   - Mat::create refuses negative extents and a size that wraps 64 bits; so does blob_span_bytes;
//   - layout_as / converted refuse a packing other than 1 or 4 or one the channels do not divide by, ncnn_cstep
//     an element size of 0;
//   - a moved-from Mat or VkMat is empty (dims 0, no memory), not a shape whose memory went elsewhere;
//   - create_pipeline uploads the weights load_model gave (and leaves weights not yet given to the first forward);
//   - forward_add refuses an empty VkMat before taking any device: the layer then runs on a context of its caller's;
//     so does a forward refused for missing weights;
//   - an op, Option.path or Option.max_workgroup_size set to what names no value is refused (device and CPU);
//   - NormParams::check reads each type's own fields, not the others';
//   - a Mat whose extents were edited past its cstep is told so;
//   - the headers compile where X11's None macro is defined first (xlib_first.cpp).
#include <vknorm/norm.h>
#include <vknorm/recorder.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

bool xlib_none_macro_leaves_the_headers_whole();  // xlib_first.cpp

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

// The float32 rule of the Python tests (tests/reference.py FP32_TOL): max |y - float64| <= this x max(1, max |y|).
constexpr double kFloat32Rule = 1e-5;

// Half the spacing of a float16 value's binade (float16's subnormals below 2^-14): the most rounding to float16 moved
// it, since rounding never takes a value into a lower binade.
double half_fp16_spacing(double v) {
  return std::ldexp(1.0, std::ilogb(std::max(std::fabs(v), std::ldexp(1.0, -14))) - 11);
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
  report(xlib_none_macro_leaves_the_headers_whole(),
         "the headers compile after X11's None macro; Fusion::InPlace and Activation::Identity name None's values");
  // ---- ParamDict reads as ncnn's: a float where an int is read counts as not given (.param "0=16.0"), an int
  // where a float is read is that number
  {
    vknorm::ParamDict pd;
    pd.set(0, 16.0f);
    pd.set(1, 3);
    report(pd.get(0, 7) == 7 && pd.get(0, 1.f) == 16.f && pd.get(1, 0.5f) == 3.f && pd.get(1, 9) == 3 && pd.get(2, 4) == 4,
           "ParamDict: a float read as an int is the default, an int read as a float its value");
    vknorm::Norm ln(vknorm::NormOp::LayerNorm);
    pd.set(1, 1e-5f);
    ln.load_param(pd);
    report(ln.affine_size == 0, "LayerNorm 0=16.0: affine_size 0, as in ncnn (got " + std::to_string(ln.affine_size) + ")");
  }
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
        if (fp16) {  // float16 storage: the float32-storage result on the float16-rounded input, up to the
                     // output's rounding to float16 (half the spacing at the output) and the float32 rule on each side
          bool close = true;
          vknorm::Mat ref = vknorm::cast_fp32(vknorm::cast_fp16(ramp(c, 3, 16)));
          vknorm::Norm l32(vknorm::NormOp::LayerNorm);
          load_layernorm(l32, 16);
          l32.forward_inplace(ref);
          const float* got = reinterpret_cast<const float*>(a.data());
          const float* want = reinterpret_cast<const float*>(ref.data());
          float scale = 1;
          for (size_t i = 0; i < a.bytes() / 4; ++i) scale = std::max(scale, std::fabs(want[i]));
          for (size_t i = 0; i < a.bytes() / 4; ++i)
            close = close && std::fabs(got[i] - want[i]) <= half_fp16_spacing(got[i]) + 2 * kFloat32Rule * scale;
          report(close, "float16 storage result within the float16 rule (c=" + std::to_string(c) + ")");
        }
      }
    }

    // ---- forward_inplace_cpu(Mat&) through shallow copies, where it converts the blob (pack4, float16)
    for (bool fp16 : {false, true}) {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 16);
      vknorm::Mat a = vknorm::convert_packing(ramp(8, 3, 16), 4);
      if (fp16) a = vknorm::cast_fp16(a);
      vknorm::Mat b = a;
      l.forward_inplace_cpu(b);
      const vknorm::Mat unpacked = vknorm::convert_packing(vknorm::cast_fp32(a), 1);
      report(a.data() == b.data() && (fp16 || normalized(unpacked, 16)) &&
                 std::fabs(reinterpret_cast<const float*>(unpacked.data())[0] - reinterpret_cast<const float*>(ramp(8, 3, 16).data())[0]) > 0.1f,
             std::string("forward_inplace_cpu writes through a shallow copy (pack4") + (fp16 ? ", float16)" : ")"));
    }

    // ---- forward_inplace_cpu on a Mat::external with dense channels where it converts the blob (float16 planes
    // of 15: ncnn's cstep pads them to 16, so the converted copy's layout is not the Mat's)
    for (int pack : {1, 4}) {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 5);
      const vknorm::Mat src = vknorm::cast_fp16(vknorm::convert_packing(ramp(8, 3, 5), pack));
      vknorm::Mat want = src.clone();
      l.forward_inplace_cpu(want);
      std::vector<uint16_t> dense(8 * 15);
      vknorm::Mat shape = vknorm::Mat::layout(3, 5, 3, 1, 8 / pack, 2, pack);
      shape.cstep = 15;
      vknorm::Mat m = vknorm::Mat::external(shape, dense.data());
      vknorm::convert_into(src, m, m.data());
      std::string err;
      try {
        l.forward_inplace_cpu(m);
      } catch (const std::exception& e) {
        err = std::string(": ") + e.what();
      }
      bool same = err.empty() && m.data() == reinterpret_cast<unsigned char*>(dense.data());
      for (int q = 0; q < m.c; ++q)
        same = same && std::memcmp(m.channel(q), want.channel(q), size_t(15) * m.elemsize) == 0;
      report(same, "forward_inplace_cpu on a float16 Mat::external with dense channels (pack" + std::to_string(pack) +
                       ")" + err);
    }

    // ---- a dims 1-2 Mat::external over a dense array (ncnn's Mat(w, h, data)) is written no further than its last
    // element: Mat::layout pads the end of a 3x5 float Mat to 16, which such an array does not have
    for (int dims : {1, 2}) {
      std::vector<float> memory(15 + 4, 99.f);  // 15 elements, then 4 guards
      for (int i = 0; i < 15; ++i) memory[i] = std::sin(float(i));
      const vknorm::Mat shape = dims == 1 ? vknorm::Mat::layout(1, 15, 1, 1, 1) : vknorm::Mat::layout(2, 5, 3, 1, 1);
      vknorm::Mat m = vknorm::Mat::external(shape, memory.data());
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, dims == 1 ? 15 : 5);
      std::string err;
      try {
        l.forward_inplace(m);
        vknorm::Mat top = vknorm::Mat::external(shape, memory.data());
        l.forward(m.clone(), top);
        vknorm::VkMat::upload(m, ctx).download(top);
      } catch (const std::exception& e) {
        err = std::string(": ") + e.what();
      }
      const bool guards = std::all_of(memory.begin() + 15, memory.end(), [](float v) { return v == 99.f; });
      report(err.empty() && guards && m.cstep == 15,
             "forward_inplace, forward and download keep to a dense dims-" + std::to_string(dims) + " Mat::external" + err);
    }

    // ---- forward(bottom, top): bottom only read; top allocated, or written where it lies
    for (int c : {6, 8}) {
      for (bool fp16 : {false, true}) {
        vknorm::Norm l(vknorm::NormOp::LayerNorm);
        load_layernorm(l, 5);
        vknorm::Option opt;
        opt.use_fp16_storage = fp16;
        const vknorm::Mat bottom = ramp(c, 3, 5);  // planes of 15 floats: ncnn's cstep pads them to 16
        const vknorm::Mat before = bottom.clone();
        vknorm::Mat want = ramp(c, 3, 5);
        l.forward_inplace(want, opt);
        vknorm::Mat top;
        l.forward(bottom, top, opt);
        const std::string what = " (c=" + std::to_string(c) + (fp16 ? ", float16 storage)" : ")");
        report(std::memcmp(bottom.data(), before.data(), bottom.bytes()) == 0, "forward leaves bottom as it was" + what);
        report(top.data() != bottom.data() && top.cstep == want.cstep &&
                   std::memcmp(top.data(), want.data(), want.bytes()) == 0,
               "forward allocates top and gives forward_inplace's result" + what);
        std::vector<float> dense(size_t(c) * 15, -7.f);
        vknorm::Mat shape = vknorm::Mat::layout(3, 5, 3, 1, c);
        shape.cstep = 15;
        vknorm::Mat into = vknorm::Mat::external(shape, dense.data());
        l.forward(bottom, into, opt);
        bool same = into.data() == reinterpret_cast<unsigned char*>(dense.data());
        for (int q = 0; q < c; ++q)
          same = same && std::memcmp(&dense[size_t(q) * 15], want.channel(q), 15 * sizeof(float)) == 0;
        report(same, "forward writes a fitting top where it lies (dense channels)" + what);
      }
    }

    // ---- forward(bottom, top) that throws leaves a top it would have replaced as it was
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      vknorm::ParamDict affine;
      affine.set(0, 5);
      affine.set(2, 1);
      l.load_param(affine);
      vknorm::Mat top = ramp(2, 3, 16);  // not bottom's shape: forward would allocate a new one
      const vknorm::Mat before = top;
      bool threw = false;
      try {
        l.forward(ramp(2, 3, 7), top);  // weights of 5 for rows of 7
      } catch (const std::invalid_argument&) {
        threw = true;
      }
      report(threw && top.data() == before.data() && top.w == 16,
             "forward that throws leaves top as it was (not a Mat of unwritten memory)");
    }

    // ---- download(Mat&): converted into the caller's format
    {
      vknorm::Option half;
      half.use_fp16_storage = true;
      const vknorm::Mat src = ramp(8, 3, 5);
      vknorm::VkMat v = vknorm::VkMat::upload(src, ctx, half);  // float16, pack4
      vknorm::Mat out = vknorm::Mat::create(3, 5, 3, 1, 8);    // float32, pack1
      const unsigned char* where = out.data();
      v.download(out);
      const vknorm::Mat want = vknorm::convert_packing(vknorm::cast_fp32(v.download()), 1);
      report(v.elempack == 4 && out.data() == where && out.elempack == 1 && !out.is_fp16() &&
                 std::memcmp(out.data(), want.data(), want.bytes()) == 0,
             "download(Mat&) converts a float16 pack4 VkMat into a float32 pack1 Mat where it lies");
    }

    // ---- host Mats that describe memory they do not have
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 5);
      int refused = 0;
      for (int edit = 0; edit < 5; ++edit) {
        vknorm::Mat m = ramp(8, 3, 5);
        if (edit == 0) m = vknorm::Mat::layout(3, 5, 3, 1, 8);  // no memory
        if (edit == 1) m.cstep = 4096;                          // past its memory
        if (edit == 2) m.cstep = 5;  // within its memory, but channels of 15 elements would overlap
        if (edit == 3) m.elempack = 2, m.elemsize = 8, m.c = 4;  // within its memory: pack2, which vknorm has not
        if (edit == 4) m.elemsize = 8, m.c = 4;                  // within its memory: 8-byte scalars (float64)
        for (int call = 0; call < 5; ++call) {
          try {
            vknorm::Mat top;
            if (call == 0) l.forward(m, top);
            if (call == 1) l.forward(m, m);  // top names bottom: allocating top must not replace bottom
            if (call == 2) l.forward_inplace(m);
            if (call == 3) (void)vknorm::VkMat::upload(m, ctx);
            if (call == 4) l.forward_inplace_cpu(m);
          } catch (const std::invalid_argument&) {
            ++refused;
          }
        }
      }
      report(refused == 25, "a Mat without memory, with fields past it, with a cstep below a channel's w*h*d, or "
                            "with an elempack or scalar size vknorm has not, is refused by forward, forward_inplace, "
                            "forward_inplace_cpu and upload (" + std::to_string(refused) + " of 25)");
    }

    // ---- the conversions refuse what the layers refuse
    {
      int refused = 0;
      for (int edit = 0; edit < 3; ++edit) {
        vknorm::Mat m = ramp(8, 4, 8);  // cstep 32: 1024 bytes
        if (edit == 0) m = vknorm::Mat::layout(3, 8, 4, 1, 8);  // no memory
        if (edit == 1) m.cstep = 40;                            // 1280 bytes described
        if (edit == 2) m.c = 9;                                 // one channel past the memory
        std::vector<unsigned char> into(4096);
        for (int call = 0; call < 5; ++call) {
          try {
            if (call == 0) (void)vknorm::cast_fp16(m);
            if (call == 1) (void)vknorm::cast_fp32(m);
            if (call == 2) (void)vknorm::convert_packing(m, 4);
            if (call == 3) (void)vknorm::converted(m, 2, 1);
            if (call == 4) vknorm::convert_into(m, vknorm::Mat::layout(3, 8, 4, 1, m.c), into.data());
          } catch (const std::invalid_argument&) {
            ++refused;
          }
        }
      }
      report(refused == 15, "cast_fp16, cast_fp32, convert_packing, converted and convert_into refuse a Mat without "
                            "memory or with fields past it (" + std::to_string(refused) + " of 15)");
    }
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 4);
      vknorm::Mat m = ramp(2, 4, 8);
      m.w = -2, m.h = -2;  // size_t(-2) * -2 wraps to 4 elements a channel
      int refused = 0;
      for (int call = 0; call < 4; ++call) {
        try {
          if (call == 0) vknorm::check_host_mat(m, "check_host_mat");
          if (call == 1) l.forward_inplace_cpu(m);
          if (call == 2) l.forward_inplace(m);
          if (call == 3) (void)vknorm::cast_fp16(m);
        } catch (const std::invalid_argument&) {
          ++refused;
        }
      }
      report(refused == 4, "a Mat whose extents were edited negative is refused by check_host_mat, forward_inplace_cpu, "
                           "forward_inplace and cast_fp16 (" + std::to_string(refused) + " of 4)");
    }
    {
      int refused = 0;
      try {
        (void)vknorm::Mat::create(1, 8, 1, 1, 1, 4, 4);
      } catch (const std::invalid_argument&) {
        ++refused;
      }
      vknorm::Mat m = vknorm::Mat::create(1, 8, 1, 1, 1);  // 32 bytes
      m.elempack = 4, m.elemsize = 16, m.w = 2, m.cstep = 2;  // the same 32 bytes, packed
      try {
        vknorm::check_host_mat(m, "check_host_mat");
      } catch (const std::invalid_argument&) {
        ++refused;
      }
      try {
        (void)vknorm::convert_packing(m, 1);
      } catch (const std::invalid_argument&) {
        ++refused;
      }
      report(refused == 3, "elempack 4 on a dims-1 Mat (pack4 packs channels or rows) is refused by Mat::create, "
                           "check_host_mat and convert_packing (" + std::to_string(refused) + " of 3)");
    }

    // ---- forward(bottom, top), top over bottom's memory with another cstep (dense channels in, ncnn's out)
    for (bool pieces : {false, true}) {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 5);
      vknorm::Option pack1;  // the device format is bottom's own but for the cstep
      pack1.use_packing_layout = false;
      vknorm::Mat want = ramp(8, 3, 5);
      l.forward_inplace(want, pack1);
      std::vector<float> memory(8 * 16, 0.f);
      vknorm::Mat dense = vknorm::Mat::layout(3, 5, 3, 1, 8);
      dense.cstep = 15;
      const vknorm::Mat bottom = vknorm::Mat::external(dense, memory.data());
      const vknorm::Mat src = ramp(8, 3, 5);
      for (int q = 0; q < 8; ++q) std::memcpy(&memory[size_t(q) * 15], src.channel(q), 15 * sizeof(float));
      vknorm::Mat top = vknorm::Mat::external(vknorm::Mat::layout(3, 5, 3, 1, 8), memory.data());  // cstep 16
      if (pieces) setenv("VKNORM_MAX_BUFFER_BYTES", "200", 1);  // 512 bytes: in pieces
      l.forward(bottom, top, pack1);
      unsetenv("VKNORM_MAX_BUFFER_BYTES");
      bool same = top.data() == reinterpret_cast<unsigned char*>(memory.data());
      for (int q = 0; q < 8; ++q) same = same && std::memcmp(top.channel(q), want.channel(q), 15 * sizeof(float)) == 0;
      report(same && (l.last_dispatch().pieces > 1) == pieces,
             std::string("forward with top over bottom's memory at another cstep (") +
                 (pieces ? std::to_string(l.last_dispatch().pieces) + " pieces)" : "one piece)"));
    }

    // ---- forward_add with the sum written over one of its inputs
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 16);
      const vknorm::Mat xs = ramp(2, 3, 16), rs = ramp(2, 3, 16);
      vknorm::VkMat x = vknorm::VkMat::upload(xs, ctx), r = vknorm::VkMat::upload(rs, ctx), sum;
      const vknorm::Mat want_y = l.forward_add(x, r, &sum).download(), want_sum = sum.download();
      for (int aliased : {0, 1}) {
        vknorm::VkMat x2 = vknorm::VkMat::upload(xs, ctx), r2 = vknorm::VkMat::upload(rs, ctx);
        vknorm::VkMat& into = aliased ? r2 : x2;
        const vknorm::Mat y = l.forward_add(x2, r2, &into).download(), got_sum = into.download();
        report(std::memcmp(y.data(), want_y.data(), y.bytes()) == 0 &&
                   std::memcmp(got_sum.data(), want_sum.data(), got_sum.bytes()) == 0,
               std::string("forward_add writes its sum over ") + (aliased ? "the residual" : "x") + " (x = x + r)");
      }
    }

    // ---- forward_add on host Mats: the device path's result, outputs over the inputs, shared outputs refused
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 16);
      l.set_activation(vknorm::Activation::Swish);
      l.create_pipeline(ctx);
      const vknorm::Mat xs = ramp(2, 3, 16), rs = ramp(2, 3, 16);
      vknorm::Option fp16;
      fp16.use_fp16_storage = true;
      for (const vknorm::Option& o : {vknorm::Option(), fp16}) {
        const char* storage = o.use_fp16_storage ? "float16 storage" : "float32 storage";
        vknorm::VkMat vsum;
        vknorm::Mat want_y = vknorm::Mat::create(3, 16, 3, 1, 2), want_sum = vknorm::Mat::create(3, 16, 3, 1, 2);
        l.forward_add(vknorm::VkMat::upload(xs, ctx, o), vknorm::VkMat::upload(rs, ctx, o), &vsum, o).download(want_y);
        vsum.download(want_sum);  // as float32, as the host forward_add gives them for float32 input
        vknorm::Mat y, sum;
        l.forward_add(xs, rs, y, &sum, o);
        bool same = true;
        for (int q = 0; q < 2; ++q)
          same = same && std::memcmp(y.channel(q), want_y.channel(q), 48 * sizeof(float)) == 0 &&
                 std::memcmp(sum.channel(q), want_sum.channel(q), 48 * sizeof(float)) == 0;
        report(same, std::string("forward_add on host Mats gives the VkMat forward_add's result and sum, ") + storage);
        for (int aliased : {0, 1}) {  // y over x and the sum over the residual, or the other way round
          vknorm::Mat x2 = xs.clone(), r2 = rs.clone();
          vknorm::Mat& y_into = aliased ? r2 : x2;
          vknorm::Mat& sum_into = aliased ? x2 : r2;
          const unsigned char *y_mem = y_into.data(), *sum_mem = sum_into.data();
          l.forward_add(x2, r2, y_into, &sum_into, o);
          bool ok = y_into.data() == y_mem && sum_into.data() == sum_mem;  // written where they lie
          for (int q = 0; q < 2; ++q)
            ok = ok && std::memcmp(y_into.channel(q), want_y.channel(q), 48 * sizeof(float)) == 0 &&
                 std::memcmp(sum_into.channel(q), want_sum.channel(q), 48 * sizeof(float)) == 0;
          report(ok, std::string("host forward_add writes its outputs over its inputs (") +
                         (aliased ? "y over the residual, sum over x, " : "y over x, sum over the residual, ") +
                         storage + ")");
        }
      }
      vknorm::Mat shared = xs.clone(), alias = shared;  // two Mats, one memory (a shallow copy)
      const vknorm::Mat before = shared.clone();
      try {
        l.forward_add(xs, rs, shared, &alias);
        report(false, "host forward_add refuses a top and sum that share memory");
      } catch (const std::invalid_argument&) {
        report(std::memcmp(shared.data(), before.data(), shared.bytes()) == 0,
               "host forward_add refuses a top and sum that share memory, writing nothing");
      }
      // One Mat named as both outputs, empty (each output would get memory of its own and the sum, assigned
      // last, would silently take the result's place): refused as well, the Mat left empty.
      vknorm::Mat both;
      try {
        l.forward_add(xs, rs, both, &both);
        report(false, "host forward_add refuses one empty Mat as both top and sum (it held the sum, not the result)");
      } catch (const std::invalid_argument&) {
        report(both.empty(), "host forward_add refuses one empty Mat as both top and sum, leaving it empty");
      }
    }

    // ---- public fields written after a forward
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      vknorm::ParamDict affine;
      affine.set(0, 16);
      affine.set(1, 1e-5f);
      affine.set(2, 1);
      l.load_param(affine);
      l.load_model(std::vector<float>(16, 1.f), std::vector<float>(16, 0.f));
      vknorm::Mat first = ramp(2, 3, 16);
      l.forward_inplace(first);
      l.gamma_data.assign(16, 3.f);
      l.beta_data.assign(16, -0.5f);
      l.activation = vknorm::Activation::ReLU;
      l.eps = 0.25f;
      vknorm::Mat gpu = ramp(2, 3, 16), cpu = ramp(2, 3, 16);
      l.forward_inplace(gpu);
      l.forward_inplace_cpu(cpu);
      float worst = 0, scale = 1;
      for (size_t i = 0; i < gpu.bytes() / 4; ++i) {
        const float want = reinterpret_cast<const float*>(cpu.data())[i];
        worst = std::max(worst, std::fabs(reinterpret_cast<const float*>(gpu.data())[i] - want));
        scale = std::max(scale, std::fabs(want));
      }
      // both within the float32 rule of float64, so within twice it of each other
      report(worst <= 2 * kFloat32Rule * scale,
             "fields written after a forward take effect on the device (max |GPU - CPU| " + std::to_string(worst) + ")");
      l.eps = -1.f;
      try {
        vknorm::Mat m = ramp(2, 3, 16);
        l.forward_inplace(m);
        report(false, "a negative eps written directly is refused at the forward");
      } catch (const std::invalid_argument&) {
        report(true, "a negative eps written directly is refused at the forward");
      }
      l.eps = 1e-5f;
      // Weights loaded, but not as many as the params now want: the message names the counts.
      l.gamma_data.assign(4, 1.f);
      for (bool on_cpu : {false, true}) {
        std::string what;
        try {
          vknorm::Mat m = ramp(2, 3, 16);
          on_cpu ? l.forward_inplace_cpu(m) : l.forward_inplace(m);
        } catch (const std::invalid_argument& e) {
          what = e.what();
        }
        report(what.find("gamma has 4 values, expected 16") != std::string::npos,
               std::string("gamma written with the wrong count is named at the ") + (on_cpu ? "CPU" : "Vulkan") +
                   " forward: " + what);
      }
      l.gamma_data.assign(16, 1.f);
      // An int cast to Activation that is none of its values: refused where load_param would refuse it.
      l.activation = vknorm::Activation(3);
      int refused = 0;
      for (bool on_cpu : {false, true}) {
        try {
          vknorm::Mat m = ramp(2, 3, 16);
          on_cpu ? l.forward_inplace_cpu(m) : l.forward_inplace(m);
        } catch (const std::invalid_argument&) {
          ++refused;
        }
      }
      try {
        l.set_activation(vknorm::Activation(100));
      } catch (const std::invalid_argument&) {
        ++refused;
      }
      report(refused == 3, "an Activation value that is none of the enum's is refused (both forwards, set_activation)");
      l.activation = vknorm::Activation::None;
    }

    // ---- a VkMat whose public fields were edited past its buffer
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 16);
      vknorm::VkMat v = vknorm::VkMat::upload(ramp(2, 3, 16), ctx);
      int refused = 0;
      for (int edit = 0; edit < 3; ++edit) {
        vknorm::VkMat e = v;  // shares the buffer
        if (edit == 0) e.c = 4096;
        if (edit == 1) e.cstep = 1;
        if (edit == 2) e.elemsize = 3;
        for (int call = 0; call < 2; ++call) {
          try {
            if (call == 0) l.forward_inplace(e);
            else (void)e.download();
          } catch (const std::invalid_argument&) {
            ++refused;
          }
        }
      }
      // Within the buffer by its own cstep, but not by the host Mat's (ncnn's 16-byte-aligned) one: download
      // would copy that many bytes.
      vknorm::Option pack1;
      pack1.use_packing_layout = false;
      vknorm::VkMat small = vknorm::VkMat::upload(ramp(8, 1, 4), ctx, pack1);  // 8 channels of 4: 128 bytes
      small.w = 3, small.cstep = 3, small.c = 10;                               // 120 bytes by its cstep
      try {
        (void)small.download();
      } catch (const std::invalid_argument&) {
        ++refused;
      }
      report(refused == 7, "a VkMat whose fields no longer fit its buffer is refused by forward_inplace and download (" +
                               std::to_string(refused) + " of 7)");
    }

    // ---- a VkMat whose buffer is not its context's
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 16);
      const vknorm::VkMat v = vknorm::VkMat::upload(ramp(2, 3, 16), ctx);
      vknorm::VkMat assembled;  // fields copied one by one, the buffer shared: no context of its own
      assembled.dims = v.dims, assembled.w = v.w, assembled.h = v.h, assembled.d = v.d, assembled.c = v.c;
      assembled.elemsize = v.elemsize, assembled.elempack = v.elempack, assembled.cstep = v.cstep;
      assembled.buffer = v.buffer;
      vknorm::VkMat swapped = vknorm::VkMat::upload(ramp(2, 3, 16), nullptr);  // on the default context
      swapped.buffer = v.buffer;                                                // ctx's buffer
      int refused = 0;
      for (vknorm::VkMat* m : {&assembled, &swapped}) {
        for (int call = 0; call < 4; ++call) {
          try {
            vknorm::VkMat top;
            if (call == 0) l.forward_inplace(*m);
            if (call == 1) (void)m->download();
            if (call == 2) (void)l.forward_add(*m, *m);
            if (call == 3) l.forward(*m, top);
          } catch (const std::invalid_argument&) {
            ++refused;
          }
        }
      }
      report(refused == 8, "a VkMat whose buffer is not its context's is refused by forward_inplace, download, "
                           "forward_add and forward (" + std::to_string(refused) + " of 8)");
    }

    // ---- forward(VkMat bottom, VkMat& top): bottom only read, forward_inplace's result in top
    for (bool fp16 : {false, true}) {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 16);
      vknorm::Option o;
      o.use_fp16_storage = fp16;
      const vknorm::VkMat bottom = vknorm::VkMat::upload(ramp(8, 3, 16), ctx, o);  // pack4
      const vknorm::Mat before = bottom.download();
      vknorm::VkMat want = vknorm::VkMat::upload(ramp(8, 3, 16), ctx, o);
      l.forward_inplace(want, o);
      const vknorm::Mat expected = want.download();
      auto same = [](const vknorm::Mat& a, const vknorm::Mat& b) {
        return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
      };
      const std::string storage = fp16 ? " (float16 storage)" : " (float32 storage)";
      vknorm::VkMat fresh;  // empty: allocated
      l.forward(bottom, fresh, o);
      report(fresh.buffer && fresh.buffer != bottom.buffer && same(fresh.download(), expected) &&
                 same(bottom.download(), before),
             "forward(VkMat) into an empty top: forward_inplace's result, bottom as it was" + storage);
      vknorm::VkMat fitting = vknorm::VkMat::create_like(bottom);
      const auto fitting_buffer = fitting.buffer;
      l.forward(bottom, fitting, o);
      report(fitting.buffer == fitting_buffer && same(fitting.download(), expected),
             "forward(VkMat) writes a top of bottom's layout where it lies" + storage);
      vknorm::VkMat alias = bottom;  // shares bottom's buffer: a new one, bottom left as it was
      l.forward(bottom, alias, o);
      report(alias.buffer != bottom.buffer && same(alias.download(), expected) && same(bottom.download(), before),
             "forward(VkMat) with top sharing bottom's buffer gives top a buffer of its own" + storage);
    }

    // ---- refused sizes
    try {
      vknorm::Mat::create(3, -4, -4, 1, 1);
      report(false, "Mat::create refuses negative extents");
    } catch (const std::invalid_argument&) {
      report(true, "Mat::create refuses negative extents");
    }
    try {
      vknorm::Mat::create(4, 65536, 65536, 65536, 65536);
      report(false, "Mat::create refuses a size past 64 bits");
    } catch (const std::invalid_argument&) {
      report(true, "Mat::create refuses a size past 64 bits");
    }
    try {
      vknorm::blob_span_bytes(3, 1, 1, 1, (1 << 30) + 1, size_t(1) << 60, 4, false);
      report(false, "blob_span_bytes refuses a size past 64 bits");
    } catch (const std::invalid_argument&) {
      report(true, "blob_span_bytes refuses a size past 64 bits");
    }

    // ---- bad packing and element sizes are refused, not divided by
    for (int pack : {0, 3}) {
      try {
        vknorm::layout_as(ramp(8, 2, 4), 4, pack);
        report(false, "layout_as refuses elempack " + std::to_string(pack));
      } catch (const std::invalid_argument&) {
        report(true, "layout_as refuses elempack " + std::to_string(pack));
      }
    }
    try {
      vknorm::converted(ramp(6, 2, 4), 4, 4);
      report(false, "converted refuses packing 6 channels by 4");
    } catch (const std::invalid_argument&) {
      report(true, "converted refuses packing 6 channels by 4");
    }
    try {
      vknorm::ncnn_cstep(3, 4, 4, 1, 0);
      report(false, "ncnn_cstep refuses elemsize 0");
    } catch (const std::invalid_argument&) {
      report(true, "ncnn_cstep refuses elemsize 0");
    }

    // ---- a moved-from Mat or VkMat is empty, not a shape without memory
    {
      vknorm::Mat a = ramp(2, 3, 16);
      vknorm::Mat b = std::move(a);
      vknorm::Mat c;
      c = std::move(b);
      report(a.empty() && a.dims == 0 && a.data() == nullptr && a.bytes() == 0 && b.empty() && b.bytes() == 0 &&
                 !c.empty() && c.data() != nullptr && c.c == 2,
             "a moved-from Mat is empty (construction and assignment)");
      vknorm::VkMat d = vknorm::VkMat::upload(c, ctx);
      vknorm::VkMat e = std::move(d);
      vknorm::VkMat f;
      f = std::move(e);
      report(d.dims == 0 && !d.buffer && !d.context() && e.dims == 0 && !e.buffer && f.dims == 3 && f.buffer &&
                 f.context() == ctx,
             "a moved-from VkMat is empty (construction and assignment)");
    }

    // ---- create_pipeline uploads the weights (ncnn's order: load_param, load_model, create_pipeline)
    {
      auto own = vknorm::Context::create();
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      vknorm::ParamDict p;
      p.set(0, 16);
      p.set(2, 1);
      l.load_param(p);
      const uint64_t before = own->live_buffers();
      l.create_pipeline(own);
      const uint64_t without_weights = own->live_buffers();
      l.load_model(std::vector<float>(16, 2.f), std::vector<float>(16, 1.f));
      l.create_pipeline(own);
      const uint64_t with_weights = own->live_buffers();
      vknorm::Mat m = ramp(1, 2, 16), want = ramp(1, 2, 16);
      l.forward_inplace(m);
      l.forward_inplace_cpu(want);
      bool same = true;  // the uploaded weights are the ones used (gamma 2, beta 1: far from the unweighted output)
      for (int i = 0; i < 32; ++i)
        same = same && std::fabs(reinterpret_cast<const float*>(m.data())[i] - reinterpret_cast<const float*>(want.data())[i]) < 1e-4f;
      report(without_weights == before && with_weights > before && own->live_buffers() >= with_weights && same,
             "create_pipeline uploads complete weights, and leaves missing ones to the first forward (buffers " +
                 std::to_string(before) + " -> " + std::to_string(without_weights) + " -> " + std::to_string(with_weights) + ")");
    }

    // ---- a refused input leaves the layer on no device
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      vknorm::ParamDict p;
      p.set(0, 16);
      p.set(2, 0);  // no weights
      l.load_param(p);
      bool refused = false;
      try {
        l.forward_add(vknorm::VkMat(), vknorm::VkMat());
      } catch (const std::invalid_argument&) {
        refused = true;
      }
      auto own = vknorm::Context::create();
      const vknorm::Mat m = ramp(1, 2, 16);
      std::string error;
      try {
        const vknorm::VkMat v = vknorm::VkMat::upload(m, own);
        l.forward_add(v, v).download();
      } catch (const std::exception& e) {
        error = e.what();
      }
      report(refused && error.empty(), "forward_add refuses an empty VkMat without binding the layer to a device" +
                                           (error.empty() ? std::string() : " (then: " + error + ")"));
    }

    // ---- fields that name no value (an op or path cast from an int, a negative workgroup cap) are refused on the
    // device and the CPU alike, not run as another op or as the defaults
    {
      auto refused = [](auto&& run, const char* what) {
        try {
          run();
        } catch (const std::invalid_argument& e) {
          return std::string(e.what()).find(what) != std::string::npos;
        }
        return false;
      };
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 16);
      l.op = vknorm::NormOp(7);
      vknorm::Mat m = ramp(1, 2, 16);
      const bool op = refused([&] { l.forward_inplace(m); }, "op 7 is not one of NormOp's values") &&
                      refused([&] { l.forward_inplace_cpu(m); }, "op 7 is not one of NormOp's values");
      l.op = vknorm::NormOp::LayerNorm;
      vknorm::Option bad_path, bad_cap;
      bad_path.path = vknorm::Path(17);
      bad_cap.max_workgroup_size = -5;
      const bool options = refused([&] { l.forward_inplace(m, bad_path); }, "Option.path 17") &&
                           refused([&] { l.forward_inplace(m, bad_cap); }, "Option.max_workgroup_size must be >= 0");
      report(op && options, "an op, a path or a workgroup cap that names no value is refused, on the device and CPU");
    }

    // ---- a type's check reads its own fields: an InstanceNorm's group, a LayerNorm's group and channels, are not
    // its, whatever they hold
    {
      vknorm::NormParams in;
      in.op = vknorm::NormOp::InstanceNorm, in.channels = 8, in.affine = 0, in.group = 0;
      vknorm::NormParams ln;
      ln.op = vknorm::NormOp::LayerNorm, ln.affine_size = 16, ln.affine = 0, ln.group = 3, ln.channels = -1;
      vknorm::NormParams gn;
      gn.op = vknorm::NormOp::GroupNorm, gn.group = 2, gn.channels = 8, gn.affine = 0, gn.affine_size = -1;
      bool ok = true;
      for (const vknorm::NormParams* p : {&in, &ln, &gn}) {
        try {
          p->check();
        } catch (const std::exception& e) {
          ok = false;
          std::printf("  %s\n", e.what());
        }
      }
      vknorm::NormParams bad = gn;
      bad.group = 0;
      bool refused = false;
      try {
        bad.check();
      } catch (const std::invalid_argument&) {
        refused = true;
      }
      report(ok && refused, "NormParams::check reads each type's own fields (a GroupNorm's group 0 refused)");
    }

    // ---- a forward refused for missing weights leaves the layer on no device: the next error is that one again
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      vknorm::ParamDict p;
      p.set(0, 16);
      p.set(2, 1);  // weights expected, none loaded
      l.load_param(p);
      std::string first, second;
      vknorm::Mat m = ramp(1, 2, 16);
      try {
        l.forward_inplace(m);
      } catch (const std::exception& e) {
        first = e.what();
      }
      auto own = vknorm::Context::create();
      try {
        vknorm::VkMat v = vknorm::VkMat::upload(m, own);
        l.forward_inplace(v);
      } catch (const std::exception& e) {
        second = e.what();
      }
      report(first.find("no weights loaded") != std::string::npos && second == first && !l.context(),
             "a forward without its weights binds no device: a VkMat of another context is told the same (" + second +
                 ")");
    }

    // ---- a Mat whose extents were edited past its cstep is told so
    {
      vknorm::Norm l(vknorm::NormOp::LayerNorm);
      load_layernorm(l, 4);
      vknorm::Mat m = vknorm::Mat::create(2, 4, 3, 1, 1);  // dims 2: 3 rows of 4, cstep 12
      m.h = 100;
      std::string error;
      try {
        l.forward_inplace(m);
      } catch (const std::invalid_argument& e) {
        error = e.what();
      }
      report(error.find("cstep 12 is less than a plane of its shape (400 elements)") != std::string::npos,
             "a Mat's extents edited past its cstep are named as such (" + error + ")");
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
