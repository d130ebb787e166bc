"""Repository rule for the CUDA toolkit and NCCL, pinned to what the torch 2.11.0 wheel was built with.

Accepts CUDA toolkit 13.x and NCCL 2.28 under CUDA_PATH (default /usr/local/cuda). Anything else is not
an error while the repository is only loaded (CPU builds never need it); every target here fails to
build instead, with a message naming what was found. Targets (used only under --config=cuda):
  @cuda//:cudart   CUDA runtime headers + libcudart
  @cuda//:nccl     NCCL headers + libnccl
  @cuda//:defs.bzl NVCC (absolute path of nvcc) and CUDA_VERSION
"""

_TOOLKIT_MAJOR = "13"
_NCCL_VERSION = "2.28"

def _define(text, name):
    for line in text.splitlines():
        parts = [p for p in line.replace("\t", " ").split(" ") if p]
        if len(parts) >= 3 and parts[0] == "#define" and parts[1] == name:
            return parts[2]
    return None

def _cuda_repository_impl(rctx):
    cuda_home = rctx.os.environ.get("CUDA_PATH", "") or "/usr/local/cuda"
    nvcc = cuda_home + "/bin/nvcc"
    problems = []
    toolkit = "not found"
    if rctx.path(nvcc).exists:
        result = rctx.execute([nvcc, "--version"])
        at = result.stdout.find("release ")
        if at >= 0:
            toolkit = result.stdout[at + len("release "):].split(",")[0].strip()
        if not toolkit.startswith(_TOOLKIT_MAJOR + "."):
            problems.append("CUDA toolkit %s at %s (need %s.x, the torch wheel's)" % (toolkit, cuda_home, _TOOLKIT_MAJOR))
    else:
        problems.append("nvcc not found at %s" % nvcc)

    nccl_header = None
    for candidate in [cuda_home + "/include/nccl.h", "/usr/include/nccl.h", "/usr/local/include/nccl.h"]:
        if rctx.path(candidate).exists:
            nccl_header = candidate
            break
    nccl = "not found"
    if nccl_header:
        text = rctx.read(nccl_header)
        nccl = "%s.%s.%s" % (_define(text, "NCCL_MAJOR"), _define(text, "NCCL_MINOR"), _define(text, "NCCL_PATCH"))
        if not nccl.startswith(_NCCL_VERSION + "."):
            problems.append("NCCL %s in %s (need %s.x, the torch wheel's)" % (nccl, nccl_header, _NCCL_VERSION))
    else:
        problems.append("nccl.h not found under %s/include, /usr/include or /usr/local/include" % cuda_home)

    lib_dirs = [d for d in [cuda_home + "/lib64", cuda_home + "/lib"] if rctx.path(d).exists]
    rctx.symlink(cuda_home + "/include", "include")
    rctx.file("defs.bzl", 'NVCC = "%s"\nCUDA_VERSION = "%s"\nNCCL_VERSION = "%s"\n' % (nvcc, toolkit, nccl))

    if problems:
        message = "orthoshard --config=cuda: " + "; ".join(problems)
        check = 'genrule(name = "check", outs = ["check.h"], cmd = "echo \'%s\' >&2; exit 1")' % message.replace("'", "")
    else:
        check = 'genrule(name = "check", outs = ["check.h"], cmd = "echo \'// CUDA %s, NCCL %s\' > $@")' % (toolkit, nccl)

    linkdirs = ", ".join(['"-L%s", "-Wl,-rpath,%s"' % (d, d) for d in lib_dirs])
    rctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

{check}

cc_library(
    name = "cudart",
    hdrs = glob(["include/*.h", "include/crt/**"]) + [":check.h"],
    includes = ["include"],
    linkopts = [{linkdirs}, "-lcudart"],
)

cc_library(
    name = "nccl",
    linkopts = [{linkdirs}, "-lnccl"],
    deps = [":cudart"],
)
""".format(check = check, linkdirs = linkdirs))

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
