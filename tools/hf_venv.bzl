"""hf_venv_repository: where the HF chat tokenizer's venv (tools/hf_chat) lives.

scripts/setup creates <workspace>/.cache/hf-venv with pinned tokenizers, jinja2 and transformers;
the environment variable MEGATRAIN_HF_VENV may name another venv. @hf_venv//:python_path is a
one-line file holding that venv's Python; the tests that use it (tests/python:hf_chat_test) fail
naming scripts/setup when it is not there, rather than skipping.
"""

def _impl(ctx):
    venv = ctx.os.environ.get("MEGATRAIN_HF_VENV", "")
    if not venv:
        root = ctx.path(Label("//tools:hf_venv.bzl")).dirname.dirname
        venv = "%s/.cache/hf-venv" % root
    ctx.file("python_path", "%s/bin/python\n" % venv)
    ctx.file("BUILD", """# The HF chat tokenizer's venv: {venv}
package(default_visibility = ["//visibility:public"])

exports_files(["python_path"])
""".format(venv = venv))

hf_venv_repository = repository_rule(
    implementation = _impl,
    environ = ["MEGATRAIN_HF_VENV"],
    local = True,
)
