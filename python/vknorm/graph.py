"""ncnn models with vknorm's LayerNorm, RMSNorm, GroupNorm and InstanceNorm inside ncnn's Vulkan graph: no
host round trip.

Shaped like pyncnn where the two overlap, so code written for pyncnn moves over by changing an import::

    from vknorm import graph as ncnn          # instead of: import ncnn
    import numpy as np

    net = ncnn.Net()                           # vknorm's layers registered; ncnn.Net(vknorm=False): stock ncnn
                                               # fusing add -> norm -> activation as it loads (fuse=False: not)
    net.opt.use_vulkan_compute = True          # set options before load_param, as with pyncnn
    net.load_param("model.ncnn.param")
    net.load_model("model.ncnn.bin")
    ex = net.create_extractor()
    ex.input("in0", ncnn.Mat(np.random.rand(197, 768).astype(np.float32)))
    ret, out = ex.extract("out0")
    y = np.array(out)
    print(net.vknorm_counters())              # {'vulkan_forwards': 12, 'cpu_forwards': 0, 'pipelines': ...}

``Net.load_param_bin(path)`` loads ncnn2mem's binary params as they are, not fused (fusion reads text params: run
``vknorm optimize`` on the text before ncnn2mem). They name no blob, layer or type: blobs and layers are named by their
indexes, "0", "1", ... (ncnn2mem's .id.h numbers), types by ncnn's names. A fused model's types need
``net.register_layer(256 + j, "vknorm.GroupNorm")`` (ncnn2mem's ``TYPEINDEX_``) before the load, and the index stays
that type's for the net's life (text params naming the type that held it before are refused there). A Python layer
type registered by name is the custom index ncnn gives the net's own types in the order registered (256 first in a
``Net(vknorm=False)``; a ``Net()`` gives 256-259 to vknorm's fused types); ``net.register_custom_layer(256 + j,
creator)`` puts it where ncnn2mem numbered it. ``load_param_bin`` takes a path, not a ``DataReader`` (a TypeError).

Not there (AttributeError): ``destroy_gpu_instance``, allocator objects
(``allocator=None`` is taken, as are ``elemsize=4`` and ``elempack=1``;
``Mat.create`` / ``create_like`` / ``clone_from`` / ``release`` / ``shape`` are there, float32 of elempack 1),
``DataReader`` subclasses (``DataReaderFromEmpty`` is there), the Mat
functions that make other element types or packings (``convert_packing``, ``cast_*``, ``quantize_to_int8``),
``VulkanDevice``'s allocators, ``Mat.refcount`` / ``addref``, Mat's batch API, and ``Option``'s int8 switches
(this ncnn is built without int8) and ``use_tensor_storage``. A Mat's ``w``, ``h``, ``c``, ... are read-only; an
option switch set to None is a TypeError (pyncnn takes it as False). ``Net.layers()`` gives ``(name, type,
is_vknorm, on_vulkan)`` tuples, not Layer objects; it and ``Net.blobs()`` (pyncnn's ``Blob``: name, producer,
consumer, and the .param's shape hint as a list) describe the net as loaded, a fused net's own (whose blobs an index of
``output_indexes()``, the model's numbering, does not address). bfloat16 storage (``opt.use_bf16_storage`` /
``use_bf16_packed``), where the device takes it, is refused by vknorm's layers at load (``Net(vknorm=False)`` runs it).

Where pyncnn code behaves otherwise here: ``Mat(array)`` is a copy (pyncnn's Mat of a float32 array shares the
array's memory: code that refills one array for each frame makes a new Mat each time, or writes through
``mat.numpy()``), and a Mat made from a 3-D or 4-D array has ncnn's channel padding (cstep a multiple of 16 bytes;
pyncnn's of an array has none: ``m[i]``, ``total()`` and ``memoryview`` count it); an int array param
(``pd.get(id, Mat())`` of a -23300 list) holds the ints' values as float32 (pyncnn's holds their bits:
``.view(np.int32)`` there, ``astype(np.int32)`` here); ``create_extractor()`` raises before ``load_param`` and
``load_model`` have succeeded, after ``clear()``, and once a format option (packing, float16 storage, the convolution
switches, subgroup ops on Vulkan) changed after ``load_model`` (pyncnn's runs layers without pipelines, or crashes);
an input left out is -1 with its name (ncnn's CPU net: -100); ``create_layer`` of an unknown type is a ValueError
(pyncnn: None).

This is ncnn compiled from its pinned source (1.0.20261020, tools/build_ncnn.sh) into vknorm itself, so
a stock run and a vknorm run in one process share one ncnn. It lives beside pyncnn: the two copies of ncnn
keep their symbols to themselves, so both can be imported in one process.

In a Vulkan net (``opt.use_vulkan_compute = True``) vknorm's layers record their kernels into ncnn's
command buffer on ncnn's blobs, in whatever packing (1 or 4) and storage (``opt.use_fp16_storage`` /
``use_fp16_packed``: float16; float32 otherwise) the graph chose. In a CPU net they run ncnn's own CPU
layers (the norm, a fused activation, a fused add's BinaryOp): stock ncnn's results and speed. ``vknorm.ncnn.register`` (pyncnn custom layers) remains for pyncnn users, but it is the slow
path: a pyncnn layer always runs on the host, so a Vulkan net downloads and re-uploads around it.

Custom Python layers, as pyncnn's::

    class Focus(ncnn.Layer):
        def __init__(self):
            ncnn.Layer.__init__(self)
            self.one_blob_only = True              # forward(bottom_blob, top_blob, opt); else lists of Mats
        def forward(self, bottom_blob, top_blob, opt):
            x = np.array(bottom_blob)
            top_blob.clone_from(ncnn.Mat(x[..., ::2, ::2]), opt.blob_allocator)
            return 0                               # ncnn's code: 0 on success

    net.register_custom_layer("Focus", Focus)      # before load_param; a destroyer(layer) may follow

A layer may define ``forward`` or ``forward_inplace`` (with ``support_inplace = True``), for one blob or lists of them,
``load_param(pd)`` (``pd.get(id, default)``: default's type is the type read; an int array comes as float32),
``load_model(mb)`` (``mb.load(w, type)``, ``mb.load(w, h, type)``, ...; type 1: raw float32) and
``create_pipeline(opt)`` / ``destroy_pipeline(opt)``. It runs on the host, in CPU and Vulkan nets (a Vulkan net
downloads its inputs and uploads its outputs, as ncnn does for any layer without Vulkan), on copies of its inputs as
float32 of elempack 1 (``support_vulkan``, ``support_packing``, ``support_fp16_storage``, ... stay False), and the
option without ncnn's allocators: the layer may keep them. A ParamDict or ModelBin is usable only during the call it was
given to (``ParamDict()`` makes one to fill with ``set(id, value)``, to call a layer's ``load_param`` by hand). The net
holds each layer it made until it lets it go (``clear``, another ``load_param``, the net's end), calling the destroyer
then; not as Python ends, and not always for a net the garbage collector reclaims from a reference cycle (pyncnn's net
holds no layer: one nothing else holds is collected, and it crashes); the Mats a multi-blob layer leaves in its lists
reach the net (pyncnn's hands it copies). What a layer raises comes out of the ``load_param``, ``load_model``,
``extract`` or ``clear`` that ran it, noted with the layer (the layer returns -1 to ncnn); a forward that returns 0
without filling its tops is a ValueError. A layer's code cannot call a Net's or an Extractor's methods, which wait for a
net (the one that runs it is held meanwhile): a RuntimeError (``net.opt``, Mats and this module's functions are usable
there). ``super().forward(...)`` (and the other methods) run ncnn's base Layer's: where ``support_inplace``, the tops
cloned from the bottoms and ``forward_inplace`` run on them; -1 otherwise. Registering a type again replaces its
creator and destroyer; a net takes at most 256 types that are not ncnn's own (vknorm's fused types are 4 of them).
``register_custom_layer(index, creator, destroyer=None)`` registers by index, as pyncnn's: a built-in type's index is
that type; a custom one (256 + j) is where binary params number a model's own types. A type vknorm's layers run
(``LayerNorm``, ...) or that fusion folds into them (``BinaryOp``, ``Split``, ``ReLU``, ``Sigmoid``, ``Swish``,
``GELU``) is refused: ``Net(vknorm=False)`` or ``Net(fuse=False)`` takes it.

ncnn's own layers from Python, as pyncnn's model zoo runs a Softmax after an extract::

    softmax = ncnn.create_layer("Softmax")         # or a type index (layer_to_index)
    softmax.load_param(ncnn.ParamDict())
    softmax.forward_inplace(mat_out, net.opt)

``create_layer`` makes ncnn's CPU layer (ncnn's ``LayerNorm``, ... too, not vknorm's). It takes ncnn's order:
``load_param(pd)``, ``load_model(mb)`` where it has weights (``ModelBinFromMatArray(weights)``: a list of Mats, each
load taking the next, or one Mat as pyncnn takes it), ``create_pipeline(opt)``, then ``forward`` /
``forward_inplace``, on float32 Mats of elempack 1: the option's storage and packing switches are off for it, and its
forwards run with the option its pipeline was made with (and the forward's ``num_threads``). A forward after
``load_param`` takes the steps between as a net would (no weights, a pipeline with the forward's option); a pipeline
made again (after ``destroy_pipeline``) reads its weights again, as ncnn's layers may free them as they make one.
Refused, where ncnn's layers would crash: steps out of that order, weights too few or of another size than the layer
reads, empty inputs, the form ncnn's net does not call the layer by (one blob where ``one_blob_only``, lists
otherwise), lists shorter than the layer's type and params index (a BinaryOp's two inputs, an SDPA's three, a
Slice's tops past its slices, ...), ``num_threads`` outside 1..1024, types this ncnn is built without. A view off
ncnn's alignment (``Mat.range``, ``row_range``, ...) runs on a copy, the result written back through it. Shapes
are the layer's own to check, as in a net (ncnn's layers read past blobs of shapes they do not take). An int array
param (a .param's ``-23300=`` list) is set from a list or numpy array of ints (``pd.set(0, [2, -233])``); a Mat's
values are float32. A creator registered with ``register_custom_layer`` returns a ``Layer`` subclass, not such a
layer.

Fusion (``Net(fuse=True)``, the default with vknorm's layers): ``load_param`` rewrites the model so every
norm takes in the BinaryOp add that feeds it and the activation after it (vknorm::ncnn::fuse_param);
``net.fused()`` lists what was fused ({"pattern", "layers"}), ``vknorm_counters()["unfused_adds"]`` counts
adds ncnn's BinaryOp ran instead (inputs that differed in shape at run time, or float16 blobs the device's kernels
cannot read as they are). ``vknorm optimize`` writes the same rewrite to disk. The blobs inside a fused pattern (the add's output, the norm's output before its
activation) are gone from the rewritten net: ``extract`` or ``input`` them in a ``Net(fuse=False)``.

As in ncnn, an extractor computes each blob once: an input given again after an extract does not recompute what
was extracted (make a new extractor per inference). Input shapes a model was not made for may crash inside stock
ncnn's own Vulkan layers (its BinaryOp broadcasting a dims-2 blob over a dims-3 one, its MultiHeadAttention given
another rank; stock pyncnn crashes the same way): ``vknorm check`` runs a model in a worker process and says so.
vknorm's fused activations follow ncnn's CPU formulas (GELU: erf, or tanh with fast_gelu), which ncnn's own
Vulkan GELU approximates: a fused net and ``Net(fuse=False)`` differ by that (up to ~5e-3 at outputs of ~20 in
ln_residual_stack), the fused one nearer ncnn's CPU result. So with NaN: a fused ReLU passes it on, as ncnn's CPU
ReLU does, where ncnn's Vulkan ReLU gives 0.

Decoders with a kv cache run token by token as with pyncnn: an SDPA or MultiHeadAttention with ``7=1`` reads the past
key and value caches as its last two inputs (empty Mats at the first step, or left unset as pyncnn's decoders may:
the one place ``input()`` takes an empty Mat) and gives the grown caches as its second and third outputs; give them back to the next step's ``input()`` as
``extract`` returned them, in the kind of net that made them. On the CPU a cache is in ncnn's own layout, handed out
as made (not a copy) and appended to in place, so it goes on once, as the key or value of the layer and model that
made it, beside its step's other cache: given again
after its step ran, cloned, remade from numpy, to another model, or fed to a Vulkan net, it is -1 with a message (a
clone given to a Vulkan net excepted: it looks like a Vulkan cache). A Vulkan net's caches are copies (a decoder may
branch from one).
``Extractor.set_kvcache_max_seqlen_hint`` and ``Option.kvcache_max_seqlen_hint`` are ncnn's hint (CPU caches).

Light mode (``opt.lightmode``, on by default as in ncnn): each layer frees its inputs once it has run, so an
extractor gives a blob only until something downstream of it was extracted; extracting it later returns -1 and
says so when making it again would need a freed blob (stock pyncnn returns an empty Mat, -100, or crashes;
a blob made from constants alone, such as a MemoryData, still comes back, and so does one a Vulkan net already
downloaded: it keeps that copy, as pyncnn; a blob between that one and a later extract is not made again from
the copy, where pyncnn's Vulkan net does, but is -1 with the message). Extract intermediates first, or turn light mode off
(``opt.lightmode``, ``Extractor.set_light_mode``). A blob set with ``input()`` comes back as given, and once
freed it is -1, never made again from upstream.

Command buffers: ncnn's own extract makes a command pool, buffer and fence for every extract and destroys them
after (0.4-0.6 ms on an H200's driver: most of a small model's inference there). A Vulkan Net here keeps them and
resets them for its next extracts, from any extractor (up to 8 kept, for extracts on several threads at once);
``vknorm_counters()`` counts ``command_buffers_made`` and ``command_buffers_reused``.

Threads: loads, clears and extracts of one Net may run on several threads (loads wait for running extracts).
Options are not guarded that way: set ``net.opt`` fields before ``load_param``, not while another thread loads.

Mat: ``Mat(array)`` copies a numpy array of shape (w), (h, w), (c, h, w) or (c, d, h, w) as float32 (read-only
arrays too, as pyncnn's Mat); ``mat.numpy()`` is a view of the Mat's memory, as pyncnn's (writes reach the Mat; the
view holds the memory), and so are ``np.asarray(mat)``, ``memoryview(mat)`` and numpy's functions given a Mat, through
pyncnn's buffer protocol (a padded Mat, channels cstep apart, has no contiguous export: ``struct`` of it needs
``np.array(mat)``); ``np.array(mat)`` is a copy; iterating a Mat gives the elements ``np.array(mat)`` holds (``m[i]``
counts ncnn's cstep padding, as pyncnn's of a Mat ncnn made); ``fill``, ``clone`` and ``reshape``
as pyncnn's, and pyncnn's shape constructors ``Mat(w)``, ``Mat(w, h)``, ``Mat(w, h, c)``, ``Mat(w, h, d, c)``
(zeroed float32), ``elemsize``, ``cstep`` and ``total()`` as ncnn's. pyncnn's views ``channel``, ``channel_range``,
``depth``, ``depth_range``, ``row`` (a numpy array), ``row_range``, ``range`` and ``m[i]`` (ncnn's memory, cstep
padding included; ``len(m)`` is w, as pyncnn's; a dims 1-2 Mat is its one channel and depth plane, whole, where
pyncnn's ``channel(0)`` relabels it dims - 1) share the Mat's memory, as ncnn's do, and hold it (pyncnn's read
freed memory once their Mat is gone or made again); outside the Mat they are an IndexError (pyncnn reads past it),
and ``Extractor.input`` copies a view it is given (an in-place layer would otherwise write into the Mat). pyncnn's image helpers ``Mat.from_pixels``, ``from_pixels_resize``,
``from_pixels_roi`` and ``from_pixels_roi_resize`` (a numpy uint8 image or bytes, ``Mat.PixelType``, an optional row
stride in bytes; a numpy view given with its own row stride, pyncnn's way to convert a crop, is read as numpy shows
it, refused where its rows' bytes are not next to each other or are narrower than w; ``allocator=None`` only) and ``substract_mean_normalize(mean, norm)`` are ncnn's own code: the
conversions give pyncnn's results bit for bit, the normalization within float32 rounding. What pyncnn would read or
write past (a short buffer, an roi outside the image, images or targets past 2^31 bytes, means or norms not one per
channel, norms on a Mat of dims 1 or 2), and arrays that are not uint8, are a ValueError or TypeError. pyncnn's ``Net.load_param_mem`` (text or
bytes; fused like ``load_param``), ``Net.load_model_mem`` (the .bin's bytes, a bytearray or a uint8 array: read no
further than their end, and copied, so the caller may drop or reuse them; 0 or ncnn's error code, where pyncnn's
gives None), ``load_param`` / ``load_model`` with a ``pathlib.Path`` or bytes (names need not be UTF-8), ``get_gpu_count`` /
``get_default_gpu_index``, the CPU and OpenMP helpers (``get_physical_big_cpu_count``, ``set_cpu_powersave``,
``cpu_support_x86_avx2``, ...; values ncnn would ignore are a ValueError), ``layer_to_index``, ``__version__``, pyncnn's
keyword names
(``load_param(protopath=)``, ``load_model(modelpath=)``, ``set_vulkan_device(device_index=)``),
``Extractor.input`` / ``extract`` by blob index (the model's own numbering, as its .param
gives it: a fused net resolves an index through the model as written, and one whose blob the rewrite removed gives
-1, as does a blob whose name an earlier blob has: blobs are reached by name, and a name finds its first blob), ``Extractor.set_light_mode`` and ``with`` blocks (leaving one clears the Net or Extractor) work too; ``extract`` gives the blob as float32 (pyncnn's ``type=0``) and as a
copy of the caller's own (a CPU kv cache excepted: ncnn's own, above).

Mat functions, as pyncnn's: ``copy_make_border`` / ``copy_make_border_3d`` (``BorderType``: constant, replicate,
reflect), ``copy_cut_border`` / ``copy_cut_border_3d``, ``resize_nearest`` / ``resize_bilinear`` / ``resize_bicubic``,
``flatten``; each returns the new Mat, or writes it into a ``dst`` given second (``dst`` may be ``src``), with an
optional ``opt``. They are ncnn's own code on host Mats (pyncnn's results bit for bit; bicubic, and bilinear of a 1-wide
or 1-high Mat, within float32 rounding), and give float32 of elempack 1; a result that needs no change is ``src`` itself,
as in ncnn. Refused (ValueError), where ncnn would read or write past a buffer or give a wrong Mat: negative borders, a
reflection as wide as the Mat, a border along an axis the Mat lacks, cuts that leave nothing, sizes below 1 or past
ncnn's int coefficient tables, resizing a dims 4 Mat, Mats and results past 2^31 elements.
``net.load_model(DataReaderFromEmpty())`` loads every weight as zero, as pyncnn's: a model from its .param alone.

Device: a Vulkan net runs on ncnn's default GPU; ``net.set_vulkan_device(i)`` (ncnn's GPU index, before
``load_param``) picks another, as in pyncnn. ``get_gpu_info(i)`` (a ``GpuInfo``: pyncnn's getters and ncnn's storage,
subgroup and workgroup ones), ``get_gpu_device(i)`` and ``net.vulkan_device()`` (a ``VulkanDevice``: ``info()``,
``get_heap_budget()``; None until the net has a device; ``net.set_vulkan_device`` takes one too) are pyncnn's too.
An index outside ncnn's devices is a ValueError (pyncnn: None from ``get_gpu_device``, a crash from ``get_gpu_info``
and ``VulkanDevice(i)``). ``VKNORM_DEVICE`` picks the device of vknorm's own layers
(``vknorm.LayerNorm`` ...), not an ncnn net's. ``net.model_bytes_read``: how many bytes of the .bin the last
``load_model`` or ``load_model_mem`` read (fewer than it holds: a .bin for another .param?).
"""
from __future__ import annotations

import operator

try:
    from . import _graph
except ImportError as e:  # built without ncnn (CMake did not find it)
    raise ImportError(
        "vknorm was built without its ncnn layers: build ncnn with tools/build_ncnn.sh and reinstall with "
        "-C cmake.define.ncnn_DIR=<prefix>/lib/cmake/ncnn (make setup does both)"
    ) from e

Mat = _graph.Mat
Option = _graph.Option
Extractor = _graph.Extractor
Blob = _graph.Blob
# pyncnn's custom Python layers: subclass Layer, register a creator with Net.register_custom_layer
Layer = _graph.Layer
ParamDict = _graph.ParamDict
ModelBin = _graph.ModelBin
ModelBinFromMatArray = _graph.ModelBinFromMatArray
# pyncnn's create_layer: ncnn's own CPU layers, run from Python on this module's Mats
create_layer = _graph.create_layer
# As pyncnn's: the version of the ncnn inside (tools/build_ncnn.sh's pin; ncnn's own version string there is the
# date it was built)
__version__ = "1.0.20261020"

# pyncnn's names for ncnn's own code, bound as they are: DataReaderFromEmpty, the CPU and OpenMP helpers, and ncnn's
# Mat functions (each returns the new Mat, or writes it into a dst given second)
from ._graph import (  # noqa: E402
    BorderType, DataReaderFromEmpty, copy_cut_border, copy_cut_border_3d, copy_make_border, copy_make_border_3d,
    cpu_support_arm_asimdhp, cpu_support_arm_neon, cpu_support_arm_vfpv4, cpu_support_x86_avx, cpu_support_x86_avx2,
    flatten, get_big_cpu_count, get_cpu_count, get_cpu_powersave, get_kmp_blocktime, get_little_cpu_count,
    get_omp_dynamic, get_omp_num_threads, get_omp_thread_num, get_physical_big_cpu_count, get_physical_cpu_count,
    get_physical_little_cpu_count, layer_to_index, resize_bicubic, resize_bilinear, resize_nearest,
    set_cpu_powersave, set_kmp_blocktime, set_omp_dynamic, set_omp_num_threads,
)

__all__ = [
    "Net", "Mat", "Option", "Extractor", "Blob", "Layer", "ParamDict", "ModelBin", "ModelBinFromMatArray",
    "create_layer", "gpu_count", "gpu_name",
    "get_gpu_count", "get_default_gpu_index", "GpuInfo",
    "get_gpu_info", "VulkanDevice", "get_gpu_device", "configure", "track_device_memory", "device_memory",
    "set_device_memory_limit",
    # ncnn's own code, as imported above
    "BorderType", "DataReaderFromEmpty", "copy_cut_border", "copy_cut_border_3d", "copy_make_border",
    "copy_make_border_3d", "cpu_support_arm_asimdhp", "cpu_support_arm_neon", "cpu_support_arm_vfpv4",
    "cpu_support_x86_avx", "cpu_support_x86_avx2", "flatten", "get_big_cpu_count", "get_cpu_count",
    "get_cpu_powersave", "get_kmp_blocktime", "get_little_cpu_count", "get_omp_dynamic", "get_omp_num_threads",
    "get_omp_thread_num", "get_physical_big_cpu_count", "get_physical_cpu_count", "get_physical_little_cpu_count",
    "layer_to_index", "resize_bicubic", "resize_bilinear", "resize_nearest", "set_cpu_powersave",
    "set_kmp_blocktime", "set_omp_dynamic", "set_omp_num_threads",
]


def gpu_count() -> int:
    """Vulkan devices ncnn sees."""
    return _graph.gpu_count()


get_gpu_count = gpu_count  # pyncnn's name


def get_default_gpu_index() -> int:
    """ncnn's default GPU (pyncnn's get_default_gpu_index)."""
    return _graph.default_gpu_index()


def gpu_name(index: int | None = None) -> str:
    """Name of ncnn's Vulkan device ``index`` (its default device when None)."""
    return _graph.gpu_name(_graph.default_gpu_index() if index is None else index)


class GpuInfo:
    """pyncnn's GpuInfo: what ncnn knows of one Vulkan device, read through ncnn's getter names
    (``info.device_name()``, ``info.support_fp16_storage()``, ...), as it was when ``get_gpu_info`` was called.
    ``pipeline_cache_uuid()`` is bytes (pyncnn: a memoryview of them); ``type()`` is ncnn's 0 discrete, 1 integrated,
    2 virtual, 3 CPU. ``as_dict()`` gives every value at once."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict):
        self._fields = dict(fields)

    def as_dict(self) -> dict:
        return dict(self._fields)

    def __repr__(self) -> str:
        return f"GpuInfo(device_index={self.device_index()}, device_name={self.device_name()!r})"

    # ncnn's GpuInfo getters, by name (support_subgroup_ops: ncnn's bit mask of subgroup operations)
    def device_index(self) -> int: return self._fields["device_index"]
    def device_name(self) -> str: return self._fields["device_name"]
    def api_version(self) -> int: return self._fields["api_version"]
    def driver_version(self) -> int: return self._fields["driver_version"]
    def driver_id(self) -> int: return self._fields["driver_id"]
    def driver_name(self) -> str: return self._fields["driver_name"]
    def vendor_id(self) -> int: return self._fields["vendor_id"]
    def device_id(self) -> int: return self._fields["device_id"]
    def pipeline_cache_uuid(self) -> bytes: return self._fields["pipeline_cache_uuid"]
    def type(self) -> int: return self._fields["type"]
    def max_shared_memory_size(self) -> int: return self._fields["max_shared_memory_size"]
    def max_workgroup_invocations(self) -> int: return self._fields["max_workgroup_invocations"]
    def max_workgroup_size_x(self) -> int: return self._fields["max_workgroup_size_x"]
    def max_workgroup_count_x(self) -> int: return self._fields["max_workgroup_count_x"]
    def subgroup_size(self) -> int: return self._fields["subgroup_size"]
    def timestamp_period(self) -> float: return self._fields["timestamp_period"]
    def compute_queue_count(self) -> int: return self._fields["compute_queue_count"]
    def support_fp16_packed(self) -> bool: return self._fields["support_fp16_packed"]
    def support_fp16_storage(self) -> bool: return self._fields["support_fp16_storage"]
    def support_fp16_arithmetic(self) -> bool: return self._fields["support_fp16_arithmetic"]
    def support_bf16_storage(self) -> bool: return self._fields["support_bf16_storage"]
    def support_int8_storage(self) -> bool: return self._fields["support_int8_storage"]
    def support_subgroup_ops(self) -> int: return self._fields["support_subgroup_ops"]
    def support_cooperative_matrix(self) -> bool: return self._fields["support_cooperative_matrix"]


def get_gpu_info(device_index: int = 0) -> GpuInfo:
    """pyncnn's get_gpu_info: ncnn's facts about Vulkan device ``device_index`` (ValueError outside
    0..get_gpu_count()-1, where pyncnn reads past ncnn's device table)."""
    return GpuInfo(_graph.gpu_info(operator.index(device_index)))


class VulkanDevice:
    """pyncnn's VulkanDevice, as ``get_gpu_device(i)`` and ``Net.vulkan_device()`` give it: ncnn's device ``i``, the
    one every net of that index runs on. ``info()`` is its GpuInfo, ``get_heap_budget()`` ncnn's estimate of the
    device memory left to use, in MB. (pyncnn's ``VulkanDevice(i)`` makes another logical device; this one names
    ncnn's shared one. Allocator objects are not bound here.)"""

    __slots__ = ("_index",)

    def __init__(self, device_index: int = 0, *, _caller: str = "VulkanDevice"):
        self._index = _graph.check_gpu_index(operator.index(device_index), _caller)  # now, not at first use

    def info(self) -> GpuInfo:
        return get_gpu_info(self._index)

    def get_heap_budget(self) -> int:
        return _graph.gpu_heap_budget(self._index)

    def __eq__(self, other) -> bool:
        return isinstance(other, VulkanDevice) and other._index == self._index

    def __hash__(self) -> int:
        return hash(("VulkanDevice", self._index))

    def __repr__(self) -> str:
        return f"VulkanDevice({self._index})"


def get_gpu_device(device_index: int = 0) -> VulkanDevice:
    """pyncnn's get_gpu_device: ncnn's Vulkan device ``device_index`` (ValueError outside its range, where
    pyncnn's gives None)."""
    return VulkanDevice(device_index, _caller="get_gpu_device")


class Net(_graph.Net):
    """An ncnn Net with vknorm's layers inside (``Net(vknorm=False)``: stock ncnn; ``fuse``: the graph rewrite, on
    by default with vknorm's layers), shaped like pyncnn's (module docstring)."""

    __slots__ = ()  # as the bound Net (and pyncnn's): a misspelt attribute is an error, not a new field

    def __enter__(self) -> Net:
        super().__enter__()
        return self

    def vulkan_device(self) -> VulkanDevice | None:
        """pyncnn's: the device the net runs on, None until ``set_vulkan_device`` or a Vulkan net's ``load_param``
        picks one."""
        index = self._vulkan_device_index()  # type: ignore[attr-defined]  # private: not in the stub
        return None if index is None else VulkanDevice(index)

    def set_vulkan_device(self, device: int | VulkanDevice | None = None, /, *, device_index: int | None = None,
                          vkdev: VulkanDevice | None = None) -> None:
        """pyncnn's two forms, before ``load_param`` as in ncnn: ncnn's device index (by position or
        ``device_index=``) or a VulkanDevice (by position or ``vkdev=``), one of them."""
        given = [(name, v) for name, v in (("device", device), ("device_index", device_index), ("vkdev", vkdev))
                 if v is not None]
        if len(given) != 1:
            raise TypeError("set_vulkan_device takes one device: an index (device_index=) or a VulkanDevice "
                            f"(vkdev=), got {len(given)}")
        form, value = given[0]
        if form == "vkdev" and not isinstance(value, VulkanDevice):
            raise TypeError(f"set_vulkan_device: vkdev must be a vknorm.graph.VulkanDevice, got "
                            f"{type(value).__name__}")
        if isinstance(value, VulkanDevice):
            if form == "device_index":
                raise TypeError("set_vulkan_device: device_index must be an integer, got VulkanDevice")
            index = value._index
        else:
            try:
                index = operator.index(value)
            except TypeError:
                raise TypeError(f"set_vulkan_device: device_index must be an integer, got "
                                f"{type(value).__name__}") from None
        super().set_vulkan_device(index)


def configure(net: Net, *, vulkan: bool = True, fp16: bool = False, packing: bool = True,
              lightmode: bool = True) -> Net:
    """Set the options vknorm's tools use on a new net (before ``load_param``): Vulkan compute on or off,
    float16 storage (``fp16``) or float32 everywhere, packing layout on or off. float16 arithmetic stays
    off so float16 runs differ from float32 ones by storage alone."""
    opt = net.opt
    opt.use_vulkan_compute = vulkan
    opt.use_fp16_storage = fp16
    opt.use_fp16_packed = fp16
    opt.use_fp16_arithmetic = False
    opt.use_bf16_storage = False
    opt.use_bf16_packed = False
    opt.use_packing_layout = packing
    opt.lightmode = lightmode
    return net


def track_device_memory() -> None:
    """Count the device memory ncnn allocates from now on (every VkDeviceMemory of its allocators: blobs,
    workspace, staging, weights; vknorm's layers allocate through them, and their kernels' scratch through an ncnn
    allocator of their own, held until ``Net.clear()``). Starts ncnn's Vulkan instance.
    Read the figures with ``device_memory()``."""
    _graph.track_device_memory()


def device_memory() -> dict:
    """What ncnn holds since ``track_device_memory()``: ``bytes`` and ``blocks`` (VkDeviceMemory objects)
    live now, ``peak_bytes`` (since tracking started or the limit was last set), ``allocations`` made in
    all, ``refused``: allocations the limit turned down, ``limit`` (0: none), ``tracking``."""
    return dict(_graph.device_memory())


def set_device_memory_limit(limit_bytes: int) -> None:
    """Answer ncnn's allocations past ``limit_bytes`` of live device memory with
    VK_ERROR_OUT_OF_DEVICE_MEMORY, as a full device would (0: no limit). Needs ``track_device_memory()``.
    Set it after ``load_model``: ncnn's loader does not survive a refused weight upload (it crashes, as on a
    device that is full at load time); inference past the limit fails with -100 and the net runs again
    at a normal size."""
    if not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or not 0 <= limit_bytes < 2**64:
        raise ValueError(f"set_device_memory_limit: expected a byte count 0..2^64-1, got {limit_bytes!r}")
    if not _graph.device_memory()["tracking"]:
        raise RuntimeError("set_device_memory_limit: call track_device_memory() first")
    _graph.set_device_memory_limit(limit_bytes)

