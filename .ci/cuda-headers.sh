#!/usr/bin/env bash
# Puts cuda.h and libcuda.so (Debian's CUDA 11.8 headers and the 535 driver
# stub, non-free) under DIR/include and DIR/lib, so that the `cuda` build
# tag can be vetted and compiled on a machine without a GPU. Idempotent.
# Usage: .ci/cuda-headers.sh DIR
set -euo pipefail
dir=${1:?usage: cuda-headers.sh DIR}
if [ -f "$dir/include/cuda.h" ] && [ -e "$dir/lib/libcuda.so" ]; then exit 0; fi
src=/etc/apt/sources.list.d/debian.sources
if [ -f "$src" ] && ! grep -q '^Components:.*non-free' "$src"; then
	sed -i 's/^Components: main$/Components: main non-free/' "$src"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for try in 1 2 3; do
	if apt-get update -qq && (cd "$tmp" && apt-get download -qq nvidia-cuda-dev libcuda1); then break; fi
	[ "$try" = 3 ] && { echo "cuda-headers: apt download failed" >&2; exit 1; }
	sleep 5
done
mkdir -p "$dir/include" "$dir/lib" "$tmp/x"
dpkg-deb --fsys-tarfile "$tmp"/nvidia-cuda-dev_*.deb | tar x -C "$tmp/x" ./usr/include/cuda.h
dpkg-deb -x "$tmp"/libcuda1_*.deb "$tmp/x"
cp "$tmp/x/usr/include/cuda.h" "$dir/include/"
cp -a "$tmp"/x/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so* "$dir/lib/"
[ -e "$dir/lib/libcuda.so" ] || ln -s libcuda.so.1 "$dir/lib/libcuda.so"
echo "cuda-headers: $dir ready"
