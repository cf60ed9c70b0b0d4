"""Job spec: precedence, coercion, derived values, and errors that name the flag to change."""

from __future__ import annotations

import json

import pytest

from tests.helpers.jobs import build_spec, spec_file
from trainkit import hardware
from trainkit.errors import SpecError
from trainkit.run.prepare import write_spec


@pytest.fixture(autouse=True)
def no_local_services(monkeypatch, tmp_path):
    """No `make up` etcd of this checkout leaks into the rendezvous checks."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))


def spec_of(**flags):
    return build_spec(flags)


def test_recipe_then_profile_then_flags(tmp_path):
    spec = spec_of(model="llama2-tiny", runs_dir=str(tmp_path), steps="7", lr="0.01")
    assert spec.steps == 7 and spec.lr == 0.01  # flags (as text) win and are typed
    assert spec.seq_len == 128 and spec.global_batch_size == 16  # from the llama2-tiny recipe
    assert spec.rdzv == "c10d" and spec.target == "local"  # local profile; c10d: the local default
    assert spec.grad_accum_steps == spec.global_batch_size // (spec.micro_batch_size * spec.world_size)


def test_run_id_is_stable_for_the_same_training_and_changes_with_it(tmp_path):
    a = spec_of(runs_dir=str(tmp_path), steps=10)
    b = spec_of(runs_dir=str(tmp_path), steps=10, log_interval=5, metrics_port=0)
    c = spec_of(runs_dir=str(tmp_path), steps=11)
    assert a.run_id == b.run_id  # logging does not change what is trained: same run, resumable
    assert a.run_id != c.run_id
    assert a.run_id.startswith("llama2-tiny-")


def test_recipe_micro_batch_shrinks_to_fit_processes(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "local_gpu_count", lambda: 8)
    spec = spec_of(runs_dir=str(tmp_path))  # 16 sequences over 8 GPUs: micro 8 cannot fit
    assert spec.nproc == 8 and spec.micro_batch_size == 2 and spec.grad_accum_steps == 1


def test_layers_label_and_limits(tmp_path):
    spec = spec_of(model="llama2-7b", layers=2, seq_len=128, runs_dir=str(tmp_path))
    assert spec.truncated_label == "llama2-7b truncated to 2 of 32 layers"
    with pytest.raises(SpecError, match=r"--layers 33 exceeds llama2-7b's 32 layers"):
        spec_of(model="llama2-7b", layers=33)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"model": "gpt5"}, r"--model 'gpt5' is not a known model; choose one of: llama2-7b, llama2-13b"),
        ({"steps": "-3"}, r"--steps must be a positive integer \(got -3\)"),
        ({"steps": "ten"}, r"--steps must be an integer \(got 'ten'\)"),
        ({"global_batch_size": 10, "micro_batch_size": 4}, r"--global-batch-size 10 is not divisible by"),
        ({"nproc": 4096}, r"--nproc 4096 x --nodes 1 needs 4096 processes but this machine has"),
        ({"sharding": "ZERO3"}, r"--sharding 'ZERO3' is not valid; choose one of: FULL_SHARD, HYBRID_SHARD"),
        ({"sharding": "HYBRID_SHARD"}, r"HYBRID_SHARD shards within a node .* needs --nodes >= 2"),
        ({"seq_len": 4096}, r"--seq-len 4096 exceeds llama2-tiny's context of 512 tokens"),
        ({"init": "pretrained"}, r"llama2-tiny has no published weights"),
        ({"weights": "/x"}, r"--weights is only used with --init pretrained"),
        ({"rdzv": "etcd"}, r"--rdzv etcd needs an etcd server: run `make up`"),
        ({"steps": 5, "epochs": 1}, r"give either --steps or --epochs"),
        ({"activation_checkpointing": "maybe"}, r"--activation-checkpointing must be true or false"),
        ({"run_id": "../escape"}, r"--run-id '../escape': use 1-63 ASCII letters"),
        ({"lr": "0"}, r"--lr must be positive"),
        ({"sharding": "NO_SHARD", "prefetch": 2}, r"--prefetch: FSDP2 settings, and --sharding NO_SHARD is DDP"),
        ({"sharding": "NO_SHARD", "reshard_last_layer": "false"}, r"--reshard-last-layer: FSDP2 settings"),
        ({"precision": "fp32", "reduce_dtype": "bf16"}, r"--reduce-dtype bf16: under --precision fp32"),
        ({"reduce_dtype": "bf16"}, r"--reduce-dtype bf16: under --precision auto on this machine \(no GPU\)"),
        (
            {"sharding": "SHARD_GRAD_OP", "reshard_last_layer": "false"},
            r"--reshard-last-layer false: under --sharding SHARD_GRAD_OP no layer reshards after forward",
        ),
        ({"ac_every": 2}, r"--ac-every 2: selects the layers .* add --activation-checkpointing true"),
        ({"model": "resnet-tiny", "pin_memory": "true"}, r"--pin-memory true pins host memory .* and no GPU"),
        (
            {"model": "resnet-tiny", "synthetic": True, "steps": 3, "prefetch_factor": 2, "pin_memory": "false"},
            r"--pin-memory, --prefetch-factor: data loader settings, and --synthetic makes its batches on the device",
        ),
        (
            {"model": "resnet-tiny", "loader_workers": 0, "persistent_workers": "false"},
            r"--persistent-workers: settings of loader worker processes, and --loader-workers 0",
        ),
        ({"channels_last": "true"}, r"--channels-last applies to vision models, not to llama2-tiny"),
    ],
)
def test_bad_input_names_the_flag(flags, message, monkeypatch):
    monkeypatch.setattr(hardware, "local_gpu_count", lambda: 0)  # the messages of a machine without GPUs, anywhere
    with pytest.raises(SpecError, match=message):
        spec_of(**flags)


def test_the_default_reduction_dtype_may_be_given_under_fp32(monkeypatch):
    """fp32 is what an fp32 run reduces in anyway (issue 50): only `bf16`, which it would ignore, is refused."""
    monkeypatch.setattr(hardware, "local_gpu_count", lambda: 0)
    assert spec_of(reduce_dtype="fp32").reduce_dtype == "fp32"


@pytest.mark.parametrize("target", ["local", "eks"])
def test_max_runtime_is_a_deadline_on_every_target(target, recorded_outputs):
    """SageMaker and Batch map it too, with their own limits (tests/integration/test_sagemaker_dry_run.py,
    tests/unit/test_aws_batch_request.py); the spot-only flags stay SageMaker's."""
    assert spec_of(target=target, model="llama2-7b", max_runtime="90m").max_runtime == 5400
    with pytest.raises(SpecError, match=r"--max-wait is for --target sagemaker \(managed spot training\); drop it"):
        spec_of(target=target, model="llama2-7b", max_runtime="90m", max_wait="2h")


def test_compile_without_a_compiler_is_refused_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "local_gpu_count", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ on it
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(
        SpecError, match=r"--compile true: .* a C\+\+ compiler and this machine has none .* g\+\+ python3-dev"
    ):
        spec_of(compile="true")
    (tmp_path / "g++").write_text("#!/bin/sh\n")
    (tmp_path / "g++").chmod(0o755)
    assert spec_of(compile="true").compile is True  # a compiler on PATH: accepted


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(SpecError, match=r"--profile 'nope' does not exist; choose one of: aws, local"):
        build_spec({}, profile="nope")


def test_spec_json_written_and_a_different_job_refused_in_the_same_run(tmp_path):
    spec = spec_of(runs_dir=str(tmp_path), run_id="demo", steps=10)
    path = write_spec(spec.job)
    data = json.loads(path.read_text())
    assert data["optimisation"]["steps"] == 10 and data["derived"]["world_size"] == spec.world_size
    assert data["run"]["run_id"] == "demo"
    write_spec(spec_of(runs_dir=str(tmp_path), run_id="demo", steps=10, log_interval=3).job)  # resumable change
    # the refusal names the run's value, so the command that continues it can be written from it
    with pytest.raises(SpecError, match=r"run 'demo' already exists with different --lr \(the run's: 0.003\), which"):
        write_spec(spec_of(runs_dir=str(tmp_path), run_id="demo", steps=10, lr=0.5).job)
    # LoRA (issue 53): a run continued with another rank is another training; the refusal gives the run's rank
    lora = {"runs_dir": str(tmp_path), "run_id": "adapted", "init": "pretrained", "weights": str(tmp_path)}
    write_spec(spec_of(**lora, lora_rank=4).job)
    with pytest.raises(SpecError, match=r"different --lora-rank \(the run's: 4\), which changes what it trains"):
        write_spec(spec_of(**lora, lora_rank=8).job)


def test_a_run_continues_at_another_size_with_its_own_global_batch_and_learning_rate(monkeypatch, tmp_path):
    """The same command on 3 processes instead of 2: the same derived run, resumed from its checkpoint. The recipe's
    global batch rounded for 3 processes (and the learning rate scaled with it) gives way to the run's; what the
    user changes that changes the training is refused, named."""
    monkeypatch.setattr(hardware, "local_cpu_count", lambda: 8)
    two, three = spec_of(runs_dir=str(tmp_path), steps=10), spec_of(runs_dir=str(tmp_path), steps=10, nproc=3)
    assert two.run_id == three.run_id and two.nproc == 2  # what it trains, not where: one run
    assert (two.global_batch_size, three.global_batch_size) == (16, 15) and three.lr < two.lr  # rounded per process
    write_spec(two.job)
    (two.run_dir / "checkpoints" / "step-00000004").mkdir(parents=True)
    (two.run_dir / "checkpoints" / "step-00000004" / "COMPLETE").touch()
    assert any(note.startswith("global batch 15: the recipe's 16 rounded") for note in three.job.run.notes)
    write_spec(three.job)
    assert three.job.run.notes[-1] == (
        f"resuming step 4 of a 2-process run on 3 processes; its global batch 16 and learning rate {two.lr:g} stay "
        "the run's"
    )
    assert not any(note.startswith("global batch 15") for note in three.job.run.notes)  # not so any more
    saved = spec_file(three.run_dir)
    assert (saved.nproc, saved.global_batch_size, saved.lr, saved.global_batch_derived) == (3, 16, two.lr, True)
    assert (two.micro_batch_size, three.micro_batch_size) == (8, 5)  # each fitted to its own launch's batch
    assert saved.micro_batch_size == 6  # refitted to the run's: 16 over 3 processes is 6 at most, in one pass
    given = spec_of(runs_dir=str(tmp_path), run_id=two.run_id, steps=10, nproc=2, global_batch_size=8)
    with pytest.raises(SpecError, match=r"already exists with different --global-batch-size \(the run's: 16\), which"):
        write_spec(given.job)
    again = spec_of(runs_dir=str(tmp_path), run_id=two.run_id, steps=10, nproc=2)
    write_spec(again.job)  # back on 2 processes, nothing to keep: the recipe's values are the run's
    assert again.job.run.notes[-1] == "resuming step 4 of a 3-process run on 2 processes"
    (two.run_dir / "summary.json").write_text("{}")  # finished: another launch only says so (the workers do)
    finished = spec_of(runs_dir=str(tmp_path), run_id=two.run_id, steps=10, nproc=3)
    write_spec(finished.job)
    assert not any(note.startswith("resuming") for note in finished.job.run.notes)


def test_a_run_written_before_lr_derived_existed_continues_at_another_size(monkeypatch, tmp_path):
    """A spec.json of the trainkit before (no lr_derived): its learning rate counts as chosen where this launch
    chooses one, so the run continues with its own; a launch that gives --lr must give the run's."""
    monkeypatch.setattr(hardware, "local_cpu_count", lambda: 8)
    two = spec_of(runs_dir=str(tmp_path), run_id="old", steps=10)
    path = write_spec(two.job)
    data = json.loads(path.read_text())
    del data["optimisation"]["lr_derived"]
    path.write_text(json.dumps(data))
    three = spec_of(runs_dir=str(tmp_path), run_id="old", steps=10, nproc=3)
    write_spec(three.job)
    assert spec_file(three.run_dir).lr == two.lr and "learning rate" in three.job.run.notes[-1]
    with pytest.raises(SpecError, match="different --lr"):
        write_spec(spec_of(runs_dir=str(tmp_path), run_id="old", steps=10, nproc=3, lr=0.5).job)


def test_vision_recipe_on_gpus_scales_the_learning_rate_with_the_batch(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "local_gpu_count", lambda: 8)
    monkeypatch.setattr(hardware, "local_cpu_count", lambda: 96)
    spec = spec_of(model="resnet50", runs_dir=str(tmp_path))
    assert (spec.global_batch_size, spec.micro_batch_size, spec.nproc) == (1024, 128, 8)
    assert spec.sharding == "NO_SHARD" and spec.epochs == 90 and spec.steps is None
    assert spec.lr == pytest.approx(0.4)  # 0.1 per 256 images x 1024
    assert (spec.warmup_epochs, spec.warmup_steps, spec.image_size) == (5, None, 224)
    assert spec.loader_workers == 10  # this machine's 96 CPUs / 8 processes, less 2 (tests/unit/test_loader_workers.py)
    assert (spec.grad_clip, spec.weight_decay, spec.label_smoothing) == (0.0, 1e-4, 0.1)
    lamb = spec_of(model="resnet50", optimizer="lamb", global_batch_size="4096", runs_dir=str(tmp_path))
    assert lamb.lr == pytest.approx(0.005 * 4)  # square root of 4096/256
    given = spec_of(model="resnet50", lr="0.2", warmup_steps="100", steps="500", runs_dir=str(tmp_path))
    assert (given.lr, given.warmup_steps, given.warmup_epochs, given.steps, given.epochs) == (0.2, 100, None, 500, None)
    assert not any("learning rate" in note for note in given.notes)


def test_vision_on_a_cpu_machine_uses_the_cpu_recipe_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "local_gpu_count", lambda: 0)
    spec = spec_of(model="efficientnet-b7", runs_dir=str(tmp_path))
    assert (spec.global_batch_size, spec.micro_batch_size, spec.loader_workers) == (8, 4, 1)
    assert any(note.startswith("no GPU: using the CPU settings of the efficientnet-b7 recipe") for note in spec.notes)
    own_batch = spec_of(model="efficientnet-b7", global_batch_size="16", runs_dir=str(tmp_path))
    assert (own_batch.global_batch_size, own_batch.micro_batch_size) == (16, 8)  # batch flags keep the GPU micro


def test_synthetic_input_runs_steps_without_warmup_epochs(tmp_path):
    spec = spec_of(model="resnet-tiny", synthetic=True, runs_dir=str(tmp_path))
    assert (spec.steps, spec.epochs, spec.warmup_steps, spec.warmup_epochs) == (50, None, 0, None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"model": "resnet50", "seq_len": "512"}, "--seq-len applies to language models, not to resnet50; drop it"),
        ({"model": "llama2-tiny", "image_size": "64"}, "--image-size applies to vision models, not to llama2-tiny"),
        ({"model": "llama2-tiny", "synthetic": True}, "--synthetic applies to vision models"),
        ({"model": "resnet-tiny", "sharding": "FULL_SHARD"}, "trains data-parallel: NO_SHARD (DDP)"),
        ({"model": "resnet-tiny", "init": "pretrained"}, "trains from random weights; use --init random"),
        ({"model": "resnet-tiny", "optimizer": "adam"}, "--optimizer 'adam' is not valid; choose one of: sgd, lamb"),
        ({"model": "resnet-tiny", "optimizer": "adamw"}, "--optimizer adamw: resnet-tiny trains with sgd or lamb"),
        ({"model": "bert-tiny", "optimizer": "sgd"}, "--optimizer sgd: bert-tiny trains with lamb or adamw"),
        ({"model": "bert-tiny", "channels_last": "true"}, "--channels-last applies to vision models, not to bert-tiny"),
        ({"model": "bert-tiny", "ac_every": "2"}, "--ac-every applies to decoder models, not to bert-tiny"),
        ({"model": "bert-tiny", "sharding": "FULL_SHARD"}, "ZERO_1 (DeepSpeed ZeRO stage 1) or NO_SHARD (DDP)"),
        ({"model": "llama2-tiny", "sharding": "ZERO_1"}, "DeepSpeed ZeRO-1 is BERT's; llama2-tiny shards with FSDP2"),
        ({"model": "bert-tiny", "seq_len": "1024"}, "--seq-len 1024 exceeds bert-tiny's context of 512 tokens"),
        ({"model": "bert-tiny", "seq_len": "2"}, "a bert-tiny row holds [CLS], at least one token and [SEP]"),
        ({"model": "resnet-tiny", "label_smoothing": "1.5"}, "--label-smoothing must be in [0, 1)"),
        ({"model": "resnet-tiny", "image_size": "0"}, "--image-size must be a positive integer"),
        ({"model": "resnet-tiny", "synthetic": True, "epochs": "2"}, "--synthetic has no dataset to count epochs"),
        ({"model": "resnet-tiny", "synthetic": True, "dataset": "/data"}, "--synthetic feeds random tensors"),
        (
            {"model": "resnet-tiny", "warmup_steps": "3", "warmup_epochs": "1"},
            "either --warmup-steps or --warmup-epochs",
        ),
    ],
)
def test_vision_flag_errors_name_the_flag(flags, message, tmp_path):
    with pytest.raises(SpecError) as error:
        spec_of(runs_dir=str(tmp_path), **flags)
    assert message in str(error.value)


def test_elastic_node_range_and_restarts(monkeypatch, tmp_path):
    spec = spec_of(nodes="1:2", nproc="1", max_restarts="5", runs_dir=str(tmp_path))
    assert (spec.min_nodes, spec.nodes, spec.max_restarts, spec.world_size) == (1, 2, 5, 2)
    fixed = spec_of(nodes="2", nproc="1", runs_dir=str(tmp_path))
    assert fixed.min_nodes == 2 and fixed.run_id == spec.run_id  # elasticity does not change what is trained
    with pytest.raises(SpecError, match=r"--nodes must be N or MIN:MAX, e\.g\. 1:2 \(got '1:x'\)"):
        spec_of(nodes="1:x")
    with pytest.raises(SpecError, match="--nodes 3:2: the minimum must not exceed the maximum"):
        spec_of(nodes="3:2", nproc="1")
    # 9 sequences split over 3 processes, but not over the 2 an elastic 2:3 job may shrink to.
    monkeypatch.setattr(hardware, "local_cpu_count", lambda: 8)
    with pytest.raises(SpecError, match=r"1 x 2 processes = 2 \(at 2 node\(s\), allowed by --nodes 2:3\)"):
        spec_of(nodes="2:3", nproc="1", global_batch_size="9", micro_batch_size="1")


def test_hybrid_shard_on_cpu_processes_is_refused_before_anything_starts(monkeypatch):
    """Accelerate refuses its 2-D mesh on CPU processes (measured: a ValueError in every rank after start)."""
    monkeypatch.setattr(hardware, "local_gpu_count", lambda: 0)
    monkeypatch.setattr(hardware, "local_cpu_count", lambda: 8)
    flags = {"model": "llama2-tiny", "sharding": "HYBRID_SHARD", "nodes": "2", "nproc": "2"}
    with pytest.raises(SpecError, match=r"HYBRID_SHARD needs GPUs.*use FULL_SHARD here"):
        build_spec(flags)
    assert build_spec({**flags, "sharding": "FULL_SHARD"}).sharding == "FULL_SHARD"
    assert build_spec({**flags, "target": "eks", "nproc": "8"}).sharding == "HYBRID_SHARD"
