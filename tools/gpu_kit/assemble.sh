#!/usr/bin/env bash
# Assembles a self-contained GPU kit: stripped binaries in bin/, every non-CUDA, non-glibc shared
# library they load copied (real files) into lib/, RPATH $ORIGIN/../lib, plus run.sh and its data.
# Usage: assemble.sh --files FILE... --bins BINARY... --out DIR
#   (what //tools/gpu_kit:assemble and :gpu_kit_test pass; a relative DIR is taken from
#   $BUILD_WORKING_DIRECTORY when `bazel run` sets it). KIT_VERSION names the build.
set -euo pipefail

files=() bins=() out=""
mode=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --files) mode=files ;;
    --bins) mode=bins ;;
    --out) out="$2"; shift ;;
    *) if [[ $mode == files ]]; then files+=("$1"); elif [[ $mode == bins ]]; then bins+=("$1");
       else echo "assemble.sh: unexpected $1" >&2; exit 2; fi ;;
  esac
  shift
done
[[ -n "$out" && ${#bins[@]} -gt 0 ]] || { sed -n '4,7p' "$0" >&2; exit 2; }
[[ "$out" == /* ]] || out="${BUILD_WORKING_DIRECTORY:-$PWD}/$out"
for tool in patchelf strip ldd; do
  command -v "$tool" >/dev/null || { echo "assemble.sh: $tool missing (scripts/setup installs it)" >&2; exit 1; }
done

# Refuse to empty a folder that is not an earlier kit.
if [[ -e "$out" && -n "$(ls -A "$out")" && ! -e "$out/.gpu-kit" ]]; then
  echo "assemble.sh: $out exists, is not empty and is not a kit; not touching it" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/share/text"
touch "$out/.gpu-kit"

# glibc, the C++ runtime and CUDA stay on the machine: machine_libs.sh (one of --files) says so.
for f in "${files[@]}"; do [[ "$(basename "$f")" == machine_libs.sh ]] && source "$f"; done
[[ -n "${machine_libs:-}" ]] || { echo "assemble.sh: machine_libs.sh not among --files" >&2; exit 1; }

for bin in "${bins[@]}"; do
  name="$(basename "$bin")"
  [[ -e "$out/bin/$name" ]] && { echo "assemble.sh: two binaries named $name" >&2; exit 1; }
  listing="$(ldd "$bin")"
  if grep -q "not found" <<<"$listing"; then
    echo "assemble.sh: $bin has unresolved libraries here:" >&2
    grep "not found" <<<"$listing" >&2
    exit 1
  fi
  while read -r soname arrow path _; do
    [[ "$arrow" == "=>" && ! "$soname" =~ $machine_libs && ! -e "$out/lib/$soname" ]] || continue
    cp -L "$path" "$out/lib/$soname"  # follows Bazel's _solib symlinks to the real file
  done <<<"$listing"
  cp -L "$bin" "$out/bin/$name"
done
chmod -R u+w "$out/bin" "$out/lib"
for lib in "$out"/lib/*; do
  strip --strip-unneeded "$lib"
  patchelf --force-rpath --set-rpath '$ORIGIN' "$lib"
done
# Libraries over 256 KiB (OpenBLAS alone is 37 MB) travel gzipped, so the kit and the working
# tree stay under the device tool's 64 MiB together; run.sh calls unpack.sh first.
find "$out/lib" -type f -size +256k -exec gzip -9 {} +
for bin in "$out"/bin/*; do
  strip --strip-all "$bin"
  # DT_RPATH (not RUNPATH): it outranks LD_LIBRARY_PATH and covers indirect loads too. CUDA 13's
  # toolkit keeps libnccl.so.2 in lib/, the rest in lib64/.
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib:/usr/local/cuda/lib64:/usr/local/cuda/lib' "$bin"
done

for f in "${files[@]}"; do
  case "$f" in
    *.json | *.textproto) cp "$f" "$out/share/" ;;
    *) cp "$f" "$out/" ;;
  esac
done
chmod +x "$out"/*.sh
# Training text for the byte-level tiny model: Debian's fortunes-min "cookie" file (scripts/setup
# installs it) when present, else generated lines.
if [[ -r /usr/share/games/fortunes/cookie ]]; then
  cp /usr/share/games/fortunes/cookie "$out/share/text/cookie"
else
  for i in $(seq 1 4000); do echo "line $i: the kit trains on this text when no fortunes exist."; done \
    >"$out/share/text/generated.txt"
fi

# VERSION: the build and the newest glibc symbol version the kit needs.
needs="$( (objdump -T "$out"/bin/* "$out"/lib/*.so* 2>/dev/null || true) | grep -o 'GLIBC_[0-9.]*\|GLIBCXX_[0-9.]*' |
  sort -V | awk -F_ '{last[$1] = $0} END {print last["GLIBC"], last["GLIBCXX"]}')"
echo "${KIT_VERSION:-unversioned}; needs $needs or newer" >"$out/VERSION"
(cd "$out" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2) >"$out/MANIFEST"
size=$(du -sb "$out" | cut -f1)
echo "assemble.sh: kit at $out: ${#bins[@]} binaries, $(ls "$out/lib" | wc -l) libraries," \
  "$((size / 1048576)) MiB ($size bytes); $(cat "$out/VERSION")"
