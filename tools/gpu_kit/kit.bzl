"""kit_binaries: the kit's executables, with all their runfiles (the Bazel _solib libraries too).

A plain filegroup or `data` passes on a cc_test's executable but not the shared libraries it was
linked against, so ldd could not resolve them from a dependent's runfiles.
"""

def _kit_binaries_impl(ctx):
    runfiles = ctx.runfiles()
    executables = []
    for target in ctx.attr.binaries:
        info = target[DefaultInfo]
        runfiles = runfiles.merge(info.default_runfiles)
        executables.append(info.files_to_run.executable)
    return [DefaultInfo(files = depset(executables), runfiles = runfiles)]

kit_binaries = rule(
    implementation = _kit_binaries_impl,
    attrs = {"binaries": attr.label_list(mandatory = True)},
    doc = "Executables of `binaries` as files, with every runfile of theirs as runfiles.",
)
