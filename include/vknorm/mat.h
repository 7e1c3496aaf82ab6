// Host tensors in ncnn's layout: dims 1-4 with w, h, d, c; channels cstep elements apart, each channel
// starting on a 16-byte boundary; elempack 4 interleaves 4 consecutive channels (dims 3/4) or rows (dims 2).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace vknorm {

// A Mat's memory. Blocks of 1 MiB and more go back to a small process-wide pool when freed (at most 4 blocks,
// 128 MiB), to be handed out again for the same size: glibc returns a large freed heap top to the system,
// and a host round trip that frees two 16 MiB blocks a call then faults in 8000 fresh pages on every call.
struct HostMemory {
  explicit HostMemory(size_t bytes, bool zeroed = true);
  // Memory someone else owns and frees (Mat::external).
  HostMemory(unsigned char* borrowed, size_t bytes) : data(borrowed), size(bytes), owned(false) {}
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  unsigned char* data = nullptr;
  size_t size = 0;
  bool owned = true;
};

// A blob's shape fields (dims .. cstep, public in Mat and VkMat) moved from `from` to `to`, `from` left with a
// default-made blob's: what the move operations of both share (their memory moves beside, leaving none).
template <class Blob>
void move_blob_fields(Blob& to, Blob& from) noexcept {
  to.dims = std::exchange(from.dims, 0), to.w = std::exchange(from.w, 0), to.h = std::exchange(from.h, 0);
  to.d = std::exchange(from.d, 0), to.c = std::exchange(from.c, 0), to.elemsize = std::exchange(from.elemsize, 0);
  to.elempack = std::exchange(from.elempack, 1), to.cstep = std::exchange(from.cstep, 0);
}

class Mat {
 public:
  int dims = 0;
  int w = 0, h = 0, d = 0, c = 0;  // as ncnn: packed counts (c, or h for dims 2, is divided by elempack)
  size_t elemsize = 0;             // bytes of one packed element (4 or 2, times elempack)
  int elempack = 1;
  size_t cstep = 0;                // packed elements between channels

  Mat() = default;
  Mat(const Mat&) = default;
  Mat& operator=(const Mat&) = default;
  // A moved-from Mat is empty (dims 0, no memory), not a shape whose memory went elsewhere.
  Mat(Mat&& o) noexcept { take(o); }
  Mat& operator=(Mat&& o) noexcept {
    if (this != &o) take(o);
    return *this;
  }
  // Shape in ncnn order; h/d/c default to 1 for lower dims. scalar_bytes is 4 (float32) or 2 (float16); elempack 4
  // only for dims 2-4 (a dims-1 blob is unpacked). Throws std::invalid_argument otherwise, or for negative extents.
  static Mat create(int dims, int w, int h, int d, int c, size_t scalar_bytes = 4, int elempack = 1);
  // Memory for `layout`'s fields (its cstep as given), not zeroed (as make_shared_for_overwrite): for a Mat every
  // byte of which is written next, as convert_into writes its destination, padding included.
  static Mat create_for_overwrite(const Mat& layout);
  // The same fields without storage: how such a Mat lies in memory (convert_into's destination format).
  static Mat layout(int dims, int w, int h, int d, int c, size_t scalar_bytes = 4, int elempack = 1);
  // A Mat over memory it does not own, laid out as `layout`'s fields say (its cstep as that memory has it:
  // a dense array's is w*h*d; a dims 1-2 Mat's is always w*h, nothing past its last element), as ncnn's
  // Mat(w, h, c, data) constructors: the caller keeps the memory alive while this Mat or a copy of it is used.
  // clone() makes an owned copy.
  static Mat external(const Mat& layout, void* data);

  bool empty() const { return dims == 0 || total() == 0; }
  bool is_fp16() const { return elemsize == 2u * elempack; }
  size_t scalar_bytes() const { return elemsize / elempack; }
  size_t total() const { return cstep * (dims >= 3 ? c : 1); }  // packed elements, cstep padding included
  size_t bytes() const { return total() * elemsize; }
  unsigned char* data() { return storage_ ? storage_->data : nullptr; }
  const unsigned char* data() const { return storage_ ? storage_->data : nullptr; }
  size_t capacity() const { return storage_ ? storage_->size : 0; }  // bytes of memory behind data()
  unsigned char* channel(int i) { return data() + i * cstep * elemsize; }
  const unsigned char* channel(int i) const { return data() + i * cstep * elemsize; }
  // The "outer" axis is what pack4 interleaves: channels (dims 3/4) or rows (dims 2).
  int outer() const { return dims == 1 ? 1 : dims == 2 ? h : c; }
  int unpacked_outer() const { return outer() * elempack; }
  size_t outer_stride() const { return dims == 2 ? size_t(w) : cstep; }  // packed elements
  size_t outer_elems() const { return dims == 2 ? size_t(w) : size_t(w) * h * d; }
  unsigned char* outer_ptr(int i) { return data() + i * outer_stride() * elemsize; }
  const unsigned char* outer_ptr(int i) const { return data() + i * outer_stride() * elemsize; }
  Mat clone() const;
  // The owner of the memory, shared (not a pointer to the bytes: data() is): what keeps the memory alive past
  // this Mat (a numpy array viewing it).
  std::shared_ptr<const void> storage() const { return storage_; }

 private:
  void take(Mat& o) noexcept {
    move_blob_fields(*this, o);
    storage_ = std::move(o.storage_);
  }
  std::shared_ptr<HostMemory> storage_;
};

// ncnn's cstep: w*h*d rounded up to 16 bytes (every dims; dims 1/2 have one channel, so only the
// allocation's tail is padded there).
size_t ncnn_cstep(int dims, int w, int h, int d, size_t elemsize);

// The same extents (dims, w, h, d, unpacked channels or rows), whatever the storage, packing and cstep.
bool same_shape(const Mat& a, const Mat& b);
// `out` can take a's shape where it is: it has memory, a's extents, and a cstep that holds its planes.
bool holds_shape(const Mat& out, const Mat& a);
// Whether these are a blob's fields, as Mat::layout makes them: dims 1-4, extents >= 1 (1 past its dims), elempack
// 1 or 4 (4 only for dims 2-4), 2- or 4-byte scalars. The host checks of Mat and VkMat both apply it.
bool valid_blob_fields(int dims, int w, int h, int d, int c, size_t elemsize, int elempack);
// Throws std::invalid_argument, naming `what`, unless m is a Mat with elements that holds them (holds_shape(m, m)):
// a Mat::layout has no memory, and fields edited past the memory would be read beyond it (negative extents, whose
// product may wrap to a small size, and elempack 4 on a dims-1 Mat are refused too).
void check_host_mat(const Mat& m, const char* what);

// m's shape in another storage (2- or 4-byte scalars) and packing (1, or 4 where the outer extent divides by 4):
// its Mat::layout, ncnn's cstep, no memory.
Mat layout_as(const Mat& m, size_t scalar_bytes, int elempack);
// m converted to that layout in one pass, into memory of its own (convert_packing and the casts are this).
Mat converted(const Mat& m, size_t scalar_bytes, int elempack);

// The conversions below throw std::invalid_argument for a source check_host_mat refuses. Each returns src
// itself, sharing its memory (and keeping its cstep), where src already has the packing or storage asked for, as
// ncnn's convert_packing does; converted() always gives memory of its own.
// Repack to elempack 1 or 4 (4 only when the outer extent divides by 4), as ncnn's convert_packing.
Mat convert_packing(const Mat& src, int elempack);
// float32 <-> float16 storage (round to nearest even), layout unchanged.
Mat cast_fp16(const Mat& src);
Mat cast_fp32(const Mat& src);
// src in format's storage and packing, in one pass, written to `out` laid out as format describes (format: a Mat
// or Mat::layout of src's shape; only its fields are read), its cstep padding zeroed.
void convert_into(const Mat& src, const Mat& format, unsigned char* out);

uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

}  // namespace vknorm
