"""Medusa heads (model/medusa.py) and the EAGLE head (model/eagle.py, EagleTraining). Medusa-1 (the
default) freezes the target and only the heads learn, on sum_i 0.8^i CE_i. Medusa-2 (--medusa-joint)
trains a copy of the target and the heads together on L_LM + 0.2 L_heads, the target at a 4x lower
learning rate so that the heads' loss nudges its hidden states without ruining its own predictions; the
new target is saved beside the heads (medusa-target.pt). At every evaluation each head's top-1..top-10
accuracy is measured on val; they choose the tree saved with the heads (decode.medusa.build_tree).
"""
import os

import torch
import torch.nn.functional as F
from torch import nn

from data import TargetOutputs
from decode.eagle import TREE_WIDTH
from decode.medusa import DEFAULT_TREE_SIZE, build_tree, expected_length
from model.checkpoint import checkpoint_path, save_checkpoint
from model.eagle import EagleHead, eagle_loss, eagle_losses, save_eagle
from model.kv_cache import KVCache
from model.medusa import MedusaConfig, MedusaHeads, head_losses, heads_loss, save_medusa
from optim import adamw, make_optimizer

# The heads' settings: one evaluation, at the end, which also measures the accuracies
# (lr and iterations: docs/2026-12-06-epyc-t.md).
HEADS_TRAINING = dict(batch_size=16, max_iters=1000, learning_rate=3e-3, warmup_iters=50,
                      eval_interval=1000, eval_iters=20, weight_decay=0.0, grad_clip=1.0)
EAGLE_TRAINING = dict(HEADS_TRAINING, max_iters=2000)  # docs/2026-12-06-epyc-t.md
LAMBDA0 = 0.2             # Medusa-2: weight of the heads' loss next to the target's own
BACKBONE_LR_SCALE = 0.25  # Medusa-2: the target learns 4x slower than the heads
TOP = 10                  # accuracies are measured for each head's 10 likeliest tokens
EAGLE_DEPTHS = 4          # draft depths at which the EAGLE head's agreement with the target is measured


def for_phase(kind, args, frozen, settings, log):
    """The training of OUT_DIR/medusa.pt or eagle.pt (`kind`) that train.py's flags `args` ask for, on
    the run's frozen target (a data.FrozenTarget); Medusa-2 trains a copy of it jointly with the heads."""
    path, common = checkpoint_path(args.out_dir, kind), dict(device=frozen.device, seed=args.seed, log=log)
    if kind == "eagle":
        return EagleTraining(*frozen.loaded, path, settings, **common)
    return MedusaTraining(*(frozen.load() if args.medusa_joint else frozen.loaded), path, settings,
                          n_heads=args.medusa_heads, tied=args.medusa_tied, joint=args.medusa_joint,
                          tree_size=args.tree_size, **common)


class HeadsTraining(nn.Module):
    """What Medusa's and EAGLE's training share, as train.py's loop (`fit`) trains them: the target
    (already on `device`; frozen, or trained with the heads), the splits (the training one, for heads
    on the frozen target, with its features: computed here unless it holds them) and the file."""

    def __init__(self, target, tokenizer, train, val, out_path, settings, device, seed, log, frozen):
        super().__init__()
        self.target, self.tokenizer, self.val_split, self.out_path = target, tokenizer, val, out_path
        self.settings, self.device, self.seed, self.log = settings, device, seed, log
        self.block_size = target.config.block_size
        train.check_fits(self.block_size)
        val.check_fits(self.block_size)
        self.train_split, self.generator = train, torch.Generator().manual_seed(seed)  # draws the training batches
        self.start_iter, self.history = 0, []
        torch.manual_seed(seed)
        target.requires_grad_(not frozen).train(not frozen)
        if frozen:  # the features are the same at every visit of a window: computed once
            self.train_split = TargetOutputs.shared(train, target, {"features"}, device)

    def describe(self, heads, what=None):
        return (f"{sum(p.numel() for p in heads.parameters()) / 1e6:.2f}M parameters, " + (f"{what}, " if what else "")
                + f"{self.settings['max_iters']} iterations of {self.settings['batch_size']} x {self.block_size} tokens")


class MedusaTraining(HeadsTraining):
    """K = n_heads Medusa heads on `target`, saved to out_path with their val accuracies and a tree of
    tree_size candidates; joint=True: Medusa-2. train, val: data.TokenData; settings: HEADS_TRAINING and the flags."""

    def __init__(self, target, tokenizer, train, val, out_path, settings, n_heads=4, tied=False, joint=False,
                 tree_size=DEFAULT_TREE_SIZE, device="cpu", seed=1337, log=print):
        super().__init__(target, tokenizer, train, val, out_path, settings, device, seed, log, frozen=not joint)
        self.heads, self.joint, self.tree_size = MedusaHeads(target, MedusaConfig(n_heads, tied)), joint, tree_size
        groups = [dict(params=list(self.heads.parameters()), lr_scale=1.0)]
        if joint:
            groups.append(dict(params=list(target.parameters()), lr_scale=BACKBONE_LR_SCALE))
        self.optimizer = adamw(groups, settings)
        self.target_path = os.path.join(os.path.dirname(out_path), "medusa-target.pt")
        what = "Medusa-2: target and heads jointly" if joint else "Medusa-1: heads on the frozen target"
        log(f"medusa: {n_heads} heads ({'tied to' if tied else 'own copies of'} the target's lm_head), "
            + self.describe(self.heads, what))
        if joint:
            self.evaluate()
            self.lm_before = self.lm_loss  # the target's val loss before it trains with the heads
        else:
            self.following = self.train_split.tokens[1:].to(device)  # following[p]: the token after position p

    def forward(self, x, y):
        """Medusa-1: the heads' loss at x's positions y (B, T), read off the target's cached features;
        Medusa-2: the target's loss and the heads' on the tokens y that follow x's."""
        if not self.joint:
            return heads_loss(head_losses(self.heads(self.train_split.features[y]), self.following[y]))
        logits, hidden = self.target(x, return_hidden=True)  # (B, T, V), (B, T, C)
        heads = heads_loss(head_losses(self.heads(hidden), y))
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()) + LAMBDA0 * heads

    def evaluate(self):
        self.lm_loss, self.head_losses, self.accuracies = evaluate_heads(
            self.target, self.heads, self.val_split, self.settings["batch_size"], self.block_size,
            self.settings["eval_iters"], self.device)
        self.tree = build_tree(self.accuracies, self.tree_size)
        return (dict(val_loss=heads_loss(self.head_losses)),
                "val loss per head " + " ".join(f"{ce:.3f}" for ce in self.head_losses))

    def save(self, history):
        if self.joint:
            save_checkpoint(self.target_path, self.target, self.tokenizer, kind="target", medusa_joint=True)
        save_medusa(self.out_path, self.heads, self.target, self.tokenizer, accuracies=self.accuracies,
                    tree=[list(p) for p in self.tree], val_losses=self.head_losses, target_val_loss=self.lm_loss,
                    seconds=history[-1]["seconds"], history=history,
                    train_settings=dict(self.settings, joint=self.joint, seed=self.seed, tree_size=self.tree_size))

    def finish(self):
        """Say what the last evaluation measured; a line for the run's summary."""
        accuracies, log, tree = self.accuracies, self.log, self.tree
        for d, acc in enumerate(accuracies):
            log(f"head {d} (token t+{d + 2}): top-1 {acc[0]:.3f}  top-5 {sum(acc[:5]):.3f}  top-10 {sum(acc):.3f}")
        log("expected accepted candidates per round, by tree size: " + ", ".join(
            f"{n}: {expected_length(accuracies, build_tree(accuracies, n)):.2f}" for n in (1, 2, 4, 8, 16, 32, 64)))
        if self.joint:
            log(f"target val loss {self.lm_before:.4f} -> {self.lm_loss:.4f} nats/token after joint training; "
                f"saved the new target to {self.target_path}")
            self.target.requires_grad_(False).eval()
        log(f"saved {self.out_path} (tree of {len(tree)} candidates, expected "
            f"{expected_length(accuracies, tree):.2f} accepted per round)")
        return f"{self.out_path}: head 0 top-1 {accuracies[0][0]:.3f}"


class EagleTraining(HeadsTraining):
    """An EAGLE head on the frozen `target`, saved to out_path with its val accuracies at draft
    depths 1..EAGLE_DEPTHS. train, val: data.TokenData; settings: EAGLE_TRAINING and the flags."""

    def __init__(self, target, tokenizer, train, val, out_path, settings, device="cpu", seed=1337, log=print):
        super().__init__(target, tokenizer, train, val, out_path, settings, device, seed, log, frozen=True)
        self.head = EagleHead(target)
        self.optimizer = make_optimizer(self.head, settings)
        log(f"eagle: one {target.config.n_embd}-wide block on the frozen target's features, " + self.describe(self.head))
        self.noise = torch.Generator(device).manual_seed(seed)

    def forward(self, x, positions):
        features = self.train_split.features[positions]  # (B, T, C)
        with torch.no_grad():
            logits = self.target.lm_head(features)  # (B, T, V)
        return eagle_loss(*eagle_losses(self.head, features, logits, x, self.noise))

    def evaluate(self):
        self.measured = evaluate_eagle(self.target, self.head, self.val_split, self.settings["batch_size"],
                                       self.block_size, self.settings["eval_iters"], self.device)
        feature_loss, token_loss, accuracies, ranks = self.measured
        return (dict(val_loss=eagle_loss(feature_loss, token_loss)),
                f"val feature loss {feature_loss:.4f}, token loss {token_loss:.4f}, top-1 agreement with the target "
                f"at depth 1..{EAGLE_DEPTHS}: " + " ".join(f"{a:.3f}" for a in accuracies)
                + "; depth 1 by rank: " + " ".join(f"{a:.3f}" for a in ranks))

    def save(self, history):
        feature_loss, token_loss, accuracies, ranks = self.measured
        save_eagle(self.out_path, self.head, self.target, self.tokenizer, accuracies=accuracies, ranks=ranks,
                   feature_loss=feature_loss, token_loss=token_loss, seconds=history[-1]["seconds"],
                   history=history, train_settings=dict(self.settings, seed=self.seed))

    def finish(self):
        self.log(f"saved {self.out_path}")
        return f"{self.out_path}: top-1 agreement with the target {self.measured[2][0]:.3f} at depth 1"


def rank_counts(logits, truth, top):
    """How often the true token (...) is the (i+1)-th likeliest under logits (..., V), for i < top:
    the rank of a token is the number of tokens with higher logits."""
    rank = (logits > logits.gather(-1, truth[..., None])).sum(-1)
    return torch.bincount(rank.flatten().cpu(), minlength=top)[:top]


@torch.no_grad()
def evaluate_heads(target, heads, val, batch_size, block_size, eval_iters, device):
    """(target's val loss, each head's val loss, accuracies) over eval_iters fixed val batches.
    accuracies[d][i]: the fraction of positions where the true token is head d's (i+1)-th likeliest,
    so sum(accuracies[d][:k]) is head d's top-k accuracy."""
    was_training = target.training
    target.eval()
    heads.eval()
    K = heads.n_heads
    lm, ce, hits, positions = 0.0, torch.zeros(K), torch.zeros(K, TOP), torch.zeros(K)
    for x, y in val.fixed_batches(eval_iters, batch_size, block_size, device):
        logits, hidden = target(x, return_hidden=True)
        head_logits = heads(hidden)  # (K, B, T, V)
        lm += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item()
        ce += torch.tensor([loss.item() for loss in head_losses(head_logits, y)])
        for d, logits_d in enumerate(head_logits):
            logits_d, truth = logits_d[:, :-(d + 1)], y[:, d + 1:]  # (B, T-d-1, V), (B, T-d-1)
            hits[d] += rank_counts(logits_d, truth, TOP)
            positions[d] += truth.numel()
    target.train(was_training)
    heads.train()
    return lm / eval_iters, (ce / eval_iters).tolist(), (hits / positions[:, None]).tolist()


@torch.no_grad()
def evaluate_eagle(target, head, val, batch_size, block_size, eval_iters, device):
    """(feature loss, token loss, accuracies, ranks) over eval_iters fixed val batches.
    accuracies[d-1]: how often the head's top-1 at draft depth d equals the target's top-1 there;
    ranks[i]: how often the target's top-1 is the head's (i+1)-th choice at depth 1. Depth 1 reads the
    target's real features; depth d > 1, as in drafting, its own predicted feature from depth d-1
    (with the text's token), attending to the real pairs up to where drafting started and to its
    own earlier drafts."""
    was_training = head.training
    head.eval()
    losses, hits, counts = torch.zeros(2), torch.zeros(EAGLE_DEPTHS), torch.zeros(EAGLE_DEPTHS)
    rank_hits = torch.zeros(TREE_WIDTH)
    for x, _ in val.fixed_batches(eval_iters, batch_size, block_size, device):
        logits, features = target(x, return_hidden=True)  # (B, T, V), (B, T, C)
        losses += torch.tensor([loss.item() for loss in eagle_losses(head, features, logits, x)])
        best = logits.argmax(-1)  # (B, T): the target's token after each position
        B, T, C = features.shape
        n = T - 1  # drafts start after every position t < T-1, at the pair (f_t, x_{t+1})
        cache = KVCache(1, B, head.config.n_head, C // head.config.n_head, n * (EAGLE_DEPTHS + 1),
                        dtype=features.dtype, device=device)
        predicted, head_logits = head(features[:, :-1], x[:, 1:], cache)  # depth 1, over the real pairs
        cache.commit()
        rank_hits += rank_counts(head_logits, best[:, 1:], TREE_WIDTH)
        for d in range(1, EAGLE_DEPTHS + 1):
            valid = n - d + 1  # row t guesses the token at t+d+1, which the target predicts at t+d
            hits[d - 1] += (head_logits[:, :valid].argmax(-1) == best[:, d:d + valid]).sum().item()
            counts[d - 1] += B * valid
            if d == EAGLE_DEPTHS or valid <= 1:
                break
            # depth d+1: row t reads (its depth-d feature, x_{t+d+1}); it sees the real pairs 0..t
            # and its own drafts at depths 2..d+1
            tokens = torch.cat([x[:, d + 1:], x.new_zeros(B, d)], 1)  # (B, n); the tail rows go unscored
            rows = torch.arange(n, device=device)
            mask = torch.zeros(n, cache.length + n, dtype=torch.bool, device=device)
            mask[:, :n] = rows[None, :] <= rows[:, None]
            for depth_slot in range(1, d + 1):
                mask[rows, depth_slot * n + rows] = True
            predicted, head_logits = head(predicted, tokens, cache, mask)
            cache.commit()
    head.train(was_training)
    return *(losses / eval_iters).tolist(), (hits / counts.clamp_min(1)).tolist(), (rank_hits / counts[0]).tolist()
