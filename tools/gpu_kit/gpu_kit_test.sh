#!/usr/bin/env bash
# CI test of the GPU kit on a machine without a GPU: it assembles, it is relocatable, every
# binary loads from the kit alone (only glibc and CUDA from outside) in a clean environment, and
# run.sh --cpu-only passes from there. Checks results, never timings.
# Args: what assemble.sh takes (--files ... --bins ...), passed by the BUILD rule.
set -euo pipefail
tmp="${TEST_TMPDIR:?run by bazel test}"
fail() { echo "FAIL: $*" >&2; exit 1; }

KIT_VERSION=ci tools/gpu_kit/assemble.sh "$@" --out "$tmp/built"
# Relocatable: everything is found through $ORIGIN, so move it first.
mkdir -p "$tmp/moved"
mv "$tmp/built" "$tmp/moved/kit"
kit="$tmp/moved/kit"

size=$(du -sb "$kit" | cut -f1)
((size < 60 * 1048576)) || fail "kit is $size bytes, over 60 MiB"
[[ -z "$(find "$kit" -type l)" ]] || fail "kit holds symbolic links: $(find "$kit" -type l)"
for bin in "$kit"/bin/*; do
  # Read the whole dynamic section first: `readelf | grep -q` under pipefail fails at random when
  # grep exits on the match while readelf is still writing (SIGPIPE).
  dynamic="$(readelf -d "$bin")"
  grep -q 'RPATH.*\$ORIGIN/\.\./lib' <<<"$dynamic" || fail "$bin has no RPATH \$ORIGIN/../lib"
done
for want in ops_test gemm_test cuda_trainer_test train_local megatraind megatrain bandwidth_probe; do
  [[ -x "$kit/bin/$want" ]] || fail "bin/$want missing"
done

# Only CUDA from outside, plus the kit's own gzipped libraries unpacked (as run.sh does).
unpacked="$tmp/unpacked"
clean_env=(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$unpacked:/usr/local/cuda/lib64" HOME="$tmp"
  TMPDIR="$tmp")
"${clean_env[@]}" "$kit/unpack.sh" "$kit" "$unpacked"
[[ -e "$unpacked/libopenblas.so.0" ]] || fail "libopenblas.so.0 missing after unpack.sh"
"${clean_env[@]}" "$kit/check_ldd.sh" "$kit" "$unpacked" >"$tmp/ldd.log" 2>&1 ||
  { cat "$tmp/ldd.log"; fail "check_ldd.sh on the kit"; }

# The check itself must catch a library missing from the kit (here found on the system instead).
cp -r "$kit" "$tmp/broken"
victim="$(ls "$tmp/broken/lib" | grep -m1 '^libsqlite3\.so')"
rm "$tmp/broken/lib/$victim"
if "${clean_env[@]}" "$tmp/broken/check_ldd.sh" "$tmp/broken" "$unpacked" >"$tmp/broken.log" 2>&1; then
  fail "check_ldd.sh passed a kit without lib/$victim"
fi
grep -q "PROBLEM: .*$victim" "$tmp/broken.log" || fail "check_ldd.sh did not name $victim"

out="$tmp/out"
before=$(du -sb "$kit" | cut -f1)
clean_env=(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH=/usr/local/cuda/lib64 HOME="$tmp" TMPDIR="$tmp")
if ! "${clean_env[@]}" "$kit/run.sh" --cpu-only --budget 0 --only env,tests "$out" >"$tmp/run.log" 2>&1; then
  cat "$tmp/run.log"
  cat "$out/kit.log" 2>/dev/null | tail -n 100
  fail "run.sh --cpu-only"
fi
cat "$tmp/run.log"
(($(du -sb "$kit" | cut -f1) == before)) || fail "run.sh changed the kit's size (it must stay carriable)"

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs]
assert len(files) <= 8, f"run.sh wrote {len(files)} files: {files}"
for f in files:
    assert os.path.getsize(f) < 16 << 20, f"{f} is over 16 MiB"
summary = json.load(open(os.path.join(out, "summary.json")))
stages = {s["name"]: s for s in summary["stages"]}
assert summary["failed"] == 0, summary
for name in ["ldd", "train_cpu", "ops_test", "gemm_test", "cuda_trainer_test", "bandwidth_probe"]:
    assert stages[name]["status"] == "passed", stages.get(name)
for name in ["ops_test", "gemm_test", "cuda_layer_math_test", "cuda_trainer_test", "bandwidth_probe"]:
    assert stages[name]["note"] == "skipped cleanly: no CUDA device", stages[name]
gtest = json.load(open(os.path.join(out, "gtest.json")))
assert "ops_test" in gtest and gtest["ops_test"]["tests"] > 0, gtest.keys()
print("gpu_kit_test: summary checks passed:", len(stages), "stages")
EOF
echo "gpu_kit_test: kit $((size / 1048576)) MiB ($size bytes), all checks passed"
