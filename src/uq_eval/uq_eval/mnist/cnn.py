"""A small MNIST CNN with a feature/linear-head split, its training loop and MC-dropout inference.

ROS-free. The network exposes the penultimate features ``phi(x)`` and a linear head
``logits = W phi + b``, the form the last-layer NTK-GP needs. Dropout sits after the
convolutional trunk and before the head, so MC dropout perturbs the whole network as in
Gal & Ghahramani's CNN experiments, while ``phi`` in eval mode is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from tqdm import tqdm

__all__ = [
    'SmallCNN',
    'TrainConfig',
    'batches',
    'mc_dropout_probabilities',
    'predict',
    'to_tensor',
    'train',
]


class SmallCNN(nn.Module):
    """LeNet-style CNN: two 5x5 conv blocks, a ``feature_dim`` ReLU layer, a linear head.

    ``conv`` (the convolutional trunk) is deterministic; dropout sits only in the fully
    connected part (``conv -> dropout -> fc -> ReLU = phi -> dropout -> head``), as in the
    PyTorch MNIST example. In eval mode ``phi`` is deterministic and ``logits = W phi + b``.

    Parameters
    ----------
    feature_dim : int
        Width ``D`` of the penultimate layer (the GP's feature dimension).
    num_classes : int
        Number of output logits ``C``.
    conv_dropout, head_dropout : float
        Dropout probabilities after the convolutional trunk and before the head.
    """

    def __init__(self, feature_dim: int = 128, num_classes: int = 10,
                 conv_dropout: float = 0.25, head_dropout: float = 0.5) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.conv_dropout = nn.Dropout(conv_dropout)
        self.fc = nn.Linear(32 * 4 * 4, feature_dim)
        self.head_dropout = nn.Dropout(head_dropout)
        self.head = nn.Linear(feature_dim, num_classes)

    def fully_connected(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and logits from the trunk's output: ``(phi (B, D), logits (B, C))``.

        Stochastic when the dropout layers are in training mode.
        """
        phi = torch.relu(self.fc(self.conv_dropout(conv_out)))
        return phi, self.head(self.head_dropout(phi))

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and logits from one pass: ``(phi (B, D), logits (B, C))``."""
        return self.fully_connected(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits, shape ``(B, C)``."""
        return self.fully_connected(self.conv(x))[1]


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser settings for :func:`train`.

    Attributes
    ----------
    epochs : int
        Passes over the training images.
    batch_size : int
        Mini-batch size.
    learning_rate : float
        Peak learning rate of a one-cycle schedule (15 % warm-up, cosine decay).
    weight_decay : float
        Decoupled weight decay (AdamW).
    """

    epochs: int = 3
    batch_size: int = 128
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f'epochs must be >= 1, got {self.epochs}')
        if self.batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {self.batch_size}')
        if not self.learning_rate > 0:
            raise ValueError(f'learning_rate must be > 0, got {self.learning_rate}')
        if self.weight_decay < 0:
            raise ValueError(f'weight_decay must be >= 0, got {self.weight_decay}')


def to_tensor(images: NDArray[np.uint8] | NDArray[np.float32], mean: float, std: float
              ) -> torch.Tensor:
    """Standardise images ``(N, 28, 28)`` into a float tensor ``(N, 1, 28, 28)``.

    Parameters
    ----------
    images : ndarray of uint8 or float32
        Raw pixel values in 0..255.
    mean, std : float
        Pixel statistics of the training split (in [0, 1] units).
    """
    if std <= 0:
        raise ValueError(f'std must be > 0, got {std}')
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32) / 255.0)
    return ((x - mean) / std).unsqueeze(1)


def batches(x: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
    """Consecutive slices of ``x`` along its first axis."""
    for start in range(0, x.shape[0], batch_size):
        yield x[start:start + batch_size]


def train(model: SmallCNN, x: torch.Tensor, y: torch.Tensor, config: TrainConfig, seed: int,
          description: str = 'train', progress: bool = True) -> list[float]:
    """Train ``model`` in place with AdamW and cross-entropy; returns the mean loss per epoch.

    Parameters
    ----------
    model : SmallCNN
        Network to train (its initial weights should come from the same ``seed``).
    x : Tensor, shape (N, 1, 28, 28)
        Standardised training images.
    y : Tensor of int64, shape (N,)
        Training labels.
    config : TrainConfig
        Optimiser settings.
    seed : int
        Seeds the shuffling and the dropout masks.
    description : str
        Label of the progress bar.
    progress : bool
        Show a tqdm progress bar per epoch.
    """
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f'need as many labels as images (> 0), got {x.shape[0]} and '
                         f'{y.shape[0]}')
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # dropout masks draw from the global generator
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    steps_per_epoch = -(-x.shape[0] // config.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=config.learning_rate, total_steps=config.epochs * steps_per_epoch,
        pct_start=0.15, anneal_strategy='cos')
    loss_fn = nn.CrossEntropyLoss()
    history: list[float] = []
    model.train()
    for epoch in range(config.epochs):
        order = torch.randperm(x.shape[0], generator=generator)
        total = 0.0
        bar = tqdm(range(steps_per_epoch), desc=f'{description} epoch {epoch + 1}/'
                   f'{config.epochs}', disable=not progress, leave=False, unit='batch')
        for step in bar:
            index = order[step * config.batch_size:(step + 1) * config.batch_size]
            loss = loss_fn(model(x[index]), y[index])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            total += loss.item() * index.numel()
            if step % 50 == 0:
                bar.set_postfix(loss=f'{loss.item():.3f}')
        bar.close()
        history.append(total / x.shape[0])
        if progress:
            tqdm.write(f'{description}: epoch {epoch + 1}/{config.epochs} mean loss '
                       f'{history[-1]:.4f}')
    model.eval()
    return history


@torch.no_grad()
def predict(model: SmallCNN, x: torch.Tensor, batch_size: int = 1000
            ) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Deterministic (eval-mode) features and logits for all of ``x``, in batches.

    Returns
    -------
    features : ndarray, shape (N, D)
    logits : ndarray, shape (N, C)
    """
    model.eval()
    feats, logits = [], []
    for xb in batches(x, batch_size):
        phi, out = model.forward_with_features(xb)
        feats.append(phi.numpy())
        logits.append(out.numpy())
    return np.concatenate(feats), np.concatenate(logits)


@torch.no_grad()
def mc_dropout_probabilities(model: SmallCNN, x: torch.Tensor, samples: int,
                             generator: torch.Generator) -> NDArray[np.float32]:
    """Softmax outputs of ``samples`` stochastic passes with dropout active.

    The convolutional trunk has no dropout, so its output is the same in every pass: it is
    computed once and only the fully connected layers are sampled ``samples`` times. This
    gives exactly the distribution of ``samples`` full stochastic passes at a fraction of
    the cost.

    Parameters
    ----------
    model : SmallCNN
        Trained network.
    x : Tensor, shape (B, 1, 28, 28)
        Standardised images.
    samples : int
        Number of passes ``T``.
    generator : torch.Generator
        Source of the dropout masks (seed it for repeatable results).

    Returns
    -------
    ndarray, shape (T, B, C)
        Class probabilities of each pass.
    """
    if samples < 1:
        raise ValueError(f'samples must be >= 1, got {samples}')
    model.eval()
    conv_out = model.conv(x)
    keep_conv = 1.0 - model.conv_dropout.p
    keep_head = 1.0 - model.head_dropout.p
    out = np.empty((samples, x.shape[0], model.head.out_features), dtype=np.float32)
    for t in range(samples):
        # Inverted dropout drawn from ``generator`` (nn.Dropout cannot take one), so the
        # masks do not depend on, or disturb, the global RNG.
        mask = torch.rand(conv_out.shape, generator=generator) < keep_conv
        phi = torch.relu(model.fc(conv_out * mask / keep_conv))
        mask = torch.rand(phi.shape, generator=generator) < keep_head
        out[t] = torch.softmax(model.head(phi * mask / keep_head), dim=1).numpy()
    return out
