"""The built-in trainer: a few real optimisation steps of a catalog workload on synthetic data.

Run as ``python -m horus_airflow.catalog.train --model resnet18 --batch-size 32 --steps 10``. It uses
the GPU that ``CUDA_VISIBLE_DEVICES`` leaves visible, or the CPU when there is none, and reports what
it measured (throughput, loss) as JSON to ``$HORUS_METRICS_FILE`` for the telemetry wrapper.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch

from horus_airflow.catalog import resolve
from horus_airflow.telemetry.wrapper import METRICS_FILE_ENV

log = logging.getLogger(__name__)


def train(
    model: str, dataset: str | None, batch_size: int, steps: int, amp: bool, seq_len: int | None = None
) -> dict[str, float | str]:
    resolved = resolve(model, dataset, seq_len)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = resolved.build().to(device)
    if resolved.workload.optimizer == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    inputs, targets = resolved.batch(batch_size, device)
    use_amp = amp and device.type == "cuda"
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, enabled=use_amp):
            loss = resolved.loss(net(*inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return float(loss.detach())

    step()  # warm-up: allocator, cuDNN autotuning and lazy init stay out of the timing
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    loss = 0.0
    for _ in range(steps):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    return {
        "device": device.type,
        "steps": float(steps),
        "step_time_s": elapsed / steps,
        "throughput_samples_per_s": batch_size * steps / elapsed,
        "final_loss": loss,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dataset")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--amp", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics = train(args.model, args.dataset, args.batch_size, args.steps, args.amp, args.seq_len)
    log.info("trained %s for %d steps: %s", args.model, args.steps, metrics)
    target = os.environ.get(METRICS_FILE_ENV)
    if target:
        Path(target).write_text(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
