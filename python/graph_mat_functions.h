// ncnn's Mat functions for vknorm._graph (graph_mat_functions.cpp).
#pragma once
#include <nanobind/nanobind.h>

namespace vknorm_python {

// BorderType, copy_make_border, copy_make_border_3d, copy_cut_border(_3d), resize_nearest / _bilinear / _bicubic, flatten:
// defined once Mat and Option are.
void define_mat_functions(nanobind::module_& m);

}  // namespace vknorm_python
