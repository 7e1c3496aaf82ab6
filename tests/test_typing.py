"""The package's types, as IDEs and type checkers read them: each compiled module (vknorm._core, vknorm._graph) has a
stub that nanobind's stubgen wrote from the module as built, installed beside it and naming everything the module
binds; with the package's py.typed, mypy checks a pyncnn-style script against vknorm.graph's API and vknorm's layers
(the script as the README writes it is clean; a misspelt method, a write to a read-only field, a Mat taken for an int,
None for an option switch, a device that may be None and a layer's numpy result taken for a VkMat are errors)."""
from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from availability import import_or_missing, needs_graph

ROOT = Path(__file__).resolve().parent.parent

CLEAN = """
import numpy as np
import vknorm
from vknorm import graph as ncnn

net = ncnn.Net()
net.opt.use_vulkan_compute = True
net.load_param("model.ncnn.param")
net.load_model("model.ncnn.bin")
ex = net.create_extractor()
ex.input("in0", ncnn.Mat(np.zeros((16, 64), np.float32)))
ret, out = ex.extract("out0")
w: int = out.w
name: str = ncnn.get_gpu_info(0).device_name()
budget: int = ncnn.get_gpu_device(0).get_heap_budget()
device = net.vulkan_device()
if device is not None:
    subgroup: int = device.info().subgroup_size()
net.set_vulkan_device(vkdev=ncnn.get_gpu_device(0))
zeros = net.load_model(ncnn.DataReaderFromEmpty())
ncnn.set_omp_num_threads(2)
small: ncnn.Mat = ncnn.resize_bilinear(out, 8, 8)
ln = vknorm.LayerNorm(affine_size=768, eps=1e-5)
ln.load_model(np.ones(768, np.float32), np.zeros(768, np.float32))
y: np.ndarray = ln(np.zeros((4, 768), np.float32))
on_device: vknorm.VkMat = ln(vknorm.to_device(np.zeros((4, 768), np.float32)))
normed, summed = ln.forward_add(y, y, return_sum=True)
either = ln.forward_add(y, y, return_sum=bool(len(y)))  # known only at run time
with ncnn.Net() as scoped:
    scoped.set_vulkan_device(vkdev=ncnn.get_gpu_device(0))
    kind = scoped.vulkan_device()
total: float = float(normed.sum() + summed.sum())


class Focus(ncnn.Layer):  # pyncnn's custom layer, as its model zoo writes one
    def __init__(self) -> None:
        ncnn.Layer.__init__(self)
        self.one_blob_only = True

    def load_param(self, pd: ncnn.ParamDict) -> int:
        self.k = pd.get(0, 2)
        return 0

    def forward(self, bottom_blob: ncnn.Mat, top_blob: ncnn.Mat, opt: ncnn.Option) -> int:
        top_blob.clone_from(ncnn.Mat(np.array(bottom_blob)[..., ::2, ::2]), opt.blob_allocator)
        return 0


class Doubled(ncnn.Layer):  # the list form, ncnn's base forward through super()
    def forward(self, bottom_blobs: list[ncnn.Mat], top_blobs: list[ncnn.Mat], opt: ncnn.Option) -> int:
        return super().forward(bottom_blobs, top_blobs, opt)


net.register_custom_layer("Focus", Focus)
hints = [b.shape for b in net.blobs() if b.producer >= 0]
softmax = ncnn.create_layer("Softmax")  # pyncnn's model zoo runs ncnn's own layers so
code: int = softmax.load_param(ncnn.ParamDict()) + softmax.forward_inplace(out, net.opt)
conv = ncnn.create_layer(ncnn.layer_to_index("Convolution"))
conv.load_model(ncnn.ModelBinFromMatArray([ncnn.Mat(np.ones(27, np.float32))]))
"""

WRONG = """
from vknorm import graph as ncnn

net = ncnn.Net()
ex = net.create_extractor()
ret, out = ex.extract("out0")
out.w = 3
index: int = ex.extract("out0")[1]
net.load_parm("x")
net.opt.lightmode = None
net.vulkan_device().info()
import numpy as np
import vknorm
kept: vknorm.VkMat = vknorm.LayerNorm(affine_size=8)(np.zeros((2, 8), np.float32))
"""


def stub_names(tree) -> set:
    """What a stub's module or class body defines: classes, functions, and (annotated) assignments."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize("name", ["_core", pytest.param("_graph", marks=needs_graph)])
def test_each_compiled_module_has_a_stub_beside_it_naming_everything_it_binds(name):
    module = importlib.import_module(f"vknorm.{name}")
    stub = Path(module.__file__).with_name(f"{name}.pyi")
    assert stub.is_file(), f"no {stub.name} beside {module.__file__}"
    tree = ast.parse(stub.read_text())
    public = {n for n in dir(module) if not n.startswith("_")}
    assert public <= stub_names(tree), sorted(public - stub_names(tree))
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert len(classes) >= 4
    for node in classes:
        bound = {n for n in vars(getattr(module, node.name)) if not n.startswith("_")}
        assert bound <= stub_names(node), (node.name, sorted(bound - stub_names(node)))


@needs_graph
def test_mypy_checks_a_script_against_the_bound_api(tmp_path):
    """The package laid out as a wheel installs it (its Python modules, py.typed, the compiled modules' stubs); its
    modules check clean themselves."""
    import_or_missing("mypy")
    package = tmp_path / "site" / "vknorm"
    package.mkdir(parents=True)
    for f in (ROOT / "python" / "vknorm").iterdir():
        if f.suffix == ".py" or f.name == "py.typed":
            shutil.copy(f, package)
    for name in ("_core", "_graph"):
        module = importlib.import_module(f"vknorm.{name}")
        shutil.copy(Path(module.__file__).with_name(f"{name}.pyi"), package)
    (tmp_path / "clean.py").write_text(CLEAN)
    (tmp_path / "wrong.py").write_text(WRONG)

    def mypy(*scripts):
        env = dict(os.environ, MYPYPATH=str(tmp_path / "site"))
        return subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-incremental",
                               "--cache-dir", os.devnull, *scripts], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=300)

    own = mypy(*sorted(str(f.relative_to(tmp_path)) for f in package.glob("*.py")))
    assert own.returncode == 0, own.stdout + own.stderr
    clean = mypy("clean.py")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    wrong = mypy("wrong.py")
    errors = [ln.split(" error: ")[1] for ln in wrong.stdout.splitlines() if " error: " in ln]
    assert wrong.returncode == 1 and len(errors) == 6, wrong.stdout + wrong.stderr
    assert errors[0].startswith('Property "w" defined in "Mat" is read-only'), errors
    assert errors[1].startswith('Incompatible types in assignment (expression has type "Mat", variable has type "int")')
    assert errors[2].startswith('"Net" has no attribute "load_parm"'), errors
    assert errors[3].startswith('Incompatible types in assignment (expression has type "None", variable has type '
                                '"bool")'), errors
    assert errors[4].startswith('Item "None" of "VulkanDevice | None" has no attribute "info"'), errors
    assert errors[5].startswith('Incompatible types in assignment (expression has type "ndarray'), errors
