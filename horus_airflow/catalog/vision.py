"""Image models the catalog builds beyond torchvision's classifiers: an MLP, MobileNet v1, U-Net and
the two GANs. Each GAN computes its own training loss, since a step trains generator and critic."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from horus_airflow.catalog.datasets import ImageData


class Mlp(nn.Module):
    def __init__(self, data: ImageData, hidden: int = 512) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(data.sample_elements, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, data.classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class MobileNetV1(nn.Module):
    """Howard et al. 2017, width 1.0: depthwise-separable convolutions."""

    _PLAN = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *((512, 1),) * 5, (1024, 2), (1024, 1))

    def __init__(self, data: ImageData) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(data.channels, 32, 3, 2)]
        width = 32
        for out, stride in self._PLAN:
            layers += [_conv_bn(width, width, 3, stride, groups=width), _conv_bn(width, out, 1, 1)]
            width = out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(width, data.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _conv_bn(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """Ronneberger et al. 2015 with bilinear upsampling; per-pixel class logits."""

    def __init__(self, data: ImageData, base: int = 64) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(5)]
        self.downs = nn.ModuleList([_double_conv(data.channels, widths[0])])
        self.downs.extend(_double_conv(widths[i], widths[i + 1]) for i in range(4))
        self.ups = nn.ModuleList(_double_conv(widths[i + 1] + widths[i], widths[i]) for i in reversed(range(4)))
        self.head = nn.Conv2d(widths[0], data.classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, down in enumerate(self.downs):
            x = down(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, skip in zip(self.ups, reversed(skips[:-1])):
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            x = up(torch.cat([x, skip], dim=1))
        return self.head(x)


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class Dcgan(nn.Module):
    """Radford et al. 2015: transposed-convolution generator and strided-convolution discriminator,
    sized to the dataset's images. One call runs a training step's discriminator and generator passes
    and returns their summed loss."""

    def __init__(self, data: ImageData, latent: int = 100, width: int = 64) -> None:
        super().__init__()
        start, doublings = data.size, 0
        while start % 2 == 0 and start > 7:
            start //= 2
            doublings += 1
        self.latent, self.start = latent, start
        top = width * 2 ** max(doublings - 1, 0)
        self.project = nn.Sequential(nn.Linear(latent, top * start * start, bias=False), nn.BatchNorm1d(top * start * start), nn.ReLU(True))
        gen: list[nn.Module] = []
        channels = top
        for i in range(doublings):
            last = i == doublings - 1
            out = data.channels if last else channels // 2
            gen.append(nn.ConvTranspose2d(channels, out, 4, 2, 1, bias=False))
            gen += [nn.Tanh()] if last else [nn.BatchNorm2d(out), nn.ReLU(True)]
            channels = out
        self.top = top
        self.generator = nn.Sequential(*gen) if gen else nn.Sequential(nn.Conv2d(top, data.channels, 3, padding=1), nn.Tanh())
        disc: list[nn.Module] = []
        channels = data.channels
        for i in range(doublings):
            out = width * 2**i
            disc.append(nn.Conv2d(channels, out, 4, 2, 1, bias=False))
            disc += ([nn.BatchNorm2d(out)] if i else []) + [nn.LeakyReLU(0.2, True)]
            channels = out
        self.discriminator = nn.Sequential(*disc, nn.Flatten(), nn.Linear(channels * start * start, 1))

    def forward(self, real: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(real.shape[0], self.latent, device=real.device, dtype=real.dtype)
        fake = self.generator(self.project(noise).view(real.shape[0], self.top, self.start, self.start))
        real_logits, fake_logits = self.discriminator(real), self.discriminator(fake)
        ones, zeros = torch.ones_like(real_logits), torch.zeros_like(fake_logits)
        critic = F.binary_cross_entropy_with_logits(real_logits, ones) + F.binary_cross_entropy_with_logits(fake_logits, zeros)
        return critic + F.binary_cross_entropy_with_logits(fake_logits, ones)


class CycleGan(nn.Module):
    """Zhu et al. 2017: two ResNet generators (9 blocks from 256 px, else 6) and two 70x70 PatchGAN
    critics. The batch stands for one domain and its reversal for the other (shapes are what count);
    one call returns a step's least-squares adversarial plus cycle-consistency loss."""

    def __init__(self, data: ImageData, width: int = 64) -> None:
        super().__init__()
        blocks = 9 if data.size >= 256 else 6
        self.g_ab, self.g_ba = (_resnet_generator(data.channels, width, blocks) for _ in range(2))
        self.d_a, self.d_b = (_patch_critic(data.channels, width) for _ in range(2))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        a, b = images, images.flip(0)
        fake_b, fake_a = self.g_ab(a), self.g_ba(b)
        cycle = F.l1_loss(self.g_ba(fake_b), a) + F.l1_loss(self.g_ab(fake_a), b)
        adversarial = torch.zeros((), device=images.device)
        for critic, x, target in ((self.d_a, a, 1.0), (self.d_a, fake_a, 0.0), (self.d_b, b, 1.0), (self.d_b, fake_b, 0.0)):
            score = critic(x)
            adversarial = adversarial + F.mse_loss(score, torch.full_like(score, target))
        return adversarial + 10.0 * cycle


def _resnet_generator(channels: int, width: int, blocks: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.ReflectionPad2d(3), nn.Conv2d(channels, width, 7), nn.InstanceNorm2d(width), nn.ReLU(True)]
    for i in range(2):
        cin = width * 2**i
        layers += [nn.Conv2d(cin, cin * 2, 3, 2, 1), nn.InstanceNorm2d(cin * 2), nn.ReLU(True)]
    layers += [_ResidualBlock(width * 4) for _ in range(blocks)]
    for i in reversed(range(2)):
        cout = width * 2**i
        layers += [nn.ConvTranspose2d(cout * 2, cout, 3, 2, 1, output_padding=1), nn.InstanceNorm2d(cout), nn.ReLU(True)]
    layers += [nn.ReflectionPad2d(3), nn.Conv2d(width, channels, 7), nn.Tanh()]
    return nn.Sequential(*layers)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels), nn.ReLU(True),
            nn.ReflectionPad2d(1), nn.Conv2d(channels, channels, 3), nn.InstanceNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def _patch_critic(channels: int, width: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(channels, width, 4, 2, 1), nn.LeakyReLU(0.2, True)]
    for i in range(1, 4):
        cin, cout = width * 2 ** (i - 1), width * 2 ** min(i, 3)
        layers += [nn.Conv2d(cin, cout, 4, 2 if i < 3 else 1, 1), nn.InstanceNorm2d(cout), nn.LeakyReLU(0.2, True)]
    layers.append(nn.Conv2d(width * 8, 1, 4, 1, 1))
    return nn.Sequential(*layers)
