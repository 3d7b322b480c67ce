#!/usr/bin/env bash
# A fresh virtualenv at DIR holding TORCH (a pip requirement such as torch==2.13.0) and its
# dependencies, nothing else:
#
#   scripts/torch-venv.sh DIR TORCH
#
# The first call for a requirement (and interpreter, $PYTHON) installs it into a base
# virtualenv under .whl/; every call copies that base to DIR. pip unpacking torch and
# compiling its 2,000-odd modules takes about 35 s on 2 cores, and CI makes five such
# environments (the dev venv, the wheel, the sdist, the minimum versions; the newest torch
# has its own base). The package under test is never in a base.
#
# The copy hard-links the base's files (2 s for torch's CPU build, 4 s for the 5 GB CUDA
# build, against 20 s and 55 s for copying the bytes): nothing writes a file in place
# there. pip removes a distribution's files before it installs another version, and
# Python writes bytecode to a new file that replaces the old one. Where the two
# directories cannot share files (another filesystem), the bytes are copied.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 DIR TORCH" >&2; exit 2; }
dir=$1
torch=$2
PYTHON=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
key=$(printf '%s %s' "$torch" "$("$PYTHON" -c 'import sys; print(sys.version)')" \
      | sha256sum | cut -c1-16)
base=$root/.whl/torch-$key
if [ ! -f "$base/.complete" ]; then
    rm -rf "$base"
    mkdir -p "$root/.whl"
    "$PYTHON" -m venv "$base"
    "$base/bin/python" -m pip install -q --disable-pip-version-check "$torch"
    touch "$base/.complete"
fi
rm -rf "$dir"
cp -al "$base" "$dir" 2>/dev/null || { rm -rf "$dir"; cp -a "$base" "$dir"; }
rm -f "$dir/.complete"
