"""Optional integrations of probmoe with other libraries.

Each subpackage imports its library when it is imported itself; ``import probmoe`` imports none.

    transformers: ProbMoE and the paper's baselines as a drop-in router for transformers 5.x
        MoE models (OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, FlexOlmo, DeepSeek-V3); see docs/transformers.md.
    torchtitan: ProbMoE as torchtitan 0.3.0's token-choice router, with expert parallelism;
        megatron: as a Megatron-Core RouterInterface; scale_out: what the two share (no framework
        import); see docs/scale-out.md.
    final_model: the sha256 record probmoe-train writes beside its final model, which every loader
        of the folder checks (no library import).
"""
