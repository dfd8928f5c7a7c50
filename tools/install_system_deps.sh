#!/usr/bin/env bash
# Installs the Debian packages fastload builds against, only when they are missing.
# libjpeg-turbo is the C++ engine's one native dependency; pkg-config is how setup.py finds it.
set -euo pipefail
need=()
[ -f /usr/include/jpeglib.h ] || need+=(libjpeg62-turbo-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v g++ >/dev/null 2>&1 || need+=(g++)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -eq 0 ]; then
  echo "system deps: present (libjpeg-turbo headers, pkg-config, g++)"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system deps: missing ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2
  echo "system deps: continuing; without libjpeg-turbo fastload installs with its Pillow decode path" >&2
  exit 0
fi
echo "system deps: apt-get install ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
