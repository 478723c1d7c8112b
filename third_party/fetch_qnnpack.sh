#!/usr/bin/env bash
# Obtain PyTorch's QNNPACK (pytorch_qnnpack) source through apt's own client and
# install its Debian-packaged dependencies. Idempotent.
#
#   third_party/fetch_qnnpack.sh [CACHE_DIR]
#
# Result: CACHE_DIR/qnnpack (default: third_party/.cache/qnnpack), the subtree
# aten/src/ATen/native/quantized/cpu/qnnpack of Debian's pytorch 1.13.1 source.
# Off Debian, or without root: check out QNNPACK yourself and pass its path as
# QPACK_QNNPACK_SOURCE_DIR instead.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${1:-$here/.cache}"
dest="$cache/qnnpack"
tarball="pytorch_1.13.1+dfsg.orig.tar.xz"
sha256="d0355588b8528566d477e6ebf1b4d9d036a6fd75711339f66b27472ce5879dc7"
subtree="aten/src/ATen/native/quantized/cpu/qnnpack"
deps=(libcpuinfo-dev libpthreadpool-dev libfp16-dev libfxdiv-dev libpsimd-dev libxxhash-dev)

die() { echo "fetch_qnnpack: $*" >&2; exit 1; }
escape="Set QPACK_QNNPACK_SOURCE_DIR to a checkout of $subtree (from PyTorch 1.13) instead."

if [[ -f "$dest/CMakeLists.txt" && -f "$dest/.qpack-sha256" ]] \
   && [[ "$(cat "$dest/.qpack-sha256")" == "$sha256" ]]; then
  missing=()
  for p in "${deps[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "fetch_qnnpack: $dest is ready"
    exit 0
  fi
fi

[[ -r /etc/debian_version ]] || die "not a Debian system (no /etc/debian_version). $escape"
[[ "$(id -u)" == 0 ]] || die "must run as root to use apt-get. $escape"
command -v apt-get >/dev/null || die "apt-get not found. $escape"

# A deb-src entry derived from the existing Debian sources entry.
src_list=/etc/apt/sources.list.d/qpack-debian-src.sources
need_update=0
if [[ ! -f "$src_list" ]]; then
  base=/etc/apt/sources.list.d/debian.sources
  if [[ -f "$base" ]]; then
    # Keep only the first stanza (the main archive), switch its type to deb-src.
    awk 'BEGIN{RS=""; ORS="\n\n"} NR==1{print}' "$base" \
      | sed -e 's/^Types:.*/Types: deb-src/' > "$src_list"
  elif [[ -f /etc/apt/sources.list ]] && grep -q '^deb ' /etc/apt/sources.list; then
    grep -m1 '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' \
      > /etc/apt/sources.list.d/qpack-debian-src.list
    src_list=/etc/apt/sources.list.d/qpack-debian-src.list
  else
    die "no Debian sources entry found to derive a deb-src entry from. $escape"
  fi
  need_update=1
fi
stamp="$cache/.apt-updated"
mkdir -p "$cache"
if [[ $need_update == 1 || ! -f "$stamp" ]]; then
  apt-get update -qq
  touch "$stamp"
fi

missing=()
for p in "${deps[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [[ ${#missing[@]} -gt 0 ]]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ ! -f "$dest/CMakeLists.txt" || ! -f "$dest/.qpack-sha256" ]]; then
  dl="$cache/download"
  mkdir -p "$dl"
  if [[ ! -f "$dl/$tarball" ]]; then
    (cd "$dl" && apt-get source --download-only --tar-only pytorch >/dev/null) \
      || die "apt-get source pytorch failed. $escape"
  fi
  [[ -f "$dl/$tarball" ]] || die "apt-get did not produce $tarball (got: $(ls "$dl")). $escape"
  echo "$sha256  $dl/$tarball" | sha256sum -c --quiet - \
    || die "sha256 mismatch for $tarball. $escape"
  rm -rf "$dest" "$cache/extract"
  mkdir -p "$cache/extract"
  tar -xJf "$dl/$tarball" -C "$cache/extract" --wildcards "*/$subtree"
  found="$(find "$cache/extract" -type d -path "*/$subtree" -print -quit)"
  [[ -n "$found" ]] || die "$subtree not found in $tarball. $escape"
  mv "$found" "$dest"
  rm -rf "$cache/extract"
  echo "$sha256" > "$dest/.qpack-sha256"
fi
echo "fetch_qnnpack: $dest is ready"
