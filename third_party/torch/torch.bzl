"""Repository rule that exposes LibTorch from the pinned PyPI torch wheel.

tools/setup installs `torch==2.11.0` with --no-deps into `<orthoshard>/.deps/python` (orthoshard's checkout,
also when another workspace uses it through deps.bzl); set TORCH_DIR to
the `torch` package directory of another install (one holding `include/` and `lib/`) to override.

Targets:
  @torch//:torch_cpu   headers + libtorch_cpu + libc10 (runs without a GPU)
  @torch//:torch       torch_cpu, plus libtorch_cuda + libc10_cuda under --config=cuda

Bazel links shared libraries through `_solib_*` symlinks, which breaks the wheel's $ORIGIN rpaths, so
the libraries are linked by absolute path with an rpath to the real `torch/lib`. libtorch_cpu.so of the
CUDA wheel also needs libcudart.so.13 and libcupti.so.13 at load time; they come from the CUDA toolkit.
"""

_PINNED_VERSION = "2.11.0"

# Only these header trees are exposed: the wheel also ships protobuf and pybind11 headers that must not
# shadow the system ones.
_HEADER_DIRS = ["ATen", "c10", "caffe2", "fmt", "torch"]

def _find_dir(rctx, candidates, filename):
    for d in candidates:
        if d and rctx.path(d + "/" + filename).exists:
            return d
    return None

def _rpaths(dirs):
    return ", ".join(['"-Wl,-rpath,%s"' % d for d in dirs])

def _torch_repository_impl(rctx):
    # orthoshard's own checkout (this workspace, or the one a consumer names "orthoshard").
    workspace_root = str(rctx.path(Label("@orthoshard//:WORKSPACE")).dirname)
    torch_dir = rctx.os.environ.get("TORCH_DIR", "") or workspace_root + "/.deps/python/torch"
    version_file = rctx.path(torch_dir + "/version.py")
    if not rctx.path(torch_dir + "/include/torch").exists or not version_file.exists:
        fail(("LibTorch not found at '%s' (expected include/torch and version.py there). " +
              "Run tools/setup, or set TORCH_DIR to the `torch` directory of a torch==%s install.") %
             (torch_dir, _PINNED_VERSION))
    version = None
    for line in rctx.read(version_file).splitlines():
        if line.startswith("__version__"):
            version = line.split("=")[1].strip().strip("'\"")
    if version == None or version.split("+")[0] != _PINNED_VERSION:
        fail("LibTorch at '%s' is version '%s'; orthoshard pins torch==%s. Run tools/setup." %
             (torch_dir, version, _PINNED_VERSION))

    for d in _HEADER_DIRS:
        rctx.symlink(torch_dir + "/include/" + d, "include/" + d)

    # tools/setup installs the nvidia-cuda-runtime and nvidia-cuda-cupti wheels next to torch; a system
    # CUDA 13 toolkit works too.
    cuda_home = rctx.os.environ.get("CUDA_PATH", "") or "/usr/local/cuda"
    wheel_lib = torch_dir + "/../nvidia/cu13/lib"
    cuda_lib = _find_dir(rctx, [wheel_lib, cuda_home + "/lib64", cuda_home + "/lib"], "libcudart.so.13")
    cupti_lib = _find_dir(rctx, [wheel_lib, cuda_home + "/lib64", cuda_home + "/lib", cuda_home + "/extras/CUPTI/lib64"], "libcupti.so.13")
    if cuda_lib == None or cupti_lib == None:
        fail(("libtorch_cpu.so of the torch %s wheel needs libcudart.so.13 and libcupti.so.13; " +
              "not found in %s or under %s. Run tools/setup.") % (_PINNED_VERSION, wheel_lib, cuda_home))
    torch_lib = torch_dir + "/lib"
    cpu_dirs = [torch_lib, cuda_lib]
    if cupti_lib != cuda_lib:
        cpu_dirs.append(cupti_lib)

    # Libraries libtorch_cuda.so needs that the CUDA toolkit here may not have: cuDNN, NCCL (in the
    # toolkit's lib/), and cusparseLt, nvshmem, cufile from the PyPI wheels tools/setup installs.
    cuda_dirs = [cuda_home + "/lib"]
    nvidia = rctx.path(torch_dir + "/../nvidia")
    if nvidia.exists:
        for sub in nvidia.readdir():
            if rctx.path(str(sub) + "/lib").exists and str(sub) + "/lib" not in cpu_dirs:
                cuda_dirs.append(str(sub) + "/lib")

    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# LibTorch {version} from {torch_dir}

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"]),
    includes = ["include", "include/torch/csrc/api/include"],
)

cc_library(
    name = "torch_cpu",
    linkopts = ["-L{torch_lib}", "-ltorch_cpu", "-lc10", {cpu_rpaths}],
    deps = [":headers"],
)

config_setting(
    name = "cuda_enabled",
    define_values = {{"orthoshard_cuda": "1"}},
)

cc_library(
    name = "torch_cuda_libs",
    linkopts = ["-L{torch_lib}", "-ltorch_cuda", "-lc10_cuda", {cuda_rpaths}],
    deps = [":torch_cpu"],
)

cc_library(
    name = "torch",
    defines = select({{":cuda_enabled": ["ORTHOSHARD_CUDA=1"], "//conditions:default": []}}),
    deps = [":torch_cpu"] + select({{":cuda_enabled": [":torch_cuda_libs"], "//conditions:default": []}}),
)

exports_files(["version.txt"])
""".format(
        version = version,
        torch_dir = torch_dir,
        torch_lib = torch_lib,
        cpu_rpaths = _rpaths(cpu_dirs),
        cuda_rpaths = _rpaths(cuda_dirs),
    ))
    rctx.file("version.txt", version + "\n")

torch_repository = repository_rule(
    implementation = _torch_repository_impl,
    environ = ["TORCH_DIR", "CUDA_PATH"],
    local = True,
)
