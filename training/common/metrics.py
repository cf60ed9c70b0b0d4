"""Training metrics: Prometheus gauges on every rank, `metrics.jsonl` and `summary.json` on rank 0.

Metric names (all carry labels run_id, model, rank, node):

    trainkit_train_loss                  mean loss over the global batch at the last logged step
    trainkit_learning_rate               learning rate at the last logged step
    trainkit_tokens_per_second           tokens/s of the whole job at the last logged step (language models)
    trainkit_samples_per_second          samples (sequences or images) per second of the whole job
    trainkit_data_wait_seconds           time the last step waited for its input batch
    trainkit_step_time_seconds           wall time of the last optimizer step
    trainkit_mfu_ratio                   model FLOPs utilisation (0..1); absent without a peak FLOP/s
    trainkit_peak_memory_bytes           peak accelerator memory of this rank (max RSS on CPU)
    trainkit_train_step                  last completed optimizer step
    trainkit_last_step_timestamp_seconds Unix time of the last logged step (stall detection)
    trainkit_checkpoint_duration_seconds wall time of the last checkpoint save
    trainkit_restarts                    times this run resumed from a checkpoint (0 from the first step)
    trainkit_stall_restarts              of those, the restarts the stall watchdog made (a rank stopped stepping)
    trainkit_val_top1_ratio              top-1 accuracy on the validation set after the last epoch (0..1)
    trainkit_val_top5_ratio              top-5 accuracy on the validation set after the last epoch (0..1)
    trainkit_epoch_time_seconds          wall time of the last complete epoch (training only)
    trainkit_eval_loss                   token-mean loss on the held-out data at the last evaluation
    trainkit_eval_perplexity             its perplexity, exp(eval loss)
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from training.spec import SUMMARY_FILE

from .files import append_jsonl, publish_jsonl, publish_text, read_jsonl

log = logging.getLogger(__name__)

GAUGES = {
    "trainkit_train_loss": "Mean training loss over the global batch at the last logged step.",
    "trainkit_learning_rate": "Learning rate at the last logged step.",
    "trainkit_tokens_per_second": "Training tokens per second, whole job.",
    "trainkit_samples_per_second": "Training samples (sequences or images) per second, whole job.",
    "trainkit_data_wait_seconds": "Time the last step waited for its input batch in seconds.",
    "trainkit_step_time_seconds": "Wall time of the last optimizer step in seconds.",
    "trainkit_mfu_ratio": "Model FLOPs utilisation, 0..1.",
    "trainkit_peak_memory_bytes": "Peak memory of this rank in bytes.",
    "trainkit_train_step": "Last completed optimizer step.",
    "trainkit_last_step_timestamp_seconds": "Unix time at which the last logged step completed.",
    "trainkit_checkpoint_duration_seconds": "Wall time of the last checkpoint save in seconds.",
    "trainkit_restarts": "Times this run resumed from a checkpoint.",
    "trainkit_stall_restarts": "Times the stall watchdog restarted this run (a rank stopped stepping).",
    "trainkit_val_top1_ratio": "Top-1 validation accuracy after the last epoch, 0..1.",
    "trainkit_val_top5_ratio": "Top-5 validation accuracy after the last epoch, 0..1.",
    "trainkit_epoch_time_seconds": "Wall time of the last complete training epoch in seconds.",
    "trainkit_eval_loss": "Token-mean loss on the held-out data at the last evaluation.",
    "trainkit_eval_perplexity": "Perplexity on the held-out data at the last evaluation, exp(eval loss).",
}
_FIELD_TO_GAUGE = {
    "loss": "trainkit_train_loss",
    "lr": "trainkit_learning_rate",
    "tokens_per_s": "trainkit_tokens_per_second",
    "samples_per_s": "trainkit_samples_per_second",
    "data_wait_s": "trainkit_data_wait_seconds",
    "step_time_s": "trainkit_step_time_seconds",
    "mfu": "trainkit_mfu_ratio",
    "peak_memory_bytes": "trainkit_peak_memory_bytes",
    "step": "trainkit_train_step",
    "time": "trainkit_last_step_timestamp_seconds",
    "val_top1": "trainkit_val_top1_ratio",
    "val_top5": "trainkit_val_top5_ratio",
    "epoch_time_s": "trainkit_epoch_time_seconds",
    "eval_loss": "trainkit_eval_loss",
    "eval_ppl": "trainkit_eval_perplexity",
}
# Per-step rates whose median (over steps that are not warm-up) goes into summary.json.
_MEDIANS = ("tokens_per_s", "samples_per_s", "mfu", "step_time_s", "data_wait_s", "epoch_time_s")


def metrics_address(target: str) -> str:
    """Where a rank's /metrics listens: loopback on one machine (the local Prometheus scrapes 127.0.0.1),
    every interface on EKS, where Prometheus scrapes the pod's IP."""
    return "0.0.0.0" if target == "eks" else "127.0.0.1"


class MetricsSink:
    def __init__(
        self, run_dir: Path, labels: dict[str, str], is_main: bool, port: int | None, address: str = "127.0.0.1"
    ):
        """`address`: where the rank's /metrics listens; this machine only unless a scraper elsewhere needs it
        (EKS: Prometheus scrapes the pod's IP), see metrics_address."""
        self.run_dir = Path(run_dir)
        self.is_main = is_main
        self.jsonl = self.run_dir / "metrics.jsonl"
        if is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tracker = None
        self.registry = CollectorRegistry()
        names = sorted(labels)
        self._gauges = {name: Gauge(name, doc, names, registry=self.registry) for name, doc in GAUGES.items()}
        self._labels = labels
        if port:
            try:
                start_http_server(port, addr=address, registry=self.registry)
            except OSError as error:  # a busy port must not kill a training run
                log.warning("metrics port %d unavailable (%s); Prometheus export disabled for this rank", port, error)

    def set(self, gauge: str, value: float) -> None:
        self._gauges[gauge].labels(**self._labels).set(value)

    def truncate_after(self, step: int) -> list[dict]:
        """Drop lines for steps beyond `step` (written before a crash and now redone), and any torn or corrupt one;
        returns the records kept (rank 0's; none elsewhere)."""
        if not self.is_main or not self.jsonl.exists():
            return []
        kept = [
            record
            for record in read_jsonl(self.jsonl)
            if isinstance(record.get("step"), int) and record["step"] <= step
        ]
        publish_jsonl(self.jsonl, kept)
        return kept

    def log_step(self, record: dict) -> None:
        record.setdefault("time", time.time())  # wall clock: recovery times are measured across restarts
        for field, gauge in _FIELD_TO_GAUGE.items():
            if record.get(field) is not None:
                self.set(gauge, record[field])
        if self.is_main:
            append_jsonl(self.jsonl, record)  # not fsynced at every step; NaN/Infinity refused (not JSON)
            if self.tracker is not None:
                self.tracker.log(record)

    def start_tracking(self, job, kept: list[dict]) -> None:
        """Rank 0 of a job that tracks: its MLflow run (training/common/tracking.py), which first gets the steps
        the run kept (`kept`, what truncate_after returned) that it does not hold yet."""
        if self.is_main and self.tracker is None:
            from training.common.tracking import open_tracker

            self.tracker = open_tracker(job, self.run_dir, kept)

    def close_tracking(self) -> None:
        """Send what the tracker still holds, within its bound (FLUSH_S)."""
        if self.tracker is not None:
            self.tracker.close()

    def read_records(self) -> list[dict]:
        return read_jsonl(self.jsonl)

    def write_summary(self, extra: dict, eval_metric: str | None = None, lower_is_better: bool = True) -> Path:
        """summary.json: the steps, first and last loss, the medians, and where the run evaluated (`eval_metric`, the
        family's), its first, last and best figure and the best one's step."""
        records = self.read_records()
        measured = [r for r in records if not r.get("warmup") and not r.get("profiled")]  # one-off costs

        def median(key: str) -> float | None:
            values = [r[key] for r in measured if r.get(key) is not None]
            return statistics.median(values) if values else None

        summary = {
            "steps": records[-1]["step"] if records else 0,
            "first_loss": records[0]["loss"] if records else None,
            "last_loss": records[-1]["loss"] if records else None,
            **{f"{key}_median": median(key) for key in _MEDIANS},
            "peak_memory_bytes": max((r.get("peak_memory_bytes") or 0 for r in records), default=None),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        evaluated = [r for r in records if eval_metric and r.get(eval_metric) is not None]
        if evaluated:
            pick = min if lower_is_better else max
            best = pick(evaluated, key=lambda r: r[eval_metric])
            summary["evaluation"] = {
                "metric": eval_metric,
                "evaluations": len(evaluated),
                "first": evaluated[0][eval_metric],
                "last": evaluated[-1][eval_metric],
                "best": best[eval_metric],
                "best_step": best["step"],
            }
        summary.update(extra)
        return publish_text(self.run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
