#!/usr/bin/env bash
# Writes the kit's syscall-filter.txt from megatraind's unit and this machine's systemd: `allow
# NAME` for every system call the unit's SystemCallFilter= lines allow (@groups expanded by
# systemd-analyze, nested ones too) plus @default (systemd adds it to every allow list), `known
# NAME` for @known (systemd answers ENOSYS, not EPERM, for a call outside it) and `family AF_X`
# for the unit's RestrictAddressFamilies=. seccomp_exec reads it.
# Usage: syscall_list.sh UNIT OUT
set -euo pipefail
unit="${1:?the systemd unit}" out="${2:?output file}"
command -v systemd-analyze >/dev/null ||
  { echo "syscall_list.sh: systemd-analyze missing (scripts/setup installs systemd)" >&2; exit 1; }

# The unit's values of KEY=, words of every line joined.
unit_values() { sed -n "s/^$1=//p" "$unit" | tr ' ' '\n' | sed '/^$/d'; }

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

if grep -qx 'SystemCallFilter=[[:space:]]*' "$unit"; then
  echo "syscall_list.sh: an empty SystemCallFilter= (a reset) is not supported" >&2
  exit 1
fi
entries="$(unit_values SystemCallFilter)"
[[ -n "$entries" ]] || { echo "syscall_list.sh: $unit has no SystemCallFilter=" >&2; exit 1; }
if grep -q '^~\|:' <<<"$entries"; then
  echo "syscall_list.sh: deny lists (~) and per-call errnos (:) are not supported: $entries" >&2
  exit 1
fi
allow="$(
  expand @default
  while read -r entry; do
    if [[ "$entry" == @* ]]; then expand "$entry"; else echo "$entry"; fi
  done <<<"$entries"
)"
allow="$(sort -u <<<"$allow")"
seen=()
known="$(expand @known | sort -u)"
(($(wc -l <<<"$allow") > 100)) || { echo "syscall_list.sh: only $(wc -l <<<"$allow") calls allowed" >&2; exit 1; }
{
  echo "# SystemCallFilter=$(tr '\n' ' ' <<<"$entries")of $(basename "$unit"), expanded by $(systemctl --version | head -1)"
  while read -r name; do echo "allow $name"; done <<<"$allow"
  while read -r name; do echo "known $name"; done <<<"$known"
  unit_values RestrictAddressFamilies | while read -r family; do echo "family $family"; done
} >"$out"
