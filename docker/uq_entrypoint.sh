#!/usr/bin/env bash
# Entrypoint of the uq-stack images (docker/Dockerfile, docker/Dockerfile.jetson):
#   1. enters the ROS 2 and the workspace environments, with `uq` and the node executables
#      on PATH;
#   2. with UQ_BUILD_ENGINE=1, builds the TensorRT engine UQ_ENGINE_PATH with
#      `uq build-engine` if it does not exist yet (first start on a new device: the engine
#      is specific to the GPU and the TensorRT version, so it is built where it runs and
#      kept on the /var/lib/uq volume); if that fails it stops with exit code 3 and says why;
#   3. runs the command it was given (the images give `ros2 launch uq_bringup
#      uq_stack.launch.py` plus the arguments of `docker run`).
# Paths can be changed for tests: UQ_ROS_SETUP, UQ_WS_SETUP, UQ_MODEL_PATH.
set -euo pipefail

ros_setup=${UQ_ROS_SETUP:-/opt/ros/${ROS_DISTRO:-jazzy}/setup.bash}
ws_setup=${UQ_WS_SETUP:-/opt/uq/setup.bash}
for file in "$ros_setup" "$ws_setup"; do
  [ -f "$file" ] || { echo "uq_entrypoint: missing environment file $file" >&2; exit 2; }
done
# The setup scripts read unset variables.
set +u
# shellcheck source=/dev/null
source "$ros_setup"
# shellcheck source=/dev/null
source "$ws_setup"
set -u
# Console scripts of ament_python packages live in lib/<package>/ (merged or isolated install).
prefix=$(dirname "$ws_setup")
for dir in "$prefix"/lib/uq_* "$prefix"/uq_*/lib/uq_*; do
  [ -d "$dir" ] && PATH="$dir:$PATH"
done
export PATH

if [ "${UQ_BUILD_ENGINE:-0}" = 1 ]; then
  engine=${UQ_ENGINE_PATH:-/var/lib/uq/detector_trt.ep}
  model=${UQ_MODEL_PATH:-$prefix/share/uq_bringup/models/detector.pt}
  if [ ! -s "$engine" ]; then
    echo "uq_entrypoint: building the TensorRT engine $engine from $model (first start;" \
         "this takes minutes)" >&2
    if ! uq build-engine --model "$model" --out "$engine"; then
      echo "uq_entrypoint: error: could not build the TensorRT engine $engine (see above);" \
           "start with backend:=pytorch-cuda or pytorch-cpu, or fix the GPU set-up" >&2
      exit 3
    fi
  fi
fi

exec "$@"
