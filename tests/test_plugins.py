"""Placement plugins from outside the package: a tiny plugin package is pip-installed into a folder of
its own, registers through the ``horus_airflow.placement_plugins`` entry-point group and is used from
a YAML profile, exactly as a user's package would be."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from horus_airflow.errors import ProfileError
from horus_airflow.placement import ClusterState, GpuState, load_profile, place
from horus_airflow.placement.plugins import ENTRY_POINT_GROUP
from horus_airflow.predictor import Demand, GpuDemand

PLUGIN_MODULE = '''
"""A score that prefers the highest GPU index: the one-file plugin docs/PLACEMENT.md shows."""
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class PreferHighIndex:
    name: ClassVar[str] = "prefer-high-index"
    kind: ClassVar[str] = "score"
    strength: float = 1.0

    def costs(self, need, gpus):
        return {"index": -self.strength * gpus.gpu_index.astype(float)}


class NoKind:
    name = "no-kind"

    def costs(self, need, gpus):
        return {}
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("tiny-plugin")
    (source / "tiny_horus_plugin.py").write_text(PLUGIN_MODULE)
    (source / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tiny-horus-plugin"
        version = "0.1"

        [tool.setuptools]
        py-modules = ["tiny_horus_plugin"]

        [project.entry-points."{ENTRY_POINT_GROUP}"]
        prefer-high-index = "tiny_horus_plugin:PreferHighIndex"
        no-kind = "tiny_horus_plugin:NoKind"
    """))
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(source)], check=True)
    return site


@pytest.fixture
def with_plugin(installed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(installed))
    importlib.invalidate_caches()


STATE = ClusterState(tuple(GpuState(f"n1/{i}", "n1", i, "a100-80gb", 80_000) for i in range(4)))
DEMAND = Demand("job", 1, {"a100-80gb": GpuDemand(30, 33, 1000)})


@pytest.mark.integration
def test_an_installed_score_plugin_is_used_from_a_yaml_profile(with_plugin: None, tmp_path: Path) -> None:
    profile_file = tmp_path / "mine.yaml"
    profile_file.write_text(textwrap.dedent("""
        name: mine
        filters:
          - name: memory-fit
        scores:
          - name: prefer-high-index
            args: {strength: 2}
    """))
    profile = load_profile(str(profile_file))
    decision = place(DEMAND, STATE, profile)
    assert decision.gpu_ids == ("n1/3",)
    chosen = next(c for c in decision.candidates if c.gpu_id == "n1/3")
    assert chosen.cost_parts == {"prefer-high-index.index": -6.0, "prefer-high-index": 0.0}
    worst = next(c for c in decision.candidates if c.gpu_id == "n1/0")
    assert worst.cost_parts["prefer-high-index"] == 100.0


def test_a_plugin_argument_of_the_wrong_type_names_the_type(with_plugin: None) -> None:
    from horus_airflow.placement.profiles import parse_profile

    with pytest.raises(ProfileError, match="score 'prefer-high-index': strength must be a number \\(default 1.0\\), got 'strong'"):
        parse_profile({"name": "x", "scores": [{"name": "prefer-high-index", "args": {"strength": "strong"}}]})


def test_a_plugin_that_declares_no_kind_is_refused_with_the_kinds(with_plugin: None) -> None:
    from horus_airflow.placement.profiles import parse_profile

    with pytest.raises(ProfileError, match="must declare kind, one of filter, score, shortlist, gang"):
        parse_profile({"name": "x", "scores": [{"name": "no-kind"}]})


def test_without_the_package_the_plugin_is_unknown() -> None:
    from horus_airflow.placement.profiles import parse_profile

    with pytest.raises(ProfileError, match="unknown plugin 'prefer-high-index'"):
        parse_profile({"name": "x", "scores": [{"name": "prefer-high-index"}]})


@pytest.fixture
def registered_minutes() -> Iterator[None]:
    from horus_airflow.simulator import traces

    yield
    traces.TRACE_READERS.pop("minutes", None)


def test_a_registered_trace_reader_is_read_like_the_built_in_ones(tmp_path: Path, registered_minutes: None) -> None:
    from horus_airflow.simulator import traces

    traces.register_trace_reader(traces.CsvTraceReader(
        "minutes", "arrival and duration in minutes", ("id", "at_min", "gpus", "for_min", "model"),
        lambda row: (60.0 * row["at_min"], int(row["gpus"]), 60.0 * row["for_min"],
                     traces.trace_workload(str(row["model"]), None))))
    trace_file = tmp_path / "t.csv"
    trace_file.write_text("job_id,id,at_min,gpus,for_min,model\n1,1,2,1,10,resnet50\n2,2,1,0,10,resnet50\n")
    trace = traces.read_trace(trace_file, "minutes", "v100")
    assert [(j.arrival_s, j.duration_s) for j in trace.jobs] == [(120.0, 600.0)]
    assert trace.skipped == {"fewer than 1 GPU": 1}
    with pytest.raises(ValueError, match="already registered"):
        traces.register_trace_reader(traces.TRACE_READERS["native"])


def test_the_cli_takes_its_formats_from_the_registries(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from horus_airflow.cli import main

    with pytest.raises(SystemExit):
        main(["simulate", "--trace", str(tmp_path / "t.csv"), "--nodes", "1", "--trace-format", "alibaba"])
    assert "unknown trace format 'alibaba'; accepted: muri, gavel, tiresias, native" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["telemetry", "import", str(tmp_path / "x.txt"), "--format", "influx"])
    assert "unknown telemetry format 'influx'; accepted: prometheus-json, prometheus-text" in capsys.readouterr().err
