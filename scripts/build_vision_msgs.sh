#!/usr/bin/env bash
# Build the vision_msgs interfaces from a local source checkout into an overlay of this
# workspace, for development machines where no package provides them (ROS 2 from PyPI has no
# vision_msgs; a robot installs ros-jazzy-vision-msgs with rosdep instead).
#
#   scripts/build_vision_msgs.sh SRC_DIR [OUT_DIR]
#
# SRC_DIR      a checkout of https://github.com/ros-perception/vision_msgs at a Jazzy release
#              (branch ros2 or a 4.x tag); only its vision_msgs package is built, the RViz
#              plugins (which need RViz) are left out.
# OUT_DIR      where colcon builds (OUT_DIR/build, OUT_DIR/log) and installs the overlay
#              (OUT_DIR/install); default build/vision_msgs_ws, whose install/ scripts/env.sh
#              sources when it exists.
#
# Uses colcon and the rosidl generators of the workspace's environment (.venv, from
# `make setup`); nothing is downloaded.
set -euo pipefail

usage() { echo "usage: $0 SRC_DIR [OUT_DIR]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
SRC=$(cd "$1" 2>/dev/null && pwd) || { echo "error: $1 is not a directory" >&2; exit 2; }
DEFAULT_WS="$ROOT/build/vision_msgs_ws"

# The checkout's vision_msgs package: SRC_DIR itself or a folder below it.
manifest=""
for candidate in "$SRC/package.xml" "$SRC"/*/package.xml; do
  if [ -f "$candidate" ] && grep -q '<name>vision_msgs</name>' "$candidate"; then
    manifest=$candidate
    break
  fi
done
if [ -z "$manifest" ]; then
  echo "error: no vision_msgs package (a package.xml named vision_msgs) in $SRC or its folders" >&2
  exit 2
fi
version=$(sed -n 's:.*<version>\(.*\)</version>.*:\1:p' "$manifest" | head -1)
case "$version" in
  4.*) ;;
  *) echo "error: vision_msgs $version in $SRC; ROS 2 Jazzy takes 4.x (branch ros2 or a 4.x tag)" >&2
     exit 2 ;;
esac

[ -x "$VENV/bin/colcon" ] || { echo "error: $VENV/bin/colcon not found: run 'make setup' first" >&2; exit 1; }
WS=${2:-$DEFAULT_WS}
mkdir -p "$WS/log"
WS=$(cd "$WS" && pwd)
INSTALL="$WS/install"

echo "[vision_msgs] building vision_msgs $version from $(dirname "$manifest") into $INSTALL"
(
  # The workspace's ROS (the .venv prefix) underneath, as scripts/setup.sh builds uq_msgs.
  export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH"
  "$VENV/bin/colcon" --log-base "$WS/log" build --base-paths "$(dirname "$manifest")" \
    --packages-select vision_msgs --build-base "$WS/build" --install-base "$INSTALL" \
    --event-handlers console_cohesion- status- summary+ \
    --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$VENV/bin/python" \
    >"$WS/log/colcon-build.txt" 2>&1 \
    || { tail -50 "$WS/log/colcon-build.txt"; echo "error: colcon build of vision_msgs failed (log: $WS/log/colcon-build.txt)" >&2; exit 1; }
)
# Check that the generated Python module imports with the overlay sourced.
(
  set +u
  source "$VENV/bin/activate"
  source "$INSTALL/local_setup.bash"
  python -c 'from vision_msgs.msg import Detection2DArray; Detection2DArray()' \
    || { echo "error: vision_msgs was built but does not import" >&2; exit 1; }
)
echo "[vision_msgs] done; 'source scripts/env.sh' picks it up from $INSTALL"
[ "$WS" = "$DEFAULT_WS" ] || echo "[vision_msgs] (not the default location: source $INSTALL/local_setup.bash after scripts/env.sh)"
