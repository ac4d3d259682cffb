"""The workspace's packages as their manifests declare them, for the tests that check what a
robot installs: the robot build (README, docs/deployment.md, docker/) selects uq_bringup and
the workspace packages it needs, followed through the manifests."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / 'src'
#: The package the robot build is made for: the stack's launch file, profiles and model.
ROBOT_BRINGUP = 'uq_bringup'
#: The dependency kinds a build and a run need (`rosdep install -t buildtool
#: -t buildtool_export -t build -t build_export -t exec`); test dependencies are left out.
RUN_TAGS = ('depend', 'buildtool_depend', 'buildtool_export_depend', 'build_depend',
            'build_export_depend', 'exec_depend')


def manifests() -> dict[str, Path]:
    """Package name -> its package.xml, for every package of src/."""
    return {path.parent.name: path for path in sorted(SRC.glob('*/package.xml'))}


def run_dependencies(package: str) -> set[str]:
    """Every key a package's manifest names for its build and its run."""
    root = ET.parse(manifests()[package]).getroot()
    return {element.text.strip() for tag in RUN_TAGS for element in root.iter(tag)
            if element.text and element.text.strip()}


def needed_packages(package: str) -> set[str]:
    """``package`` and every workspace package it needs, directly or through others."""
    workspace = set(manifests())
    seen, todo = {package}, [package]
    while todo:
        for dependency in run_dependencies(todo.pop()) & workspace:
            if dependency not in seen:
                seen.add(dependency)
                todo.append(dependency)
    return seen


def robot_packages() -> set[str]:
    """The packages a robot builds: uq_bringup and what it needs."""
    return needed_packages(ROBOT_BRINGUP)
