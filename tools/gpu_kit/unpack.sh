#!/usr/bin/env bash
# Unpacks the kit's gzipped libraries (lib/*.gz, the large ones, packed to keep the kit small)
# into DEST, outside the kit, so the kit itself stays small enough to carry again; binaries find
# them through LD_LIBRARY_PATH=DEST (run.sh sets it).
# Usage: unpack.sh KIT DEST
set -euo pipefail
kit="$1"
dest="$2"
mkdir -p "$dest"
for packed in "$kit"/lib/*.gz; do
  [[ -e "$packed" ]] || continue
  lib="$dest/$(basename "${packed%.gz}")"
  if ! [[ -e "$lib" && "$lib" -nt "$packed" ]]; then
    gzip -dc "$packed" >"$lib.tmp"
    mv "$lib.tmp" "$lib"
  fi
done
