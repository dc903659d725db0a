"""cuda_library: compiles .cu files with the toolkit's nvcc into a cc_library.

Bazel 4.2.3 has no CUDA rules we can fetch offline, so each .cu file becomes
one genrule invoking /usr/local/cuda/bin/nvcc. Device code is built for
sm_80 (A100), sm_90a (H100/H200/GH200), sm_100 (B200) as SASS plus compute_90
PTX so newer GPUs can JIT. A compile error in any .cu fails the build.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_100,code=sm_100",
    "-gencode=arch=compute_90,code=compute_90",
]

NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "-ccbin /usr/bin/g++",
    "-Xcompiler -fPIC",
    "-Xcompiler -Wall",
    "-Xcompiler -Wextra",
    "--Werror all-warnings",
    "-I.",
    "-I$(GENDIR)",
    "-I/usr/local/cuda/include",
    "-I/usr/local/cuda/include/cccl",
    "--expt-relaxed-constexpr",
]

def cuda_library(name, srcs, hdrs = [], cuda_hdrs = [], deps = [], **kwargs):
    """A cc_library holding the objects nvcc makes of `srcs` (.cu files).

    Args:
      name: target name.
      srcs: .cu files.
      hdrs: public C++ headers of the library (callable from plain g++).
      cuda_hdrs: headers the .cu files include (e.g. //kernels/common).
      deps: cc deps of the resulting library.
      **kwargs: passed to cc_library.
    """
    objs = []
    for src in srcs:
        stem = src.replace("/", "_").replace(".cu", "")
        obj = "_objs_cuda/%s/%s.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            cmd = "%s %s %s -c $(location %s) -o $@" % (
                NVCC,
                " ".join(NVCC_FLAGS),
                " ".join(GENCODE),
                src,
            ),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:runtime"],
        linkstatic = 1,
        **kwargs
    )
