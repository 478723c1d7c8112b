#!/usr/bin/env bash
# Debian's default-jdk-headless (javac, java and the JNI headers) for make jni-test,
# through apt only. Idempotent: fast when already installed. Prints JAVA_HOME.
set -euo pipefail
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
if ! installed default-jdk-headless; then
  [[ "$(id -u)" == 0 ]] || { echo "jdk_deps: run as root to apt-get install default-jdk-headless" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  echo "jdk_deps: installing default-jdk-headless" >&2
  apt-get install -y -qq default-jdk-headless >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq default-jdk-headless >/dev/null; }
fi
javac="$(readlink -f "$(command -v javac)")"
home="$(dirname "$(dirname "$javac")")"
[[ -f "$home/include/jni.h" ]] || { echo "jdk_deps: no jni.h under $home/include" >&2; exit 1; }
echo "$home"
