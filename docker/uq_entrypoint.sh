#!/usr/bin/env bash
# Entrypoint of the uq-stack images (docker/Dockerfile, docker/Dockerfile.jetson):
#   1. enters the ROS 2 and the workspace environments, with `uq` and the node executables
#      on PATH;
#   2. when the command is the image's `ros2 launch uq_bringup uq_stack.launch.py` and its
#      arguments name no `backend:=`, UQ_BACKEND picks the detector's backend:
#        auto          tensorrt where torch-tensorrt loads, else pytorch-cuda, saying why in
#                      one line (an image built without TORCH_TENSORRT_INDEX has none);
#        tensorrt      builds the TensorRT engine UQ_ENGINE_PATH with `uq build-engine` if it
#                      does not exist yet (first start on a new device: the engine is specific
#                      to the GPU and the TensorRT version, so it is built where it runs and
#                      kept on the /var/lib/uq volume), and runs it; if the build fails it
#                      stops with exit code 3 and says why;
#        other values  passed on as `backend:=<value>`; unset: nothing is added;
#   3. runs the command it was given, with the backend arguments appended.
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
# `uq` is in bin/, which the workspace's setup put on PATH. The node executables live in
# lib/<package>/ (merged or isolated install), where `ros2 run` looks: on PATH too, so that
# a command can start one by name.
prefix=$(dirname "$ws_setup")
for dir in "$prefix"/lib/uq_* "$prefix"/uq_*/lib/uq_*; do
  [ -d "$dir" ] && PATH="$dir:$PATH"
done
export PATH

# Why torch-tensorrt cannot be used here, in one line, or nothing when it can (the node's own
# check; warnings on stderr are not reasons).
tensorrt_problem() {
  python3 - 2>/dev/null <<'PY' || echo "python3 could not check torch-tensorrt"
try:
    from uq_perception.runtime.backends import BackendUnavailableError, import_torch_tensorrt
except Exception as error:  # noqa: BLE001 - whatever stops the check is the reason
    print(f'uq_perception does not load ({type(error).__name__}: {error})'.replace('\n', ' '))
    raise SystemExit(0)
try:
    import_torch_tensorrt()
except BackendUnavailableError as error:
    print(str(error).replace('\n', ' '))
PY
}

backend_args=()
stack=(ros2 launch uq_bringup uq_stack.launch.py)
if [ -n "${UQ_BACKEND:-}" ] && [ $# -ge 4 ] && [ "${*:1:4}" = "${stack[*]}" ] \
   && ! printf '%s\n' "${@:5}" | grep -q '^backend:='; then
  backend=$UQ_BACKEND
  if [ "$backend" = auto ]; then
    problem=$(tensorrt_problem)
    if [ -z "$problem" ]; then
      backend=tensorrt
    else
      echo "uq_entrypoint: running backend pytorch-cuda, not tensorrt: $problem" >&2
      backend=pytorch-cuda
    fi
  fi
  if [ "$backend" = tensorrt ]; then
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
    backend_args=("backend:=tensorrt" "engine_path:=$engine")
  else
    backend_args=("backend:=$backend")
  fi
fi

exec "$@" ${backend_args[@]+"${backend_args[@]}"}
