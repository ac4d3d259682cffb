"""Follow-up teaching (ROS-free): an answered object keeps teaching the detector while its
track is still wrong or uncertain.

A person's answer is taught with one embedding: the object as it looked in the frame the
request was made on. When the object then looks different (it was asked about while being
put down and now rests on the table, the light or a shadow changes, it is partly occluded),
that single point may not cover it, and the detector goes on calling it something else. The
person has already said what the track is, so the track's later embeddings can carry the
same label: while the answered track is classified as another class or its uncertainty (the
help policy's signal) stays above the threshold, one of its embeddings is taught again, at
most ``max_per_object`` times and at least ``min_interval_s`` apart. Tracks unseen for
``track_timeout_s`` are forgotten, and a backwards clock (a restarted detector numbers its
tracks anew) forgets all, so a label never follows a track id onto another object; the clock
then restarts at that stamp, so one stamp from the future does not make every later frame
forget all again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FollowUpConfig:
    """Limits of follow-up teaching; ``max_per_object`` 0 turns it off."""

    max_per_object: int = 3
    min_interval_s: float = 1.0
    track_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_per_object < 0:
            raise ValueError(f'max_per_object must be >= 0, got {self.max_per_object}')
        for name in ('min_interval_s', 'track_timeout_s'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f'{name} must be finite and >= 0, got {value}')


@dataclass
class _Binding:
    request_id: str
    label: str
    last_seen: float
    taught: int = 0
    last_taught: float = -math.inf


class FollowUpTeacher:
    """Which answered tracks need another teaching; time is the image stamp, seconds."""

    def __init__(self, config: FollowUpConfig | None = None) -> None:
        self.config = config or FollowUpConfig()
        self._tracks: dict[int, _Binding] = {}
        self._newest = -math.inf

    def bind(self, track_id: int, request_id: str, label: str, now: float) -> None:
        """The person answered ``request_id`` (made on ``track_id``) with ``label``."""
        if track_id >= 0:
            self._tracks[track_id] = _Binding(request_id, label, now)

    def observe(self, now: float, track_id: int, class_name: str, uncertainty: float,
                threshold: float) -> str | None:
        """An update id to teach this detection's embedding under, or ``None``.

        The id is ``<request_id>#follow-<n>``, so the detector applies each one once.
        """
        if now < self._newest - 1.0:
            self._tracks.clear()  # clock reset: track ids no longer mean the same objects
            self._newest = now
        self._newest = max(self._newest, now)
        for stale in [t for t, b in self._tracks.items()
                      if now - b.last_seen > self.config.track_timeout_s]:
            del self._tracks[stale]
        binding = self._tracks.get(track_id)
        if binding is None:
            return None
        binding.last_seen = now
        # Labels are stored case-folded (uq_common.class_labels); a base class may not be.
        if class_name.casefold() == binding.label and not uncertainty > threshold:
            return None
        if binding.taught >= self.config.max_per_object or \
                now - binding.last_taught < self.config.min_interval_s:
            return None
        binding.taught += 1
        binding.last_taught = now
        return f'{binding.request_id}#follow-{binding.taught}'

    def label_of(self, track_id: int) -> str | None:
        """The label a bound track carries."""
        binding = self._tracks.get(track_id)
        return None if binding is None else binding.label
