"""Adding the calibrated score's reference to a GP artefact (ROS-free).

The reference (:mod:`uq_perception.ntk.calibrated_score`) is the distribution of GP
variances of known validation objects. :func:`add_score_reference` computes it for an
existing detector + GP pair, with the features the training calibrates the OOD threshold
on (:func:`uq_perception.training.train.object_embeddings`: matched detections, ground-truth
boxes for missed objects), and rewrites the GP artefact with it; nothing else in the
artefact changes. Command line::

    python -m uq_perception.training.score_reference --model models/detector.pt \\
        --gp models/detector_gp.npz --split out/detector_data/val

The validation split alone is needed (``uq sim dataset --splits val`` renders it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uq_perception.ntk import ScoreReference


def split_provenance(split_dir: Path) -> str:
    """The reference's ``split`` text: the split's folder name, and the generator, seed,
    size and format of its dataset when ``dataset.json`` beside it says them."""
    manifest_path = split_dir.parent / 'dataset.json'
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return split_dir.name
    if not isinstance(manifest, dict):
        return split_dir.name
    details = [f'{key} {manifest[key]}' for key in ('generator', 'seed', 'n', 'format_version')
               if isinstance(manifest.get(key), (str, int)) and not isinstance(
                   manifest.get(key), bool)]
    text = f'{split_dir.name} ({", ".join(details)})' if details else split_dir.name
    return text if len(text) <= 200 and text.isprintable() else split_dir.name


def add_score_reference(model_path: Path, gp_path: Path, split_dir: Path,
                        out_path: Path | None = None, max_images: int | None = None,
                        progress: bool = False) -> ScoreReference:
    """Compute the score reference of ``gp_path`` on the known objects of ``split_dir``
    and write the GP state, with it, to ``out_path`` (default: over ``gp_path``, atomically).

    Raises
    ------
    ValueError
        If the files do not belong together (feature size, model id), the split's classes
        are not the model's, or the split has no known object.
    FileNotFoundError
        If a file or the split is missing.
    """
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.training.detector_data import load_split
    from uq_perception.training.train import object_embeddings

    model = load_detector(model_path)
    gp = LastLayerNTKGP.load(gp_path, feature_dim=model.embedding_dim,
                             model_id=getattr(model, 'model_id', '') or None)
    split = load_split(split_dir, model.input_size, model.class_names, max_images)
    features, _ = object_embeddings(model, split, progress=progress)
    if len(features) == 0:
        raise ValueError(f'{split_dir}: no known object to take a score reference from')
    reference = gp.calibrate_score(features, split_provenance(Path(split_dir)))
    gp.save(out_path or gp_path)
    return reference


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the calibrated score's reference (validation GP variances) to a GP artefact."""
    from uq_perception.detectors.model_files import default_detector_path, default_gp_path

    parser.add_argument('--model', type=Path, default=default_detector_path(),
                        help='detector weights')
    parser.add_argument('--gp', type=Path, default=default_gp_path(),
                        help='GP artefact of these weights')
    parser.add_argument('--split', type=Path, required=True,
                        help='validation split folder of `uq sim dataset` (annotations.json)')
    parser.add_argument('--out', type=Path, default=None,
                        help='write the GP artefact here (default: rewrite --gp)')
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Compute and store the reference; print its provenance and range."""
    try:
        reference = add_score_reference(args.model, args.gp, args.split, args.out)
    except (OSError, ValueError) as exc:
        print(f'score reference: {exc}', file=sys.stderr)
        return 2
    q = reference.variance_quantiles
    print(f'wrote {args.out or args.gp}: score reference from {reference.count} known objects '
          f'of {reference.split}, model {reference.model_id}; GP variance min {q[0]:.4g}, '
          f'median {q[len(q) // 2]:.4g}, max {reference.maximum:.4g}')
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m uq_perception.training.score_reference``."""
    parser = argparse.ArgumentParser(prog='python -m uq_perception.training.score_reference',
                                     description=(configure.__doc__ or '').strip())
    configure(parser)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == '__main__':
    sys.exit(main())
