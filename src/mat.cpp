#include "vknorm/mat.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace vknorm {

size_t ncnn_cstep(int dims, int w, int h, int d, size_t elemsize) {
  const size_t plane = size_t(w) * (dims >= 2 ? h : 1) * (dims == 4 ? d : 1);
  return ((plane * elemsize + 15) / 16 * 16) / elemsize;
}

Mat Mat::create(int dims, int w, int h, int d, int c, size_t scalar_bytes, int elempack) {
  if (dims < 1 || dims > 4) throw std::invalid_argument("Mat: dims must be 1-4, got " + std::to_string(dims));
  if (scalar_bytes != 2 && scalar_bytes != 4) throw std::invalid_argument("Mat: scalar size must be 2 or 4 bytes");
  if (elempack != 1 && elempack != 4) throw std::invalid_argument("Mat: elempack must be 1 or 4");
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
  m.storage_ = std::make_shared<std::vector<unsigned char>>(m.bytes());
  return m;
}

Mat Mat::clone() const {
  Mat m = *this;
  if (storage_) m.storage_ = std::make_shared<std::vector<unsigned char>>(*storage_);
  return m;
}

namespace {
// Four unpacked channel planes (rows for dims 2) <-> one packed plane, element by element: each plane is read
// or written in order (a per-scalar copy with strided writes was 10x slower on large blobs).
template <typename T>
void repack(const Mat& src, Mat& dst, int packed_planes, size_t plane) {
  const bool packing = dst.elempack == 4;
  for (int p = 0; p < packed_planes; ++p) {
    if (packing) {
      const T* s[4];
      for (int k = 0; k < 4; ++k) s[k] = reinterpret_cast<const T*>(src.outer_ptr(4 * p + k));
      T* t = reinterpret_cast<T*>(dst.outer_ptr(p));
      for (size_t i = 0; i < plane; ++i)
        t[4 * i] = s[0][i], t[4 * i + 1] = s[1][i], t[4 * i + 2] = s[2][i], t[4 * i + 3] = s[3][i];
    } else {
      const T* s = reinterpret_cast<const T*>(src.outer_ptr(p));
      T* t[4];
      for (int k = 0; k < 4; ++k) t[k] = reinterpret_cast<T*>(dst.outer_ptr(4 * p + k));
      for (size_t i = 0; i < plane; ++i)
        t[0][i] = s[4 * i], t[1][i] = s[4 * i + 1], t[2][i] = s[4 * i + 2], t[3][i] = s[4 * i + 3];
    }
  }
}
}  // namespace

Mat convert_packing(const Mat& src, int elempack) {
  if (src.elempack == elempack) return src;
  if (elempack != 1 && elempack != 4) throw std::invalid_argument("convert_packing: elempack must be 1 or 4");
  const int outer = src.unpacked_outer();
  if (src.dims == 1) throw std::invalid_argument("convert_packing: vknorm's Mat keeps a dims-1 blob unpacked (one group)");
  if (outer % elempack != 0)
    throw std::invalid_argument("convert_packing: cannot pack " + std::to_string(outer) + " channels/rows by " +
                                std::to_string(elempack));
  const size_t sb = src.scalar_bytes();
  const int dst_outer = outer / elempack;
  Mat dst = Mat::create(src.dims, src.w, src.dims == 2 ? dst_outer : src.h, src.d,
                        src.dims >= 3 ? dst_outer : 1, sb, elempack);
  const size_t plane = src.outer_elems();
  if (sb == 2)
    repack<uint16_t>(src, dst, outer / 4, plane);
  else
    repack<uint32_t>(src, dst, outer / 4, plane);
  return dst;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));  // inf / nan
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (absx < 0x38800000u) {  // half subnormal or zero: scale by 2^24 and round to nearest even
    float a;
    std::memcpy(&a, &absx, 4);
    const float scaled = a * 16777216.0f;
    uint32_t r = uint32_t(scaled);
    const float frac = scaled - float(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  const uint32_t mant = absx & 0x7fffffu;
  uint32_t h = ((absx >> 23) - 112u) << 10 | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carries into the exponent correctly
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
template <typename From, typename To, typename Conv>
Mat cast(const Mat& src, size_t to_bytes, Conv conv) {
  // Channel by channel: cstep depends on the element size, so the padding differs between storages.
  Mat dst = Mat::create(src.dims, src.w, src.h, src.d, src.c, to_bytes, src.elempack);
  const size_t plane = src.outer_elems() * src.elempack;
  for (int q = 0; q < src.outer(); ++q) {
    const From* s = reinterpret_cast<const From*>(src.outer_ptr(q));
    To* t = reinterpret_cast<To*>(dst.outer_ptr(q));
    for (size_t i = 0; i < plane; ++i) t[i] = conv(s[i]);
  }
  return dst;
}
}  // namespace

Mat cast_fp16(const Mat& src) {
  if (src.is_fp16()) return src;
  return cast<float, uint16_t>(src, 2, float_to_half);
}

Mat cast_fp32(const Mat& src) {
  if (!src.is_fp16()) return src;
  return cast<uint16_t, float>(src, 4, half_to_float);
}

}  // namespace vknorm
