#!/usr/bin/env bash
# deps.sh: make sure every tool the build and the tests need is installed.
# Reads: the Debian package database (dpkg) and the files each package must provide.
# Writes: nothing when all is present. As root it installs what is missing with
# apt-get; otherwise it prints the one command to run and exits 1.
# The Makefile runs it once per clone (stamp build/.deps-ok, redone when this
# script changes).
set -euo pipefail

# package            file (a glob) or command it must provide
REQUIRED=(
    "make               make"
    "gcc                gcc"
    "flex               flex"
    "bison              bison"
    "python3            python3"
    "python3-numpy      /usr/lib/python3/dist-packages/numpy/__init__.py"
    "libcriterion-dev   /usr/include/criterion/criterion.h"
    "llvm-14            /usr/lib/llvm-14/bin/llvm-symbolizer"
    "llvm-14-tools      /usr/lib/llvm-14/bin/FileCheck"
    "llvm-14-tools      /usr/lib/llvm-14/bin/not"
    "llvm-14-tools      /usr/lib/llvm-14/build/utils/lit/lit.py"
    "clang              clang"
    "libclang-rt-14-dev /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a"
    "clang-format       clang-format"
    "libopenblas-dev    /usr/include/*/cblas.h"
    "libcjson-dev       /usr/include/cjson/cJSON.h"
    "openmpi-bin        mpirun"
    "openmpi-bin        mpicc"
    "libopenmpi-dev     /usr/lib/*/openmpi/include/mpi.h"
    "pocl-opencl-icd    /etc/OpenCL/vendors/pocl.icd"
    "ocl-icd-opencl-dev /usr/lib/*/libOpenCL.so"
    "opencl-headers     /usr/include/CL/cl.h"
    "clinfo             clinfo"
)

# Is the package installed (when dpkg exists) and is its file or command there?
have()
{
    local pkg=$1 what=$2
    if command -v dpkg-query >/dev/null 2>&1; then
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            return 1
    fi
    case $what in
    /*) compgen -G "$what" >/dev/null ;;
    *) command -v "$what" >/dev/null 2>&1 ;;
    esac
}

missing=()
for row in "${REQUIRED[@]}"; do
    read -r pkg what <<<"$row"
    if ! have "$pkg" "$what"; then
        case " ${missing[*]-} " in
        *" $pkg "*) ;;
        *) missing+=("$pkg") ;;
        esac
    fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

echo "tcc: missing packages: ${missing[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
    echo "tcc: no apt-get here; install the equivalents of: ${missing[*]}" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "tcc: run this, then make again:" >&2
    echo "    sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi

echo "tcc: installing ${missing[*]}" >&2
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"

for row in "${REQUIRED[@]}"; do
    read -r pkg what <<<"$row"
    if ! have "$pkg" "$what"; then
        echo "tcc: $pkg is installed but $what is still missing" >&2
        exit 1
    fi
done
