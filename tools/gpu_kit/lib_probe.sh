# Sourced by run.sh: finds the CUDA libraries the kit does not carry (toolkit, driver, or pip's
# nvidia-* wheels), extends LD_LIBRARY_PATH with the folders that hold them, and finds
# compute-sanitizer. Defines probe_cuda_libraries (sets cuda_lib_json) and find_sanitizer.

# The CUDA sonames the kit's binaries may load; libcuda.so.1 is the driver (dlopened by cudart).
cuda_sonames=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2
  libcuda.so.1)

# Folders of the system toolkit and driver, in the order searched (CUDA 13's toolkit keeps
# libnccl.so.2 in lib/, not lib64/).
cuda_system_dirs() {
  local d
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 \
    "${CUDA_HOME:-/usr/local/cuda}/lib" /usr/local/cuda/lib \
    /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
    /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu; do
    [[ -d "$d" ]] && echo "$d"
  done
}

# lib folders of pip's nvidia-* wheels under every python3 site-packages folder.
cuda_pip_dirs() {
  command -v python3 >/dev/null 2>&1 || return 0
  local site
  for site in $(python3 -c 'import site, sys; print(*site.getsitepackages(), *sys.path)' 2>/dev/null); do
    [[ -d "$site/nvidia" ]] || continue
    find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null
  done | awk '!seen[$0]++'
}

probe_cuda_libraries() {
  local soname d found where entries=() added=()
  local system_dirs pip_dirs
  mapfile -t system_dirs < <(cuda_system_dirs)
  mapfile -t pip_dirs < <(cuda_pip_dirs)
  for soname in "${cuda_sonames[@]}"; do
    found="" where=""
    for d in "${system_dirs[@]}"; do
      if [[ -e "$d/$soname" ]]; then found="$d/$soname" where=system; break; fi
    done
    if [[ -z "$found" ]]; then
      for d in "${pip_dirs[@]}"; do
        if [[ -e "$d/$soname" ]]; then found="$d/$soname" where=pip; break; fi
      done
    fi
    if [[ -n "$found" ]]; then
      d="$(dirname "$found")"
      case "$d" in
        /usr/lib/x86_64-linux-gnu | /lib/x86_64-linux-gnu | /usr/lib64) ;;  # searched anyway
        *) if [[ ":${LD_LIBRARY_PATH:-}:" != *":$d:"* && " ${added[*]} " != *" $d "* ]]; then
          added+=("$d")
        fi ;;
      esac
      echo "cuda library $soname: $found ($where)"
    else
      echo "cuda library $soname: missing"
    fi
    entries+=("\"$soname\": \"${found:-missing}\"")
  done
  local joined
  joined="$(IFS=:; echo "${added[*]}")"
  export LD_LIBRARY_PATH="${joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  cuda_lib_json="$(IFS=,; echo "${entries[*]}")"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

find_sanitizer() {
  local c
  for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer "$(command -v compute-sanitizer || true)" \
    /opt/nvidia/compute-sanitizer/compute-sanitizer; do
    if [[ -n "$c" && -x "$c" ]]; then echo "$c"; return; fi
  done
}
