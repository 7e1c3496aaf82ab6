#include <cstdlib>
#include <cstring>
#include <string>

#include "vk.h"

namespace vknorm {

namespace {
// One decimal: 605184 bytes are 0.6 MiB, not 1.
std::string mib(uint64_t bytes) {
  const uint64_t tenths = (bytes * 10 + (1 << 19)) >> 20;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}
}  // namespace

std::shared_ptr<Buffer> Buffer::create(std::shared_ptr<Context> ctx, vk::DeviceSize size, Kind kind) {
  auto& c = ctx->impl();
  c.instance->check_same_process();  // a fork()ed child's first allocation hangs on NVIDIA's driver
  size = std::max<vk::DeviceSize>(size, 16);
  // Counted in use from here on, so that requests of several threads see each other against the cap; given
  // back if this one fails.
  const uint64_t now = (c.bytes_in_use += size);
  struct Reservation {
    Context::Impl& c;
    uint64_t size;
    bool kept = false;
    ~Reservation() {
      if (!kept) c.bytes_in_use -= size;
    }
  } reservation{c, size};
  if (c.max_device_bytes && now > c.max_device_bytes)
    throw DeviceOutOfMemory("vknorm: cannot allocate " + std::to_string(size) + " bytes (" + mib(size) +
                            ") on the device: " + std::to_string(now - size) +
                            " bytes in use, VKNORM_MAX_DEVICE_BYTES=" + std::to_string(c.max_device_bytes));
  auto b = std::make_shared<Buffer>();
  b->size = size;
  b->kind = kind;
  if (auto cached = c.cache.take({int(kind), size})) {
    b->buffer = std::move(cached->buffer);
    b->memory = std::move(cached->memory);
    b->mapped = cached->mapped;
  } else {
    // One allocation larger than its heap is invalid usage (VUID-vkAllocateMemory-pAllocateInfo-01713):
    // refuse it as out of memory instead of asking the driver.
    const uint32_t type_index = kind == Kind::Staging ? c.staging_memory_type : c.device_memory_type;
    const auto props = c.physical.getMemoryProperties();
    const uint64_t heap = props.memoryHeaps[props.memoryTypes[type_index].heapIndex].size;
    if (size > heap)
      throw DeviceOutOfMemory("vknorm: cannot allocate " + std::to_string(size) + " bytes (" + mib(size) +
                              ") on the device: its memory heap holds " + std::to_string(heap) + " bytes (" + mib(heap) + ")");
    // The cap counts what the cache keeps: make room in it first.
    if (c.max_device_bytes) {
      const uint64_t in_use = c.bytes_in_use;  // this request included
      (void)c.cache.trim(in_use < c.max_device_bytes ? c.max_device_bytes - in_use : 0);
    }
    using U = vk::BufferUsageFlagBits;
    b->buffer = vk::raii::Buffer(c.device, vk::BufferCreateInfo{
                                               .size = size,
                                               .usage = U::eStorageBuffer | U::eTransferSrc | U::eTransferDst,
                                               .sharingMode = vk::SharingMode::eExclusive});
    const auto req = b->buffer.getMemoryRequirements();
    const bool host = kind == Kind::Staging || c.direct_host_access;
    if (!(req.memoryTypeBits & (1u << type_index))) throw std::runtime_error("vknorm: buffer cannot use the chosen memory type");
    const vk::MemoryAllocateInfo allocation{.allocationSize = req.size, .memoryTypeIndex = type_index};
    try {
      try {
        b->memory = vk::raii::DeviceMemory(c.device, allocation);
      } catch (const vk::SystemError&) {  // what the cache keeps may be what is missing
        if (!c.cache.bytes()) throw;
        (void)c.cache.trim(0);
        b->memory = vk::raii::DeviceMemory(c.device, allocation);
      }
    } catch (const vk::SystemError& e) {
      throw DeviceOutOfMemory("vknorm: the device could not allocate " + std::to_string(size) + " bytes (" + mib(size) +
                              "), " + std::to_string(c.bytes_in_use - size) + " bytes in use: " + e.what());
    }
    ++c.allocations;
    b->buffer.bindMemory(*b->memory, 0);
    if (host) b->mapped = b->memory.mapMemory(0, VK_WHOLE_SIZE);
  }
  b->ctx = std::move(ctx);
  reservation.kept = true;
  uint64_t peak = c.bytes_peak;
  while (now > peak && !c.bytes_peak.compare_exchange_weak(peak, now)) {}
  ++c.live_buffers;
  return b;
}

Buffer::~Buffer() {
  if (!ctx) return;
  auto& c = ctx->impl();
  c.bytes_in_use -= size;
  --c.live_buffers;
  // Left to the process's end, its VkBuffer and VkDeviceMemory never freed: in a fork()ed child, where the memory
  // is the parent's and freeing it calls into the driver for a device whose threads the child does not have (the
  // context leaves the device itself alone there too); at exit past the driver's teardown (a static's buffer, see
  // Instance::destroys_handles); and, with VKNORM_DEBUG_LEAK_BUFFER=1 (tests only), the
  // first buffer destroyed in the process, to prove that the validation layer's leak report at vkDestroyDevice
  // reaches vknorm (tests/test_reliability.py).
  static std::atomic<bool> leaked{false};
  const char* debug_leak = std::getenv("VKNORM_DEBUG_LEAK_BUFFER");
  if (!c.instance->destroys_handles() ||
      (debug_leak && *debug_leak && std::strcmp(debug_leak, "0") != 0 && !leaked.exchange(true))) {
    (void)buffer.release();
    (void)memory.release();
    return;
  }
  if (size <= c.cache_limit) {
    (void)c.cache.put({int(kind), size}, size, {std::move(buffer), std::move(memory), mapped}, c.cache_limit);
    mapped = nullptr;
    return;
  }
  if (mapped) memory.unmapMemory();
}

}  // namespace vknorm
