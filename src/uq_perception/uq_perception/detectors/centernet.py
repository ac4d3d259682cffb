"""Compact CenterNet-style object detector with a per-detection embedding (ROS-free).

The network maps an RGB image to a stride-4 feature map with three dense heads: a
class-agnostic objectness heatmap, the box size (log of the size in feature cells) and the
sub-cell centre offset. Peaks of the heatmap (3x3 max-pool, no NMS) become detections;
for each peak an embedding ``phi`` is read from an embedding map at the peak cell plus a
coarse context map, passed through a small MLP, and classified by one linear layer
``head``. ``(boxes, embeddings, head)`` is what the NTK-GP engine attaches to.

``forward`` is pure tensor code with static shapes (a fixed number of top-K candidates),
so it can be traced or exported for other backends; ``decode`` turns its outputs into
:class:`Detections` with numpy (threshold, top-K cut, mapping back to image pixels).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from uq_common.file_kind import describe_file
from uq_perception.detectors.centernet_io import (
    STRIDE,
    decode_candidates,
    image_array,
)
from uq_perception.detectors.contract import Detections

# The backbone downsamples four times by 2 and the neck upsamples back to stride 4, so
# the input height and width must be multiples of 16 for the skip connections to align.
SIZE_MULTIPLE = 16
FORMAT_NAME = 'uq_perception.centernet_detector'
FORMAT_VERSION = 2
DEFAULT_INPUT_SIZE = (240, 320)
# The embedding samples the stride-8 map on a ROI_GRID x ROI_GRID grid inside the box, at
# these fractions of the box size around its centre (the central part of the object).
ROI_GRID = 3
ROI_SPAN = 2.0 / 3.0
# Hidden activations of the embedding MLP (see CenterNetDetector's embedding_activation).
EMBEDDING_ACTIVATIONS = {
    'relu': lambda: nn.ReLU(inplace=True),
    'leaky_relu': lambda: nn.LeakyReLU(0.2, inplace=True),
}
# Bounds on the predicted log-size (in feature cells) keep exp() finite for any input.
_LOG_SIZE_MIN = -2.0
_LOG_SIZE_MAX = 6.0


class _ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1,
                 groups: int = 1, dilation: int = 1) -> None:
        padding = dilation * (kernel // 2)
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, groups=groups,
                      bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )


class _SeparableBlock(nn.Module):
    """Depthwise 3x3 + pointwise 1x1 convolution, residual when the shape is kept."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.depthwise = _ConvBNReLU(cin, cin, 3, stride, groups=cin, dilation=dilation)
        self.pointwise = nn.Sequential(
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pointwise(self.depthwise(x))
        if self.residual:
            y = y + x
        return F.relu(y)


def gather_cells(feature: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Read ``feature`` (B, Ch, H, W) at flat cell indices ``index`` (B, K) -> (B, K, Ch)."""
    b, ch = feature.shape[0], feature.shape[1]
    flat = feature.reshape(b, ch, -1)
    picked = flat.gather(2, index.unsqueeze(1).expand(b, ch, index.shape[1]))
    return picked.transpose(1, 2)


class CenterNetDetector(nn.Module):
    """Class-agnostic CenterNet detector with a per-detection embedding and linear head.

    Parameters
    ----------
    class_names : Sequence[str]
        Names of the known classes, in the order of the head's outputs.
    embedding_dim : int
        Dimension ``D`` of the embedding ``phi`` fed to :attr:`head`.
    input_size : tuple[int, int]
        Network input ``(height, width)``; both multiples of 16.
    channels : Sequence[int]
        Channel widths of the four backbone stages (strides 2, 4, 8, 16).
    neck_channels : int
        Channels of the stride-4 feature map that the dense heads read.
    embedding_channels : int
        Channels of the stride-8 map that the embedding samples inside each box.
    max_candidates : int
        Number of heatmap peaks that ``forward`` keeps (static, for tracing).
    normalize_embedding : bool
        Put the embedding on the sphere of radius ``sqrt(embedding_dim)`` (see
        :meth:`embed_cells`).
    embedding_activation : str
        Hidden activation of the embedding MLP, one of :data:`EMBEDDING_ACTIVATIONS`.
        ``'leaky_relu'`` (default) keeps every hidden unit alive: with ``'relu'`` (files
        saved before it existed) 94 of 128 units had died in training, the embedding
        spanned 33 of its 64 dimensions, and unknown objects could only land in the
        subspace of the known ones, where the GP variance cannot set them apart.
    """

    roi_offsets: torch.Tensor  # buffer: sampling grid over a box, fractions of its size

    def __init__(self, class_names: Sequence[str], embedding_dim: int = 64,
                 input_size: tuple[int, int] = DEFAULT_INPUT_SIZE,
                 channels: Sequence[int] = (16, 32, 64, 128), neck_channels: int = 64,
                 embedding_channels: int = 96, max_candidates: int = 64,
                 normalize_embedding: bool = True,
                 embedding_activation: str = 'leaky_relu') -> None:
        super().__init__()
        if embedding_activation not in EMBEDDING_ACTIVATIONS:
            raise ValueError(f'embedding_activation must be one of '
                             f'{sorted(EMBEDDING_ACTIVATIONS)}, got {embedding_activation!r}')
        if len(class_names) < 1 or len(set(class_names)) != len(class_names):
            raise ValueError(f'class_names must be non-empty and unique, got {class_names!r}')
        if embedding_dim < 1:
            raise ValueError(f'embedding_dim must be positive, got {embedding_dim}')
        height, width = (int(v) for v in input_size)
        if height <= 0 or width <= 0 or height % SIZE_MULTIPLE or width % SIZE_MULTIPLE:
            raise ValueError(
                f'input_size must be positive multiples of {SIZE_MULTIPLE}, got {input_size}')
        if len(channels) != 4:
            raise ValueError(f'channels must list 4 stage widths, got {channels!r}')
        if max_candidates < 1:
            raise ValueError(f'max_candidates must be positive, got {max_candidates}')
        if embedding_channels < 1 or neck_channels < 1:
            raise ValueError('neck_channels and embedding_channels must be positive')
        c1, c2, c3, c4 = (int(c) for c in channels)
        self.class_names = list(class_names)
        self.embedding_dim = int(embedding_dim)
        self.input_size = (height, width)
        self.channels = (c1, c2, c3, c4)
        self.neck_channels = int(neck_channels)
        self.embedding_channels = int(embedding_channels)
        self.max_candidates = int(max_candidates)
        self.normalize_embedding = bool(normalize_embedding)
        self.embedding_activation = embedding_activation
        # Identity of trained weights, filled by load_detector (empty for a fresh model).
        self.model_id = ''
        self.metadata: dict[str, Any] = {}
        self.batchnorm_folded = False

        self.stem = _ConvBNReLU(3, c1, 3, 2)
        self.stage2 = nn.Sequential(_SeparableBlock(c1, c2, 2), _SeparableBlock(c2, c2))
        # The deep, low-resolution stages carry the shape evidence for classification and
        # cost little: most of the time is spent at stride 4.
        self.stage3 = nn.Sequential(_SeparableBlock(c2, c3, 2), _SeparableBlock(c3, c3),
                                    _SeparableBlock(c3, c3))
        # Dilation widens the receptive field at stride 16 so large objects are seen whole.
        self.stage4 = nn.Sequential(_SeparableBlock(c3, c4, 2), _SeparableBlock(c4, c4),
                                    _SeparableBlock(c4, c4, dilation=2),
                                    _SeparableBlock(c4, c4, dilation=4))
        n = self.neck_channels
        self.lateral4 = nn.Conv2d(c4, n, 1)
        self.lateral3 = nn.Conv2d(c3, n, 1)
        self.lateral2 = nn.Conv2d(c2, n, 1)
        self.smooth3 = _SeparableBlock(n, n)
        self.smooth2 = _SeparableBlock(n, n)

        self.box_trunk = _SeparableBlock(n, n)
        # One 1x1 conv for heatmap (1), log-size (2) and offset (2): a single wide conv is
        # much faster on CPU than three narrow ones.
        self.box_head = nn.Conv2d(n, 5, 1)
        # Class evidence needs context more than resolution: the embedding map has stride 8.
        e = self.embedding_channels
        self.embedding_trunk = nn.Sequential(_SeparableBlock(n, e), _SeparableBlock(e, e))
        offsets = (torch.arange(ROI_GRID, dtype=torch.float32) / (ROI_GRID - 1) - 0.5) * ROI_SPAN
        self.register_buffer('roi_offsets', offsets, persistent=False)
        self.embedding_mlp = nn.Sequential(
            nn.Linear(ROI_GRID * ROI_GRID * e + c4, 128),
            EMBEDDING_ACTIVATIONS[embedding_activation](),
            nn.Linear(128, self.embedding_dim))
        self.head = nn.Linear(self.embedding_dim, len(self.class_names))
        self._init_heads()

    def _init_heads(self) -> None:
        weight, bias = self.box_head.weight, self.box_head.bias
        assert bias is not None  # created with bias=True
        nn.init.normal_(weight, std=0.01)
        with torch.no_grad():
            # Focal-loss prior: objectness ~0.1 everywhere so the many background cells
            # do not swamp the first updates (as in CenterNet / RetinaNet).
            bias[0] = -math.log((1 - 0.1) / 0.1)
            # Typical objects span ~10 cells; start the log-size there.
            bias[1:3] = math.log(10.0)
            bias[3:5] = 0.5

    @torch.no_grad()
    def fold_batchnorm(self) -> None:
        """Fold every batch norm into the convolution before it, for faster inference.

        The outputs are unchanged (up to float rounding) in eval mode; the model can no
        longer be trained or saved afterwards, so only loaded inference models do this.
        """
        if self.batchnorm_folded:
            return
        sequences = [m for m in self.modules() if isinstance(m, nn.Sequential)]
        for seq in sequences:
            for i in range(len(seq) - 1):
                conv, bn = seq[i], seq[i + 1]
                if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)):
                    continue
                # Always tracked: the model is built with track_running_stats=True.
                assert bn.running_var is not None and bn.running_mean is not None
                scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
                bias = conv.bias if conv.bias is not None else torch.zeros_like(scale)
                conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
                conv.bias = nn.Parameter((bias - bn.running_mean) * scale + bn.bias)
                seq[i + 1] = nn.Identity()
        self.batchnorm_folded = True
        self.eval()

    @property
    def num_classes(self) -> int:
        """Number of known classes ``C``."""
        return len(self.class_names)

    @property
    def output_size(self) -> tuple[int, int]:
        """Height and width of the stride-4 output maps."""
        return self.input_size[0] // STRIDE, self.input_size[1] // STRIDE

    def config(self) -> dict[str, Any]:
        """Constructor arguments, enough to rebuild the architecture."""
        return {
            'class_names': list(self.class_names),
            'embedding_dim': self.embedding_dim,
            'input_size': list(self.input_size),
            'channels': list(self.channels),
            'neck_channels': self.neck_channels,
            'embedding_channels': self.embedding_channels,
            'max_candidates': self.max_candidates,
            'normalize_embedding': self.normalize_embedding,
            'embedding_activation': self.embedding_activation,
        }

    def feature_maps(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense maps of a batch: the raw head outputs and the embedding feature maps.

        Parameters
        ----------
        images : torch.Tensor
            ``(B, 3, H, W)`` float in ``[0, 1]`` with ``(H, W) == input_size``.

        Returns
        -------
        dict[str, torch.Tensor]
            ``heatmap_logits (B,1,h,w)``, ``size (B,2,h,w)`` (log width/height in cells),
            ``offset (B,2,h,w)`` (x, y), ``embedding_map (B,e,h/2,w/2)``, ``context_map
            (B,c4,h/4,w/4)``; ``h, w`` are the stride-4 output size.
        """
        # Fixed per-channel normalisation instead of a learned one keeps export simple.
        x = (images - 0.5) / 0.25
        f1 = self.stem(x)
        f2 = self.stage2(f1)
        f3 = self.stage3(f2)
        f4 = self.stage4(f3)
        p4 = self.lateral4(f4)
        p3 = self.smooth3(self.lateral3(f3) + F.interpolate(p4, scale_factor=2.0,
                                                            mode='nearest'))
        p2 = self.smooth2(self.lateral2(f2) + F.interpolate(p3, scale_factor=2.0,
                                                            mode='nearest'))
        box = self.box_head(self.box_trunk(p2))
        return {
            'heatmap_logits': box[:, 0:1],
            'size': box[:, 1:3],
            'offset': box[:, 3:5],
            'embedding_map': self.embedding_trunk(p3),
            'context_map': f4,
        }

    def embed_cells(self, maps: dict[str, torch.Tensor], index: torch.Tensor,
                    boxes: torch.Tensor) -> torch.Tensor:
        """Embeddings ``phi`` of objects centred at stride-4 cells with the given boxes.

        The stride-8 embedding map is sampled (bilinearly) on a 3x3 grid over the central
        two thirds of each box, so ``phi`` sees the object's layout; the stride-16 context
        map is read at the centre cell.

        Parameters
        ----------
        maps : dict[str, torch.Tensor]
            Output of :meth:`feature_maps`.
        index : torch.Tensor
            ``(B, K)`` int64 flat indices ``y * w + x`` into the stride-4 map.
        boxes : torch.Tensor
            ``(B, K, 4)`` boxes ``center_x, center_y, width, height`` in input pixels.

        Returns
        -------
        torch.Tensor
            ``(B, K, D)`` embeddings.
        """
        h, w = maps['heatmap_logits'].shape[2], maps['heatmap_logits'].shape[3]
        emb = maps['embedding_map']
        b, k = index.shape
        ctx_w = maps['context_map'].shape[3]
        ys = torch.div(index, w, rounding_mode='floor')
        xs = index - ys * w
        # The context map has stride 16: four stride-4 cells per cell.
        ctx_index = torch.div(ys, 4, rounding_mode='floor') * ctx_w + torch.div(
            xs, 4, rounding_mode='floor')
        context = gather_cells(maps['context_map'], ctx_index)
        # grid_sample's normalised coordinates (align_corners=False): -1 and 1 are the
        # outer edges of the input image.
        grid = self.roi_offsets.to(boxes.dtype)
        px = boxes[..., 0:1] + grid * boxes[..., 2:3]
        py = boxes[..., 1:2] + grid * boxes[..., 3:4]
        gx = (px / (w * STRIDE)) * 2 - 1
        gy = (py / (h * STRIDE)) * 2 - 1
        n = grid.shape[0]
        points = torch.stack([gx.unsqueeze(2).expand(b, k, n, n),
                              gy.unsqueeze(3).expand(b, k, n, n)], dim=4)
        sampled = F.grid_sample(emb, points.reshape(b, k * n * n, 1, 2), mode='bilinear',
                                padding_mode='border', align_corners=False)
        local = sampled.reshape(b, emb.shape[1], k, n * n).permute(0, 2, 1, 3).reshape(
            b, k, emb.shape[1] * n * n)
        embedding = self.embedding_mlp(torch.cat([local, context], dim=2))
        if self.normalize_embedding:
            # A last-layer GP with a linear kernel scores novelty by feature norm, and a
            # cross-entropy network gives unfamiliar inputs *smaller* features (feature
            # collapse), so they would look familiar. On a sphere of fixed radius sqrt(D)
            # only the direction counts: novel objects point where training data is thin.
            embedding = F.normalize(embedding, dim=-1) * math.sqrt(self.embedding_dim)
        return embedding

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the network and extract a fixed number of candidate detections.

        Parameters
        ----------
        images : torch.Tensor
            ``(B, 3, H, W)`` float in ``[0, 1]``, ``(H, W) == input_size``.

        Returns
        -------
        dict[str, torch.Tensor]
            Raw maps ``heatmap (B,1,h,w)`` (sigmoid objectness), ``size``, ``offset``; and
            the top ``max_candidates`` peaks: ``scores (B,K)``, ``boxes (B,K,4)`` (centre x,
            centre y, width, height in input pixels), ``embeddings (B,K,D)``, ``logits
            (B,K,C)``. Candidates are sorted by score; ``decode`` applies the threshold.
        """
        return self.candidates(self.feature_maps(images))

    def candidates(self, maps: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Top-K heatmap peaks of :meth:`feature_maps` output, as returned by ``forward``."""
        heatmap = torch.sigmoid(maps['heatmap_logits'])
        b, _, h, w = heatmap.shape
        # A cell is a peak when it equals the max of its 3x3 neighbourhood.
        pooled = F.max_pool2d(heatmap, 3, stride=1, padding=1)
        peaks = heatmap * (pooled == heatmap).to(heatmap.dtype)
        k = min(self.max_candidates, h * w)
        scores, index = peaks.reshape(b, -1).topk(k, dim=1)
        ys = torch.div(index, w, rounding_mode='floor')
        xs = index - ys * w
        offset = gather_cells(maps['offset'], index)
        log_size = gather_cells(maps['size'], index).clamp(_LOG_SIZE_MIN, _LOG_SIZE_MAX)
        size = torch.exp(log_size) * STRIDE
        cx = (xs.to(heatmap.dtype) + offset[..., 0]) * STRIDE
        cy = (ys.to(heatmap.dtype) + offset[..., 1]) * STRIDE
        boxes = torch.stack([cx, cy, size[..., 0], size[..., 1]], dim=2)
        embeddings = self.embed_cells(maps, index, boxes)
        return {
            'heatmap': heatmap,
            'size': maps['size'],
            'offset': maps['offset'],
            'scores': scores,
            'boxes': boxes,
            'embeddings': embeddings,
            'logits': self.head(embeddings),
        }

    def decode(self, outputs: dict[str, torch.Tensor], score_threshold: float = 0.3,
               max_detections: int = 20,
               image_sizes: Sequence[tuple[int, int]] | None = None) -> list[Detections]:
        """Turn the candidates of :meth:`forward` into per-image :class:`Detections`.

        Parameters
        ----------
        outputs : dict[str, torch.Tensor]
            ``forward``'s outputs (any backend producing ``scores``, ``boxes``,
            ``embeddings`` and ``logits`` with the same shapes).
        score_threshold : float
            Minimum objectness, in ``[0, 1]``.
        max_detections : int
            Maximum detections per image (at most ``max_candidates`` are available).
        image_sizes : Sequence[tuple[int, int]] | None
            Original ``(height, width)`` per image; boxes are scaled from ``input_size``
            to it and clipped to the image. ``None`` keeps input coordinates.

        Returns
        -------
        list[Detections]
            One entry per image of the batch.
        """
        return decode_candidates(
            _to_numpy(outputs['scores']), _to_numpy(outputs['boxes']),
            _to_numpy(outputs['embeddings']), _to_numpy(outputs['logits']), self.input_size,
            score_threshold, max_detections, image_sizes)

    def preprocess(self, image_rgb: np.ndarray) -> torch.Tensor:
        """Validate an RGB uint8 image and turn it into a ``(1, 3, H, W)`` input tensor."""
        return normalize_images(self.image_tensor(image_rgb))

    def image_tensor(self, image_rgb: np.ndarray) -> torch.Tensor:
        """Validate an RGB uint8 image and return it as a ``(1, 3, H, W)`` uint8 tensor of
        ``input_size`` (resized when it differs), still unnormalised: a GPU backend uploads
        these bytes, a quarter of the float32 input, and normalises on the device."""
        array = image_array(image_rgb, self.input_size)
        if not array.flags.writeable:
            # A view of a received message's bytes: torch tensors want writable memory.
            array = array.copy()
        return torch.from_numpy(array)

    @torch.no_grad()
    def detect(self, image_rgb: np.ndarray, score_threshold: float = 0.3,
               max_detections: int = 20) -> Detections:
        """Detect objects in one RGB image.

        Parameters
        ----------
        image_rgb : np.ndarray
            ``(H, W, 3)`` uint8 RGB; resized to ``input_size`` when it differs.
        score_threshold : float
            Minimum objectness.
        max_detections : int
            Maximum number of detections.

        Returns
        -------
        Detections
            Boxes in the pixel coordinates of ``image_rgb``.

        Raises
        ------
        ValueError
            If the image is not an ``(H, W, 3)`` uint8 array.
        """
        tensor = self.preprocess(image_rgb)
        was_training = self.training
        self.eval()
        try:
            outputs = self(tensor.to(self.head.weight.device))
        finally:
            self.train(was_training)
        return self.decode(outputs, score_threshold, max_detections,
                           image_sizes=[image_rgb.shape[:2]])[0]


def normalize_images(images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 ``(B, 3, H, W)`` images to the network's ``[0, 1]`` input, on their device."""
    return images.to(dtype).div_(255.0)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to('cpu', torch.float32).numpy()


def model_digest(model: CenterNetDetector) -> str:
    """SHA-256 of the model's parameters and buffers, to tie artefacts to exact weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_detector(model: CenterNetDetector, path: str | Path, model_id: str,
                  metadata: dict[str, Any] | None = None) -> None:
    """Save weights, architecture and identity of a detector to one file.

    Parameters
    ----------
    model : CenterNetDetector
        The detector to save.
    path : str | Path
        Destination file (``.pt``); parent directories are created.
    model_id : str
        Identifier shared with the GP artefact fitted to this model.
    metadata : dict[str, Any] | None
        JSON-like extra information (training data, seed, metrics).
    """
    if not model_id:
        raise ValueError('model_id must be a non-empty string')
    if model.batchnorm_folded:
        raise ValueError('cannot save a detector whose batch norms were folded; save the '
                         'trained model before fold_batchnorm()')
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {
        'format': FORMAT_NAME,
        'version': FORMAT_VERSION,
        'model_id': str(model_id),
        'config': model.config(),
        'state_dict': state,
        'digest': model_digest(model),
        'metadata': _plain_metadata(metadata),
    }
    tmp = path.with_suffix(path.suffix + '.tmp')
    torch.save(payload, tmp)
    tmp.replace(path)


def _plain_metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    # The file is read with weights_only=True, which accepts plain containers only.
    try:
        return json.loads(json.dumps(dict(metadata or {})))
    except (TypeError, ValueError) as exc:
        raise ValueError(f'metadata must be JSON-serialisable: {exc}') from exc


def load_detector(path: str | Path, map_location: str | torch.device = 'cpu',
                  fold_batchnorm: bool = True) -> CenterNetDetector:
    """Load a detector saved by :func:`save_detector`, in eval mode, for inference.

    The loaded model carries the ``model_id`` and ``metadata`` it was saved with.

    Parameters
    ----------
    path : str | Path
        File written by :func:`save_detector`.
    map_location : str | torch.device
        Device for the weights.
    fold_batchnorm : bool
        Fold batch norms into convolutions (faster; see
        :meth:`CenterNetDetector.fold_batchnorm`). Pass ``False`` to fine-tune the model.

    Raises
    ------
    ValueError
        If the file is missing, unreadable, of another format or version, or its weights
        do not match the stored architecture or checksum.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f'detector file not found: {path}')
    expected = f'a detector saved by save_detector ({FORMAT_NAME} v{FORMAT_VERSION}, torch zip)'
    if path.stat().st_size == 0:
        raise ValueError(f'cannot read detector file {path}: expected {expected}, found '
                         f'{describe_file(path)}')
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt files
        # torch's own message ("[enforce fail at inline_container.cc:180]") rarely says why;
        # name what the bytes are instead, and keep torch's text at the end.
        raise ValueError(f'cannot read detector file {path}: expected {expected}, found '
                         f'{describe_file(path)} (torch: {str(exc).strip() or type(exc).__name__})'
                         ) from exc
    if not isinstance(payload, dict) or payload.get('format') != FORMAT_NAME:
        found = (f'a {type(payload).__name__}' if not isinstance(payload, dict)
                 else f'a dict with format {payload.get("format")!r} and keys '
                      f'{sorted(map(str, payload))[:6]}')
        raise ValueError(f'{path} is not a {FORMAT_NAME} file: expected {expected}, found '
                         f'{found}')
    if payload.get('version') != FORMAT_VERSION:
        raise ValueError(f'{path} has format version {payload.get("version")}, '
                         f'this code reads version {FORMAT_VERSION}')
    for key in ('model_id', 'config', 'state_dict', 'digest'):
        if key not in payload:
            raise ValueError(f'{path} lacks the field {key!r}')
    config = payload['config']
    try:
        model = CenterNetDetector(
            class_names=config['class_names'], embedding_dim=config['embedding_dim'],
            input_size=tuple(config['input_size']), channels=tuple(config['channels']),
            neck_channels=config['neck_channels'],
            embedding_channels=config['embedding_channels'],
            max_candidates=config['max_candidates'],
            normalize_embedding=bool(config['normalize_embedding']),
            # Files written before the activation was configurable used ReLU.
            embedding_activation=config.get('embedding_activation', 'relu'))
    except (KeyError, TypeError) as exc:
        raise ValueError(f'{path} has an invalid architecture config: {exc}') from exc
    try:
        model.load_state_dict(payload['state_dict'], strict=True)
    except RuntimeError as exc:
        raise ValueError(f'{path}: weights do not match the architecture: {exc}') from exc
    if model_digest(model) != payload['digest']:
        raise ValueError(f'{path}: weight checksum mismatch, the file is corrupt')
    model.model_id = str(payload['model_id'])
    model.metadata = dict(payload.get('metadata') or {})
    model.eval()
    if fold_batchnorm:
        model.fold_batchnorm()
    return model.to(map_location)
