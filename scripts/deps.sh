#!/usr/bin/env bash
# Installs what building and testing ember needs on Debian 12; does nothing when all of it is there.
# usage: scripts/deps.sh [--bench] [--bench-python] [--fuzz]
#   --bench         libjpeg-turbo-progs (tjbench, the decode limit of bench/bench_images; cjpeg/djpeg for
#                   tests/fixtures/gen_images.py), plasma-workspace-wallpapers (the photographs of
#                   scripts/make_photo_set.sh), and the performance peer of bench/vs_libtorch: the current PyPI `torch` wheel (~1.3 GB), without its
#                   dependencies except two small CUDA runtime libraries that libtorch_cpu loads, in a virtual
#                   environment outside the tree ($EMBER_TORCH_VENV, by default ~/.cache/ember/torch-venv);
#                   vs_libtorch links only its CPU libraries (libtorch_cpu, libc10).
#                   EMBER_TORCH_VERSION=2.15.0 pins a version. Also Debian's libgloo-dev, the Gloo peer of
#                   bench/bench_allreduce.
#   --bench-python  --bench plus the wheel's dependencies (~4 GB: PyPI's Linux wheel is the CUDA build, and `import
#                   torch` loads its CUDA runtime packages), for the Python peers bench/torch_*_peer.py (torch.compile),
#                   torchvision + Pillow (bench/torchvision_loader_peer.py, tests/fixtures/gen_images.py), and the
#                   webdataset package (the reference reader of tests/fixtures/gen_tar.py)
#   --fuzz          accepted for old scripts (clang and libFuzzer are now always installed: the tests run the fuzzers)
set -euo pipefail
# zlib1g-dev: gzip'd IDX files; nlohmann-json3-dev: the tests' independent JSON parser; dataset-fashion-mnist: the examples' data
# clang, libclang-rt-14-dev: libFuzzer for the fuzz jobs of the test suite (ctest's fuzz_smoke, scripts/fuzz.sh)
# time: GNU time, for scripts/compile_time.sh's peak-memory figures
# libopenmpi-dev, openmpi-bin: the mpi backend of the collectives (ember::mpi) and its test under mpirun
# libjpeg62-turbo-dev, libspng-dev: JPEG and PNG decoding (ember::image) and its tests (whose reference decodes are
# committed fixtures: CI needs no djpeg)
# doxygen: the API reference (the docs target) and its check (ctest's docs_api)
pkgs=(cmake g++ make libeigen3-dev doctest-dev libbenchmark-dev zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist
      clang libclang-rt-14-dev time libopenmpi-dev openmpi-bin libjpeg62-turbo-dev libspng-dev doxygen)
bench=0 bench_python=0
for arg in "$@"; do
  case $arg in
    --bench) bench=1 ;;
    --bench-python) bench=1 bench_python=1 ;;
    --fuzz) ;;
    *) echo "usage: $0 [--bench] [--bench-python] [--fuzz]" >&2; exit 2 ;;
  esac
done
[ $bench -eq 0 ] || pkgs+=(python3-venv libgloo-dev)  # (Gloo: bench/allreduce_gloo_peer, bench_allreduce's TCP peer)
[ $bench -eq 0 ] || pkgs+=(libjpeg-turbo-progs plasma-workspace-wallpapers)

missing=()
for p in "${pkgs[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all installed"
else
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "deps: installing ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
[ $bench -eq 1 ] || exit 0

venv=${EMBER_TORCH_VENV:-$HOME/.cache/ember/torch-venv}
py=$venv/bin/python
[ -x "$py" ] || python3 -m venv "$venv"
# Where the package is, without importing it (an import needs the CUDA packages that --bench leaves out).
torch_dir() { "$py" -c "import importlib.util as u, os; s = u.find_spec('torch'); print(os.path.dirname(s.origin) if s else '')"; }
want=torch${EMBER_TORCH_VERSION:+==$EMBER_TORCH_VERSION}
if [ -z "$(torch_dir)" ] || { [ -n "${EMBER_TORCH_VERSION:-}" ] && ! grep -q "^__version__ = '$EMBER_TORCH_VERSION" "$(torch_dir)/version.py"; }; then
  echo "deps: pip install --no-deps $want into $venv"
  "$py" -m pip install --quiet --no-deps "$want"
fi
version=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$(torch_dir)/version.py")
# libtorch_cpu.so itself needs two small CUDA runtime libraries (libcudart, libcupti; ~7 MB) at load time: the
# versions the wheel names (its cuda-toolkit requirement), with their cudart and cupti parts only.
toolkit=$(grep -o 'cuda-toolkit\[[^]]*\]==[0-9.]*' "$(torch_dir)/../torch-${version%%+*}.dist-info/METADATA" | head -1 || true)
if [ -n "$toolkit" ] && ! ls "$(torch_dir)"/../nvidia/*/lib/libcupti.so.* > /dev/null 2>&1; then
  echo "deps: the CUDA runtime libraries libtorch_cpu loads: ${toolkit%%\[*}[cudart,cupti]==${toolkit##*==}"
  "$py" -m pip install --quiet "${toolkit%%\[*}[cudart,cupti]==${toolkit##*==}"
  echo "deps: (pip lists the wheel's other requirements as missing: they are left out on purpose)"
fi
if [ $bench_python -eq 1 ]; then
  echo "deps: torch $version's dependencies (for the Python peers) into $venv"
  "$py" -m pip install --quiet "torch==${version%%+*}"
  # bench/torchvision_loader_peer.py and tests/fixtures/gen_images.py: the torchvision that matches this torch;
  # tests/fixtures/gen_tar.py: webdataset
  echo "deps: torchvision, Pillow and webdataset for torch $version into $venv"
  "$py" -m pip install --quiet "torch==${version%%+*}" torchvision pillow webdataset
fi
echo "deps: LibTorch $version in $venv; cmake finds it through -DEMBER_TORCH_PYTHON=$py (the default is ~/.cache/ember/torch-venv/bin/python)"
