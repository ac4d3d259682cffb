"""Synthetic COCO detection dataset of the tabletop (ROS-free).

Layout (the contract with the detector's training and evaluation)::

    DIR/dataset.json                      generation settings and per-split counts
    DIR/<split>/images/<6-digit id>.png   RGB images
    DIR/<split>/annotations.json          COCO: images, annotations, categories

Splits ``val`` and ``test`` hold known objects only; ``train`` holds known objects and,
in some images, auxiliary "other objects" (see :mod:`uq_sim.objects`); ``test_unknown``
holds known and unknown objects with at least one clearly visible unknown object per
image. Unknown shapes never appear outside ``test_unknown``.
Image ids are global (unique across splits, starting at 1) and equal the file number.

Every image is a deterministic function of ``(seed, image id)``, independent of the other
images and of the number of worker processes, so the same seed gives byte-identical
annotations (and images, on the same renderer).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

SPLITS: tuple[str, ...] = ('train', 'val', 'test', 'test_unknown')
DEFAULT_FRACTIONS: dict[str, float] = {'train': 0.7, 'val': 0.1, 'test': 0.1,
                                       'test_unknown': 0.1}
FORMAT_VERSION = 3
_MAX_ATTEMPTS = 20


def split_counts(n: int, fractions: Mapping[str, float] | None = None) -> dict[str, int]:
    """Number of images per split (largest-remainder rounding, sums to ``n``).

    Raises
    ------
    ValueError
        If ``n`` is negative, a split name is unknown, or the fractions are negative or
        do not sum to 1.
    """
    fractions = dict(DEFAULT_FRACTIONS if fractions is None else fractions)
    if n < 0:
        raise ValueError(f'n must be >= 0, got {n}')
    unknown = set(fractions) - set(SPLITS)
    if unknown:
        raise ValueError(f'unknown split(s) {sorted(unknown)}; expected names from {SPLITS}')
    if any(f < 0 or not math.isfinite(f) for f in fractions.values()):
        raise ValueError(f'split fractions must be finite and >= 0, got {fractions}')
    if abs(sum(fractions.values()) - 1.0) > 1e-6:
        raise ValueError(f'split fractions must sum to 1, got {sum(fractions.values())}')
    names = [s for s in SPLITS if s in fractions]
    exact = {s: n * fractions[s] for s in names}
    counts = {s: int(math.floor(exact[s])) for s in names}
    # Hand the remaining images to the largest remainders; ties go to the later split so
    # that tiny datasets still get val/test images.
    order = sorted(names, key=lambda s: (-(exact[s] - counts[s]), -names.index(s)))
    for s in order[:n - sum(counts.values())]:
        counts[s] += 1
    return counts


def image_rng(seed: int, image_id: int, attempt: int = 0) -> np.random.Generator:
    """The random generator of one image (independent streams per seed and image)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(image_id), attempt]))


def _config_for(split: str):  # -> RandomizationConfig (imported lazily: pulls in MuJoCo)
    from uq_sim.randomization import RandomizationConfig
    if split == 'test_unknown':
        return RandomizationConfig(n_known=(1, 4), n_unknown=(1, 2))
    if split == 'train':
        return RandomizationConfig(n_auxiliary=(0, 2))
    return RandomizationConfig()


def render_example(renderer, seed: int, image_id: int, split: str
                   ) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Render image ``image_id`` of ``split`` and its annotations (without ids).

    Scenes are redrawn (deterministically) until the image has an annotated object, and
    for ``test_unknown`` an unknown object that is neither occluded nor truncated.

    Parameters
    ----------
    renderer : uq_sim.scene.SceneRenderer
        Renderer of the dataset's image size.
    seed, image_id : int
        Dataset seed and global image id.
    split : str
        One of :data:`SPLITS`.

    Returns
    -------
    rgb : numpy.ndarray
        (H, W, 3) uint8 image.
    annotations : list of dict
        COCO annotation fields except ``id`` and ``image_id``.

    Raises
    ------
    RuntimeError
        If no valid scene is found within the attempt budget (not expected).
    """
    from uq_sim.randomization import sample_scene

    if split not in SPLITS:
        raise ValueError(f'unknown split {split!r}; expected one of {SPLITS}')
    config = _config_for(split)
    for attempt in range(_MAX_ATTEMPTS):
        rng = image_rng(seed, image_id, attempt)
        renderer.load(sample_scene(rng, config, size=(renderer.width, renderer.height)))
        frame = renderer.render()
        anns = frame.annotations
        if not anns:
            continue
        if split == 'test_unknown' and not any(
                not a.known and not a.occluded and not a.truncated for a in anns):
            continue
        return frame.rgb, [{
            'category_id': a.category_id, 'bbox': list(a.bbox), 'area': a.area, 'iscrowd': 0,
            'occluded': a.occluded, 'truncated': a.truncated,
            'visible_fraction': a.visible_fraction,
        } for a in anns]
    raise RuntimeError(f'no valid scene for image {image_id} of split {split!r} after '
                       f'{_MAX_ATTEMPTS} attempts')


def _write_png(path: Path, rgb: np.ndarray) -> None:
    import cv2

    if not cv2.imwrite(str(path), np.ascontiguousarray(rgb[..., ::-1])):
        raise OSError(f'could not write {path}')


# One renderer per worker process, created by the pool initializer.
_WORKER_RENDERER: Any = None


def _init_worker(width: int, height: int) -> None:
    global _WORKER_RENDERER
    from uq_sim.scene import SceneRenderer
    _WORKER_RENDERER = SceneRenderer(width, height)


def _render_jobs(jobs: Sequence[tuple[int, str, str]], seed: int
                 ) -> list[tuple[int, list[dict[str, Any]]]]:
    """Render and save a batch of (image id, split, png path); returns the annotations."""
    out = []
    for image_id, split, path in jobs:
        rgb, anns = render_example(_WORKER_RENDERER, seed, image_id, split)
        _write_png(Path(path), rgb)
        out.append((image_id, anns))
    return out


def _chunks(items: Sequence, size: int) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def generate_dataset(out_dir: str | Path, n: int, seed: int = 0, width: int = 320,
                     height: int = 240, fractions: Mapping[str, float] | None = None,
                     splits: Sequence[str] | None = None, workers: int = 1,
                     progress: bool = True) -> dict[str, Path]:
    """Render a synthetic COCO dataset of ``n`` images.

    Parameters
    ----------
    out_dir : str or Path
        Output directory (created; existing split files are overwritten).
    n : int
        Total number of images over all splits (also those not generated, see ``splits``).
    seed : int
        Dataset seed; the same seed gives the same dataset.
    width, height : int
        Image size in pixels.
    fractions : mapping of str to float, optional
        Fraction of ``n`` per split, summing to 1 (default 0.7/0.1/0.1/0.1 for train, val,
        test, test_unknown).
    splits : sequence of str, optional
        Generate only these splits; ids stay those of the full dataset.
    workers : int
        Rendering processes (each with its own GL context). The output does not depend on
        it.
    progress : bool
        Show a progress bar on stderr.

    Returns
    -------
    dict of str to Path
        The directory of each generated split (holding ``annotations.json`` and
        ``images/``).

    Raises
    ------
    ValueError
        For invalid sizes, counts, fractions, split names or worker counts.
    """
    from tqdm import tqdm

    from uq_sim.objects import coco_categories

    if not (16 <= width <= 4096 and 16 <= height <= 4096):
        raise ValueError(f'image size must be within 16..4096 pixels, got {width}x{height}')
    if workers < 1:
        raise ValueError(f'workers must be >= 1, got {workers}')
    counts = split_counts(n, fractions)
    selected = list(counts) if splits is None else list(splits)
    bad = [s for s in selected if s not in counts]
    if bad:
        raise ValueError(f'split(s) {bad} not in the dataset splits {list(counts)}')
    out = Path(out_dir)
    layout: dict[str, list[int]] = {}
    next_id = 1
    for split, count in counts.items():
        layout[split] = list(range(next_id, next_id + count))
        next_id += count

    jobs: list[tuple[int, str, str]] = []
    for split in selected:
        images = out / split / 'images'
        images.mkdir(parents=True, exist_ok=True)
        for stale in images.glob('*.png'):
            if re.fullmatch(r'\d{6}\.png', stale.name):
                stale.unlink()
        jobs += [(i, split, str(images / f'{i:06d}.png')) for i in layout[split]]

    results: dict[int, list[dict[str, Any]]] = {}
    bar = tqdm(total=len(jobs), desc='rendering', unit='img', file=sys.stderr,
               disable=not progress)
    batches = list(_chunks(jobs, 8))
    try:
        if workers == 1:
            _init_worker(width, height)
            try:
                for batch in batches:
                    for image_id, anns in _render_jobs(batch, seed):
                        results[image_id] = anns
                        bar.update(1)
            finally:
                if _WORKER_RENDERER is not None:
                    _WORKER_RENDERER.close()
        else:
            # spawn, not fork: a forked child must not inherit the parent's GL state.
            with ProcessPoolExecutor(workers, mp_context=get_context('spawn'),
                                     initializer=_init_worker,
                                     initargs=(width, height)) as pool:
                futures = [pool.submit(_render_jobs, batch, seed) for batch in batches]
                for future in futures:
                    for image_id, anns in future.result():
                        results[image_id] = anns
                        bar.update(1)
    finally:
        bar.close()

    categories = coco_categories()
    paths = {}
    for split in selected:
        images_json: list[dict[str, Any]] = []
        anns_json: list[dict[str, Any]] = []
        for image_id in layout[split]:
            images_json.append({'id': image_id, 'file_name': f'images/{image_id:06d}.png',
                                'width': width, 'height': height})
            for ann in results[image_id]:
                anns_json.append({'id': len(anns_json) + 1, 'image_id': image_id, **ann})
        coco = {
            'info': {'description': f'uq_sim synthetic tabletop, split {split}',
                     'version': FORMAT_VERSION, 'seed': seed},
            'images': images_json, 'annotations': anns_json, 'categories': categories,
        }
        split_dir = out / split
        (split_dir / 'annotations.json').write_text(json.dumps(coco, indent=1) + '\n')
        paths[split] = split_dir

    manifest = {
        'generator': 'uq_sim.dataset', 'format_version': FORMAT_VERSION, 'seed': seed, 'n': n,
        'width': width, 'height': height, 'fractions': dict(fractions or DEFAULT_FRACTIONS),
        'counts': counts, 'categories': categories,
    }
    (out / 'dataset.json').write_text(json.dumps(manifest, indent=1) + '\n')
    return paths


def load_coco(split_dir: str | Path) -> dict[str, Any]:
    """Read ``annotations.json`` of one split directory."""
    return json.loads((Path(split_dir) / 'annotations.json').read_text())
