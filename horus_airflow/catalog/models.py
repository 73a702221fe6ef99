"""Model builders: a catalog name to a freshly initialised ``torch.nn.Module`` (no weights fetched),
the inputs it accepts, its training loss and the optimizer its reference recipe uses."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torchvision import models as tv

from horus_airflow.catalog import language, other, vision
from horus_airflow.catalog.datasets import Dataset, EnvironmentData, ImageData, TokenData

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Optimizer state kept per parameter, in copies of the weights: SGD with momentum 1, Adam 2.
OPTIMIZER_STATE = {"sgd": 1, "adam": 2}


def cross_entropy(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Class logits on the last axis: one label per sample, per token or per span end."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), targets.reshape(-1))


def pixel_cross_entropy(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-pixel logits ``B x C x H x W`` against one label per image, spread over its pixels."""
    return F.cross_entropy(output.float(), labels[:, None, None].expand(-1, *output.shape[2:]))


def binary_cross_entropy(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(output.float(), targets.float())


def q_learning(output: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Squared TD error of the taken action's Q-value (the bootstrap target is a constant here)."""
    return output.gather(1, actions[:, None]).float().pow(2).mean()


def own_loss(output: torch.Tensor, _targets: torch.Tensor) -> torch.Tensor:
    """Models that train several networks per step return their loss themselves."""
    return output.float()


def output_mean(output: torch.Tensor, _targets: torch.Tensor) -> torch.Tensor:
    """Stand-in loss for user models: backward costs the same whatever scalar it starts from."""
    return output.float().mean()


@dataclass(frozen=True)
class Workload:
    """A model, the inputs it accepts and how it trains.

    ``family`` groups architectures that share a design (the predictor is evaluated on families it
    has never seen). The remaining fields constrain which datasets fit.
    """

    name: str
    family: str
    input_kinds: tuple[str, ...]
    default_dataset: str
    build: Callable[[Dataset], nn.Module]
    loss: Loss = cross_entropy
    optimizer: str = "sgd"
    min_image_size: int = 1
    image_size_multiple: int = 1
    rgb_only: bool = False
    text_tasks: tuple[str, ...] = ("lm", "span", "classify")
    max_seq_len: int | None = None
    actions: str = "any"
    vocab: int | None = None
    description: str = ""

    def misfit(self, data: Dataset) -> str | None:
        """Why ``data`` cannot feed this model, or None when it fits."""
        if data.kind not in self.input_kinds:
            return f"takes {' or '.join(self.input_kinds)} input but {data.name!r} gives {data.kind}"
        if isinstance(data, ImageData):
            if self.rgb_only and data.channels != 3:
                return f"needs 3-channel images but {data.name!r} has {data.channels}"
            if data.size < self.min_image_size:
                return f"needs images of at least {self.min_image_size} px but {data.name!r} has {data.size}"
            if data.size % self.image_size_multiple:
                return f"needs an image size divisible by {self.image_size_multiple} but {data.name!r} has {data.size}"
        if isinstance(data, TokenData) and data.task not in self.text_tasks:
            return f"trains on {' or '.join(self.text_tasks)} text but {data.name!r} is a {data.task} task"
        seq_len = getattr(data, "seq_len", 0)
        if self.max_seq_len is not None and seq_len > self.max_seq_len:
            return f"takes at most {self.max_seq_len} tokens but {data.name!r} has {seq_len}"
        if isinstance(data, EnvironmentData) and self.actions != "any":
            kind = "continuous" if data.continuous else "discrete"
            if kind != self.actions:
                return f"needs {self.actions} actions but {data.name!r} has {kind} ones"
        return None


def _torchvision(builder: Callable[..., nn.Module], **options: object) -> Callable[[Dataset], nn.Module]:
    def build(data: Dataset) -> nn.Module:
        assert isinstance(data, ImageData)
        return builder(weights=None, num_classes=data.classes, **options)

    return build


def _vit_b_16(data: Dataset) -> nn.Module:
    assert isinstance(data, ImageData)
    return tv.vit_b_16(weights=None, image_size=data.size, num_classes=data.classes)


def _regnet_y_400mf(data: Dataset) -> nn.Module:
    """torchvision computes RegNet's block widths with tensors, which the meta device cannot read back:
    they are computed on the CPU, the network is then built wherever the caller builds."""
    assert isinstance(data, ImageData)
    with torch.device("cpu"):
        params = tv.regnet.BlockParams.from_init_params(depth=16, w_0=48, w_a=27.89, w_m=2.09, group_width=8, se_ratio=0.25)
    return tv.RegNet(params, num_classes=data.classes, norm_layer=partial(nn.BatchNorm2d, eps=1e-05, momentum=0.1))


def _resnet18_cifar(data: Dataset) -> nn.Module:
    """ResNet-18 as CIFAR training scripts build it (kuangliu's pytorch-cifar, which Gavel's and Lucid's
    ResNet-18 jobs run): a 3x3 stride-1 stem and no max-pool, so the first stage works at 32x32, not 8x8;
    about 50 times torchvision's FLOPs on a CIFAR image."""
    assert isinstance(data, ImageData)
    network = tv.resnet18(weights=None, num_classes=data.classes)
    network.conv1 = nn.Conv2d(data.channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    network.maxpool = nn.Identity()
    return network


def _mobilenet_v2_cifar(data: Dataset) -> nn.Module:
    """MobileNetV2 with pytorch-cifar's two changes for 32 px: the stem and the first 24-channel block at
    stride 1, so the network downsamples by 8, not 32."""
    assert isinstance(data, ImageData)
    network = tv.mobilenet_v2(weights=None, num_classes=data.classes)
    network.features[0][0].stride = (1, 1)
    network.features[2].conv[1][0].stride = (1, 1)
    return network


def _vgg11_cifar(data: Dataset) -> nn.Module:
    """VGG-11 with batch norm as pytorch-cifar builds it: the five pooled stages leave 512 x 1 x 1 at
    32 px, read by one linear layer instead of torchvision's 4096-wide classifier (larger images are
    averaged down to that)."""
    assert isinstance(data, ImageData)
    network = tv.vgg11_bn(weights=None)
    network.avgpool = nn.AdaptiveAvgPool2d(1)
    network.classifier = nn.Linear(512, data.classes)
    return network


def _classifier(name: str, family: str, builder: Callable[[Dataset], nn.Module], default: str = "imagenet", min_size: int = 16, description: str = "") -> Workload:
    return Workload(name, family, ("image",), default, builder, min_image_size=min_size, rgb_only=True, description=description)


_IMAGE_CLASSIFIERS = (
    _classifier("resnet18", "resnet", _torchvision(tv.resnet18), default="cifar10"),
    _classifier("resnet18_cifar", "resnet", _resnet18_cifar, default="cifar10", min_size=32, description="ResNet-18 with the CIFAR stem (3x3 stride-1 conv, no max-pool)"),
    _classifier("resnet50", "resnet", _torchvision(tv.resnet50)),
    _classifier("resnet101", "resnet", _torchvision(tv.resnet101)),
    _classifier("vgg11", "vgg", _torchvision(tv.vgg11), min_size=32),
    _classifier("vgg11_cifar", "vgg", _vgg11_cifar, default="cifar10", min_size=32, description="VGG-11-BN for 32 px: one linear classifier on 512 x 1 x 1"),
    _classifier("vgg16", "vgg", _torchvision(tv.vgg16), min_size=32),
    _classifier("vgg19", "vgg", _torchvision(tv.vgg19), min_size=32),
    _classifier("alexnet", "alexnet", _torchvision(tv.alexnet), min_size=64),
    _classifier("squeezenet", "squeezenet", _torchvision(tv.squeezenet1_0), min_size=32, description="SqueezeNet 1.0"),
    _classifier("densenet121", "densenet", _torchvision(tv.densenet121), min_size=32),
    _classifier("inception_v3", "inception", _torchvision(tv.inception_v3, aux_logits=False, init_weights=False), min_size=75),
    _classifier("googlenet", "inception", _torchvision(tv.googlenet, aux_logits=False, init_weights=False)),
    _classifier("mobilenet_v1", "mobilenet", vision.MobileNetV1, min_size=32),  # type: ignore[arg-type]
    _classifier("mobilenet_v2", "mobilenet", _torchvision(tv.mobilenet_v2)),
    _classifier("mobilenet_v2_cifar", "mobilenet", _mobilenet_v2_cifar, default="cifar10", min_size=32, description="MobileNetV2 with the stem and first 24-channel block at stride 1"),
    _classifier("mobilenet_v3_large", "mobilenet", _torchvision(tv.mobilenet_v3_large)),
    _classifier("mobilenet_v3_small", "mobilenet", _torchvision(tv.mobilenet_v3_small)),
    _classifier("shufflenet_v2_x1_0", "shufflenet", _torchvision(tv.shufflenet_v2_x1_0)),
    _classifier("mnasnet", "mnasnet", _torchvision(tv.mnasnet1_0), description="MnasNet 1.0"),
    _classifier("efficientnet_b0", "efficientnet", _torchvision(tv.efficientnet_b0)),
    _classifier("efficientnet_b4", "efficientnet", _torchvision(tv.efficientnet_b4)),
    _classifier("efficientnet_v2_s", "efficientnet", _torchvision(tv.efficientnet_v2_s)),
    _classifier("regnet", "regnet", _regnet_y_400mf, description="RegNetY-400MF"),
    Workload("vit_b_16", "vit", ("image",), "imagenet", _vit_b_16, optimizer="adam", min_image_size=16,
             image_size_multiple=16, rgb_only=True),
)


def _text(name: str, family: str, build: Callable[[TokenData], nn.Module], default: str, **options: object) -> Workload:
    return Workload(name, family, ("text",), default, build, optimizer="adam", **options)  # type: ignore[arg-type]


_SEQUENCE_MODELS = (
    Workload("lstm_lm", "rnn_lm", ("text",), "wikitext2", lambda d: language.RecurrentLm(d, nn.LSTM), text_tasks=("lm",)),  # type: ignore[arg-type]
    Workload("lstm_lm_small", "rnn_lm", ("text",), "wikitext2", lambda d: language.RecurrentLm(d, nn.LSTM, dim=200, dropout=0.2),  # type: ignore[arg-type]
             text_tasks=("lm",), description="word_language_model's defaults: 200-wide embedding and 2-layer LSTM"),
    Workload("gru_lm", "rnn_lm", ("text",), "wikitext2", lambda d: language.RecurrentLm(d, nn.GRU), text_tasks=("lm",)),  # type: ignore[arg-type]
    _text("bert_base", "bert", lambda d: language.Bert(d, language.BERT_BASE), "squad", max_seq_len=512, vocab=30522),
    _text("bert_large", "bert", lambda d: language.Bert(d, language.BERT_LARGE), "squad", max_seq_len=512, vocab=30522),
    _text("gpt2_small", "gpt", lambda d: language.Gpt2(d, language.GPT2_SMALL), "wikitext103", max_seq_len=1024,
          text_tasks=("lm",), vocab=50257),
    _text("gpt2_medium", "gpt", lambda d: language.Gpt2(d, language.GPT2_MEDIUM), "wikitext103", max_seq_len=1024,
          text_tasks=("lm",), vocab=50257),
    Workload("transformer_base", "transformer", ("translation",), "wmt", language.TranslationTransformer,  # type: ignore[arg-type]
             optimizer="adam", max_seq_len=1024),
)

_OTHER_MODELS = (
    Workload("mlp", "mlp", ("image",), "mnist", vision.Mlp),  # type: ignore[arg-type]
    Workload("dcgan", "gan", ("image",), "lsun", vision.Dcgan, loss=own_loss, optimizer="adam", min_image_size=16),  # type: ignore[arg-type]
    Workload("cyclegan", "gan", ("image",), "horse2zebra", vision.CycleGan, loss=own_loss, optimizer="adam",  # type: ignore[arg-type]
             min_image_size=64, image_size_multiple=4),
    Workload("unet", "unet", ("image",), "oxford_pet", vision.UNet, loss=pixel_cross_entropy, optimizer="adam",  # type: ignore[arg-type]
             image_size_multiple=16),
    Workload("ncf", "recsys", ("interactions",), "movielens", other.NeuMf, loss=binary_cross_entropy, optimizer="adam",  # type: ignore[arg-type]
             description="NeuMF"),
    Workload("autoencoder_rec", "recsys", ("interactions",), "ml20m", other.AutoencoderRec, loss=own_loss,  # type: ignore[arg-type]
             optimizer="adam", description="collaborative-filtering autoencoder (DeepRec)"),
    Workload("dlrm_small", "recsys", ("interactions",), "ml20m", other.DlrmSmall, loss=binary_cross_entropy,  # type: ignore[arg-type]
             optimizer="adam"),
    Workload("pointnet", "pointnet", ("points",), "shapenet", other.PointNet, optimizer="adam"),  # type: ignore[arg-type]
    Workload("dqn", "rl", ("frames", "state"), "atari", other.QNetwork, loss=q_learning, optimizer="adam", actions="discrete"),  # type: ignore[arg-type]
    Workload("a2c", "rl", ("frames", "state"), "atari", other.ActorCritic, loss=other.actor_critic_loss, optimizer="adam"),  # type: ignore[arg-type]
    Workload("a3c", "rl", ("frames", "state"), "atari", lambda d: other.ActorCritic(d, recurrent=True),  # type: ignore[arg-type]
             loss=other.actor_critic_loss, optimizer="adam", description="A3C with its LSTM core"),
    Workload("ppo", "rl", ("frames", "state"), "lunarlander", other.ActorCritic, loss=other.actor_critic_loss, optimizer="adam"),  # type: ignore[arg-type]
    Workload("td3", "rl", ("state",), "bipedalwalker", other.Td3, loss=own_loss, optimizer="adam", actions="continuous"),  # type: ignore[arg-type]
)

WORKLOADS: dict[str, Workload] = {w.name: w for w in (*_IMAGE_CLASSIFIERS, *_SEQUENCE_MODELS, *_OTHER_MODELS)}
