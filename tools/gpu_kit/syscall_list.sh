#!/usr/bin/env bash
# Writes the kit's syscall-filter.txt from this machine's systemd: `allow NAME` for every system
# call of @system-service (nested @groups expanded) plus @default (which systemd always adds to
# an allow list), and `known NAME` for @known (systemd answers ENOSYS, not EPERM, for a system
# call outside @known). seccomp_exec reads it. Usage: syscall_list.sh OUT
set -euo pipefail
out="${1:?output file}"
command -v systemd-analyze >/dev/null ||
  { echo "syscall_list.sh: systemd-analyze missing (scripts/setup installs systemd)" >&2; exit 1; }

# expand GROUP: the group's system call names, one per line, nested groups expanded.
declare -A seen
expand() {
  local line name
  seen[$1]=1
  while read -r line; do
    name="${line%%[[:space:]]*}"
    case "$name" in
      "" | "#"*) ;;
      @*) [[ -n "${seen[$name]:-}" ]] || expand "$name" ;;
      *) echo "$name" ;;
    esac
  done < <(systemd-analyze --no-pager syscall-filter "$1" | tail -n +2)
}

allow="$( (expand @system-service; expand @default) | sort -u)"
seen=()
known="$(expand @known | sort -u)"
(($(wc -l <<<"$allow") > 100)) || { echo "syscall_list.sh: @system-service has too few calls" >&2; exit 1; }
{
  echo "# @system-service + @default of $(systemctl --version | head -1); known = @known"
  sed 's/^/allow /' <<<"$allow"
  sed 's/^/known /' <<<"$known"
} >"$out"
