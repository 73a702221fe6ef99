"""Names a DAG author writes, known without importing PyTorch: the catalog's models and datasets and the
built-in placement profiles. Airflow parses DAG files often and with a timeout, and the catalog itself
takes PyTorch (about 5 s), so operators check names against this at parse time. The model index is
generated from the catalog and kept equal to it by ``tests/test_catalog.py``, which prints the new index
when a model or dataset changes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from horus_airflow.errors import ProfileError

# model -> (its default dataset, the datasets it can train on)
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    'resnet18': ('cifar10', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'resnet18_cifar': ('cifar10', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'resnet50': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'resnet101': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'vgg11': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'vgg11_cifar': ('cifar10', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'vgg16': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'vgg19': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'alexnet': ('imagenet', ('coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'squeezenet': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'densenet121': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'inception_v3': ('imagenet', ('coco', 'gtsrb', 'horse2zebra', 'imagenet', 'oxford_pet')),
    'googlenet': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'mobilenet_v1': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'mobilenet_v2': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'mobilenet_v2_cifar': ('cifar10', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'mobilenet_v3_large': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'mobilenet_v3_small': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'shufflenet_v2_x1_0': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'mnasnet': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'efficientnet_b0': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'efficientnet_b4': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'efficientnet_v2_s': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'regnet': ('imagenet', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'vit_b_16': ('imagenet', ('cifar10', 'cifar100', 'coco', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'lstm_lm': ('wikitext2', ('wikitext103', 'wikitext2')),
    'lstm_lm_small': ('wikitext2', ('wikitext103', 'wikitext2')),
    'gru_lm': ('wikitext2', ('wikitext103', 'wikitext2')),
    'bert_base': ('squad', ('imdb', 'squad', 'wikitext103', 'wikitext2')),
    'bert_large': ('squad', ('imdb', 'squad', 'wikitext103', 'wikitext2')),
    'gpt2_small': ('wikitext103', ('wikitext103', 'wikitext2')),
    'gpt2_medium': ('wikitext103', ('wikitext103', 'wikitext2')),
    'transformer_base': ('wmt', ('multi30k', 'wmt')),
    'mlp': ('mnist', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'mnist', 'oxford_pet')),
    'dcgan': ('lsun', ('cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'lsun', 'mnist', 'oxford_pet')),
    'cyclegan': ('horse2zebra', ('coco', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'unet': ('oxford_pet', ('cifar10', 'cifar100', 'coco', 'horse2zebra', 'imagenet', 'lsun', 'oxford_pet')),
    'ncf': ('movielens', ('ml20m', 'movielens')),
    'autoencoder_rec': ('ml20m', ('ml20m', 'movielens')),
    'dlrm_small': ('ml20m', ('ml20m', 'movielens')),
    'pointnet': ('shapenet', ('shapenet',)),
    'dqn': ('atari', ('atari', 'cartpole', 'lunarlander')),
    'a2c': ('atari', ('atari', 'bipedalwalker', 'cartpole', 'lunarlander')),
    'a3c': ('atari', ('atari', 'bipedalwalker', 'cartpole', 'lunarlander')),
    'ppo': ('lunarlander', ('atari', 'bipedalwalker', 'cartpole', 'lunarlander')),
    'td3': ('bipedalwalker', ('bipedalwalker',)),
}
DATASETS: tuple[str, ...] = ('atari', 'bipedalwalker', 'cartpole', 'cifar10', 'cifar100', 'coco', 'gtsrb', 'horse2zebra', 'imagenet', 'imdb', 'lsun', 'lunarlander', 'ml20m', 'mnist', 'movielens', 'multi30k', 'oxford_pet', 'shapenet', 'squad', 'wikitext103', 'wikitext2', 'wmt')

ONNX_SUFFIX = ".onnx"
MODULE_SEPARATOR = ":"


def is_onnx(model: str) -> bool:
    """``model.onnx``: a graph to predict from, not a module to build."""
    return model.lower().endswith(ONNX_SUFFIX)


def is_user_module(model: str) -> bool:
    """``path/to/file.py:factory``: the user's own ``torch.nn.Module``."""
    path, sep, factory = model.rpartition(MODULE_SEPARATOR)
    return bool(sep) and path.endswith(".py") and bool(factory)


def builtin_profiles() -> list[str]:
    """The profiles shipped in ``horus_airflow/placement/profiles/`` (read as files: importing the
    placement package would bring PyTorch)."""
    folder = resources.files("horus_airflow").joinpath("placement", "profiles")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def require_profile(name: str) -> None:
    """Refuse a profile name that is neither built in nor a path to a YAML file."""
    if Path(name).suffix not in (".yaml", ".yml") and name not in builtin_profiles():
        raise ProfileError(unknown("placement profile", name, builtin_profiles()) + " Or give a path to a .yaml profile.")


def unknown(what: str, name: str, accepted: Iterable[str]) -> str:
    """``unknown model 'vgg1'. Did you mean: vgg19, vgg16, vgg11? Accepted: ...``"""
    accepted = sorted(accepted)
    close = difflib.get_close_matches(name, accepted, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return f"unknown {what} {name!r}.{hint} Accepted: {', '.join(accepted)}."
