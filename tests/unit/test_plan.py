"""Planner numbers against values computed by hand from the formulas in trainkit/plan/memory.py."""

from __future__ import annotations

import pytest

from tests.helpers.published import N7, N13, N70
from trainkit.errors import SpecError
from trainkit.job import build
from trainkit.plan.memory import GIB, PlanOptions, make_plan
from trainkit.plan.prices import table


def plan_of(mfu=0.40, price_per_hour=None, gpus_per_node=None, **flags):
    """The plan `invoke plan` makes for these flags (job fields, plus the planner's own options)."""
    return make_plan(build({**flags, "nproc": gpus_per_node}), PlanOptions(mfu=mfu, price_per_hour=price_per_hour))


def test_llama2_7b_on_2_p5_full_shard():
    plan = plan_of(model="llama2-7b", nodes=2)
    assert plan.param_count == N7 and plan.world_size == 16
    m = plan.memory_per_gpu["FULL_SHARD"]
    assert m.parameters == 4 * N7 / 16 == 1_684_603_904
    assert m.optimizer == 8 * N7 / 16
    # largest FSDP unit = one decoder layer, 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 = 202,383,360
    # parameters (more than the 131,072,000 of the embedding), in bf16, x2 for prefetch
    assert m.gathered_parameters == 2 * 202_383_360 * 2
    # the recipe's GPU default recomputes every 2nd layer: 16 layers x 2sbh (their inputs), the other 16 x 34sbh,
    # plus one 34sbh while a layer is recomputed; s=4096, b=4, h=4096
    sbh = 4096 * 4 * 4096
    assert plan.job.parallelism.ac_every == 2
    assert m.activations == 16 * 2 * sbh + 16 * 34 * sbh + 34 * sbh
    every_layer = plan_of(model="llama2-7b", nodes=2, ac_every=1).memory_per_gpu["FULL_SHARD"]
    assert every_layer.activations == 32 * 2 * sbh + 34 * sbh
    assert (
        plan_of(model="llama2-7b", nodes=2, activation_checkpointing=False).memory_per_gpu["FULL_SHARD"].activations
        == 32 * 34 * sbh
    )
    assert m.logits == 8 * 4096 * 4 * 32000
    assert plan.fits["FULL_SHARD"] and not plan.fits["NO_SHARD"]
    # NO_SHARD: 16 bytes per parameter replicated = 100.4 GiB > 80 GiB
    assert plan.memory_per_gpu["NO_SHARD"].parameters * 4 / GIB == pytest.approx(16 * N7 / GIB)


def test_llama2_13b_hybrid_shards_within_a_node_only():
    plan = plan_of(model="llama2-13b", nodes=4, sharding="HYBRID_SHARD")
    assert plan.param_count == N13 and plan.shard_group == 8
    assert plan.memory_per_gpu["HYBRID_SHARD"].parameters == 4 * N13 / 8


def test_llama2_70b_on_16_nodes_throughput_and_cost():
    plan = plan_of(model="llama2-70b", nodes=16, gpus_per_node=8, mfu=0.4)
    assert plan.param_count == N70
    # global batch raised from the recipe's 64 to fill 128 GPUs at micro batch 1
    assert plan.global_batch_size == 128 and plan.grad_accum_steps == 1
    # FLOPs/token = 6 x (80 layers x 855,654,400 + 32000 x 8192) + 12 x 80 x 8192 x 4096
    flops_per_token = 6 * (80 * 855_654_400 + 32000 * 8192) + 12 * 80 * 8192 * 4096
    assert plan.flops_per_token == flops_per_token
    step_time = flops_per_token * 128 * 4096 / (0.4 * 989e12 * 128)
    assert plan.step_time_s == pytest.approx(step_time)
    hourly = table()["ec2_hour"]["p5.48xlarge"]  # no credentials in the unit layer: the shipped table's price
    assert plan.usd_per_hour == pytest.approx(16 * hourly) and plan.cost.price.source.startswith("table of 2026-")
    assert plan.usd_per_epoch == pytest.approx(16 * hourly * 1e8 / (128 * 4096 / step_time) / 3600)


def test_price_override_and_bad_input():
    assert plan_of(model="llama2-7b", price_per_hour=55.0).usd_per_hour == 55.0
    with pytest.raises(SpecError, match="--instance-type 'p9.huge' is unknown"):
        plan_of(model="llama2-7b", instance_type="p9.huge")
    with pytest.raises(SpecError, match="--mfu must be in"):
        plan_of(model="llama2-7b", mfu=1.5)


# BertForMaskedLM built from bert-1.5b's config on the meta device has this many parameters (tests/unit/
# test_bert_models.py holds the registry's BertArch.parameters() to the built model).
BERT_15B = 1_527_814_522


def test_zero1_partitions_only_the_optimizer_state_of_the_registrys_exact_parameter_count():
    """ZeRO stage 1 (Rajbhandari et al. 2020, section 5.1) with fp32 gradient accumulation: 2Ψ + (2Ψ + 4Ψ) +
    12Ψ/N_d, Ψ the registry's BertForMaskedLM count (not the FLOPs shape's 1,572,385,600 with an untied head),
    N_d = 16 nodes x 8 GPUs."""
    plan = plan_of(model="bert-1.5b", nodes=16, sharding="ZERO_1")
    assert plan.param_count == BERT_15B and plan.world_size == 128 and plan.shard_group == 128
    zero = plan.memory_per_gpu["ZERO_1"]
    assert zero.optimizer == 12 * BERT_15B / 128  # fp32 master weights + LAMB's two fp32 moments, partitioned
    assert zero.parameters == 2 * BERT_15B  # bf16, on every GPU
    assert zero.gradients == 2 * BERT_15B + 4 * BERT_15B  # bf16, and their fp32 sum over the micro batches
    assert zero.buckets == 4 * 500_000_000  # at most one fp32 copy of DeepSpeed 0.19.8's all-reduce bucket
    assert zero.gathered_parameters == 0
    # the recipe: micro batch 16 of 128 tokens; 48 layers x 34sbh (h = 1600, no recomputation), fp32 logits + grad
    assert zero.activations == 48 * 34 * 128 * 16 * 1600 and zero.logits == 8 * 128 * 16 * 30522
    two_nodes = plan_of(model="bert-1.5b", nodes=2, sharding="ZERO_1").memory_per_gpu["ZERO_1"]
    assert two_nodes.optimizer == 8 * zero.optimizer  # a share of the world: an eighth of the GPUs, 8 times each
    ddp = plan.memory_per_gpu["NO_SHARD"]
    assert (ddp.parameters, ddp.gradients, ddp.optimizer, ddp.buckets) == tuple(
        k * BERT_15B for k in (4, 4, 8, 4)
    )  # fp32 replica, its gradients, two moments, DDP's bucket copy of the gradients
    assert list(plan.memory_per_gpu) == ["ZERO_1", "NO_SHARD"] and all(plan.fits.values())


def test_bert_plans_the_recipes_strategy_and_refuses_what_invoke_train_refuses():
    from trainkit.job.models import get_model

    assert plan_of(model="bert-1.5b").job.parallelism.sharding == get_model("bert-1.5b").recipe.sharding
    assert plan_of(model="bert-large", sharding="NO_SHARD").job.parallelism.sharding == "NO_SHARD"
    with pytest.raises(SpecError, match=r"--sharding ZERO_1: DeepSpeed ZeRO-1 is BERT's; llama2-7b shards with FSDP2"):
        plan_of(model="llama2-7b", sharding="ZERO_1")
    with pytest.raises(SpecError, match=r"--sharding FULL_SHARD: bert-1.5b trains data-parallel: ZERO_1"):
        plan_of(model="bert-1.5b", sharding="FULL_SHARD")
    with pytest.raises(SpecError, match=r"--activation-checkpointing applies to decoder models, not to bert-1.5b"):
        plan_of(model="bert-1.5b", activation_checkpointing=True)
    with pytest.raises(SpecError, match=r"resnet50 is a vision model: measure it with `invoke train"):
        plan_of(model="resnet50")


def test_the_bert_plan_prints_zero1s_share_throughput_and_cost():
    from trainkit.plan.shown import render_plan

    text = render_plan(plan_of(model="bert-1.5b", nodes=16, sharding="ZERO_1"))
    header = next(line for line in text.splitlines() if line.strip().startswith("strategy"))
    assert header.split() == ["strategy", "params", "grads", "optim", "buckets", "activ", "logits", "total", "fits"]
    row = next(line for line in text.splitlines() if line.startswith(" *ZERO_1"))
    assert row.split()[3] == f"{12 * BERT_15B / 128 / GIB:.1f}"  # the optimizer share, GiB
    assert "1,527,814,522" in text and "over the 128 ranks" in text and "$ per epoch" in text
    assert "with the communication" in text


@pytest.mark.parametrize("kind", ["llama2", "llama3", "qwen3", "gemma"])
def test_the_planners_adapter_count_is_what_peft_injects(kind):
    """LoRA's trained parameters as the planner counts them (training/common/flops.py) against PEFT's own injection
    into the model transformers builds (on the meta device), for decoder types with multi-head and grouped-query
    attention and a head width of their own (Qwen3, Gemma), every linear layer and a few."""
    import torch
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.helpers.tiny_decoders import tiny_config
    from training.decoders import DecoderArch

    config = tiny_config(kind)
    shape = DecoderArch.from_config(config).shape()
    for targets in (None, ("q_proj", "v_proj", "down_proj")):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        # the launcher's names (torch-free, from the shape) are the model's own linear layers, in its order
        from training.llm.lora import default_targets
        from training.llm.model import decoder_layer_class

        layer_class = decoder_layer_class(AutoConfig.for_model(**config))
        assert list(shape.linear_shapes()) == default_targets(model, layer_class), kind
        names = list(targets or shape.linear_shapes())
        inject_adapter_in_model(LoraConfig(r=4, target_modules=names), model, low_cpu_mem_usage=True)
        injected = sum(p.numel() for name, p in model.named_parameters() if ".lora_" in name)
        assert shape.adapter_params(4, targets) == injected, (kind, targets)


def test_llama2_70b_with_lora_fits_one_p5_node_where_its_full_fine_tune_needs_more():
    from trainkit.plan.shown import render_plan

    plan = plan_of(model="llama2-70b", lora_rank=16)
    assert plan.adapter_params == 80 * 16 * (4 * (8192 + 8192) + 3 * (8192 + 28672)) - 80 * 16 * 2 * (8192 - 1024)
    assert plan.fits["FULL_SHARD"] and plan.fewest_nodes == 1
    full_bytes, full_nodes = plan.full_finetune
    assert full_nodes > 1 and full_bytes > plan.memory_per_gpu["FULL_SHARD"].total
    full = plan_of(model="llama2-70b")  # the same job without adapters: the planner's own full fine-tune
    assert full.fewest_nodes == full_nodes and full.memory_per_gpu["FULL_SHARD"].total == full_bytes
    # 4 FLOPs a frozen weight instead of 6, the adapters 6 each
    assert plan.flops_per_token < full.flops_per_token * 0.7
    text = render_plan(plan)
    assert "fewest nodes        1 x p5.48xlarge (FULL_SHARD" in text
    assert f"instead of {full_nodes} x p5.48xlarge" in text
