"""What a fresh run of train.py says before anything trains: about how long it should take here. A
training step of the target's shape is timed now; each phase's time is that rate applied to its arithmetic
per token (6 x the parameters trained, 2 x those only run forward, as Kaplan et al. count), evaluations included."""
import math
import os
import time

import torch

import cli
from data import autocast_for, format_duration, split_text
from model.checkpoint import load_checkpoint
from model.eagle import EagleHead
from model.gpt import GPT, GPTConfig
from model.medusa import MedusaConfig, MedusaHeads
from model.tokenizer import Tokenizer
from optim import orthogonalisation_flops


def plan(args, kinds, outputs, text, phase_settings, device, dtype):
    """That line, for train.py's flags `args`: the phases `kinds`, each with its parameters and iterations;
    None without the target they need (their phase says what is missing). outputs: what they read of the
    frozen target's; phase_settings: train.py's, a phase's (model config, optimisation settings)."""
    target_cfg, saved = phase_settings(args, "target", device)[0], None  # saved: the target's, if not trained
    if "target" in kinds:
        target_cfg["vocab_size"] = 50257 if args.tokenizer == "gpt2" else args.vocab_size
    elif os.path.exists(cli.checkpoint_of(args, "target")):
        saved = load_checkpoint(cli.checkpoint_of(args, "target"), "target")
        target_cfg = saved["config"]
    else:
        return None
    settings = {kind: phase_settings(args, kind, device, target_cfg)[1] for kind in ("target", *kinds)}
    draft_cfg = dict(phase_settings(args, "draft", device, target_cfg)[0], vocab_size=target_cfg["vocab_size"])
    medusa, joint = MedusaConfig(args.medusa_heads, args.medusa_tied), args.medusa_joint
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        target, draft = GPT(GPTConfig(**target_cfg), init=False), GPT(GPTConfig(**draft_cfg), init=False)
        n_target = target.num_params()
        params = dict(target=n_target, draft=draft.num_params(),
                      medusa=sum(p.numel() for p in MedusaHeads(target, medusa, init=False).parameters()),
                      eagle=sum(p.numel() for p in EagleHead(target, init=False).parameters()))
    lm_head = target.lm_head.weight.numel()
    # per token: (parameters whose products run forward and backward, those that run forward only
    # in a training step and in an evaluation); the EAGLE head trains back through the lm_head, whose
    # forward also gives the target's logits from its cached features
    arithmetic = dict(target=(n_target, 0, 0), draft=(params["draft"], 0, 0),
                      medusa=(params["medusa"] + n_target * joint, 0, n_target * (not joint)),
                      eagle=(params["eagle"] + lm_head, lm_head, n_target))
    flops = 0.0
    for kind in kinds:
        s, (both, forward, eval_forward) = settings[kind], arithmetic[kind]
        evals = math.ceil(s["max_iters"] / s["eval_interval"]) * s["eval_iters"]
        tokens = s["batch_size"] * (draft_cfg if kind == "draft" else target_cfg)["block_size"]
        flops += tokens * (s["max_iters"] * (6 * both + 2 * forward) + evals * 2 * (both + eval_forward))
        if s.get("optimizer") == "muon":
            flops += s["max_iters"] * orthogonalisation_flops(dict(target=target, draft=draft)[kind])
    if outputs:  # one pass of the target over the training split, for all the phases that read it
        flops += training_tokens(args.tokenizer, text, saved) * 2 * n_target
    seconds = flops / training_rate(target_cfg, settings["target"], device, dtype)
    names = dict(target="the target", draft="the draft", medusa="the Medusa heads", eagle="the EAGLE head")
    sizes = ", ".join(f"{names[kind]} ({params[kind] / 1e6:.2f}M parameters, {settings[kind]['max_iters']:,} "
                      "iterations)" for kind in kinds)
    return (f"training {sizes}: about {format_duration(seconds)} here (a training step timed now)"
            + ("; less if val stops improving sooner" if any(settings[kind].get("patience") for kind in kinds) else ""))


def training_tokens(tokenizer_kind, text, target_state):
    """The training split's tokens: counted with the saved target's tokenizer or GPT-2's; a BPE not
    trained yet makes about 2 characters a token of English at 512 tokens (1.94 on tiny Shakespeare)."""
    train_text = split_text(text)[0]
    if target_state is None and tokenizer_kind != "gpt2":
        return len(train_text) / 2
    return len(Tokenizer(target_state["tokenizer"] if target_state else {"kind": "gpt2"}).encode(train_text))


def training_rate(target_cfg, settings, device, dtype, steps=2):
    """Arithmetic per second of a training step of the target's shape here (a throwaway model)."""
    model = GPT(GPTConfig(**target_cfg)).to(device=device, dtype=dtype)
    rows = settings["batch_size"] // settings["grad_accum"]
    x = torch.randint(target_cfg["vocab_size"], (rows, target_cfg["block_size"]), device=device)
    for step in range(steps + 1):  # the first is a warm-up
        if step == 1:
            started = time.perf_counter()
        with autocast_for(device):
            logits = model(x)
        logits.float().logsumexp(-1).mean().backward()  # a cross-entropy's cost, without labels
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 6 * model.num_params() * x.numel() * steps / (time.perf_counter() - started)
