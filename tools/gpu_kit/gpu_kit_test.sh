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
for want in ops_test gemm_test cuda_trainer_test nccl_communicator_test train_local megatraind megatrain bandwidth_probe \
  seccomp_exec; do
  [[ -x "$kit/bin/$want" ]] || fail "bin/$want missing"
done
[[ -e "$kit/bin/libseccomp_report.so" ]] || fail "bin/libseccomp_report.so missing"
compgen -G "$kit/lib/libseccomp.so*" >/dev/null || fail "lib/libseccomp.so.* missing"
grep -qx "allow execve" "$kit/syscall-filter.txt" || fail "syscall-filter.txt lacks execve"

# Only CUDA from outside, plus the kit's own gzipped libraries unpacked (as run.sh does).
unpacked="$tmp/unpacked"
clean_env=(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$unpacked:/usr/local/cuda/lib64" HOME="$tmp"
  TMPDIR="$tmp")
"${clean_env[@]}" "$kit/unpack.sh" "$kit" "$unpacked"
[[ -e "$unpacked/libopenblas.so.0" ]] || fail "libopenblas.so.0 missing after unpack.sh"
"${clean_env[@]}" "$kit/check_ldd.sh" "$kit" "$unpacked" >"$tmp/ldd.log" 2>&1 ||
  { cat "$tmp/ldd.log"; fail "check_ldd.sh on the kit"; }

# The check itself must catch a library missing from the kit (here found on the system instead):
# one that travels as is (a gzipped one would still be found in the unpacked folder).
cp -r "$kit" "$tmp/broken"
victim="$(ls "$tmp/broken/lib" | grep -v '\.gz$' | grep -m1 '^liburing\.so')"
[[ -n "$victim" ]] || fail "no unpacked liburing in the kit: $(ls "$tmp/broken/lib")"
rm "$tmp/broken/lib/$victim"
if "${clean_env[@]}" "$tmp/broken/check_ldd.sh" "$tmp/broken" "$unpacked" >"$tmp/broken.log" 2>&1; then
  fail "check_ldd.sh passed a kit without lib/$victim"
fi
grep -q "PROBLEM: .*$victim" "$tmp/broken.log" || fail "check_ldd.sh did not name $victim"

# The syscall_filter stage names a refused call: a list without getdents64, which train_local
# needs to list its text directory (and nothing before main does), fails the run naming it.
cp -r "$kit" "$tmp/filtered"
grep -vx "allow getdents64" "$kit/syscall-filter.txt" >"$tmp/filtered/syscall-filter.txt"
if "${clean_env[@]}" "$tmp/filtered/syscall_filter.sh" "$tmp/filtered" train --device=cpu --steps=3 \
  --config="$kit/share/tiny.json" --text="$kit/share/text" --micro_batch=2 --seq_len=64 \
  --eval_every=0 --warmup=1 --threads=2 >"$tmp/filtered.log" 2>&1; then
  cat "$tmp/filtered.log"
  fail "train_local passed without getdents64"
fi
grep -q "^syscall_filter: exit 1 under the filter; refused: getdents64(" "$tmp/filtered.log" ||
  { cat "$tmp/filtered.log"; fail "syscall_filter.sh did not name getdents64"; }
rm -rf "$tmp/filtered"

# racecheck_ours.sh judges hazards by kernel: one in cuDNN passes, one in our template kernel
# (its demangled name starts with the return type) fails, and so does a failed program.
cat >"$tmp/fake_sanitizer" <<'FAKE'
#!/usr/bin/env bash
echo "========= Error: Potential RAW hazard detected at __shared__ 0x470 in block (0,0,0) :"
echo "=========     Write Thread (0,0,0) at cudnn_generated_fort_native_sdpa_kernel0_0+0x6ba0"
[[ -n "${FAKE_OURS:-}" ]] && echo "=========     Read Thread (2,0,0) at void" \
  "megatrain::kernels::cuda::(anonymous namespace)::AttentionForwardKernel<64>(int)+0x10"
shift 6  # --tool racecheck --racecheck-report hazard --print-limit N
"$@"
FAKE
chmod +x "$tmp/fake_sanitizer"
"$kit/racecheck_ours.sh" "$tmp/fake_sanitizer" true >"$tmp/race.log" 2>&1 ||
  { cat "$tmp/race.log"; fail "racecheck_ours.sh failed on a hazard in cuDNN only"; }
grep -q "^racecheck: exit 0; hazards: 1 in cudnn_generated_fort_native_sdpa_kernel0_0; in our kernels: 0$" \
  "$tmp/race.log" || { cat "$tmp/race.log"; fail "racecheck_ours.sh summary"; }
if FAKE_OURS=1 "$kit/racecheck_ours.sh" "$tmp/fake_sanitizer" true >"$tmp/race.log" 2>&1; then
  cat "$tmp/race.log"; fail "racecheck_ours.sh passed a hazard in our attention kernel"
fi
grep -q "in our kernels: 1$" "$tmp/race.log" || { cat "$tmp/race.log"; fail "our hazard not counted"; }
if "$kit/racecheck_ours.sh" "$tmp/fake_sanitizer" false >"$tmp/race.log" 2>&1; then
  fail "racecheck_ours.sh passed a failed program"
fi

# Each pattern of the sanitizer stages' ops_test filter names at least one test.
source "$kit/sanitize_tests.sh"
for pattern in "${sanitize_reduction_patterns[@]}"; do
  listed="$("${clean_env[@]}" "$kit/bin/ops_test" --gtest_list_tests "--gtest_filter=$pattern")"
  grep -q '^  ' <<<"$listed" || fail "the sanitizer filter pattern $pattern matches no ops_test case"
done

# trace_summary.py reads what train_local's --trace writes (the same span format on every device).
"${clean_env[@]}" "$kit/bin/train_local" --device=cpu --steps=2 --config="$kit/share/tiny.json" \
  --text="$kit/share/text" --micro_batch=2 --seq_len=64 --eval_every=0 --warmup=1 --threads=2 \
  --weight_slots=2 --trace="$tmp/trace.json" >"$tmp/trace_run.log" 2>&1 ||
  { cat "$tmp/trace_run.log"; fail "train_local --trace on the CPU device"; }
"${clean_env[@]}" python3 "$kit/trace_summary.py" --trace "$tmp/trace.json" \
  --config "$kit/share/tiny.json" --seq_len 64 --micro_batch 2 >"$tmp/trace_summary.log" 2>&1 ||
  { cat "$tmp/trace_summary.log"; fail "trace_summary.py"; }
grep -q '^compute forward  : ' "$tmp/trace_summary.log" || { cat "$tmp/trace_summary.log"; fail "no forward rate"; }
grep -q '^summary: step ' "$tmp/trace_summary.log" || { cat "$tmp/trace_summary.log"; fail "no summary line"; }

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
# The CPU training run and the daemon's job under the unit's system call filter, nothing refused.
for name in ["syscall_filter", "syscall_filter_daemon"]:
    assert stages[name]["status"] == "passed", stages[name]
    assert "exit 0 under the filter; refused: none" in stages[name]["note"], stages[name]
log = open(os.path.join(out, "kit.log")).read()
section = log.split("=== [syscall_filter] ")[1].split("=== [")[0]
assert section.count("for 3 steps") == 2, section  # both runs trained to the end
for name in ["ops_test", "gemm_test", "cuda_layer_math_test", "cuda_trainer_test", "bandwidth_probe"]:
    assert stages[name]["note"] == "skipped cleanly: no CUDA device", stages[name]
gtest = json.load(open(os.path.join(out, "gtest.json")))
assert "ops_test" in gtest and gtest["ops_test"]["tests"] > 0, gtest.keys()
print("gpu_kit_test: summary checks passed:", len(stages), "stages")
EOF
echo "gpu_kit_test: kit $((size / 1048576)) MiB ($size bytes), all checks passed"
