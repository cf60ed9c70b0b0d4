"""Every option of `invoke train` and `invoke plan` (and `invoke run`'s own) with a bad value: refused before anything
starts.

Each case: exit code 2, one line on stderr naming the flag (or file) and what to change, no traceback,
and nothing created (no runs folder, no run folder, no spec.json). The table must cover every option the
two commands have (derived from the job model's fields and the plan task's own flags), so a new option
without a bad case fails here.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.product import invoke
from tests.helpers.tiny_decoders import write_tiny
from tests.helpers.tracked import TokenGate
from training.spec import all_fields
from trainkit.backends.sagemaker.request import CHECKPOINTS
from trainkit.cli.options import task_arguments
from trainkit.cli.run import RUN_KEYS
from trainkit.cli.run import run as run_task
from trainkit.cli.train import PLAN_FLAGS

VISION = ("--model", "resnet-tiny")
EKS = ("--target", "eks")
SAGEMAKER = ("--target", "sagemaker")
SAGEMAKER_RUNS = CHECKPOINTS  # the only --runs-dir a SageMaker job takes (the folder SageMaker syncs with S3)

# option -> (extra flags that put the bad value in context, the bad flag and value, text the message names)
TRAIN: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "run_id": ((), ("--run-id", "-abc"), "--run-id"),
    "runs_dir": ((), ("--runs-dir", "{file}"), "--runs-dir"),
    "seed": ((), ("--seed", "x"), "--seed"),
    "log_interval": ((), ("--log-interval", "0"), "--log-interval"),
    "metrics_port": ((), ("--metrics-port", "70000"), "--metrics-port"),
    "peak_tflops": ((), ("--peak-tflops", "-5"), "--peak-tflops"),
    "model": ((), ("--model", "gpt-9"), "--model"),
    "init": ((), ("--init", "magic"), "--init"),
    "weights": (VISION, ("--weights", "x"), "--weights"),
    "layers": ((), ("--layers", "0"), "--layers"),
    "dataset": ((), ("--dataset", "some-name"), "--dataset"),
    "dataset_split": ((), ("--dataset-split", ""), "--dataset-split"),
    "data_format": ((), ("--data-format", "csv"), "--data-format"),
    "packing": ((), ("--packing", "loose"), "--packing"),
    "truncation": ((), ("--truncation", "right"), "--truncation"),
    "seq_len": ((), ("--seq-len", "99999"), "--seq-len"),
    "image_size": (VISION, ("--image-size", "0"), "--image-size"),
    "synthetic": ((), ("--synthetic",), "--synthetic"),
    "loader_workers": (VISION, ("--loader-workers", "-1"), "--loader-workers"),
    "pin_memory": (VISION, ("--pin-memory", "maybe"), "--pin-memory"),
    "persistent_workers": (VISION, ("--persistent-workers", "maybe"), "--persistent-workers"),
    "prefetch_factor": (VISION, ("--prefetch-factor", "0"), "--prefetch-factor"),
    "steps": ((), ("--steps", "0"), "--steps"),
    "epochs": ((), ("--epochs", "0"), "--epochs"),
    "global_batch_size": ((), ("--global-batch-size", "0"), "--global-batch-size"),
    "micro_batch_size": ((), ("--micro-batch-size", "0"), "--micro-batch-size"),
    "lr": ((), ("--lr", "inf"), "--lr"),
    "schedule": ((), ("--schedule", "zigzag"), "--schedule"),
    "warmup_steps": ((), ("--warmup-steps", "-1"), "--warmup-steps"),
    "warmup_epochs": (VISION, ("--warmup-epochs", "-1"), "--warmup-epochs"),
    "weight_decay": ((), ("--weight-decay", "nan"), "--weight-decay"),
    "grad_clip": ((), ("--grad-clip", "-1"), "--grad-clip"),
    "optimizer": (VISION, ("--optimizer", "adam"), "--optimizer"),
    "label_smoothing": (VISION, ("--label-smoothing", "1.5"), "--label-smoothing"),
    "nodes": ((), ("--nodes", "0"), "--nodes"),
    "nproc": ((), ("--nproc", "0"), "--nproc"),
    "sharding": ((), ("--sharding", "ZERO"), "--sharding"),
    "precision": ((), ("--precision", "fp8"), "--precision"),
    "activation_checkpointing": ((), ("--activation-checkpointing", "maybe"), "--activation-checkpointing"),
    "ac_every": ((), ("--ac-every", "0"), "--ac-every"),
    "prefetch": ((), ("--prefetch", "-1"), "--prefetch"),
    "reshard_last_layer": ((), ("--reshard-last-layer", "maybe"), "--reshard-last-layer"),
    "reduce_dtype": ((), ("--reduce-dtype", "fp16"), "--reduce-dtype"),
    "attention": ((), ("--attention", "xformers"), "--attention"),
    "fused_adamw": ((), ("--fused-adamw", "maybe"), "--fused-adamw"),
    "compile": ((), ("--compile", "maybe"), "--compile"),
    "channels_last": (VISION, ("--channels-last", "maybe"), "--channels-last"),
    "checkpoint_interval": ((), ("--checkpoint-interval", "-1"), "--checkpoint-interval"),
    "keep_checkpoints": ((), ("--keep-checkpoints", "0"), "--keep-checkpoints"),
    "storage_mb_s": ((), ("--storage-mb-s", "0"), "--storage-mb-s"),
    "max_restarts": ((), ("--max-restarts", "-1"), "--max-restarts"),
    "collective_timeout": ((), ("--collective-timeout", "0"), "--collective-timeout"),
    "stall_timeout": ((), ("--stall-timeout", "-5"), "--stall-timeout"),
    "rdzv": ((), ("--rdzv", "zmq"), "--rdzv"),
    "rdzv_endpoint": ((), ("--rdzv-endpoint", "no-port-here"), "--rdzv-endpoint"),
    "target": ((), ("--target", "gcp"), "--target"),
    "instance_type": ((), ("--instance-type", "p5.48xlarge"), "--instance-type"),  # on the local target
    "image": ((), ("--image", "example/train:1"), "--image"),
    "namespace": (EKS, ("--namespace", "Not_A_Label"), "--namespace"),
    "hf_token_file": ((), ("--hf-token-file", "{missing}"), "--hf-token-file"),
    "max_runtime": (SAGEMAKER, ("--max-runtime", "3 days"), "--max-runtime"),
    "spot": ((), ("--spot",), "--spot"),  # on the local target
    "max_wait": (SAGEMAKER, ("--max-wait", "1h"), "--max-wait"),  # without --spot
    "eval_data": ((), ("--eval-data", "no/such/file.jsonl"), "--eval-data"),
    "eval_split": (VISION, ("--eval-split", "test"), "--eval-split"),
    "eval_fraction": ((), ("--eval-fraction", "1"), "--eval-fraction"),
    "eval_interval": ((), ("--eval-interval", "-1"), "--eval-interval"),
    "eval_batches": ((), ("--eval-batches", "0"), "--eval-batches"),
    "keep_best": ((), ("--keep-best", "maybe"), "--keep-best"),
    "export_from": ((), ("--export-from", "first"), "--export-from"),
    "early_stop_patience": ((), ("--early-stop-patience", "0"), "--early-stop-patience"),
    "early_stop_delta": ((), ("--early-stop-delta", "-0.1"), "--early-stop-delta"),
    "lora_rank": ((), ("--lora-rank", "0"), "--lora-rank"),
    "lora_alpha": ((), ("--lora-alpha", "0"), "--lora-alpha"),
    "lora_dropout": ((), ("--lora-dropout", "1"), "--lora-dropout"),
    "lora_targets": ((), ("--lora-targets", "q_proj"), "give --lora-rank R too"),  # without adapters
    "export": ((), ("--export", "gguf"), "--export"),
    "track": ((), ("--track", "wandb"), "--track"),
    "tracking_uri": (("--track", "mlflow"), ("--tracking-uri", "ftp://mlflow.example"), "ftp scheme is not one"),
    "experiment": ((), ("--experiment", "lr-sweep"), "add --track mlflow"),
}

# Values each valid alone that the job cannot use: per rank or per node, past the model, off the volume the pods
# see; and local files whose records have the wrong types. case -> (context flags, bad flags, text the message names)
JOINT: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "a tracking URI without --track": ((), ("--tracking-uri", "http://127.0.0.1:5000"), "add --track mlflow"),
    "an ARN that is not a tracking server's": (
        ("--track", "mlflow"),
        ("--tracking-uri", "arn:aws:sagemaker:us-east-1:123456789012:training-job/llama"),
        "is not a SageMaker MLflow tracking server's ARN",
    ),
    "credentials in the tracking URI": (
        ("--track", "mlflow"),
        ("--tracking-uri", "https://alice:s3cret@mlflow.example"),
        "https://***@mlflow.example carries credentials",
    ),
    "a tracking server that does not answer, for a run here": (
        ("--track", "mlflow"),
        ("--tracking-uri", "http://127.0.0.1:9"),
        "no MLflow server answers there",
    ),
    "a tracking server that refuses this environment's token, for a run here": (
        ("--track", "mlflow"),
        ("--tracking-uri", "{gate}"),  # a server behind a proxy that wants a bearer token; MLFLOW_TRACKING_TOKEN unset
        "the server answered 401 to this environment's token (MLFLOW_TRACKING_TOKEN, not set)",
    ),
    "a SQLite tracking store for a cluster target": (
        (*EKS, "--track", "mlflow"),
        ("--tracking-uri", "sqlite:///runs/mlflow.db"),
        "a SQLite file is this machine's",
    ),
    "metrics port past 65535 for rank 1": (("--nproc", "2"), ("--metrics-port", "65535"), "--metrics-port"),
    "metrics port past 65535 for node 1": (("--nodes", "2", "--nproc", "1"), ("--metrics-port", "65535"), "ports"),
    "metrics port past 65535 for a pod's rank 7": (EKS, ("--nproc", "8", "--metrics-port", "65530"), "--metrics-port"),
    "runs folder off the FSx volume": (EKS, ("--runs-dir", "../../etc"), "--runs-dir"),
    "runs folder off the FSx volume, absolute": (EKS, ("--runs-dir", "/fsx/../etc"), "--runs-dir"),
    "dataset off the FSx volume": (EKS, ("--dataset", "../outside.jsonl"), "--dataset"),
    "dataset that climbs off the volume from inside": (EKS, ("--dataset", "data/../../etc/x.jsonl"), "--dataset"),
    "dataset whose prompt is a number": ((), ("--dataset", "{numbers}"), "field 'prompt' is int"),
    "dataset whose summary is null": ((), ("--dataset", "{nulls}"), "field 'summary' is null"),
    "dataset mixing chat and alpaca records": ((), ("--dataset", "{mixed}"), "mixed.jsonl:2: record has fields"),
    "dataset records of no known format": ((), ("--dataset", "{unknown}"), "expected one of: chat ('messages')"),
    "chat record without an assistant turn": ((), ("--dataset", "{silent}"), "has no assistant turn"),
    "forced format the records lack": (("--data-format", "text"), ("--dataset", "{mixed}"), "missing 'text'"),
    "chat records for BERT": (("--model", "bert-tiny"), ("--dataset", "{mixed}"), "this model reads text"),
    "flash attention with masked packing": ((), ("--attention", "flash"), "--packing concat"),
    "a format the generated data is not": ((), ("--data-format", "chat"), "generates dialogue-summary records"),
    "an evaluation fraction of 0": ((), ("--eval-fraction", "0"), "--eval-fraction"),
    "held-out data two ways": ((), ("--eval-data", "{mixed}", "--eval-fraction", "0.1"), "held-out data comes one way"),
    "an evaluation interval without held-out data": ((), ("--eval-interval", "10"), "no held-out data"),
    "held-out records of another format": (
        (),
        ("--dataset", "{pairs}", "--eval-data", "{chat}"),
        "are prompt-response",
    ),
    "held-out data in S3 for a run on this machine": ((), ("--eval-data", "s3://corpora/held/"), "reads no S3"),
    "held-out data on this machine for SageMaker": (
        SAGEMAKER,
        ("--eval-data", "{chat}", "--runs-dir", SAGEMAKER_RUNS),  # the run folder SageMaker syncs
        "upload it and give",
    ),
    "LoRA on random weights": ((), ("--lora-rank", "8"), "adapters trained on random base weights teach nothing"),
    "a LoRA rank above the hidden size": (
        (),
        ("--init", "pretrained", "--weights", "{tiny}", "--lora-rank", "100000"),
        "exceeds llama2-tiny's hidden size",
    ),
    "LoRA targets the model does not have": (
        (),
        ("--init", "pretrained", "--weights", "{tiny}", "--lora-rank", "8", "--lora-targets", "q_proj,wq"),
        "its decoder layer's linear layers are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
    ),
    "weights folder missing": ((), ("--init", "pretrained", "--weights", "{missing}", "--dry-run"), "no model folder"),
    "weights in S3 for a run on this machine": ((), ("--init", "pretrained", "--weights", "s3://b/base/"), "no S3"),
    "weights on this machine for SageMaker": (
        SAGEMAKER,
        ("--init", "pretrained", "--weights", "{tiny}", "--runs-dir", SAGEMAKER_RUNS),
        "SageMaker's instances cannot read",
    ),
    "weights off the FSx volume": (EKS, ("--init", "pretrained", "--weights", "../base"), "--weights ../base"),
    "LoRA on a BERT model": (("--model", "bert-tiny"), ("--lora-rank", "8"), "--lora-rank applies to decoder models"),
    "LoRA on a vision model": (VISION, ("--lora-rank", "8"), "--lora-rank applies to decoder models"),
    "a fraction that holds out no record": ((), ("--dataset", "{pairs}", "--eval-fraction", "0.1"), "holds out 0"),
    "an evaluation interval on --synthetic images": (VISION, ("--synthetic", "--eval-interval", "5"), "no val/ split"),
    "patience without evaluation": ((), ("--early-stop-patience", "3"), "the run does not evaluate"),
    "keeping the best without evaluation": ((), ("--keep-best", "true"), "the run does not evaluate"),
    "exporting the best it does not keep": (
        ("--eval-fraction", "0.1"),
        ("--keep-best", "false", "--export-from", "best"),
        "--export-from best with --keep-best false",
    ),
    "a delta without patience": (("--eval-fraction", "0.1"), ("--early-stop-delta", "0.01"), "--early-stop-patience"),
    "exporting a BERT model": (("--model", "bert-tiny"), ("--export-from", "last"), "--export-from"),
    "a held-out split without held-out data": ((), ("--eval-fraction", "0.1", "--eval-split", "test"), "--eval-split"),
    "exporting the best of several SageMaker hosts": (
        (*SAGEMAKER, "--nodes", "2", "--eval-fraction", "0.1"),
        ("--export-from", "best"),
        "cannot be loaded whole",
    ),
}

PLAN: dict[str, tuple[tuple[str, ...], str]] = {
    "model": (("--model", "gpt-9"), "--model"),
    "layers": (("--layers", "0"), "--layers"),
    "seq_len": (("--seq-len", "0"), "--seq-len"),
    "nodes": (("--nodes", "1:2"), "--nodes"),
    "nproc": (("--nproc", "16"), "--gpus-per-node"),
    "gpus_per_node": (("--gpus-per-node", "9"), "--gpus-per-node"),
    "sharding": (("--sharding", "ZERO"), "--sharding"),
    "activation_checkpointing": (("--activation-checkpointing", "maybe"), "--activation-checkpointing"),
    "micro_batch_size": (("--micro-batch-size", "0"), "--micro-batch-size"),
    "global_batch_size": (("--global-batch-size", "0"), "--global-batch-size"),
    "instance_type": (("--instance-type", "p9.huge"), "--instance-type"),
    "mfu": (("--mfu", "1.5"), "--mfu"),
    "target": (("--target", "gcp"), "--target"),
    "spot": (("--spot",), "--spot prices SageMaker's managed spot training"),  # on EKS, whose nodes are on demand
    "price_per_hour": (("--price-per-hour", "-3"), "--price-per-hour"),
    "epoch_tokens": (("--epoch-tokens", "0"), "--epoch-tokens"),
    "output": (("--scaling", "--output", "/proc/trainkit/scaling"), "--output"),
    "lora_rank": (("--model", "llama2-7b", "--lora-rank", "4097"), "exceeds llama2-7b's hidden size 4096"),
    "lora_targets": (("--model", "llama2-7b", "--lora-rank", "8", "--lora-targets", "wq"), "no linear layer named wq"),
}
PLAN_OWN = ("gpus_per_node", "mfu", "price_per_hour", "epoch_tokens", "output")  # besides the job's fields
PLAN_JOINT: dict[str, tuple[tuple[str, ...], str]] = {
    "sequence past the model's context": (("--model", "llama2-7b", "--seq-len", "999999"), "--seq-len"),
    "more layers than the model has": (("--model", "llama2-7b", "--layers", "33"), "--layers"),
    "ZeRO-1 for a Llama model": (("--model", "llama2-7b", "--sharding", "ZERO_1"), "--sharding ZERO_1"),
    "an FSDP strategy for BERT": (("--model", "bert-1.5b", "--sharding", "FULL_SHARD"), "--sharding FULL_SHARD"),
}
VALUELESS = {"json", "scaling", "published"}  # `invoke plan --json` and the like take no value

# `invoke run`'s own options (its job options are TRAIN's): option -> (bad flags, text the message names)
SCRIPT = ("--script", "examples/native_ddp.py")
RUN: dict[str, tuple[tuple[str, ...], str]] = {
    "script": (("--script", "{file}"), "--script"),
    "requirements": ((*SCRIPT, "--requirements", "{index}"), "is a pip option"),
    "wheelhouse": ((*SCRIPT, "--wheelhouse", "wheels"), "give --requirements too"),
    "require_hashes": ((*SCRIPT, "--requirements", "{unhashed}", "--require-hashes"), "has no --hash"),
    "profile": ((*SCRIPT, "--profile", "nope"), "--profile"),
}
RUN_VALUELESS = {"dry_run"}  # prints instead of running: no bad value


def test_the_tables_cover_every_option():
    train_options = {spec.key for spec in all_fields() if spec.meta["cli"]}
    assert set(TRAIN) == train_options, sorted(set(TRAIN) ^ train_options)
    assert set(PLAN) == set(PLAN_FLAGS) | set(PLAN_OWN), sorted(set(PLAN) ^ (set(PLAN_FLAGS) | set(PLAN_OWN)))
    run_own = {a.name for a in task_arguments(run_task)} - set(RUN_KEYS) - RUN_VALUELESS
    assert set(RUN) == run_own, sorted(set(RUN) ^ run_own)


def refused(result, runs, names: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stdout[-1500:], result.stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert names in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert not runs.exists(), sorted(p.name for p in runs.rglob("*"))


def refused_train(tmp_path, context: tuple[str, ...], bad: tuple[str, ...], names: str, sets_runs: bool) -> None:
    (tmp_path / "file").write_text("not a folder\n")
    (tmp_path / "numbers.jsonl").write_text('{"prompt": "Say hi.", "response": "hi"}\n{"prompt": 7, "response": "x"}\n')
    (tmp_path / "nulls.jsonl").write_text('{"dialogue": "A: hi", "summary": null}\n')
    chat = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
    (tmp_path / "mixed.jsonl").write_text(chat + '\n{"instruction": "Add 2 and 3.", "output": "5"}\n')
    (tmp_path / "unknown.jsonl").write_text('{"question": "Why?", "answer": "Because."}\n')
    (tmp_path / "silent.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "Say hi.", "response": "hi"}\n' * 2)
    (tmp_path / "chat.jsonl").write_text(chat + "\n")
    written = ("numbers", "nulls", "mixed", "unknown", "silent", "pairs", "chat")
    files = {name: tmp_path / f"{name}.jsonl" for name in written}
    files["tiny"] = write_tiny(tmp_path / "tiny", "llama2")  # a model folder's config (no weights needed to refuse)
    with TokenGate("http://127.0.0.1:9", "unguessed") as gate:
        bad = tuple(v.format(file=tmp_path / "file", missing=tmp_path / "missing", gate=gate.url, **files) for v in bad)
        runs = tmp_path / "runs"
        # The runs folder is the local one, except where the case sets it or the target is EKS (relative to FSx).
        where = () if sets_runs or context[:2] == EKS else ("--runs-dir", str(runs))
        env = {"TRAINKIT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none"), "HF_TOKEN": ""}
        result = invoke("train", *where, *context, *bad, env={**env, "MLFLOW_TRACKING_TOKEN": ""}, timeout=60)
    refused(result, runs, names)


@pytest.mark.parametrize("option", sorted(TRAIN))
def test_train_refuses(option, tmp_path):
    context, bad, names = TRAIN[option]
    refused_train(tmp_path, context, bad, names, sets_runs=option == "runs_dir")


@pytest.mark.parametrize("case", sorted(JOINT))
def test_train_refuses_what_is_valid_alone_but_not_in_this_job(case, tmp_path):
    context, bad, names = JOINT[case]
    refused_train(tmp_path, context, bad, names, sets_runs="--runs-dir" in bad)


@pytest.mark.parametrize("option", sorted(PLAN))
def test_plan_refuses(option, tmp_path):
    bad, names = PLAN[option]
    result = invoke("plan", *bad, env={"TRAINKIT_STATE_DIR": str(tmp_path / "state")}, timeout=60)
    refused(result, tmp_path / "runs", names)


@pytest.mark.parametrize("case", sorted(PLAN_JOINT))
def test_plan_refuses_what_the_model_cannot_take(case, tmp_path):
    bad, names = PLAN_JOINT[case]
    result = invoke("plan", *bad, env={"TRAINKIT_STATE_DIR": str(tmp_path / "state")}, timeout=60)
    refused(result, tmp_path / "runs", names)


@pytest.mark.parametrize("option", sorted(RUN))
def test_run_refuses(option, tmp_path):
    (tmp_path / "file").write_text("not a script\n")
    (tmp_path / "index.txt").write_text("--extra-index-url https://mirror.example/simple\ntk-extra==1.0\n")
    (tmp_path / "unhashed.txt").write_text("tk-extra==1.0\n")
    files = {"file": tmp_path / "file", "index": tmp_path / "index.txt", "unhashed": tmp_path / "unhashed.txt"}
    bad, names = RUN[option]
    runs = tmp_path / "runs"
    env = {"TRAINKIT_STATE_DIR": str(tmp_path / "state")}
    result = invoke("run", "--runs-dir", str(runs), *(v.format(**files) for v in bad), env=env, timeout=60)
    refused(result, runs, names)


# `invoke generate`'s options (before any model is loaded): option -> (flags, text the message names); and the runs
# it cannot take. Each refusal: exit 2, one line, no traceback.
GENERATE: dict[str, tuple[tuple[str, ...], str]] = {
    "run_id": (("--run-id", "nope", "--prompt", "hi"), "--run-id 'nope': no run in"),
    "prompt": (("--run-id", "dec"), "--prompt is required"),
    "max_new_tokens": (("--run-id", "dec", "--prompt", "hi", "--max-new-tokens", "0"), "--max-new-tokens 0"),
    "temperature": (("--run-id", "dec", "--prompt", "hi", "--temperature", "-1"), "--temperature -1"),
    "seed": (("--run-id", "dec", "--prompt", "hi", "--seed", "x"), "--seed take whole numbers"),
    "runs_dir": (("--prompt", "hi", "--runs-dir", "{tmp}/empty"), "no runs in"),
    "target": (("--run-id", "remote", "--prompt", "hi", "--target", "gcp"), "--target"),
}
GENERATE_VALUELESS = {"interactive"}
GENERATE_JOINT: dict[str, tuple[tuple[str, ...], str]] = {
    "a BERT run": (("--run-id", "enc", "--prompt", "hi"), "run enc trained a BERT model"),
    "a decoder run that has not exported yet": (("--run-id", "dec", "--prompt", "hi"), "run dec has no export yet"),
    "a run on SageMaker": (("--run-id", "remote", "--prompt", "hi", "--target", "sagemaker"), "/checkpoints/remote/"),
}


def generate_refused(tmp_path, flags: tuple[str, ...], names: str) -> None:
    from training.spec import Job

    runs = tmp_path / "runs"
    for run_id, model, family in (("dec", "llama2-tiny", "decoder"), ("enc", "bert-tiny", "bert")):
        job = Job()
        job.run.run_id, job.model.name, job.model.family = run_id, model, family
        (runs / run_id).mkdir(parents=True)
        (runs / run_id / "spec.json").write_text(json.dumps(job.to_dict()))
    args = [v.format(tmp=tmp_path) for v in flags]
    where = [] if "--runs-dir" in args else ["--runs-dir", str(runs)]
    result = invoke("generate", *where, *args, env={"TRAINKIT_STATE_DIR": str(tmp_path / "state")}, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stdout[-1500:], result.stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_the_generate_table_covers_every_option():
    from trainkit.cli.generate import generate

    assert set(GENERATE) | GENERATE_VALUELESS == {a.name for a in task_arguments(generate)}


@pytest.mark.parametrize("case", sorted(GENERATE) + sorted(GENERATE_JOINT))
def test_generate_refuses(case, tmp_path):
    generate_refused(tmp_path, *(GENERATE | GENERATE_JOINT)[case])
