# Enter the workspace environment in a shell:  source scripts/env.sh
# (activates .venv with ROS 2 Jazzy and sources the colcon overlay of this workspace).
_uq_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
if [ ! -f "$_uq_root/install/setup.bash" ]; then
  echo "uq: workspace not built yet; run 'make setup' in $_uq_root first" >&2
  return 1 2>/dev/null || exit 1
fi
source "$_uq_root/.venv/bin/activate"
export AMENT_PREFIX_PATH="$_uq_root/.venv${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
# colcon's setup scripts read unset variables; relax nounset while sourcing them.
case $- in *u*) _uq_nounset=1; set +u;; *) _uq_nounset=0;; esac
source "$_uq_root/install/setup.bash"
# Optional: vision_msgs built from source by scripts/build_vision_msgs.sh (docs/deployment.md);
# the detector then also publishes vision_msgs/Detection2DArray.
if [ -f "$_uq_root/build/vision_msgs_ws/install/local_setup.bash" ]; then
  source "$_uq_root/build/vision_msgs_ws/install/local_setup.bash"
fi
[ "$_uq_nounset" = 1 ] && set -u
# `uq` is on PATH from install/setup.bash (uq_common installs it to bin/). The node
# executables live in lib/<package>, where `ros2 run` looks; put them on PATH too so they run
# directly (there is no `ros2 run` from PyPI).
for _uq_pkg in uq_perception uq_autonomy uq_sim; do
  [ -d "$_uq_root/install/$_uq_pkg/lib/$_uq_pkg" ] && PATH="$_uq_root/install/$_uq_pkg/lib/$_uq_pkg:$PATH"
done
export PATH
export MUJOCO_GL=${MUJOCO_GL:-egl}
# Fast DDS profile for camera-sized images on one host (docs/dds.md); a profile the user
# already chose wins.
export FASTRTPS_DEFAULT_PROFILES_FILE=${FASTRTPS_DEFAULT_PROFILES_FILE:-$_uq_root/config/dds/fastdds_large_images.xml}
export UQ_WORKSPACE="$_uq_root"
unset _uq_root _uq_pkg _uq_nounset
