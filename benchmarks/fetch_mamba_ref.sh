#!/usr/bin/env bash
# Fetch mamba-ssm's source distribution from PyPI and unpack it (nothing is built or
# installed), so that tests/kernels/test_mamba_ref.py can read mamba-ssm's pure-torch reference
# functions on a CPU-only machine.  Prints the folder to export as DYNLAB_MAMBA_REF.
#
#   export DYNLAB_MAMBA_REF="$(bash benchmarks/fetch_mamba_ref.sh)"
#
# Needs the active environment's pip, with torch and setuptools importable (pip reads the
# sdist's metadata by running its setup.py, which imports torch; MAMBA_SKIP_CUDA_BUILD keeps
# it from looking for nvcc).  About 0.2 MB and a few seconds.
set -euo pipefail
version="${MAMBA_SSM_VERSION:-2.3.2.post1}"
dest="${1:-${TMPDIR:-/tmp}/dynlab-mamba-ref}"
src="$dest/mamba_ssm-$version"
if [ ! -f "$src/mamba_ssm/modules/ssd_minimal.py" ]; then
    mkdir -p "$dest"
    python -c "import setuptools" 2>/dev/null || pip install --quiet setuptools >&2
    MAMBA_SKIP_CUDA_BUILD=TRUE pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
        "mamba-ssm==$version" -d "$dest" >&2
    tar -xzf "$dest/mamba_ssm-$version.tar.gz" -C "$dest"
fi
echo "$src"
