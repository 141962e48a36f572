"""The published shapes (--model <family>-shape): real widths on the meta device, --layers N, and the
one-tensor-at-a-time initialiser, checked against the parameter-count formula and the tiny build."""

import pytest
import torch

pytest.importorskip("transformers")

from probmoe.experiments import models


def olmoe_params(layers, hidden=2048, experts=64, width=1024, vocab=50304):
    """OLMoE-1B-7B: per layer q/k/v/o (4 H²), q/k norms and the two layer norms (4 H), the router
    (N H), the experts (N · 3 H I); embeddings and LM head (2 V H) and the final norm (H)."""
    per_layer = 4 * hidden**2 + 4 * hidden + experts * hidden + experts * 3 * hidden * width
    return layers * per_layer + 2 * vocab * hidden + hidden


def count(name, layers=None):
    return sum(p.numel() for p in models.empty_model(models.model_config(name, layers)).parameters())


def test_olmoe_shape_one_layer_on_meta_matches_the_formula():
    model = models.empty_model(models.model_config("olmoe-1b-7b-shape", 1))
    assert all(p.device.type == "meta" for p in model.parameters())
    c = model.config
    assert (
        c.hidden_size,
        c.num_experts,
        c.num_experts_per_tok,
        c.intermediate_size,
        c.vocab_size,
        c.num_attention_heads,
        c.num_hidden_layers,
    ) == (2048, 64, 8, 1024, 50304, 16, 1)
    assert sum(p.numel() for p in model.parameters()) == olmoe_params(1) == 625_616_896
    assert count("olmoe-1b-7b-shape") == olmoe_params(16) == 6_919_161_856


@pytest.mark.parametrize(
    "name,billions",
    [
        ("qwen1.5-moe-a2.7b-shape", 14.316),
        ("qwen3-moe-30b-a3b-shape", 30.532),
        ("mixtral-8x7b-shape", 46.703),
        ("deepseek-v3-shape", 671.026),
    ],
)
def test_published_totals(name, billions):
    """The totals their model cards state: 14.3 B, 30.5 B, 46.7 B, 671 B (DeepSeek-V3 without MTP)."""
    assert abs(count(name) / 1e9 - billions) < 5e-4


def test_layers_override_keeps_widths():
    full, two = models.model_config("qwen1.5-moe-a2.7b-shape"), models.model_config("qwen1.5-moe-a2.7b-shape", 2)
    assert two.num_hidden_layers == 2 and full.num_hidden_layers == 24
    assert (two.moe_intermediate_size, two.shared_expert_intermediate_size, two.num_experts) == (1408, 5632, 60)
    assert models.model_config("deepseek-v3-shape", 1).first_k_dense_replace == 0  # one layer: it routes
    assert models.model_config("deepseek-v3-shape", 5).first_k_dense_replace == 3
    assert models.load_model("tiny-olmoe", 0, layers=3).config.num_hidden_layers == 3
    with pytest.raises(ValueError, match="--layers"):
        models.model_config("tiny-olmoe", 0)


def test_meta_build_filled_from_a_state_dict_equals_the_built_model():
    """``materialize`` (what FSDP runs per shard) gives the model built directly, rotary buffers too."""
    built = models.load_model("tiny-deepseek-v3", seed=5)
    weights = built.state_dict()
    model = models.empty_model(models.model_config("tiny-deepseek-v3"))
    models.materialize(model, weights.__getitem__, torch.device("cpu"))
    got = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name, value in [*built.named_parameters(), *built.named_buffers()]:
        assert torch.equal(value, got[name]), name
    x = torch.randint(3, 259, (2, 7))
    assert torch.equal(model(x).logits, built(x).logits)


def test_initialiser_is_per_name_and_follows_transformers_rule():
    model = models.empty_model(models.model_config("olmoe-1b-7b-shape", 1))
    a = models.initial_tensor(model, "model.layers.0.self_attn.q_proj.weight", seed=1)
    assert torch.equal(a, models.initial_tensor(model, "model.layers.0.self_attn.q_proj.weight", seed=1))
    assert not torch.equal(a, models.initial_tensor(model, "model.layers.0.self_attn.k_proj.weight", seed=1))
    assert abs(a.std().item() - 0.02) < 1e-3
    assert torch.equal(models.initial_tensor(model, "model.norm.weight", 1), torch.ones(2048))
    embed = models.initial_tensor(model, "model.embed_tokens.weight", 1)
    assert embed.shape == (50304, 2048) and not embed[0].any()  # the padding row (pad id 0)


def test_unknown_model_names_the_choices():
    with pytest.raises(ValueError, match="olmoe-1b-7b-shape"):
        models.check_checkpoint("olmoe-1b-7b")


def test_checkpoint_loads_straight_into_bf16(tmp_path):
    """--param-dtype bfloat16: a checkpoint directory's weights come back in bf16 (rounded once from
    the file), with no fp32 parameter left."""
    fp32 = models.load_model("tiny-qwen2-moe", seed=2)
    fp32.save_pretrained(tmp_path)
    models.load_tokenizer("tiny-qwen2-moe").save_pretrained(tmp_path)
    bf16 = models.load_model(str(tmp_path), seed=0, dtype=torch.bfloat16)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    expected = fp32.state_dict()
    for name, value in bf16.state_dict().items():
        assert torch.equal(value, expected[name].to(value.dtype)), name
