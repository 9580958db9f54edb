"""Train Medusa heads for a trained target (model/medusa.py; called by `python train.py --what medusa`).

Medusa-1 (the default): the target is frozen; each batch runs it once without gradients for its
final hidden states, and only the heads learn. Head i at position t learns the token at t+i+2:

    tokens  x0 x1 x2 x3 x4 ...      y[t] = x[t+1] (the target's own job)
    head 0 at t=0 -> x2 = y[1]      head i at t -> y[t+i+1]; positions past the window are dropped
    head 1 at t=0 -> x3 = y[2]

loss = sum_i 0.8^i CE_i: the far heads are harder and their guesses are used less (a path needs
all its earlier heads right), so they weigh less.

distill=True scores head i at t against the target's own distribution for that token (its logits
at t+i+1, free in the same forward) instead of the data's token: the heads then learn to guess what
the verifier will accept, the target's choice, rather than what the text says.

Medusa-2 (joint=True): target and heads train together on L_LM + 0.2 L_medusa, the target at a
4x lower learning rate so that the heads' loss nudges its hidden states without ruining its own
predictions. The target then changes, so it is saved too, and the heads are tied to the new one.

After training, every head's top-1..top-10 accuracy is measured on val; they choose the tree
(decode.medusa.build_tree), saved with the heads.
"""
import os
import time

import torch
import torch.nn.functional as F

from decode.medusa import build_tree, expected_length
from errors import UserError
from model.checkpoint import save_checkpoint
from model.medusa import MedusaConfig, MedusaHeads, save_medusa

HEAD_DECAY = 0.8          # head i's loss weighs 0.8^i
LAMBDA0 = 0.2             # Medusa-2: weight of the heads' loss next to the target's own
BACKBONE_LR_SCALE = 0.25  # Medusa-2: the target learns 4x slower than the heads
TOP = 10                  # accuracies are measured for each head's 10 likeliest tokens


def head_losses(head_logits, labels):
    """Cross-entropy of each head (list of K scalars). head_logits (K, B, T, V); labels: the next
    tokens y (B, T), or distributions over them (B, T, V); head i at position t is scored against
    labels[t+i+1]."""
    return [F.cross_entropy(logits[:, :-(i + 1)].flatten(0, 1).float(), labels[:, i + 1:].flatten(0, 1))
            for i, logits in enumerate(head_logits)]


@torch.no_grad()
def evaluate(target, heads, val, batch_size, block_size, eval_iters, device):
    """(target's val loss, each head's val loss, accuracies) over eval_iters fixed val batches.
    accuracies[d][i]: the fraction of positions where the true token is head d's (i+1)-th likeliest,
    so sum(accuracies[d][:k]) is head d's top-k accuracy."""
    was_training = target.training
    target.eval()
    heads.eval()
    gen = torch.Generator().manual_seed(0)
    K = heads.n_heads
    lm, ce, hits, positions = 0.0, torch.zeros(K), torch.zeros(K, TOP), torch.zeros(K)
    for _ in range(eval_iters):
        x, y = val.batch(batch_size, block_size, gen, device)
        logits, hidden = target(x, return_hidden=True)
        head_logits = heads(hidden)  # (K, B, T, V)
        lm += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item()
        ce += torch.tensor([loss.item() for loss in head_losses(head_logits, y)])
        for d, logits_d in enumerate(head_logits):
            logits_d, truth = logits_d[:, :-(d + 1)], y[:, d + 1:]  # (B, T-d-1, V), (B, T-d-1)
            rank = (logits_d > logits_d.gather(-1, truth[..., None])).sum(-1)  # tokens the head prefers
            hits[d] += torch.bincount(rank.flatten().cpu(), minlength=TOP)[:TOP]
            positions[d] += rank.numel()
    target.train(was_training)
    heads.train()
    return lm / eval_iters, (ce / eval_iters).tolist(), (hits / positions[:, None]).tolist()


def train_medusa(target_model, tokenizer, train_tokens, val_tokens, out_path, n_heads=4, tied=False,
                 max_iters=1000, batch_size=16, block_size=None, lr=3e-3, joint=False, device="cpu",
                 seed=1337, log=print, tree_size=8, warmup_iters=50, eval_iters=20, log_interval=100,
                 target_out_path=None, distill=False):
    """Train K = n_heads Medusa heads on `target_model` (already on `device`) and save them to
    out_path with their val accuracies and a tree of tree_size candidates. Returns the accuracies.
    With the defaults, the default CPU target takes about 2 minutes on 2 idle cores (3.7 on one);
    for it lr 3e-3 beat Medusa's 1e-3 (head 0 top-1 0.159 vs 0.136 after 400 iterations).

    train_tokens, val_tokens: data.TokenData. block_size defaults to the target's context.
    Medusa-1 freezes the target (requires_grad off); joint=True (Medusa-2) trains it too and saves it
    to target_out_path (default: out_path with -target.pt in place of .pt). distill=True trains the
    heads on the target's distributions instead of the data's tokens."""
    from train import lr_at  # imported here: train.py imports this module

    target = target_model
    block_size = block_size or target.config.block_size
    if not n_heads < block_size <= target.config.block_size:
        raise UserError(f"block size must lie in ({n_heads}, {target.config.block_size}], got {block_size}")
    train_tokens.check_fits(block_size)
    val_tokens.check_fits(block_size)
    torch.manual_seed(seed)
    heads = MedusaHeads(target, MedusaConfig(n_heads, tied))
    target.requires_grad_(joint)
    target.train(joint)
    # no weight decay: it would pull the projections, copies of the target's lm_head, towards zero
    groups = [dict(params=list(heads.parameters()), lr_scale=1.0)]
    if joint:
        groups.append(dict(params=list(target.parameters()), lr_scale=BACKBONE_LR_SCALE))
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    schedule = dict(learning_rate=lr, min_lr=lr / 10, warmup_iters=warmup_iters, max_iters=max_iters)
    trained = [p for group in groups for p in group["params"]]
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda")
                else torch.autocast("cpu", enabled=False))
    what = "Medusa-2: target and heads jointly" if joint else "Medusa-1: heads on the frozen target"
    log(f"medusa: {n_heads} heads ({'tied to' if tied else 'own copies of'} the target's lm_head), "
        f"{sum(p.numel() for p in heads.parameters()) / 1e6:.2f}M parameters, {what}, "
        f"{max_iters} iterations of {batch_size} x {block_size} tokens")
    lm_before = evaluate(target, heads, val_tokens, batch_size, block_size, eval_iters, device)[0] if joint else None

    gen = torch.Generator().manual_seed(seed)  # draws the training batches
    started = t_log = time.time()
    for it in range(max_iters):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it, schedule) * group["lr_scale"]
        x, y = train_tokens.batch(batch_size, block_size, gen, device)
        with autocast:
            with torch.set_grad_enabled(joint):
                logits, hidden = target(x, return_hidden=True)  # (B, T, V), (B, T, C)
            labels = torch.softmax(logits.detach().float(), -1) if distill else y  # (B, T, V) or (B, T)
            losses = head_losses(heads(hidden), labels)
        loss = sum(HEAD_DECAY ** i * ce for i, ce in enumerate(losses))
        if joint:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()) + LAMBDA0 * loss
        if not torch.isfinite(loss):
            raise UserError(f"loss became {loss.item()} at iteration {it}; stopped, nothing saved; try a lower lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        if (it + 1) % log_interval == 0:
            now = time.time()
            log(f"iter {it + 1}/{max_iters} | loss {loss.item():.4f} | heads "
                + " ".join(f"{ce.item():.3f}" for ce in losses)
                + f" | {(now - t_log) / log_interval * 1e3:.0f} ms/iter | {now - started:.0f}s")
            t_log = now
    seconds = time.time() - started

    lm_loss, head_ce, accuracies = evaluate(target, heads, val_tokens, batch_size, block_size, eval_iters, device)
    log(f"trained in {seconds:.0f}s; val loss per head: " + " ".join(f"{ce:.3f}" for ce in head_ce))
    for d, acc in enumerate(accuracies):
        log(f"head {d} (token t+{d + 2}): top-1 {acc[0]:.3f}  top-5 {sum(acc[:5]):.3f}  top-10 {sum(acc):.3f}")
    log("expected accepted candidates per round, by tree size: " + ", ".join(
        f"{n}: {expected_length(accuracies, build_tree(accuracies, n)):.2f}" for n in (1, 2, 4, 8, 16, 32, 64)))
    tree = build_tree(accuracies, tree_size)
    if joint:
        target_out_path = target_out_path or os.path.splitext(out_path)[0] + "-target.pt"
        log(f"target val loss {lm_before:.4f} -> {lm_loss:.4f} nats/token after joint training; "
            f"saved the new target to {target_out_path}")
        save_checkpoint(target_out_path, target, tokenizer, kind="target", medusa_joint=True)
        target.requires_grad_(False)
        target.eval()
    save_medusa(out_path, heads, target, tokenizer, accuracies=accuracies, tree=[list(p) for p in tree],
                val_losses=head_ce, target_val_loss=lm_loss, seconds=seconds,
                train_settings=dict(max_iters=max_iters, batch_size=batch_size, block_size=block_size, lr=lr,
                                    joint=joint, seed=seed, tree_size=tree_size))
    log(f"saved {out_path} (tree of {len(tree)} candidates, expected {expected_length(accuracies, tree):.2f} "
        "accepted per round)")
    return accuracies
