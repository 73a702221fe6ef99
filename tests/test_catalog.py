"""The workload catalog: every model the issue names builds and trains one step on the meta device
with its default dataset, pairings are checked, and features answer to batch size and sequence length."""

from __future__ import annotations

import pytest

from horus_airflow.catalog import DATASETS, WORKLOADS, resolve
from horus_airflow.errors import InvalidJobError
from horus_airflow.features import extract_features

REQUIRED_MODELS = (
    "resnet18 resnet50 resnet101 vgg11 vgg16 vgg19 alexnet squeezenet densenet121 inception_v3 googlenet "
    "mobilenet_v2 mobilenet_v3_large mobilenet_v3_small shufflenet_v2_x1_0 mnasnet efficientnet_b0 efficientnet_b4 "
    "regnet vit_b_16 bert_base bert_large gpt2_small gpt2_medium transformer_base lstm_lm gru_lm dcgan cyclegan unet "
    "ncf dlrm_small pointnet a2c a3c dqn ppo td3"
).split()
REQUIRED_DATASETS = (
    "cifar10 cifar100 imagenet mnist lsun coco squad wikitext2 wikitext103 multi30k wmt movielens ml20m shapenet "
    "atari lunarlander bipedalwalker cartpole"
).split()


def test_the_catalog_holds_every_required_model_and_dataset() -> None:
    assert set(REQUIRED_MODELS) <= set(WORKLOADS)
    assert set(REQUIRED_DATASETS) <= set(DATASETS)


@pytest.mark.integration
@pytest.mark.parametrize("model", sorted(WORKLOADS))
def test_every_model_trains_a_step_on_its_default_dataset(model: str) -> None:
    workload = WORKLOADS[model]
    assert workload.misfit(DATASETS[workload.default_dataset]) is None
    features = extract_features(model, 4)
    assert features.traced and features.params > 0
    assert features.train_flops > features.forward_flops > 0
    assert features.activation_bytes > 0 and features.depth > 0
    by_class = features.flops_conv + features.flops_matmul + features.flops_attention + features.flops_recurrent
    assert by_class == features.train_flops


@pytest.mark.parametrize(
    ("model", "dataset", "message"),
    [
        ("lstm_lm", "cifar10", "takes text input but 'cifar10' gives image"),
        ("resnet18", "mnist", "needs 3-channel images but 'mnist' has 1"),
        ("inception_v3", "cifar10", "needs images of at least 75 px but 'cifar10' has 32"),
        ("unet", "mnist", "needs an image size divisible by 16 but 'mnist' has 28"),
        ("gpt2_small", "squad", "trains on lm text but 'squad' is a span task"),
        ("td3", "cartpole", "needs continuous actions but 'cartpole' has discrete ones"),
        ("dqn", "bipedalwalker", "needs discrete actions but 'bipedalwalker' has continuous ones"),
        ("transformer_base", "wikitext2", "takes translation input"),
    ],
)
def test_a_wrong_pairing_says_why_and_what_fits(model: str, dataset: str, message: str) -> None:
    with pytest.raises(InvalidJobError, match=f"model '{model}' {message}.*datasets that fit '{model}': "):
        resolve(model, dataset)


def test_unknown_dataset_suggests_close_names() -> None:
    with pytest.raises(InvalidJobError, match="unknown dataset 'cifar11'. Did you mean: cifar10"):
        resolve("resnet18", "cifar11")


def test_sequence_length_is_configurable_and_bounded_by_the_model() -> None:
    short = extract_features("gpt2_small", 2, "wikitext103", seq_len=128)
    long = extract_features("gpt2_small", 2, "wikitext103", seq_len=256)
    assert long.forward_flops > 2 * short.forward_flops * 0.95  # linear parts double, attention quadruples
    assert long.flops_attention > short.flops_attention
    with pytest.raises(InvalidJobError, match="takes at most 512 tokens but 'squad' has 1024"):
        resolve("bert_base", "squad", seq_len=1024)
    with pytest.raises(InvalidJobError, match="'imagenet' has no sequence length to set; seq_len applies to:"):
        resolve("resnet50", "imagenet", seq_len=64)


def test_operator_classes_land_where_the_architecture_says() -> None:
    cnn = extract_features("resnet50", 8)
    assert cnn.flops_conv > 0.95 * cnn.train_flops and cnn.layers_conv == 53 and cnn.flops_norm > 0
    bert = extract_features("bert_base", 2)
    assert bert.flops_attention > 0.2 * bert.train_flops and bert.layers_attention == 12
    lstm = extract_features("lstm_lm", 4)
    assert lstm.flops_recurrent > 0 and lstm.layers_recurrent == 1 and lstm.flops_conv == 0
    rl = extract_features("dqn", 32, "cartpole")
    assert rl.input_kind == "state" and rl.host_us_per_sample > 0
    assert extract_features("ppo", 32).optimizer_state_factor == 2 and cnn.optimizer_state_factor == 1


def test_gavels_jobs_map_to_the_graphs_gavel_trained() -> None:
    """Gavel's ResNet-18 has the CIFAR stem (3x3 stride 1, no max-pool) and its LM the word_language_model
    defaults (200 wide, 2 layers); counted here by hand, layer by layer."""
    from horus_airflow.simulator.workloads import gavel_workload

    resnet = gavel_workload("ResNet-18 (batch size 64)")
    assert (resnet.model, resnet.dataset, resnet.batch_size) == ("resnet18_cifar", "cifar10", 64)
    conv3 = 9 * 32 * 32  # a 3x3 convolution's multiply-adds per input and output channel at 32x32
    stage = [64 * 64 * conv3 * 4]  # stage 1: four 64->64 convolutions at 32x32
    for width, side in ((128, 16), (256, 8), (512, 4)):  # each later stage halves the side, doubles the width
        per_pixel = 9 * side * side
        stage.append((width // 2) * width * per_pixel + 3 * width * width * per_pixel + (width // 2) * width * side * side)
    macs = 3 * 64 * conv3 + sum(stage) + 512 * 10
    assert extract_features("resnet18_cifar", 1).forward_flops == pytest.approx(2 * macs, rel=1e-3)

    lm = gavel_workload("LM (batch size 20)")
    assert (lm.model, lm.dataset) == ("lstm_lm_small", "wikitext2")
    vocab, width = DATASETS["wikitext2"].vocab, 200
    lstm_layer = 4 * (2 * width * width + 2 * width)
    assert extract_features("lstm_lm_small", 20).params == vocab * width + 2 * lstm_layer + width * vocab + vocab


def test_the_name_index_operators_check_at_parse_time_matches_the_catalog() -> None:
    """horus_airflow/names.py lists the catalog without PyTorch; regenerate it when the catalog changes."""
    from horus_airflow import names

    actual = {n: (w.default_dataset, tuple(sorted(d for d, data in DATASETS.items() if w.misfit(data) is None)))
              for n, w in WORKLOADS.items()}
    assert names.MODELS == actual, "horus_airflow/names.py MODELS should be:\n" + "\n".join(
        f"    {n!r}: {v!r}," for n, v in actual.items())
    assert names.DATASETS == tuple(sorted(DATASETS))
