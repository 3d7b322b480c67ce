#!/usr/bin/env bash
# The GPU checks in one call, for a machine with a CUDA device and a torch of its own
# (an image's CUDA build): the plugin from this checkout on PYTHONPATH with its pytest
# entry point, the native harness built, tests/gpu run, then the CUDA benchmarks.
#
#   scripts/gpu-check.sh [OUTDIR]     (default: $OUT, else benchmarks/results)
#
# Writes gpu-tests.txt (the tests' summary), digest-cuda.txt and repeat-cuda.txt to
# OUTDIR; copy the ones worth keeping to benchmarks/results/ with the GPU in the name.
# Nothing is installed into the image's site-packages.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-benchmarks/results}}
mkdir -p "$out"
python=${PYTHON:-python3}
site=$(mktemp -d)
version=$("$python" -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
info="$site/pytest_backends-$version.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: pytest-backends\nVersion: %s\n' "$version" >"$info/METADATA"
printf '[pytest11]\nbackends = pytest_backends.plugin\n' >"$info/entry_points.txt"
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTEST_BACKENDS_CACHE_DIR=${PYTEST_BACKENDS_CACHE_DIR:-$site/cache}

"$python" - <<'EOF'
import platform, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}")
print(f"GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
EOF
"$python" -m pytest_backends build-native || echo "native build failed: the tests use the fallback"

status=0
"$python" -m pytest tests/gpu -q -p no:cacheprovider -p no:randomly -rfE --durations=10 \
    2>&1 | tee "$out/gpu-tests.txt" || status=1
"$python" benchmarks/bench_digest.py --device cuda --out "$out/digest-cuda.txt" || status=1
"$python" benchmarks/bench_repeat.py --device cuda --out "$out/repeat-cuda.txt" || status=1
exit $status
