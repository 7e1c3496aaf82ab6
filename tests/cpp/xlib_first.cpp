// A translation unit that sees X11's None macro before vknorm's headers, as one that includes <vulkan/vulkan.h>
// under VK_USE_PLATFORM_XLIB_KHR does (<X11/Xlib.h> defines it so): the headers still compile, and the enumerators
// named None are reachable by their other names. api_contracts reports the result.
#define None 0L  // <X11/Xlib.h>'s definition
#include <vknorm/vknorm.h>

bool xlib_none_macro_leaves_the_headers_whole() {
  const vknorm::Fusion f;  // its defaults are None's
  return None == 0L && f.residual == vknorm::Fusion::InPlace && f.activation == vknorm::Activation::Identity &&
         !f.any();
}
