// vknorm objects held by statics when main returns: a function-local static layer made before the first Vulkan
// call (run on the default context) and a namespace-scope context given a device in main, with a layer and a
// VkMat on it. Their destructors run after those of the driver and the validation layer, which were loaded
// later; the process must still exit with main's status. Prints "ok: ..." once the forwards ran.
#include <vknorm/norm.h>

#include <cmath>
#include <cstdio>
#include <memory>

namespace {

std::shared_ptr<vknorm::Context> g_context;  // constructed before main, given a device in main
vknorm::VkMat g_blob;

vknorm::LayerNorm& model() {
  static vknorm::LayerNorm ln;  // constructed at the first call, before any Vulkan call
  return ln;
}

vknorm::Mat rows() {
  vknorm::Mat m = vknorm::Mat::create(2, 16, 4, 1, 1);
  for (int i = 0; i < 64; ++i) reinterpret_cast<float*>(m.data())[i] = std::sin(float(i));
  return m;
}

}  // namespace

int main() {
  try {
    vknorm::ParamDict pd;
    pd.set(0, 16);
    pd.set(2, 0);
    model().load_param(pd);
    vknorm::Mat m = rows();
    model().forward_inplace(m);  // the default context
    g_context = vknorm::Context::create();
    static vknorm::LayerNorm on_own;
    on_own.load_param(pd);
    on_own.create_pipeline(g_context);
    g_blob = vknorm::VkMat::upload(rows(), g_context);
    on_own.forward_inplace(g_blob);
    std::printf("ok: forwards ran on the default context and on a context held by a static; returning from main\n");
  } catch (const vknorm::VulkanUnavailable& e) {
    std::printf("no Vulkan device: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::printf("FAIL: unexpected exception: %s\n", e.what());
    return 1;
  }
  return 0;
}
