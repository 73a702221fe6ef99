"""The predictor's data schema, the LightGBM model and its held-out-family evaluation, on the seed data
the project ships (data/predictor_seed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.predictor.dataset import COLUMNS, TrainingDataError, read_training_data, validate
from horus_airflow.predictor.evaluation import evaluate
from horus_airflow.predictor.model import TrainedPredictor, UtilizationModel

SEED = Path(__file__).resolve().parent.parent / "data" / "predictor_seed" / "predictor_seed.csv"


@pytest.fixture(scope="module")
def seed() -> pd.DataFrame:
    return read_training_data(SEED).rows


def test_the_seed_data_follows_the_schema_and_its_features_are_current() -> None:
    data = read_training_data(SEED)
    assert data.rejected.empty and len(data.rows) == 57
    row = data.rows[(data.rows["origin"] == "muri") & (data.rows["model"] == "vgg16")].iloc[0]
    current = extract_features("vgg16", 16, "imagenet")
    for name in ("train_flops", "params", "activation_bytes", "peak_step_bytes", "kernels", "bytes_other"):
        assert row[name] == getattr(current, name), name


def test_bad_rows_are_set_aside_with_reasons_and_good_rows_kept(seed: pd.DataFrame) -> None:
    frame = seed.copy()
    frame.loc[0, "gpu_type"] = "gtx480"
    frame.loc[1, "gpu_util"] = 140.0
    frame.loc[2, ["gpu_util", "gpu_util_p90", "gpu_mem_mib"]] = np.nan
    frame.loc[3, "batch_size"] = 0
    frame = pd.concat([frame, frame.iloc[[10]]], ignore_index=True)
    result = validate(frame)
    assert len(result.rows) == len(seed) - 4
    assert sorted(result.rejected["reason"]) == sorted(
        ["unknown gpu_type", "gpu_util outside 0-100", "no target measured", "batch_size must be a positive number",
         "duplicate of an earlier row"]
    )


def test_missing_columns_are_named_with_the_schema(seed: pd.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "thin.csv"
    seed.drop(columns=["train_flops", "gpu_type"]).to_csv(path, index=False)
    with pytest.raises(TrainingDataError, match="lacks columns: gpu_type, train_flops; the schema is: origin"):
        read_training_data(path)
    with pytest.raises(TrainingDataError, match="not found"):
        read_training_data(tmp_path / "absent.csv")
    assert COLUMNS[:3] == ("origin", "origin_ref", "gpu_type")


@pytest.mark.integration
def test_held_out_predictions_never_see_their_own_source_or_family(seed: pd.DataFrame) -> None:
    """Change one source's (and one family's) measurements: its held-out predictions must not move."""
    before = evaluate(seed, schemes=("source", "family")).predictions
    for scheme, column, held in (("source", "origin", "muri"), ("family", "family", "resnet")):
        changed = seed.copy()
        changed.loc[changed[column] == held, "gpu_util"] = 3.0
        after = evaluate(changed, schemes=("source", "family")).predictions
        rows = (before["scheme"] == scheme) & (before["held_out"] == held)
        assert np.allclose(before.loc[rows, "model.gpu_util"], after.loc[rows, "model.gpu_util"])
        assert np.allclose(before.loc[rows, "mean.gpu_util"], after.loc[rows, "mean.gpu_util"])
        others = (before["scheme"] == scheme) & (before["held_out"] != held)
        assert not np.allclose(before.loc[others, "model.gpu_util"], after.loc[others, "model.gpu_util"])


@pytest.mark.integration
def test_on_an_unseen_source_the_prior_and_the_model_beat_the_mean(seed: pd.DataFrame) -> None:
    evaluation = evaluate(seed)
    assert evaluation.schemes == ("source", "gpu", "family")
    for source in ("alnair", "muri"):
        split = evaluation.split("source", source, "gpu_util")
        assert split.prior.mae < split.mean.mae and split.model.mae < split.mean.mae, source
    pooled = evaluation.pooled("source", "gpu_util")
    assert "| **source: all** | gpu_util | 57 |" in evaluation.table()
    assert evaluation.metrics()["heldout.source.gpu_util.model.mae"] == pytest.approx(pooled.model.mae)
    assert evaluation.metrics()["transfer.gpu_util.worst_mae_ratio"] == pytest.approx(evaluation.worst_ratio())
    assert evaluation.worst_ratio() < 1


def test_a_split_scheme_that_cannot_be_held_out_is_named(seed: pd.DataFrame) -> None:
    from horus_airflow.cli import SPLIT_SCHEMES
    from horus_airflow.errors import HorusError
    from horus_airflow.predictor.evaluation import SCHEMES

    assert SPLIT_SCHEMES == tuple(SCHEMES)
    with pytest.raises(HorusError, match="unknown split scheme rack; accepted: source, gpu, family"):
        evaluate(seed, schemes=("rack",))
    with pytest.raises(HorusError, match="at least two values of a split column"):
        evaluate(seed[seed["origin"] == "muri"], schemes=("source", "gpu"))


def test_a_correction_is_weighted_by_how_well_it_transfers_between_sources(seed: pd.DataFrame) -> None:
    """Measurements made from the prior's own estimate: a bias that every source shares is learned whole,
    one whose sign flips between sources (what no model can carry over) is dropped for the prior."""
    from horus_airflow.predictor.model import design_matrix

    prior_util = design_matrix(seed, UtilizationModel().prior)["prior_util"].to_numpy()
    shared = seed.assign(gpu_util=np.clip(prior_util * 0.5, 1, 100), gpu_util_p90=np.nan)
    assert UtilizationModel().fit(shared).shrinkage["gpu_util"] == 1.0
    flipped = np.where(seed["origin"] == "alnair", 0.5, 2.0)
    opposed = seed.assign(gpu_util=np.clip(prior_util * flipped, 1, 100), gpu_util_p90=np.nan)
    model = UtilizationModel().fit(opposed)
    assert model.shrinkage["gpu_util"] == 0.0
    assert np.allclose(model.predict(opposed)["gpu_util"], np.clip(prior_util, 1, 100))


@pytest.mark.integration
def test_predictions_are_bounded_and_p90_is_conservative(seed: pd.DataFrame) -> None:
    model = UtilizationModel().fit(seed)
    assert set(model.trained_rows) == {"gpu_util", "gpu_util_p90"}  # the seed has no measured peak memory
    predicted = model.predict(seed)
    assert predicted["gpu_util"].between(1, 100).all()
    assert (predicted["gpu_util_p90"] >= predicted["gpu_util"]).all()
    features = extract_features("bert_large", 8)
    demand = TrainedPredictor(model, "horus-gpu-utilization/9").predict("j", features, 1, [GPU_SPECS["h100"]])
    assert demand.predictor == "horus-gpu-utilization/9"
    assert "prior estimate for gpu_mem_mib" in demand.explained()
    assert demand.on("h100").mem_mib > features.param_bytes * 4 / 2**20  # weights, grads, two Adam moments
    assert demand.confidence == "low" and any("no measured job on h100" in n and "p100, v100" in n for n in demand.notes)
    measured = TrainedPredictor(model, "horus-gpu-utilization/9").predict("j", extract_features("resnet18", 32), 1, [GPU_SPECS["v100"]])
    assert measured.confidence == "normal"


@pytest.mark.integration
def test_a_prediction_outside_what_was_measured_is_low_confidence_and_says_why() -> None:
    """bert_large at a batch of 1,048,576 needs hundreds of TB: not a normal answer."""
    from horus_airflow.predictor import AnalyticPrior

    features = extract_features("bert_large", 1_048_576)
    demand = AnalyticPrior().predict("j", features, 1, [GPU_SPECS["a100-80gb"], GPU_SPECS["h200"]])
    assert demand.confidence == "low"
    assert any("batch size 1,048,576 is beyond every measured job" in note for note in demand.notes)
    assert any("above every GPU's (140 GiB)" in note for note in demand.notes)
    normal = AnalyticPrior().predict("j", extract_features("bert_large", 8), 1, [GPU_SPECS["a100-80gb"]])
    assert normal.confidence == "normal" and normal.notes == ()


def test_the_placer_books_a_low_confidence_job_at_its_p90_and_a_wider_memory_margin() -> None:
    from horus_airflow.placement import ClusterState, GpuState, load_profile, place
    from horus_airflow.predictor.demand import Demand, GpuDemand

    state = ClusterState((GpuState("n/0", "n", 0, "a100-80gb", 81_920.0),))
    need = {"a100-80gb": GpuDemand(30.0, 60.0, 70_000.0)}  # fits as predicted, not with a 25 % margin
    assert place(Demand("j", 1, need), state, load_profile("horus-paper")).placed
    cautious = place(Demand("j", 1, need, confidence="low", notes=("graph not traced",)), state, load_profile("horus-paper"))
    assert not cautious.placed and "memory 87500 > " in json.dumps(cautious.to_dict())
