"""The external repositories orthoshard's targets need, for orthoshard itself and for a workspace
that builds on it. All are local (no network): Bazel's own stand-ins, Debian's protobuf, LibTorch
from the torch wheel tools/setup installs into orthoshard's `.deps/`, and the CUDA toolkit.

A consumer's WORKSPACE (see examples/consumer/):

    local_repository(name = "orthoshard", path = "/path/to/orthoshard")
    load("@orthoshard//:deps.bzl", "orthoshard_dependencies")
    orthoshard_dependencies(path = "/path/to/orthoshard")

and the .bazelrc of docs/guide.md ("Using orthoshard from your own Bazel workspace"). The library
targets bring their own -O2 (tools/defs.bzl ORTHOSHARD_OPTIMIZE).
"""

load("//third_party/cuda:cuda.bzl", "cuda_repository")
load("//third_party/torch:torch.bzl", "torch_repository")

def orthoshard_dependencies(path):
    """Defines every repository orthoshard's targets need: rules_cc, rules_java,
    remote_coverage_tools, com_google_protobuf, torch and cuda.

    Args:
      path: orthoshard's checkout, as the caller's local_repository gives it ("." for orthoshard).
    """
    native.local_repository(name = "rules_cc", path = path + "/third_party/rules_cc")
    native.local_repository(name = "rules_java", path = path + "/third_party/rules_java")
    native.local_repository(
        name = "remote_coverage_tools",
        path = path + "/third_party/remote_coverage_tools",
    )

    # Debian's protobuf 3.21 for the native proto rules.
    native.new_local_repository(
        name = "com_google_protobuf",
        build_file = str(Label("//third_party/protobuf:protobuf.BUILD")),
        path = "/usr",
    )
    torch_repository(name = "torch")
    cuda_repository(name = "cuda")
