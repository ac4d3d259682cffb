"""Rendering-rate benchmark of the simulator (ROS-free)."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np


def benchmark_rendering(n: int = 50, width: int = 320, height: int = 240, seed: int = 0
                        ) -> dict[str, Any]:
    """Measure images per second for dataset generation and for a fixed, animated scene.

    Parameters
    ----------
    n : int
        Images per measurement (after one warm-up image).
    width, height : int
        Image size.
    seed : int
        Dataset seed.

    Returns
    -------
    dict
        ``dataset_images_per_s`` (new random scene per image: compile, render, exact boxes
        with occlusion, no PNG encoding), ``scenario_frames_per_s`` (the sim camera node's
        path: one compiled scene, poses updated, RGB + boxes), per-image milliseconds
        (p50), and the machine.
    """
    from uq_sim.dataset import render_example
    from uq_sim.scenario import get_scenario
    from uq_sim.scene import SceneRenderer

    with SceneRenderer(width, height) as renderer:
        render_example(renderer, seed, 0, 'train')
        times = []
        for i in range(n):
            start = time.perf_counter()
            render_example(renderer, seed, i + 1, 'train' if i % 4 else 'test_unknown')
            times.append(time.perf_counter() - start)
        scenario = get_scenario('tabletop_demo')
        renderer.load(scenario.spec)
        frame_times = []
        for i in range(n + 1):
            start = time.perf_counter()
            scenario.apply(renderer, scenario.duration * i / (n + 1))
            renderer.render()
            if i:
                frame_times.append(time.perf_counter() - start)
    return {
        'width': width, 'height': height, 'n': n,
        'dataset_images_per_s': round(n / sum(times), 2),
        'dataset_ms_p50': round(1e3 * float(np.median(times)), 1),
        'scenario_frames_per_s': round(n / sum(frame_times), 2),
        'scenario_ms_p50': round(1e3 * float(np.median(frame_times)), 1),
        'mujoco_gl': os.environ.get('MUJOCO_GL', ''),
        'cpu_count': os.cpu_count(), 'machine': platform.machine(),
        'load_average_1min': round(os.getloadavg()[0], 2),
    }
