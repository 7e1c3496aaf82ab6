#include "vknorm/mat.h"

#include "reuse_cache.h"
#include "dispatch.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace vknorm {

namespace {
constexpr size_t kPooledMin = size_t(1) << 20, kPoolBytes = size_t(128) << 20, kPoolBlocks = 4;

using HostPool = ReuseCache<size_t, unsigned char*>;  // blocks by size
HostPool* g_pool = nullptr;
HostPool& host_pool() {
  // Never destroyed: Mats may be freed during static destruction. A fork()ed child starts a pool of its own
  // (another thread may have held the parent's lock at the fork).
  static const bool once = [] {
    g_pool = new HostPool;
    pthread_atfork(nullptr, nullptr, [] { g_pool = new HostPool; });
    return true;
  }();
  (void)once;
  return *g_pool;
}
}  // namespace

HostMemory::HostMemory(size_t n, bool zeroed) : size(n) {
  if (n >= kPooledMin) data = host_pool().take(n).value_or(nullptr);
  if (!data) data = new unsigned char[std::max<size_t>(n, 1)];
  if (zeroed) std::memset(data, 0, n);
}

HostMemory::~HostMemory() {
  if (!owned) return;
  if (size < kPooledMin || size > kPoolBytes) {
    delete[] data;
    return;
  }
  for (unsigned char* dropped : host_pool().put(size, size, data, kPoolBytes, kPoolBlocks)) delete[] dropped;
}

size_t ncnn_cstep(int dims, int w, int h, int d, size_t elemsize) {
  if (elemsize == 0) throw std::invalid_argument("ncnn_cstep: elemsize must be > 0");
  const size_t plane = size_t(w) * (dims >= 2 ? h : 1) * (dims == 4 ? d : 1);
  return ((plane * elemsize + 15) / 16 * 16) / elemsize;
}

Mat Mat::layout(int dims, int w, int h, int d, int c, size_t scalar_bytes, int elempack) {
  if (dims < 1 || dims > 4) throw std::invalid_argument("Mat: dims must be 1-4, got " + std::to_string(dims));
  if (scalar_bytes != 2 && scalar_bytes != 4) throw std::invalid_argument("Mat: scalar size must be 2 or 4 bytes");
  if (elempack != 1 && elempack != 4) throw std::invalid_argument("Mat: elempack must be 1 or 4");
  if (dims == 1 && elempack != 1)
    throw std::invalid_argument("Mat: elempack 4 packs channels (dims 3/4) or rows (dims 2); a dims-1 blob is unpacked, "
                                "got elempack " + std::to_string(elempack));
  if (w < 0 || (dims >= 2 && h < 0) || (dims == 4 && d < 0) || (dims >= 3 && c < 0))
    throw std::invalid_argument("Mat: extents must be >= 0");
  // The allocation, cstep padding included, must not wrap size_t (its bytes would read as a small Mat).
  const size_t elemsize = scalar_bytes * size_t(elempack);
  size_t bytes = 1;
  for (size_t f : {size_t(w), size_t(dims >= 2 ? h : 1), size_t(dims == 4 ? d : 1), elemsize, size_t(dims >= 3 ? c : 1)})
    if (__builtin_mul_overflow(bytes, f, &bytes) || bytes > (SIZE_MAX >> 1))
      throw std::invalid_argument("Mat: a " + std::to_string(dims) + "-d blob of w=" + std::to_string(w) + " h=" +
                                  std::to_string(h) + " d=" + std::to_string(d) + " c=" + std::to_string(c) +
                                  " is too large to address");
  Mat m;
  m.dims = dims;
  m.w = w;
  m.h = dims >= 2 ? h : 1;
  m.d = dims == 4 ? d : 1;
  m.c = dims >= 3 ? c : 1;
  m.elempack = elempack;
  m.elemsize = elemsize;
  m.cstep = ncnn_cstep(dims, m.w, m.h, m.d, m.elemsize);
  return m;
}

Mat Mat::create(int dims, int w, int h, int d, int c, size_t scalar_bytes, int elempack) {
  Mat m = layout(dims, w, h, d, c, scalar_bytes, elempack);
  m.storage_ = std::make_shared<HostMemory>(m.bytes());
  return m;
}

Mat Mat::create_for_overwrite(const Mat& layout) {
  Mat m = layout;
  m.storage_ = std::make_shared<HostMemory>(m.bytes(), false);
  check_host_mat(m, "Mat::create_for_overwrite");
  return m;
}

Mat Mat::external(const Mat& layout, void* data) {
  if (!data) throw std::invalid_argument("Mat::external: no memory");
  Mat m = layout;
  // One channel: its cstep only pads the end of the memory, which ncnn's Mat(w, h, data) does not have. Dense, so
  // that nothing (conversions zero that padding) is written or read past the last element.
  if (m.dims <= 2) m.cstep = size_t(m.w) * m.h;
  m.storage_ = std::make_shared<HostMemory>(static_cast<unsigned char*>(data), m.bytes());
  check_host_mat(m, "Mat::external");
  return m;
}

Mat Mat::clone() const {
  Mat m = *this;
  if (storage_) {
    m.storage_ = std::make_shared<HostMemory>(storage_->size, false);
    std::memcpy(m.storage_->data, storage_->data, storage_->size);
  }
  return m;
}

Mat layout_as(const Mat& m, size_t scalar_bytes, int elempack) {
  if (elempack != 1 && elempack != 4)
    throw std::invalid_argument("layout_as: elempack must be 1 or 4, got " + std::to_string(elempack));
  if (m.unpacked_outer() % elempack != 0)
    throw std::invalid_argument("layout_as: cannot pack " + std::to_string(m.unpacked_outer()) + " channels/rows by " +
                                std::to_string(elempack));
  const int outer = m.unpacked_outer() / elempack;
  return Mat::layout(m.dims, m.w, m.dims == 2 ? outer : m.h, m.d, m.dims >= 3 ? outer : 1, scalar_bytes, elempack);
}

Mat converted(const Mat& m, size_t scalar_bytes, int elempack) {
  check_host_mat(m, "converted");
  Mat out = Mat::create_for_overwrite(layout_as(m, scalar_bytes, elempack));
  convert_into(m, out, out.data());
  return out;
}

Mat convert_packing(const Mat& src, int elempack) {
  check_host_mat(src, "convert_packing");
  if (src.elempack == elempack) return src;
  if (elempack != 1 && elempack != 4) throw std::invalid_argument("convert_packing: elempack must be 1 or 4");
  const int outer = src.unpacked_outer();
  if (src.dims == 1) throw std::invalid_argument("convert_packing: vknorm's Mat keeps a dims-1 blob unpacked (one group)");
  if (outer % elempack != 0)
    throw std::invalid_argument("convert_packing: cannot pack " + std::to_string(outer) + " channels/rows by " +
                                std::to_string(elempack));
  return converted(src, src.scalar_bytes(), elempack);
}

uint16_t float_to_half(float f) {
  // Round to nearest even with one branch for the common case (bit-identical to a step-by-step rounding,
  // checked over all 2^32 inputs): the 13 dropped mantissa bits are rounded by an add whose carry may run into
  // the exponent, which is right, up to infinity from 65520 on.
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  uint32_t h;
  if (absx >= 0x47800000u) {  // 65536 and up: infinity; NaN stays a (quiet) NaN
    h = absx > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (absx < 0x38800000u) {  // below half's smallest normal: the float addition rounds to 2^-24 steps
    float a;
    std::memcpy(&a, &absx, 4);
    const float r = a + 0.5f;
    uint32_t rb;
    std::memcpy(&rb, &r, 4);
    h = rb - 0x3f000000u;
  } else {
    h = (absx + 0xfffu + ((absx >> 13) & 1u) - (112u << 23)) >> 13;
  }
  return uint16_t(sign | h);
}

float half_to_float(uint16_t hv) {
  const uint32_t sign = uint32_t(hv & 0x8000u) << 16;
  const uint32_t e = (hv >> 10) & 0x1fu, m = hv & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    float f = float(m) / 16777216.0f;  // m * 2^-24
    std::memcpy(&x, &f, 4);
    x |= sign;
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {
// Contiguous runs of scalars converted: a copy, or float32 <-> float16, 8 at a time with the F16C
// instructions where the CPU has them (the same rounding; only a NaN's payload may differ).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx,f16c"))) void to_half_f16c(const float* s, uint16_t* t, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) t[i] = float_to_half(s[i]);
}
__attribute__((target("avx,f16c"))) void to_float_f16c(const uint16_t* s, float* t, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(t + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) t[i] = half_to_float(s[i]);
}
const bool kF16C = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#else
constexpr bool kF16C = false;
void to_half_f16c(const float*, uint16_t*, size_t) {}
void to_float_f16c(const uint16_t*, float*, size_t) {}
#endif

void convert_run(const float* s, uint16_t* t, size_t n) {
  if (kF16C) return to_half_f16c(s, t, n);
  for (size_t i = 0; i < n; ++i) t[i] = float_to_half(s[i]);
}
void convert_run(const uint16_t* s, float* t, size_t n) {
  if (kF16C) return to_float_f16c(s, t, n);
  for (size_t i = 0; i < n; ++i) t[i] = half_to_float(s[i]);
}
template <typename T>
void convert_run(const T* s, T* t, size_t n) {
  std::memcpy(t, s, n * sizeof(T));
}

// CPUs this thread may run on (its affinity mask, as taskset or a container's cpuset sets it), else all online.
size_t usable_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return size_t(std::max(1, CPU_COUNT(&set)));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// Runs f(p, i0, i1) for every plane p of `planes` over its elements [i0, i1), all of [0, elems) covered, split
// among threads where the work is large: one host thread converts at about 10 GB/s, far below what memory allows
// (a 16 MiB tensor took 1.4 ms each way on the H200's host). By whole planes where there are enough of them,
// else also within planes (a dims-1 blob, an image of three channels).
template <typename F>
void for_parts(int planes, size_t elems, size_t bytes, F&& f) {
  // Measurement knobs, read once: whole numbers, else refused by name (a conversion never divides by 0 bytes).
  static const uint64_t kPerThread = [] {
    const uint64_t n = env_conversion_bytes_per_thread();
    return n ? n : uint64_t(2) << 20;
  }();
  static const uint64_t kMaxThreads = env_conversion_threads().value_or(8);
  const size_t threads = size_t(std::min<uint64_t>({usable_cpus(), kMaxThreads, bytes / kPerThread}));
  // Fewer planes than threads: each plane in `threads` parts, so that every thread gets as many.
  const size_t per_plane = threads <= size_t(planes) ? 1 : std::min(elems, threads);
  const size_t parts = size_t(planes) * per_plane;
  auto run = [&](size_t k0, size_t k1) {
    for (size_t k = k0; k < k1; ++k) {
      const size_t j = k % per_plane;
      f(int(k / per_plane), elems * j / per_plane, elems * (j + 1) / per_plane);
    }
  };
  if (threads < 2 || parts < 2) return run(0, parts);
  const size_t team = std::min(threads, parts);
  auto first = [&](size_t t) { return parts * t / team; };
  std::vector<std::thread> helpers;
  helpers.reserve(team - 1);
  for (size_t t = 1; t < team; ++t) {
    try {
      helpers.emplace_back(run, first(t), first(t + 1));
    } catch (const std::exception&) {  // no thread to be had (or no memory for one): this one does the part
      run(first(t), first(t + 1));
    }
  }
  run(0, first(1));
  for (std::thread& h : helpers) h.join();
}

// One pass over src: each unpacked channel plane (row for dims 2) is read, and written, in order; where one side
// interleaves four of them (pack4), a chunk of each goes through a small buffer between the conversion and the
// (de)interleaving. Large tensors are split among threads (for_parts). Then the destination's cstep padding is zeroed.
template <typename From, typename To>
void transcode(const Mat& src, const Mat& dst, unsigned char* out) {
  constexpr size_t kChunk = 512;
  const size_t plane = src.outer_elems();
  const size_t dst_stride = dst.outer_stride() * dst.elemsize;
  const size_t work = plane * size_t(src.unpacked_outer()) * (sizeof(From) + sizeof(To));
  auto dst_outer = [&](int i) { return reinterpret_cast<To*>(out + i * dst_stride); };
  if (src.elempack == dst.elempack) {
    const size_t pack = size_t(src.elempack);
    for_parts(src.outer(), plane, work, [&](int p, size_t i0, size_t i1) {
      convert_run(reinterpret_cast<const From*>(src.outer_ptr(p)) + i0 * pack, dst_outer(p) + i0 * pack, (i1 - i0) * pack);
    });
  } else if (dst.elempack == 4) {
    for_parts(dst.outer(), plane, work, [&](int p, size_t i0, size_t i1) {
      To lane[4][kChunk];
      To* t = dst_outer(p);
      for (; i0 < i1; i0 += kChunk) {
        const size_t n = std::min(kChunk, i1 - i0);
        for (int k = 0; k < 4; ++k) convert_run(reinterpret_cast<const From*>(src.outer_ptr(4 * p + k)) + i0, lane[k], n);
        for (size_t i = 0; i < n; ++i)
          for (int k = 0; k < 4; ++k) t[4 * (i0 + i) + k] = lane[k][i];
      }
    });
  } else {
    for_parts(src.outer(), plane, work, [&](int p, size_t i0, size_t i1) {
      From lane[4][kChunk];
      const From* s = reinterpret_cast<const From*>(src.outer_ptr(p));
      for (; i0 < i1; i0 += kChunk) {
        const size_t n = std::min(kChunk, i1 - i0);
        for (size_t i = 0; i < n; ++i)
          for (int k = 0; k < 4; ++k) lane[k][i] = s[4 * (i0 + i) + k];
        for (int k = 0; k < 4; ++k) convert_run(lane[k], dst_outer(4 * p + k) + i0, n);
      }
    });
  }
  // Padding: between channels (dims 3-4) and after the last one.
  const size_t used = plane * dst.elempack * sizeof(To);
  const size_t channels = dst.dims >= 3 ? size_t(dst.c) : 1, step = dst.cstep * dst.elemsize;
  if (dst.dims <= 2) {
    const size_t all = size_t(dst.outer()) * plane * dst.elemsize;
    std::memset(out + all, 0, dst.bytes() - all);
  } else if (step > used) {
    for (size_t q = 0; q < channels; ++q) std::memset(out + q * step + used, 0, step - used);
  }
}

}  // namespace

bool same_shape(const Mat& a, const Mat& b) {
  return a.dims == b.dims && a.w == b.w && a.unpacked_outer() == b.unpacked_outer() &&
         (a.dims == 2 || (a.h == b.h && a.d == b.d));
}

bool valid_blob_fields(int dims, int w, int h, int d, int c, size_t elemsize, int elempack) {
  return dims >= 1 && dims <= 4 && w >= 1 && h >= 1 && d >= 1 && c >= 1 && (dims >= 2 || h == 1) &&
         (dims == 4 || d == 1) && (dims >= 3 || c == 1) && (elempack == 1 || (elempack == 4 && dims >= 2)) &&
         (elemsize == 2u * size_t(elempack) || elemsize == 4u * size_t(elempack));
}

namespace {
// Negative extents are refused here, before their product (which can wrap to a small positive size) is compared
// with the memory.
bool valid_fields(const Mat& m) { return valid_blob_fields(m.dims, m.w, m.h, m.d, m.c, m.elemsize, m.elempack); }
}  // namespace

bool holds_shape(const Mat& out, const Mat& a) {
  if (!out.data() || !valid_fields(out) || !same_shape(out, a)) return false;
  // The extents are positive and bounded by int: their products below cannot wrap, the bytes spanned may.
  size_t bytes = 0;
  return out.cstep >= (out.dims >= 3 ? out.outer_elems() : size_t(out.w) * out.h) &&
         !__builtin_mul_overflow(out.cstep, size_t(out.dims >= 3 ? out.c : 1), &bytes) &&
         !__builtin_mul_overflow(bytes, out.elemsize, &bytes) && bytes <= out.capacity();
}

void check_host_mat(const Mat& m, const char* what) {
  if (m.empty()) throw std::invalid_argument(std::string(what) + ": empty input");
  if (!valid_fields(m))
    throw std::invalid_argument(std::string(what) + ": the Mat's fields (dims " + std::to_string(m.dims) + ", w " +
                                std::to_string(m.w) + ", h " + std::to_string(m.h) + ", d " + std::to_string(m.d) +
                                ", c " + std::to_string(m.c) + ", elemsize " + std::to_string(m.elemsize) +
                                ", elempack " + std::to_string(m.elempack) +
                                ") are no blob's: dims 1-4 with extents >= 1 (1 past its dims), elempack 1 or 4 "
                                "(4 only for dims 2-4) of 2- or 4-byte scalars");
  if (!holds_shape(m, m)) {
    const size_t plane = m.dims >= 3 ? m.outer_elems() : size_t(m.w) * m.h;
    if (m.capacity() && m.cstep < plane)  // the fault is the stride, not the memory: say so
      throw std::invalid_argument(std::string(what) + ": the Mat's cstep " + std::to_string(m.cstep) +
                                  " is less than a plane of its shape (" + std::to_string(plane) +
                                  " elements): its fields were changed past its memory");
    throw std::invalid_argument(std::string(what) + ": the Mat has no memory (a Mat::layout), or its fields (elemsize " +
                                std::to_string(m.elemsize) + ", elempack " + std::to_string(m.elempack) + ", cstep " +
                                std::to_string(m.cstep) + ") describe " + std::to_string(m.bytes()) +
                                " bytes where it holds " + std::to_string(m.capacity()));
  }
}

void convert_into(const Mat& src, const Mat& format, unsigned char* out) {
  check_host_mat(src, "convert_into");
  if (!valid_fields(format) || format.cstep < (format.dims >= 3 ? format.outer_elems() : size_t(format.w) * format.h) ||
      !same_shape(src, format) || !out)
    throw std::invalid_argument("convert_into: the destination must describe the source's shape");
  if (src.is_fp16() == format.is_fp16())
    src.is_fp16() ? transcode<uint16_t, uint16_t>(src, format, out) : transcode<uint32_t, uint32_t>(src, format, out);
  else if (format.is_fp16())
    transcode<float, uint16_t>(src, format, out);
  else
    transcode<uint16_t, float>(src, format, out);
}

Mat cast_fp16(const Mat& src) {
  check_host_mat(src, "cast_fp16");
  return src.is_fp16() ? src : converted(src, 2, src.elempack);
}

Mat cast_fp32(const Mat& src) {
  check_host_mat(src, "cast_fp32");
  return src.is_fp16() ? converted(src, 4, src.elempack) : src;
}

}  // namespace vknorm
