#!/usr/bin/env bash
# Install what an aarch64 (arm64) cross build of QNNPACK needs on Debian 12, through
# apt only. Idempotent: fast when already done.
#
#   third_party/cross_deps.sh [CACHE_DIR]
#
# - Debian's cross toolchain (crossbuild-essential-arm64: aarch64-linux-gnu-gcc/g++
#   and the arm64 C/C++ runtime under /usr/aarch64-linux-gnu, the qemu -L sysroot),
# - qemu-user (qemu-aarch64; binfmt is not used: ctest calls qemu-aarch64 itself
#   through CMAKE_CROSSCOMPILING_EMULATOR),
# - QNNPACK's header-only dependencies (libfp16-dev libfxdiv-dev libpsimd-dev:
#   plain headers, the same for every architecture),
# - cpuinfo and pthreadpool for arm64, Debian's own builds, by the first route
#   that works:
#   1. multiarch: dpkg --add-architecture arm64; apt-get install --no-remove
#      libcpuinfo-dev:arm64 libpthreadpool-dev:arm64 (--no-remove: the amd64
#      packages the host build needs stay). On Debian 12 both are refused:
#      libpthreadpool0/-dev are not Multi-Arch: same (apt would remove the amd64
#      ones), and libcpuinfo-dev:arm64's /usr/lib/cmake/cpuinfo/cpuinfo-targets-none.cmake
#      differs from the amd64 copy (dpkg refuses to overwrite the shared file).
#   2. (not possible here) Debian's source packages built for the target: the mirror
#      serves their .dsc but answers 404 for the .orig.tar.xz.
#   3. the same :arm64 .debs, fetched with apt-get download and unpacked with
#      dpkg-deb -x into CACHE_DIR/aarch64/sysroot (default
#      third_party/.cache/aarch64/sysroot), outside dpkg's database.
#   CACHE_DIR/aarch64/route.txt records the route each library took; the toolchain
#   file cmake/toolchains/aarch64-linux-gnu.cmake searches that tree.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${1:-$here/.cache}"
cache="$(mkdir -p "$cache" && cd "$cache" && pwd)"
adir="$cache/aarch64"
sysroot="$adir/sysroot"
host_pkgs=(crossbuild-essential-arm64 qemu-user cmake ninja-build
           libfp16-dev libfxdiv-dev libpsimd-dev)
libs=(cpuinfo pthreadpool)

die() { echo "cross_deps: $*" >&2; exit 1; }
log() { echo "cross_deps: $*"; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# Is library $1 ready for the target: an installed :arm64 -dev package, or the
# :arm64 packages unpacked into $sysroot?
lib_ready() {
  local l="$1"
  installed "lib$l-dev:arm64" && [[ -e /usr/lib/aarch64-linux-gnu/lib$l.so ]] && return 0
  [[ -f "$sysroot/.unpacked-$l" && -e "$sysroot/usr/lib/aarch64-linux-gnu/lib$l.so" ]] && return 0
  return 1
}

all_ready() {
  for p in "${host_pkgs[@]}"; do installed "$p" || return 1; done
  command -v qemu-aarch64 >/dev/null || return 1
  for l in "${libs[@]}"; do lib_ready "$l" || return 1; done
  return 0
}

if all_ready; then
  log "ready ($(cat "$adir/route.txt" 2>/dev/null | tr '\n' ' '))"
  exit 0
fi

[[ -r /etc/debian_version ]] || die "not a Debian system"
[[ "$(id -u)" == 0 ]] || die "must run as root to use apt-get"
command -v apt-get >/dev/null || die "apt-get not found"
export DEBIAN_FRONTEND=noninteractive

mkdir -p "$adir"
added_arch=0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  added_arch=1
fi
stamp="$adir/.apt-updated"
if [[ $added_arch == 1 || ! -f "$stamp" ]]; then
  apt-get update -qq
  touch "$stamp"
fi

missing=()
for p in "${host_pkgs[@]}"; do installed "$p" || missing+=("$p"); done
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]}"
  apt-get install -y -qq --no-remove "${missing[@]}" >/dev/null
fi
command -v aarch64-linux-gnu-g++ >/dev/null || die "aarch64-linux-gnu-g++ missing after install"
command -v qemu-aarch64 >/dev/null || die "qemu-aarch64 missing after install"

: > "$adir/route.txt.new"
for l in "${libs[@]}"; do
  if installed "lib$l-dev:arm64" && [[ -e /usr/lib/aarch64-linux-gnu/lib$l.so ]]; then
    echo "$l: multiarch lib$l-dev:arm64 (installed)" >> "$adir/route.txt.new"; continue
  fi
  if [[ -f "$sysroot/.unpacked-$l" ]]; then
    echo "$l: $(cat "$sysroot/.unpacked-$l") unpacked into $sysroot" >> "$adir/route.txt.new"; continue
  fi
  # Route 1: multiarch install. --no-remove: never take the amd64 twin away. apt's
  # simulation catches a package without Multi-Arch: same (pthreadpool: apt wants to
  # remove the amd64 one); a file clash between the two architectures' copies only
  # shows when dpkg unpacks (cpuinfo: /usr/lib/cmake/cpuinfo/cpuinfo-targets-none.cmake
  # differs), so a failed install is rolled back to a consistent dpkg state.
  log_f="$adir/apt-$l.log"
  if apt-get install -s --no-remove "lib$l-dev:arm64" >"$log_f" 2>&1; then
    if apt-get install -y -qq --no-remove "lib$l-dev:arm64" >>"$log_f" 2>&1; then
      log "$l: installed lib$l-dev:arm64 (multiarch)"
      echo "$l: multiarch lib$l-dev:arm64 (installed)" >> "$adir/route.txt.new"; continue
    fi
    dpkg --configure -a >>"$log_f" 2>&1 || true   # the dependencies it unpacked
  fi
  reason="$(grep -E '^E:|trying to overwrite' "$log_f" | grep -v 'Sub-process' | head -1 | sed 's/^ *//')"
  log "$l: lib$l-dev:arm64 cannot be co-installed with the amd64 package: $reason"
  # Route 2 (the brief's first fallback), Debian's source package built for the
  # target, is not available here: apt-get source cpuinfo / pthreadpool get their
  # .dsc but a 404 for the .orig.tar.xz (and pthreadpool's .debian.tar.xz) from the
  # mirror, and pytorch's dfsg tarball has empty third_party/cpuinfo, pthreadpool.
  # Route 3: the same Debian :arm64 binary packages, fetched with apt-get download
  # and unpacked with dpkg-deb into a private tree (no dpkg database entry, so no
  # clash with the amd64 twin). The toolchain file searches that tree first.
  dl="$adir/debs"; mkdir -p "$dl" "$sysroot"
  rm -f "$dl"/lib"$l"*_arm64.deb
  pkgs=("lib$l-dev:arm64" "lib${l}0:arm64")
  (cd "$dl" && apt-get download -qq "${pkgs[@]}" >>"$log_f" 2>&1) \
    || die "apt-get download ${pkgs[*]} failed (see $log_f)"
  desc=""
  for deb in "$dl"/lib"$l"*_arm64.deb; do
    dpkg-deb -x "$deb" "$sysroot"
    desc+="$(basename "$deb") "
  done
  [[ -e "$sysroot/usr/lib/aarch64-linux-gnu/lib$l.so" ]] \
    || die "lib$l.so missing after unpacking ${pkgs[*]} into $sysroot"
  echo "apt-get download ${desc% }" > "$sysroot/.unpacked-$l"
  log "$l: unpacked ${desc% } into $sysroot"
  echo "$l: $(cat "$sysroot/.unpacked-$l") unpacked into $sysroot" >> "$adir/route.txt.new"
done
mv "$adir/route.txt.new" "$adir/route.txt"
log "ready ($(tr '\n' ' ' < "$adir/route.txt"))"
