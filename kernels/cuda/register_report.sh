#!/usr/bin/env bash
# Register/spill report of every CUDA kernel (gpu-review.md point 9): compiles
# each .cu with ptxas -v for one architecture (sm_90a, what the build ships for
# H100/H200), prints one line per kernel (registers, stack frame, spill
# stores/loads, shared memory, barriers) and fails when a kernel spills unless
# spill_allowlist.txt names it with a reason. Needs only nvcc, no GPU.
#
# As a test: bazel test //kernels/cuda:register_report_test (the table is in
# the test log). By hand: kernels/cuda/register_report.sh [arch] from the
# repository root.
set -euo pipefail

NVCC="${NVCC:-/usr/local/cuda/bin/nvcc}"
ARCH="${1:-sm_90a}"
ROOT="${TEST_SRCDIR:+$TEST_SRCDIR/megatrain}"
ROOT="${ROOT:-$PWD}"
ALLOWLIST="$ROOT/kernels/cuda/spill_allowlist.txt"
SOURCES=(attention elementwise rmsnorm cross_entropy gemm_fallback)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

if [ ! -x "$NVCC" ]; then
  echo "register_report: no nvcc at $NVCC" >&2
  exit 1
fi

# The kernel's short name: namespaces and parameter lists dropped, template
# arguments kept (AttentionForwardKernel<128>).
short_name() {
  c++filt | sed -E 's/megatrain::kernels::cuda:://g; s/\(anonymous namespace\):://g; s/\(.*$//; s/^void //'
}

printf '%-34s %-30s %5s %6s %7s %7s %6s %4s\n' source kernel regs stack spill_st spill_ld smem bars
failures=0
for src in "${SOURCES[@]}"; do
  log="$WORK/$src.log"
  "$NVCC" -std=c++20 -O3 -ccbin /usr/bin/g++ -I"$ROOT" -I/usr/local/cuda/include \
    -I/usr/local/cuda/include/cccl --expt-relaxed-constexpr \
    "-gencode=arch=compute_${ARCH#sm_},code=$ARCH" -Xptxas -v \
    -c "$ROOT/kernels/cuda/$src.cu" -o "$WORK/$src.o" >"$log" 2>&1 || {
    cat "$log" >&2
    echo "register_report: nvcc failed on kernels/cuda/$src.cu" >&2
    exit 1
  }
  # ptxas prints, per entry: "Compiling entry function 'NAME' for 'ARCH'",
  # "N bytes stack frame, N bytes spill stores, N bytes spill loads",
  # "Used N registers, used N barriers, N bytes smem, ...".
  while IFS=$'\t' read -r mangled regs stack spill_st spill_ld smem bars; do
    name="$(echo "$mangled" | short_name)"
    printf '%-34s %-30s %5s %6s %7s %7s %6s %4s\n' "kernels/cuda/$src.cu" "$name" "$regs" \
      "$stack" "$spill_st" "$spill_ld" "$smem" "$bars"
    if [ "$spill_st" != 0 ] || [ "$spill_ld" != 0 ]; then
      allowed="$(awk -v n="$name" '$1 == n' "$ALLOWLIST")"
      if [ -n "$allowed" ]; then
        echo "  allowed spill: $allowed"
      else
        echo "  SPILL: $name spills ($spill_st bytes stored, $spill_ld loaded) at $ARCH;" \
          "fix it or add it to kernels/cuda/spill_allowlist.txt with a reason" >&2
        failures=$((failures + 1))
      fi
    fi
  done < <(awk '
    /Compiling entry function/ { match($0, /function \x27[^\x27]+\x27/); name = substr($0, RSTART + 10, RLENGTH - 11); stack = "?"; st = "?"; ld = "?"; next }
    /bytes stack frame/ && name != "" { stack = $1; st = $5; ld = $9; next }
    /Used [0-9]+ registers/ && name != "" {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
      bars = 0; if (match($0, /used [0-9]+ barriers/)) { bars = substr($0, RSTART + 5, RLENGTH - 14) }
      printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, regs, stack, st, ld, smem, bars; name = ""
    }' "$log")
  entries="$(grep -c 'Compiling entry function' "$log" || true)"
  if [ "$entries" = 0 ]; then
    echo "register_report: ptxas reported no kernel for kernels/cuda/$src.cu" >&2
    failures=$((failures + 1))
  fi
done

if [ "$failures" != 0 ]; then
  echo "register_report: $failures problem(s) at $ARCH" >&2
  exit 1
fi
echo "register_report: no kernel spills at $ARCH"
