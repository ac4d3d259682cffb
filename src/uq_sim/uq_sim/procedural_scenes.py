"""Scenes with one held-out procedural unknown object each (ROS-free).

The tabletop scenes of ``uq eval detector --procedural-unknowns``: like the ``test_unknown``
split's, with a shape from :mod:`uq_sim.procedural_objects` in place of the fixed unknown
ones, each drawn from its own seeded stream so that object ``index`` is the same on every
machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from uq_sim.procedural_objects import PROCEDURAL_CLASSES

if TYPE_CHECKING:
    from uq_sim.scene import ObjectAnnotation, SceneRenderer, SceneSpec

# Spawn key of the scene random streams: with it, SeedSequence([seed, index, attempt])
# gives streams independent of the dataset's SeedSequence([seed, image_id, attempt]).
PROCEDURAL_STREAM = 0x70726F63
# Largest accepted number of procedural objects per evaluation (one scene each).
MAX_PROCEDURAL_OBJECTS = 5000
_MAX_ATTEMPTS = 20


def procedural_scene_rng(seed: int, index: int, attempt: int = 0) -> np.random.Generator:
    """Random stream of procedural scene ``index``: its own spawn key keeps it apart from
    every dataset image's stream (``uq_sim.dataset.image_rng``) for any seed."""
    return np.random.default_rng(np.random.SeedSequence(
        [int(seed), int(index), int(attempt)], spawn_key=(PROCEDURAL_STREAM,)))


def procedural_family(index: int) -> str:
    """The family of procedural object ``index`` (the families take turns)."""
    return PROCEDURAL_CLASSES[index % len(PROCEDURAL_CLASSES)]


def procedural_scene(seed: int, index: int, attempt: int = 0,
                     size: tuple[int, int] = (320, 240)) -> SceneSpec:
    """A randomised tabletop scene like the ``test_unknown`` split's, with one procedural
    object in place of the fixed unknown ones: 1-4 known objects, clutter, lights, camera
    and gripper drawn by :func:`uq_sim.randomization.sample_scene`.

    ``size`` is the image (width, height).
    """
    from uq_sim.randomization import RandomizationConfig, sample_scene

    config = RandomizationConfig(n_known=(1, 4), n_unknown=(1, 1))
    return sample_scene(procedural_scene_rng(seed, index, attempt), config,
                        unknown_classes=(procedural_family(index),), size=size)


def render_procedural_example(renderer: SceneRenderer, seed: int, index: int
                              ) -> tuple[np.ndarray, list[ObjectAnnotation]]:
    """RGB image and annotations of procedural scene ``index``.

    As in the ``test_unknown`` split, scenes are redrawn (deterministically) until the
    procedural object is annotated, neither occluded nor truncated.

    Raises
    ------
    RuntimeError
        If no such scene is found within the attempt budget (not expected).
    """
    for attempt in range(_MAX_ATTEMPTS):
        renderer.load(procedural_scene(seed, index, attempt, (renderer.width, renderer.height)))
        frame = renderer.render()
        if any(a.class_name in PROCEDURAL_CLASSES and not a.occluded and not a.truncated
               for a in frame.annotations):
            return frame.rgb, frame.annotations
    raise RuntimeError(f'no valid scene for procedural object {index} (seed {seed}) after '
                       f'{_MAX_ATTEMPTS} attempts')
