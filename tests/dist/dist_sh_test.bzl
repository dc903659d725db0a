"""dist_sh_test: a tests/dist shell test run under mpirun on loopback, its tools given as args."""

_LAUNCHER = "//engine/dist:mpirun_loopback.sh"

def dist_sh_test(name, tools):
    """An sh_test `name` running <name>.sh with the launcher's path and then each tool's path.

    Every test of tests/dist has the same shape: medium, sourcing dist_test_lib.sh, its first
    argument engine/dist's mpirun_loopback.sh, then the binaries and files it drives.

    Args:
      name: the test; its script is <name>.sh.
      tools: labels whose paths follow the launcher's in the script's arguments, in order; each
        is also the test's data.
    """
    labels = [_LAUNCHER] + tools

    # Data as buildifier orders a hand-written list: this package's labels first, then the rest.
    local = sorted([label for label in labels if label.startswith(":")])
    other = sorted([label for label in labels if not label.startswith(":")])
    native.sh_test(
        name = name,
        size = "medium",
        srcs = [name + ".sh"],
        deps = [":dist_test_lib"],
        args = ["$(location %s)" % label for label in labels],
        data = local + other,
    )
