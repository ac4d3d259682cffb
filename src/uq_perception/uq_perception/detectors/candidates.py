"""The shipped detector's candidate tensors packed into one buffer (ROS-free).

Every backend of the shipped detector returns the top-K candidates of
:meth:`uq_perception.detectors.centernet.CenterNetDetector.forward` as one float32 tensor,
so a frame needs a single device-to-host copy (the full maps never leave the device) and the ONNX
export has one output.
"""

from __future__ import annotations

import torch

#: The candidate tensors :meth:`CenterNetDetector.decode` reads, in the order they are packed.
DECODED_OUTPUTS = ('scores', 'boxes', 'embeddings', 'logits')


def pack_candidates(outputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """The decoded outputs as one float32 ``(B, K, 1 + 4 + D + C)`` tensor on their device,
    and the width of each part."""
    parts = [outputs['scores'].unsqueeze(-1)] + [outputs[k] for k in DECODED_OUTPUTS[1:]]
    packed = torch.cat([part.float() for part in parts], dim=2)
    return packed, [part.shape[-1] for part in parts]
