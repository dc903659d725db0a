#!/usr/bin/env bash
# Restores the kit's gzipped libraries (lib/*.gz, the large ones, packed to keep the kit small):
# into lib/ when the kit is writable, else into SCRATCH, printed for LD_LIBRARY_PATH.
# Usage: unpack.sh KIT [SCRATCH]   (prints the folder that holds the unpacked libraries)
set -euo pipefail
kit="$1"
dest="$kit/lib"
if ! [[ -w "$dest" ]]; then
  dest="${2:?the kit is read-only: name a scratch folder}"
  mkdir -p "$dest"
fi
for packed in "$kit"/lib/*.gz; do
  [[ -e "$packed" ]] || continue
  lib="$dest/$(basename "${packed%.gz}")"
  if ! [[ -e "$lib" && "$lib" -nt "$packed" ]]; then
    gzip -dc "$packed" >"$lib.tmp"
    mv "$lib.tmp" "$lib"
  fi
done
echo "$dest"
