#!/usr/bin/env bash
# Installs what moekit needs to build and test: Debian's packages, then the pinned PyPI packages
# (the Python package's torch, transformers, pytest, scikit-build-core; CUTLASS headers; NCCL)
# into .venv. Idempotent.
# CUDA is optional: when nvcc is on the PATH (or in /usr/local/cuda/bin) the CUDA backend builds too.
set -euo pipefail
packages=(cmake ninja-build g++ nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
          libbenchmark-dev clang-14 libclang-rt-14-dev python3 python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

# The project venv .venv (ignored by git) holds the PyPI packages below.
cd "$(dirname "$0")/.."
venv_python=".venv/bin/python"
if [ ! -x "$venv_python" ]; then
  python3 -m venv .venv || {
    echo "install_deps: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi

# The Python package (pyproject.toml, python/): its build backend, torch (~540 MB with its
# nvidia-* wheels) and what its tests use (transformers builds the tiny models), pinned.
python_pins=(torch==2.15.0 transformers==5.23.0 safetensors==0.8.0 pytest==9.2.0
             scikit-build-core==1.1.2)
python_missing=()
for pin in "${python_pins[@]}"; do
  have=$("$venv_python" -m pip show "${pin%%==*}" 2>/dev/null | sed -n 's/^Version: //p' || true)
  [ "$have" = "${pin##*==}" ] || python_missing+=("$pin")
done
if ((${#python_missing[@]})); then
  echo "installing into .venv: ${python_missing[*]}"
  "$venv_python" -m pip install -q --disable-pip-version-check "${python_pins[@]}"
fi

# CUTLASS headers for the CUDA prefill path (src/cuda/prefill/): PyPI's nvidia-cutlass wheel,
# pinned, into .venv. Only where nvcc exists (CUDA builds).
cutlass_version="4.2.0.0"
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  have=$("$venv_python" -m pip show nvidia-cutlass 2>/dev/null | sed -n 's/^Version: //p' || true)
  if [ "$have" != "$cutlass_version" ]; then
    echo "installing: nvidia-cutlass==$cutlass_version into .venv"
    # (headers only: the wheel's Python generator and its dependencies are not used)
    "$venv_python" -m pip install -q --disable-pip-version-check --no-deps \
      "nvidia-cutlass==$cutlass_version"
  fi
fi

# NCCL for expert parallelism (cmake/nccl.cmake, MOEKIT_NCCL): PyPI's nvidia-nccl-cu13 wheel
# (nccl.h and libnccl.so.2), pinned to the version torch above requires, into .venv. Only where
# nvcc exists (CUDA builds).
nccl_version="2.30.7"
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  have=$("$venv_python" -m pip show nvidia-nccl-cu13 2>/dev/null | sed -n 's/^Version: //p' || true)
  if [ "$have" != "$nccl_version" ]; then
    echo "installing: nvidia-nccl-cu13==$nccl_version into .venv"
    "$venv_python" -m pip install -q --disable-pip-version-check --no-deps \
      "nvidia-nccl-cu13==$nccl_version"
  fi
fi
