#!/usr/bin/env bash
# Checks that every binary of a GPU kit loads from the kit alone: under `ldd`, each library
# resolves, and outside KIT/lib only glibc, the C++ runtime and CUDA may come (machine_libs.sh).
# Run unpack.sh KIT UNPACKED first, with UNPACKED on LD_LIBRARY_PATH.
# Usage: check_ldd.sh KIT UNPACKED   (prints each binary's ldd; exits 1 on any problem)
set -euo pipefail
kit="$(cd "$1" && pwd)"

# Libraries found in UNPACKED (unpack.sh's folder) count as the kit's own.
unpacked="$(realpath -s "${2:?the folder unpack.sh unpacked into}")"
source "$kit/machine_libs.sh"

problems=0
for bin in "$kit"/bin/*; do
  echo "== ldd $(basename "$bin")"
  if ! listing="$(ldd "$bin" 2>&1)"; then
    echo "$listing"
    echo "PROBLEM: ldd failed on $bin"
    problems=$((problems + 1))
    continue
  fi
  echo "$listing"
  if grep -q "version .* not found" <<<"$listing"; then
    echo "PROBLEM: $(basename "$bin"): a library on this machine is too old (see above)"
    problems=$((problems + 1))
  fi
  while read -r soname arrow path _; do
    if [[ "$arrow" != "=>" ]]; then  # linux-vdso.so.1 (0x...) or /lib64/ld-linux-x86-64.so.2 (0x...)
      path="$soname"
      soname="$(basename "$soname")"
    fi
    [[ "$path" == /* ]] && path="$(realpath -s "$path")"  # bin/../lib/x -> lib/x
    if [[ "$path" == "not" ]]; then
      echo "PROBLEM: $(basename "$bin") needs $soname: not found"
      problems=$((problems + 1))
    elif [[ "$path" == "$kit/lib/"* || "$path" == "$unpacked/"* ]]; then
      :
    elif ! [[ "$soname" =~ $machine_libs ]]; then
      echo "PROBLEM: $(basename "$bin") loads $soname from $path, outside the kit"
      problems=$((problems + 1))
    fi
  done <<<"$listing"
done
if ((problems > 0)); then
  echo "check_ldd: $problems problem(s)"
  exit 1
fi
echo "check_ldd: every binary resolves from the kit (plus glibc, the C++ runtime and CUDA)"
