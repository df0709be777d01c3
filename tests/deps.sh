#!/bin/sh
# make deps: installs the Debian packages that building and testing shard need, only those
# missing; silent when everything is there. pkg-config finds LuaJIT's flags for the Makefile;
# g++ compiles kernels/*.cu against the CUDA emulator (tests/cuda_emu) for make test;
# gnuplot (without X) draws shard sweep's PNG plots; iproute2's ip makes the network namespaces
# of make test's multi-host tests (tests/netns; Debian's minimal installs lack it).
# qemu-user runs bin/shard on emulated CPUs (tests/spec/cpu_spec.lua: the kernel set picked
# from cpuid on an AVX2-only and a pre-AVX CPU, whatever CPU runs the tests).
PACKAGES="g++ luajit libluajit-5.1-dev lua-busted lua-cjson libopenblas-dev openmpi-bin libopenmpi-dev libreadline-dev pkg-config gnuplot-nox iproute2 qemu-user"

# On the offline GPU node the packages are unpacked, not installed, by .device/env.sh
# (../shared/device/prep.sh gathers them), which names their root in SHARD_DEPS.
[ -n "$SHARD_DEPS" ] && exit 0

missing=""
for p in $PACKAGES; do
  dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be stale or absent on a fresh machine: refresh only if needed (absent,
# as in Debian's container images: at once, or apt-get's first try fails on every package).
ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || $sudo apt-get update
$sudo apt-get install -y --no-install-recommends $missing ||
  { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends $missing; }
