// Embedded SPIR-V, compiled from shaders/ at build time (cmake/shaders.cmake).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace vknorm::shaders {
struct Spirv {
  const uint32_t* words;
  size_t count;
};
// Name: <shader>_fp<0|1>_p<1|4>_sg<0|1>; returns {nullptr, 0} when no such variant was built.
Spirv find(const char* name);
// Every embedded variant's name.
std::vector<const char*> names();
}  // namespace vknorm::shaders
