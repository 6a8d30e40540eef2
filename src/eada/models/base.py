"""Energy-based classifiers: a backbone, an optional bottleneck and a linear energy head.

Convention (as the authors' code): the network's output *is* the energy ``E(x, y)``, lower
energy = more likely class, prediction = ``argmin_y E(x, y)``.
"""

from __future__ import annotations

import torch
from torch import nn


class EnergyNet(nn.Module):
    """``x -> backbone -> [bottleneck] -> linear head -> E(x, .)``.

    Args:
        backbone: maps inputs to flat features of size ``feature_dim``.
        feature_dim: size of the backbone's output.
        num_classes: number of classes ``C``; the head outputs ``C`` energies.
        bottleneck_dim: if given, ``Linear(feature_dim, d) -> BatchNorm1d(d)`` before the head
            (the reference code's head; no ReLU in between).
        bottleneck_relu: a ReLU after the bottleneck's batch norm (DUC's network).
    """

    def __init__(
        self,
        backbone: nn.Module,
        feature_dim: int,
        num_classes: int,
        bottleneck_dim: int | None = None,
        bottleneck_relu: bool = False,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.bottleneck: nn.Module
        if bottleneck_dim:
            layers: list[nn.Module] = [
                nn.Linear(feature_dim, bottleneck_dim),
                nn.BatchNorm1d(bottleneck_dim),
            ]
            if bottleneck_relu:  # DUC's ResNetFc: Linear -> BN -> ReLU
                layers.append(nn.ReLU())
            self.bottleneck = nn.Sequential(*layers)
            head_in = bottleneck_dim
        else:
            self.bottleneck = nn.Identity()
            head_in = feature_dim
        self.head = nn.Linear(head_in, num_classes)
        self.num_classes = num_classes
        self.cosine_temperature: float | None = None

    def freeze_bottleneck_affine(self) -> None:
        """Keep the bottleneck batch norm's affine parameters (scale 1, shift 0) at their
        initial values: they no longer require gradients, so no optimiser receives them (the
        authors' code never hands them to its optimiser). Its running statistics still update.

        Raises:
            ValueError: the network has no bottleneck batch norm.
        """
        bns = [m for m in self.bottleneck.modules() if isinstance(m, nn.BatchNorm1d)]
        if not bns:
            raise ValueError(
                "model.freeze_bottleneck_bn_affine needs a bottleneck (bottleneck_dim)"
            )
        for bn in bns:
            for p in bn.parameters():
                p.requires_grad_(False)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The penultimate features (input of the energy head), shape ``(B, D)``; with
        :attr:`cosine_temperature` ``T`` set (``model.cosine_temperature``, LADA's
        ``MODEL.NORMALIZE``), L2-normalised and divided by ``T``, so the head's outputs are
        ``T``-scaled cosine scores (plus its bias), as their classifier's."""
        z = self.bottleneck(self.backbone(x))
        if self.cosine_temperature is not None:
            z = nn.functional.normalize(z, dim=1) / self.cosine_temperature
        return z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Energies ``E(x, .)`` of shape ``(B, C)``."""
        return self.head(self.embed(x))
