"""cudnn_frontend_repository: NVIDIA's header-only cudnn-frontend, if installed.

scripts/setup unpacks the `include/` folder of PyPI's `nvidia-cudnn-frontend`
wheel (pinned version) into <workspace>/.cache/cudnn_frontend/include; the
environment variable MEGATRAIN_CUDNN_FRONTEND_INCLUDE may name another folder
holding cudnn_frontend.h. When the headers are found, @cudnn_frontend//:headers
exposes them with the define MEGATRAIN_HAVE_CUDNN_FRONTEND=1; when they are
not, the same target is empty and code built against it compiles its cuDNN
attention path out (the selection then always picks our own kernel). Either
way the workspace builds.
"""

def _impl(ctx):
    include = ctx.os.environ.get("MEGATRAIN_CUDNN_FRONTEND_INCLUDE", "")
    if not include:
        root = ctx.path(Label("//tools:cudnn_frontend.bzl")).dirname.dirname
        include = "%s/.cache/cudnn_frontend/include" % root
    found = ctx.path(include + "/cudnn_frontend.h").exists
    if found:
        ctx.symlink(include, "include")
        ctx.file("BUILD", """# cudnn-frontend headers found at {path}
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    defines = ["MEGATRAIN_HAVE_CUDNN_FRONTEND=1"],
)
""".format(path = include))
    else:
        ctx.file("BUILD", """# cudnn-frontend headers not found at {path}: run scripts/setup
package(default_visibility = ["//visibility:public"])

cc_library(name = "headers")
""".format(path = include))

cudnn_frontend_repository = repository_rule(
    implementation = _impl,
    environ = ["MEGATRAIN_CUDNN_FRONTEND_INCLUDE"],
    local = True,
)
