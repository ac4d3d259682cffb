#!/usr/bin/env python3
"""The three-frame figure of the demo (docs/demo_loop.png) from a `uq demo` GIF.

    source scripts/env.sh
    uq demo
    python scripts/demo_figure.py out/demo/overlay.gif docs/demo_loop.png

The frames are chosen by what the GIF shows, read from the colours `uq demo` draws
(``uq_eval.closed_loop.demo_report``): the level from the banner's colour, an open help
request from the magenta box around its object. Picked: the last frame at teleoperation
with the help request open; the first at shared control once it is answered; the middle
frame at assistance. They are scaled by ``--scale`` and set side by side with a white gap.
``--first`` also writes the first of them alone (the demo's look at one frame).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import imageio.v3 as iio
import numpy as np

from uq_eval.closed_loop.demo_report import HELP_COLOUR, LEVEL_COLOURS

#: Height of the level banner above the image, pixels (``annotate_frame``).
BANNER_HEIGHT = 28
#: Image rows below the banner that hold the camera image (``annotate_frame``: 2 x 240).
IMAGE_HEIGHT = 480
GAP = 4


def frame_level(frame: np.ndarray) -> int:
    """The level whose banner colour is nearest to the banner's most common colour."""
    banner = frame[:BANNER_HEIGHT].reshape(-1, 3).astype(np.int64)
    colours, counts = np.unique(banner, axis=0, return_counts=True)
    common = colours[np.argmax(counts)]
    return int(np.argmin([np.abs(common - np.array(c)).sum() for c in LEVEL_COLOURS]))


def help_open(frame: np.ndarray) -> bool:
    """Whether a help request's magenta box is drawn on the camera image."""
    image = frame[BANNER_HEIGHT:BANNER_HEIGHT + IMAGE_HEIGHT].astype(np.int64)
    return int((np.abs(image - np.array(HELP_COLOUR)).sum(axis=-1) < 40).sum()) > 100


def pick_frames(frames: np.ndarray) -> list[int]:
    """Indices of the three frames of the figure (module docstring)."""
    levels = [frame_level(f) for f in frames]
    helping = [help_open(f) for f in frames]
    asking = [i for i, (lv, h) in enumerate(zip(levels, helping, strict=True)) if lv == 0 and h]
    if not asking:
        raise ValueError('no frame at teleoperation with an open help request')
    shared = [i for i in range(asking[-1], len(frames))
              if levels[i] == 2 and not helping[i]]
    assisting = [i for i in range(asking[-1], len(frames)) if levels[i] == 3]
    if not shared or not assisting:
        raise ValueError('the GIF reaches neither shared control nor assistance after the '
                         'help request')
    return [asking[-1], shared[0], assisting[len(assisting) // 2]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('gif', type=Path, help='overlay.gif written by uq demo')
    parser.add_argument('out', type=Path, help='PNG to write')
    parser.add_argument('--scale', type=float, default=2 / 3, help='size of each frame')
    parser.add_argument('--first', type=Path, help='also write the first frame alone here')
    args = parser.parse_args(argv)
    frames = iio.imread(args.gif)
    if frames.ndim != 4 or frames.shape[-1] < 3:
        parser.error(f'{args.gif}: not an animated RGB GIF')
    frames = frames[..., :3]
    try:
        chosen = pick_frames(frames)
    except ValueError as error:
        print(f'error: {args.gif}: {error}', file=sys.stderr)
        return 1
    height, width = frames.shape[1:3]
    size = (round(width * args.scale), round(height * args.scale))
    panels = [cv2.resize(frames[i], size, interpolation=cv2.INTER_AREA) for i in chosen]
    gap = np.full((size[1], GAP, 3), 255, np.uint8)
    figure = np.concatenate([panels[0], gap, panels[1], gap, panels[2]], axis=1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(args.out), cv2.cvtColor(figure, cv2.COLOR_RGB2BGR),
                [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if args.first:
        cv2.imwrite(str(args.first), cv2.cvtColor(panels[0], cv2.COLOR_RGB2BGR),
                    [cv2.IMWRITE_PNG_COMPRESSION, 9])
    print(f'{args.out}: frames {chosen} of {len(frames)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
