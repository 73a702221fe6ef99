"""The evaluation behind docs/EVALUATION.md: every profile on the shipped Philly traces, at their recorded
arrivals and twice as fast, on the same jobs, with measured ground truth. Run it with ``make evaluate``.

Writes ``docs/evaluation/results.json`` and one PNG per scenario beside it (what docs/EVALUATION.md
cites), and prints, per scenario, the comparison table, then docs/EVALUATION.md's results table and the
targets as a table:
- ``horus-throughput`` against ``horus-paper``: at least 10 % lower mean JCT, p95 JCT no worse, OOM
  crashes no more (the project's claim to go beyond the paper);
- ``horus-paper`` against ``exclusive``: makespan and mean waiting (the paper claims 23.7-30.7 % shorter
  makespan and 68.3 % less waiting).

The five VCs also run as one stream on 16 x 8 V100s at their recorded arrivals (``gavel-vcs``), a
shared cluster's load.

Policies predict demands with the analytic prior, and again (scenarios ending ``-trained``) with the
predictor ``make demo`` registers as champion, fitted on the shipped seed data, as the operators do.

Scenarios run in parallel worker processes (``--jobs``); each result is what one process computed alone,
so the numbers do not depend on ``--jobs``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench_simulator import merged_gavel_vcs
from horus_airflow.predictor.dataset import read_training_data
from horus_airflow.predictor.model import TrainedPredictor, UtilizationModel
from horus_airflow.simulator.engine import Cluster, NodeGroup
from horus_airflow.simulator.metrics import ProfileMetrics, comparison_table
from horus_airflow.simulator.report import SimulationReport, plot
from horus_airflow.simulator.runner import run_simulation

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
PROFILES = ["exclusive", "gandiva-pack", "horus-paper", "horus-ml", "horus-throughput"]
NEW, PAPER, BASELINE = "horus-throughput", "horus-paper", "exclusive"


@dataclass(frozen=True)
class Scenario:
    trace: str
    trace_format: str
    nodes: int  # of 8 V100s: sized so that the VC's jobs queue at their recorded arrivals
    arrival_scale: float
    predictor: str = "prior"  # or "trained": the predictor `make demo` registers, fitted on the shipped seed data
    profiles: tuple[str, ...] = tuple(PROFILES)
    others: tuple[NodeGroup, ...] = ()  # node groups of other GPU types: a mixed cluster

    @property
    def name(self) -> str:
        suffix = "" if self.predictor == "prior" else f"-{self.predictor}"
        mixed = "".join(f"+{group.nodes}x{group.gpus_per_node}-{group.gpu_type}" for group in self.others)
        return f"{Path(self.trace).stem}-{self.nodes}x8-v100{mixed}-x{self.arrival_scale:g}{suffix}"

    @property
    def cluster(self) -> Cluster:
        return Cluster(self.nodes, 8, "v100", others=self.others)


MERGED_VCS = "gavel-vcs.trace"
GAVEL_VCS = (("7f04ca", 4), ("0e4a51", 4), ("2869ce", 2), ("ed69ec", 2), ("6214e9", 8))
# Philly VCs with Gavel's job types (measured truth), each at recorded arrivals and twice as fast; Muri's
# model mix on VC 7f04ca (truth from a model fitted on V100 pairs only); then the paper's policy and ours
# again at recorded arrivals with the trained predictor the operators use instead of the analytic prior.
SCENARIOS = [
    # the five VCs as one stream at their recorded arrivals: a shared cluster's load (first: it runs longest)
    Scenario(MERGED_VCS, "gavel", 16, 1.0, profiles=(BASELINE, PAPER, NEW)),
    *(Scenario(f"gavel/{vc}.trace", "gavel", nodes, scale) for vc, nodes in GAVEL_VCS for scale in (1.0, 2.0)),
    Scenario("muri/trace1.csv", "muri", 8, 1.0),
    *(Scenario(f"gavel/{vc}.trace", "gavel", nodes, 1.0, "trained", (BASELINE, PAPER, NEW)) for vc, nodes in GAVEL_VCS),
    # clusters that mix GPU types: half the V100 nodes of the VC's scenario, and as many K80 nodes
    *(Scenario(f"gavel/{vc}.trace", "gavel", nodes // 2, 1.0, others=(NodeGroup(nodes // 2, 8, "k80"),))
      for vc, nodes in GAVEL_VCS if vc in ("7f04ca", "0e4a51")),
]
SEED_DATA = TRACES.parent / "predictor_seed" / "predictor_seed.csv"


def _run(scenario: Scenario) -> tuple[Scenario, SimulationReport, float]:
    started = time.perf_counter()
    predictor = None
    if scenario.predictor == "trained":
        predictor = TrainedPredictor(UtilizationModel().fit(read_training_data(SEED_DATA).rows), "trained on the shipped seed")
    with tempfile.TemporaryDirectory() as folder:
        trace = merged_gavel_vcs(Path(folder)) if scenario.trace == MERGED_VCS else TRACES / scenario.trace
        report = run_simulation(trace, scenario.trace_format, scenario.cluster,
                                list(scenario.profiles), arrival_scale=scenario.arrival_scale, predictor=predictor)
    return scenario, report, time.perf_counter() - started


def _change(new: float, old: float) -> str:
    return f"{new / old - 1:+.1%}" if old else "n/a"


def targets(name: str, by_profile: dict[str, ProfileMetrics]) -> str:
    """One row of the targets table, with a verdict per target."""
    new, paper, exclusive = by_profile[NEW], by_profile[PAPER], by_profile[BASELINE]
    wins = (new.avg_jct_s <= 0.9 * paper.avg_jct_s and new.p95_jct_s <= paper.p95_jct_s and new.oom_events <= paper.oom_events)
    paper_claims = (paper.makespan_s <= 0.85 * exclusive.makespan_s and paper.avg_wait_s <= 0.5 * exclusive.avg_wait_s)
    return (f"| {name} | {_change(new.avg_jct_s, paper.avg_jct_s)} | {_change(new.p95_jct_s, paper.p95_jct_s)} | "
            f"{new.oom_events:,} / {paper.oom_events:,} | {'met' if wins else 'MISSED'} | "
            f"{_change(paper.makespan_s, exclusive.makespan_s)} | {_change(paper.avg_wait_s, exclusive.avg_wait_s)} | "
            f"{'met' if paper_claims else 'missed'} |")


def results_rows(name: str, results: list[ProfileMetrics]) -> list[str]:
    """The scenario's rows of docs/EVALUATION.md's results table: ratios to ``exclusive``, slowdowns and
    crashes as counted."""
    base = next(m for m in results if m.profile == BASELINE)
    rows = []
    for n, m in enumerate(m for m in results if m.profile != BASELINE):
        ratios = " | ".join(f"{getattr(m, key) / getattr(base, key):.3f}" if getattr(base, key) else "-"
                            for key in ("makespan_s", "avg_jct_s", "p95_jct_s", "avg_wait_s", "work_rate"))
        lead = f"| {name} | {base.finished:,}" if n == 0 else "|  | "
        rows.append(f"{lead} | {m.profile} | {ratios} | {m.avg_slowdown:.2f} / {m.p95_slowdown:.2f} | {m.oom_events:,} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "evaluation")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios simulated at once (worker processes)")
    args = parser.parse_args()
    started = time.perf_counter()
    results, rows, table = {}, [], []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for scenario, report, seconds in pool.map(_run, SCENARIOS):
            by_profile = {m.profile: m for m in report.results}
            first = report.results[0]
            print(f"\n=== {scenario.name}: {first.finished} jobs, {sum(first.skipped_reasons.values())} skipped "
                  f"({first.skipped_reasons}); {seconds:.0f} s")
            print(comparison_table(report.results))
            rows.append(targets(scenario.name, by_profile))
            table.extend(results_rows(scenario.name, report.results))
            trace = "data/traces/gavel/*.trace, merged" if scenario.trace == MERGED_VCS else f"data/traces/{scenario.trace}"
            results[scenario.name] = {**report.as_json(), "trace": trace, "wall_s": seconds}
            plot(report, args.out / f"{scenario.name}.png")
    print("\n| scenario | jobs | profile | makespan | mean JCT | p95 JCT | mean wait | work/GPU | mean / p95 slowdown | OOM crashes |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(table))
    print(f"\n| scenario | {NEW} mean JCT vs {PAPER} | p95 JCT | OOM crashes ({NEW} / {PAPER}) | target | "
          f"{PAPER} makespan vs {BASELINE} | mean wait | paper's claims (>= 15 % / >= 50 %) |")
    print("|---|---:|---:|---:|---|---:|---:|---|")
    print("\n".join(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out / 'results.json'} and the plots; {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
