"""Build macros shared by every orthoshard package: one place for compiler flags and test wiring."""

load("@cuda//:defs.bzl", "NVCC")

ORTHOSHARD_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    "-Wno-missing-field-initializers",
]

# Optimisation of every os_* target, so that a workspace building on orthoshard gets optimised
# libraries without copying flags: -O2 in fastbuild (Bazel's default mode passes no -O at all),
# nothing in opt (the toolchain's -O2) or dbg. A build that sets its own level for everything
# (orthoshard's .bazelrc) passes --define=orthoshard_library_O2=off.
ORTHOSHARD_OPTIMIZE = select({
    "//tools:fastbuild_own_optimization": [],
    "//tools:fastbuild": ["-O2"],
    "//conditions:default": [],
})

# Preprocessor flags for code that includes c10d (ProcessGroup, Store, Gloo backend) headers.
C10D_DEFINES = ["USE_DISTRIBUTED", "USE_C10D_GLOO"]

def os_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = ORTHOSHARD_COPTS + ORTHOSHARD_OPTIMIZE + copts, **kwargs)

def os_cc_binary(name, copts = [], deps = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = ORTHOSHARD_COPTS + ORTHOSHARD_OPTIMIZE + copts,
        # Multi-process tests run their ranks as binaries: they need the TSan suppressions too.
        deps = deps + select({
            "//tools:tsan": ["//tools:tsan_suppressions_public"],
            "//conditions:default": [],
        }),
        **kwargs
    )

def os_cc_test(name, copts = [], deps = [], gtest_main = True, linkstatic = True, **kwargs):
    """A GoogleTest test; links gtest_main unless the test brings its own main().

    Links our own libraries statically (as binaries do): one executable per test instead of a `.so` per
    library, and `--as-needed` on the system libraries sees every reference.
    """
    main = ["//third_party:gtest_main"] if gtest_main else ["//third_party:gtest"]
    native.cc_test(
        name = name,
        copts = ORTHOSHARD_COPTS + ORTHOSHARD_OPTIMIZE + copts,
        deps = deps + main + select({
            "//tools:tsan": ["//tools:tsan_suppressions"],
            "//conditions:default": [],
        }),
        linkstatic = linkstatic,
        **kwargs
    )

def os_cc_benchmark(name, copts = [], deps = [], benchmark_main = True, tags = [], **kwargs):
    """A Google Benchmark binary: `bazel run //pkg:name_benchmark`. Not a test: timings are noisy."""
    main = ["//third_party:benchmark_main"] if benchmark_main else ["//third_party:benchmark"]
    native.cc_binary(
        name = name,
        copts = ORTHOSHARD_COPTS + ORTHOSHARD_OPTIMIZE + copts,
        deps = deps + main,
        tags = tags + ["benchmark"],
        **kwargs
    )

def os_cuda_library(name, srcs, hdrs = [], deps = [], nvcc_flags = [], **kwargs):
    """CUDA kernels compiled by nvcc (absolute path, as nvcc finds its headers relative to itself).

    Built only under --config=cuda; otherwise the library is empty, so targets may depend on it
    unconditionally and guard their calls with `#ifdef ORTHOSHARD_CUDA`. `.cu` files must not include
    LibTorch headers: they take raw pointers and a cudaStream_t.
    """
    objects = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".pic.o")
        native.genrule(
            name = obj.replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = " ".join([
                "NVCC_TMP=$$(mktemp -d) && TMPDIR=$$NVCC_TMP",
                NVCC,
                "-std=c++17 -O3 --compiler-options=-fPIC -I.",
                "-gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90",
                " ".join(nvcc_flags),
                "-c $(location %s) -o $@" % src,
                "&& rm -rf $$NVCC_TMP",
            ]),
            tools = ["@cuda//:check.h"],
            tags = ["manual"],
            local = True,
        )
        objects.append(":" + obj)
    native.cc_library(
        name = name,
        srcs = select({
            "//third_party:cuda_enabled": objects,
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//third_party:cuda_enabled": ["@cuda//:cudart"],
            "//conditions:default": [],
        }),
        **kwargs
    )

def os_cc_fuzz_test(
        name,
        srcs,
        deps = [],
        corpus = [],
        dictionary = None,
        copts = [],
        size = "small",
        tags = [],
        linkstatic = True,
        runs = 3000,
        **kwargs):
    """A libFuzzer target (`LLVMFuzzerTestOneInput`) that is also a regression test.

    `name` should end in `_fuzzer`; `corpus` lists seed files of this package; `dictionary` may name a
    libFuzzer dictionary file of this package (tokens for the mutations to insert; only the libFuzzer
    binary reads it). In a normal build it is a cc_test linking //tools:fuzz_driver, which runs every
    seed file plus `runs` mutations of them drawn from a fixed seed through the function: `bazel test
    //...` replays the corpus (keep it to a few seconds: lower `runs` for a slow target). Under
    --config=fuzz (clang, -fsanitize=fuzzer,address,undefined) the same target is a libFuzzer binary
    seeded with the corpus (and the dictionary):
        bazel run --config=fuzz //pkg:name -- -max_total_time=60 [/writable/corpus/dir]
    """
    pkg = native.package_name()
    seeds = [(pkg + "/" + f) if pkg else f for f in corpus]
    fuzz_args = ["-seed_inputs=" + ",".join(seeds)] if seeds else []
    if dictionary:
        fuzz_args.append("-dict=" + ((pkg + "/" + dictionary) if pkg else dictionary))
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = ORTHOSHARD_COPTS + ORTHOSHARD_OPTIMIZE + copts,
        data = corpus + ([dictionary] if dictionary else []),
        deps = deps + select({
            "//tools:fuzzing": [],
            "//conditions:default": ["//tools:fuzz_driver"],
        }),
        linkopts = select({
            "//tools:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        args = select({
            "//tools:fuzzing": fuzz_args,
            "//conditions:default": ["-runs=%d" % runs] + seeds,
        }),
        size = size,
        tags = tags + ["fuzz"],
        linkstatic = linkstatic,
        **kwargs
    )
