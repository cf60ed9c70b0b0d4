"""Any Hugging Face causal LM trainkit sizes: `DecoderArch` against the models transformers builds (on the meta
device: no memory, no download), the refusals, and how `--model` resolves a folder, a config.json or a hub id."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM

from tests.helpers.tiny_decoders import TINY, tiny_config, write_tiny
from training.common.flops import TransformerShape
from training.llm.launch import prepare as prepare_decoder_run
from training.llm.model import build_model, decoder_layer_class, load_config
from training.registry import DECODER_TYPES, DecoderArch
from trainkit.backends import job_from_flags
from trainkit.errors import SpecError
from trainkit.job.models import get_model

# Published shapes, each from its repository's config.json on the Hugging Face hub (numbers copied, not fetched);
# `params` is the count the model card reports, which the built model must also give.
PUBLISHED = {
    # meta-llama/Meta-Llama-3-8B, config.json
    "llama-3-8b": {
        "config": {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-05,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 128000,
            "eos_token_id": 128001,
            "torch_dtype": "bfloat16",
        },
        "params": 8_030_261_248,
    },
    # mistralai/Mistral-7B-v0.1, config.json
    "mistral-7b-v0.1": {
        "config": {
            "model_type": "mistral",
            "architectures": ["MistralForCausalLM"],
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-05,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "bfloat16",
        },
        "params": 7_241_732_096,
    },
    # Qwen/Qwen2.5-7B, config.json
    "qwen2.5-7b": {
        "config": {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "hidden_size": 3584,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "intermediate_size": 18944,
            "vocab_size": 152064,
            "max_position_embeddings": 131072,
            "use_sliding_window": False,
            "sliding_window": 131072,
            "max_window_layers": 28,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-06,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 151643,
            "eos_token_id": 151643,
            "torch_dtype": "bfloat16",
        },
        "params": 7_615_616_512,
    },
    # Qwen/Qwen3-8B, config.json
    "qwen3-8b": {
        "config": {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "hidden_size": 4096,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 12288,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 36,
            "rope_theta": 1000000,
            "rms_norm_eps": 1e-06,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "torch_dtype": "bfloat16",
        },
        "params": 8_190_735_360,
    },
    # google/gemma-7b, config.json (no tie_word_embeddings: GemmaConfig's default, tied)
    "gemma-7b": {
        "config": {
            "model_type": "gemma",
            "architectures": ["GemmaForCausalLM"],
            "hidden_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "intermediate_size": 24576,
            "vocab_size": 256000,
            "max_position_embeddings": 8192,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-06,
            "hidden_act": "gelu_pytorch_tanh",
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "torch_dtype": "bfloat16",
        },
        "params": 8_537_680_896,
    },
    # google/gemma-3-1b-pt, config.json: 5 local layers (window 512) to each global one
    "gemma-3-1b": {
        "config": {
            "model_type": "gemma3_text",
            "architectures": ["Gemma3ForCausalLM"],
            "hidden_size": 1152,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "intermediate_size": 6912,
            "vocab_size": 262144,
            "max_position_embeddings": 32768,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "query_pre_attn_scalar": 256,
            "rope_theta": 1000000,
            "rope_local_base_freq": 10000,
            "rms_norm_eps": 1e-06,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
            "hidden_activation": "gelu_pytorch_tanh",
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "torch_dtype": "bfloat16",
        },
        "params": 999_885_952,
    },
}


def built(config: dict) -> torch.nn.Module:
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied LM head is the embedding: counted once


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_shapes_are_sized_exactly(name):
    config, params = PUBLISHED[name]["config"], PUBLISHED[name]["params"]
    arch = DecoderArch.from_config(config)
    assert arch.parameters() == count(built(config)) == params
    assert count(built(arch.truncated(2).hf_config())) == arch.truncated(2).parameters()
    # the trainer's shape (MFU) is read from the built model's config: the same as the launcher's (the planner)
    assert DecoderArch.from_config(AutoConfig.for_model(**config).to_dict()).shape() == arch.shape()


@pytest.mark.parametrize("kind", sorted(TINY))
def test_tiny_shapes_are_sized_exactly(kind):
    config = tiny_config(kind)
    assert DecoderArch.from_config(config).parameters() == count(built(config))
    assert (
        DecoderArch.from_config(AutoConfig.for_model(**config).to_dict()).shape()
        == DecoderArch.from_config(config).shape()
    )


def test_the_type_table_holds_transformers_defaults():
    """A config.json may leave out what its config class defaults: the table's defaults are those of 5.23's classes
    (a field the class lacks, Qwen2's head_dim, reads as None: hidden / heads, as its modeling file takes it)."""
    for model_type, kind in DECODER_TYPES.items():
        defaults = {field.name: field.default for field in dataclasses.fields(CONFIG_MAPPING[model_type])}
        assert {key: defaults.get(key) for key in kind.defaults} == kind.defaults, model_type


@pytest.mark.parametrize("kind", ["llama2", "qwen3", "gemma", "mistral"])
def test_defaults_left_out_of_a_config_size_the_same_model(kind):
    config = {k: v for k, v in tiny_config(kind).items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    config["num_attention_heads"] = 32 if kind == "qwen3" else 16  # qwen2/3's default of 32 KV heads must divide
    config["hidden_size"] = 512
    assert DecoderArch.from_config(config).parameters() == count(built(config))


def test_biases_and_head_width_are_counted():
    """Llama with attention_bias and mlp_bias (q, k, v, o and the MLP's), and head_dim apart from hidden / heads."""
    config = tiny_config("llama3") | {"attention_bias": True, "mlp_bias": True, "head_dim": 32}
    arch = DecoderArch.from_config(config)
    assert arch.parameters() == count(built(config))
    assert arch.shape().param_count() - DecoderArch.from_config(
        tiny_config("llama3") | {"head_dim": 32}
    ).parameters() == (2 * (4 * 32 + 2 * 2 * 32 + 64 + 2 * 160 + 64))


def test_flops_use_the_attention_width_and_the_windows():
    gemma = DecoderArch.from_config(PUBLISHED["gemma-7b"]["config"]).shape()
    assert gemma.head_dim * gemma.heads == 4096 != gemma.hidden
    matmul = 28 * gemma.params_per_layer() + 256000 * 3072  # the tied LM head is still a matmul
    assert gemma.flops_per_token(2048) == 6 * matmul + 12 * 28 * 4096 * 2048
    local = DecoderArch.from_config(PUBLISHED["gemma-3-1b"]["config"]).shape()
    assert (local.sliding_layers, local.window) == (22, 512)
    full = TransformerShape(**{**local.__dict__, "sliding_layers": 0})
    attention = 12 * 4 * 256 * 22 * (4096 - 512)
    assert full.flops_per_token(4096) - local.flops_per_token(4096) == attention
    assert full.flops_per_token(512) == local.flops_per_token(512)  # the window is no shorter than the sequence


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (
            {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 8},
            "model_type 'mixtral': a mixture-of-experts model (num_local_experts=8)",
        ),
        ({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}, "model_type 'phi3': no parameter formula"),
        ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, "not a text-only causal language model"),
        ({"model_type": "gemma2"}, "model_type 'gemma2': its attention soft-capping runs only in eager attention"),
        (tiny_config("gemma3_text") | {"attn_logit_softcapping": 50.0}, "sets attn_logit_softcapping"),
        (tiny_config("qwen2") | {"quantization_config": {"quant_method": "gptq"}}, "quantized weights"),
        ({"model_type": "llama", "hidden_size": 64}, "the config lacks num_hidden_layers"),
        ({"hidden_size": 64}, "the config has no model_type"),
    ],
)
def test_what_cannot_be_sized_is_refused_with_the_reason_and_the_types(config, said):
    with pytest.raises(ValueError, match="trainkit sizes and trains these model types: llama, mistral, qwen2") as error:
        DecoderArch.from_config(config)
    assert said in str(error.value)


def test_a_model_folder_resolves_to_a_decoder_entry(tmp_path):
    folder = write_tiny(tmp_path / "Tiny Qwen", "qwen2")
    entry = get_model(str(folder))
    assert entry.family == "decoder" and entry.arch.model_type == "qwen2" and entry.hub_id == str(folder.resolve())
    assert entry.label == "Tiny-Qwen" and entry.arch.parameters() == count(built(tiny_config("qwen2")))
    assert entry.recipe.seq_len == 256 and entry.recipe.ac_every is None and entry.recipe.compile is None
    assert entry.recipe.cpu == {"global_batch_size": 2, "micro_batch_size": 1}
    assert get_model(str(folder)) is entry  # read once
    config_only = get_model(str(folder / "config.json"))
    assert config_only.hub_id is None and config_only.label == "Tiny-Qwen"  # no weights beside a lone config.json


def test_unknown_names_and_folders_without_a_config_are_refused(tmp_path):
    with pytest.raises(SpecError, match="'gpt5' is not a known model; choose one of: llama2-7b.*a hub id"):
        get_model("gpt5")
    with pytest.raises(SpecError, match="holds no config.json"):
        get_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral", "num_local_experts": 8}))
    with pytest.raises(SpecError, match=f"--model {tmp_path}: model_type 'mixtral': a mixture-of-experts"):
        get_model(str(tmp_path))


def test_a_hub_id_resolves_through_its_config(monkeypatch):
    """The hub's config through AutoConfig (HF_TOKEN from the environment); here a stand-in, no network."""
    asked = []

    def from_pretrained(name, token=None):
        asked.append((name, token))
        return AutoConfig.for_model(**tiny_config("qwen3"))

    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(AutoConfig, "from_pretrained", from_pretrained)
    entry = get_model("org/Tiny-Qwen3-Base")
    assert asked == [("org/Tiny-Qwen3-Base", "hf_test")]
    assert entry.hub_id == "org/Tiny-Qwen3-Base" and entry.label == "Tiny-Qwen3-Base"
    assert entry.arch.parameters() == count(built(tiny_config("qwen3")))


def test_a_folder_job_runs_under_its_label_and_writes_its_own_config(tmp_path):
    folder = write_tiny(tmp_path / "tiny-gemma3", "gemma3_text")
    job = job_from_flags({"model": str(folder), "runs_dir": str(tmp_path / "runs"), "layers": 1, "steps": 2}, "local")
    assert job.run.run_id.startswith("tiny-gemma3-") and job.model.family == "decoder" and job.data.seq_len == 256
    assert job.model.truncated_label == f"{folder} truncated to 1 of 2 layers"
    job.run_dir.mkdir(parents=True)
    prepare_decoder_run(job, get_model(job.model.name))
    written = json.loads((job.run_dir / "model_config.json").read_text())
    assert written == tiny_config("gemma3_text") | {"num_hidden_layers": 1, "layer_types": ["sliding_attention"]}
    pretrained = job_from_flags({"model": str(folder), "runs_dir": str(tmp_path / "runs"), "init": "pretrained"})
    assert pretrained.model.weights == str(folder.resolve())


def test_a_folders_tokenizer_larger_than_its_vocabulary_is_refused_from_tokenizer_json_alone(tmp_path, monkeypatch):
    """The launcher counts a folder's tokenizer ids from tokenizer.json with `tokenizers` (issue 51: no transformers,
    no torch at launch): the byte tokenizer's 259 ids against a vocabulary of 256 are refused, and 259 fit 320."""
    import training.text.tokenizer as tokenizers
    from training.llm.launch import check_inputs

    folder = write_tiny(tmp_path / "small-vocab", "llama2", tokenizer=True)
    monkeypatch.setattr(tokenizers, "load_tokenizer", lambda source: pytest.fail("loaded the whole tokenizer"))
    for vocabulary, refused in ((256, True), (320, False)):
        config = json.loads((folder / "config.json").read_text()) | {"vocab_size": vocabulary}
        (folder / "config.json").write_text(json.dumps(config))
        job = job_from_flags({"model": str(folder), "runs_dir": str(tmp_path / "runs"), "steps": 2}, "local")
        if refused:
            with pytest.raises(SpecError, match=f"has 259 tokens and the model's vocabulary {vocabulary}"):
                check_inputs(job, get_model(job.model.name))
        else:
            check_inputs(job, get_model(job.model.name))


@pytest.mark.parametrize("kind", sorted(TINY))
def test_every_rank_builds_the_same_model_and_buffers(kind, tmp_path):
    """Rank 0 builds the weights in fp32; the others only shapes, but every buffer the state dict leaves out (each
    rotary embedding's frequencies, Gemma's embedding scale) computed as rank 0 has it."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_config(kind) | {"torch_dtype": "bfloat16"}))
    real = build_model(str(config), None, seed=0)
    shapes = build_model(str(config), None, seed=0, materialize=False)
    assert {p.dtype for p in real.parameters()} == {torch.float32}
    assert torch.equal(next(real.parameters()), next(build_model(str(config), None, seed=0).parameters()))
    # the same parameters by name: a tied LM head is the embedding on every rank (Accelerate maps them by name)
    assert [name for name, _ in shapes.named_parameters()] == [name for name, _ in real.named_parameters()]
    persistent = real.state_dict().keys()
    left_out = {name: buffer for name, buffer in real.named_buffers() if name not in persistent}
    assert left_out and all(torch.equal(buffer, shapes.get_buffer(name)) for name, buffer in left_out.items())
    assert decoder_layer_class(load_config(str(config), None)) == type(real.model.layers[0]).__name__
