""" "Training run": one run's progress, throughput, efficiency and health, from its ranks' metrics."""

from __future__ import annotations

from .common import build_dashboard, query, query_variable, stat_panel, timeseries_panel

RUN = '{run_id="$run_id"}'
RANK0 = '{run_id="$run_id", rank="0"}'  # job-wide values (loss, throughput) are the same on every rank
PER_RANK = "rank {{rank}}"


def progress_row() -> tuple[str, list]:
    return "Progress", [
        stat_panel("Step", "Last completed optimizer step.", "none", [query(f"max(trainkit_train_step{RUN})")]),
        stat_panel(
            "Since last step",
            "Seconds since a rank last logged a step; the stall alert fires at 300.",
            "s",
            [query(f"time() - max(trainkit_last_step_timestamp_seconds{RUN})")],
        ),
        stat_panel(
            "Restarts", "Times the run resumed from a checkpoint.", "none", [query(f"max(trainkit_restarts{RUN})")]
        ),
        stat_panel(
            "Stall restarts",
            "Of those, the restarts the stall watchdog made after a rank stopped stepping (events.jsonl: stalled).",
            "none",
            [query(f"max(trainkit_stall_restarts{RUN})")],
        ),
        stat_panel(
            "Ranks reporting",
            "Ranks whose metrics Prometheus scrapes.",
            "none",
            [query(f"count(trainkit_train_step{RUN})")],
        ),
        timeseries_panel(
            "Loss",
            "Mean loss over the global batch, and the loss on the held-out data at each evaluation (language models "
            "given --eval-fraction or --eval-data).",
            "none",
            [query(f"trainkit_train_loss{RANK0}", "loss"), query(f"trainkit_eval_loss{RANK0}", "eval loss")],
        ),
        timeseries_panel(
            "Learning rate", "Learning rate of the last step.", "none", [query(f"trainkit_learning_rate{RANK0}", "lr")]
        ),
    ]


def throughput_row() -> tuple[str, list]:
    return "Throughput and efficiency", [
        timeseries_panel(
            "Tokens per second",
            "Training tokens per second, whole job (language models).",
            "short",
            [query(f"trainkit_tokens_per_second{RANK0}", "tokens/s")],
            width=8,
        ),
        timeseries_panel(
            "Samples per second",
            "Sequences or images per second, whole job.",
            "short",
            [query(f"trainkit_samples_per_second{RANK0}", "samples/s")],
            width=8,
        ),
        timeseries_panel(
            "MFU",
            "Model FLOPs utilisation against the accelerator's dense BF16 peak (absent without a peak).",
            "percentunit",
            [query(f"trainkit_mfu_ratio{RANK0}", "MFU")],
            width=8,
        ),
    ]


def ranks_row() -> tuple[str, list]:
    return "Ranks", [
        timeseries_panel(
            "Step time per rank",
            "Wall time of the last optimizer step on each rank.",
            "s",
            [query(f"trainkit_step_time_seconds{RUN}", PER_RANK)],
        ),
        timeseries_panel(
            "Per-rank skew",
            "(slowest - fastest) / mean step time across ranks; a straggler shows as a rise.",
            "percentunit",
            [
                query(
                    f"(max(trainkit_step_time_seconds{RUN}) - min(trainkit_step_time_seconds{RUN}))"
                    f" / avg(trainkit_step_time_seconds{RUN})",
                    "skew",
                )
            ],
        ),
        timeseries_panel(
            "Input wait per rank",
            "Time each step waited for its batch (vision); above 0 the input pipeline is the bottleneck.",
            "s",
            [query(f"trainkit_data_wait_seconds{RUN}", PER_RANK)],
        ),
        timeseries_panel(
            "Peak memory per rank",
            "Peak accelerator memory (max RSS on CPU) of each rank.",
            "bytes",
            [query(f"trainkit_peak_memory_bytes{RUN}", PER_RANK)],
        ),
        timeseries_panel(
            "Checkpoint save time",
            "Wall time of the last checkpoint save.",
            "s",
            [query(f"max(trainkit_checkpoint_duration_seconds{RUN})", "save")],
            width=24,
        ),
    ]


def build():
    return build_dashboard(
        "Training run",
        "trainkit-training-run",
        "Loss, throughput, MFU, step time, restarts and per-rank skew of one trainkit run.",
        [query_variable("run_id", "Run", "trainkit_train_step")],
        [progress_row(), throughput_row(), ranks_row()],
    )
