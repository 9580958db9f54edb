"""Checkpoints: written atomically, read back with weights_only=True.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so that loading it
never unpickles code. A crash halfway through a save leaves the previous file untouched: the new
one is written beside it and renamed over it only once complete.
"""
import hashlib
import json
import os
import pickle
import zipfile
from dataclasses import asdict

import torch

from model.gpt import GPT, GPTConfig
from model.tokenizer import Tokenizer, TokenizerError

FORMAT = "specgpt-1"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or not the one asked for. `retrain` names the kind
    of model ("target", "draft", "medusa", "eagle") whose training would make a good one, when that helps."""

    def __init__(self, message, retrain=None):
        super().__init__(message)
        self.retrain = retrain


def checkpoint_path(out_dir, kind):
    """Where a training run keeps its model of `kind`: OUT_DIR/target.pt, draft.pt, medusa.pt, eagle.pt."""
    return os.path.join(out_dir, f"{kind}.pt")


def save_checkpoint(path, model, tokenizer, kind="target", **extra):
    """Write model weights, config and tokenizer (and whatever `extra` holds, e.g. optimizer
    state and iteration) to `path` atomically."""
    state = dict(format=FORMAT, kind=kind, config=asdict(model.config), tokenizer=tokenizer.spec,
                 model=model.state_dict(), **extra)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path, kind="target", mmap=False):
    """The raw checkpoint dict at `path`, checked to be a SpecGPT checkpoint of `kind`. A target
    checkpoint also serves where a draft is asked for: a smaller model of the same family drafting
    for a larger one. mmap: leave the tensors in the file until they are read."""
    if not os.path.exists(path):
        raise CheckpointError(f"no {kind} checkpoint at {path}", retrain=kind)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path} is not a SpecGPT checkpoint ({type(e).__name__})") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a SpecGPT checkpoint of format {FORMAT}")
    if state.get("kind") != kind and not (kind == "draft" and state.get("kind") == "target"):
        raise CheckpointError(f"{path} holds a {state.get('kind')} model, expected a {kind} model")
    return state


def load_model(path, kind="target", device="cpu", dtype=torch.float32):
    """(model in eval mode, tokenizer, the checkpoint's other entries: config, data, ...) from a
    checkpoint file."""
    state = load_checkpoint(path, kind, mmap=True)
    with torch.device("meta"):  # no memory for weights about to be replaced
        model = GPT(GPTConfig(**state["config"]), init=False)
    model.load_state_dict(state.pop("model"), assign=True)  # the mapped tensors: one copy of a large model, not two
    state.pop("optimizer", None)  # nor does anything keep the file's other tensors mapped
    model.transformer.wte.weight = model.lm_head.weight  # assigning untied them
    model.to(device=device, dtype=dtype).eval()
    try:
        tokenizer = Tokenizer(state["tokenizer"])
    except TokenizerError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return model, tokenizer, state


# Medusa heads and EAGLE heads only make sense with the target they were trained on: their file
# records the target's fingerprint, and loading refuses any other target. Weights are hashed at
# float32 (exact for float32 and float64 targets) and at each half precision, as a target loaded in
# bf16/fp16 has lost the bits a float32 hash would need.
FINGERPRINT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def target_fingerprint(model, tokenizer, dtype=torch.float32):
    """A short hash of the target's weights (cast to `dtype`, in name order) and tokenizer spec."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        t = tensor.detach().to(dtype).cpu()
        h.update((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes())  # numpy has no bf16
    h.update(json.dumps(tokenizer.spec, sort_keys=True).encode())
    return h.hexdigest()[:16]


def target_fingerprints(model, tokenizer):
    """{dtype name: fingerprint} for each dtype the target may be loaded in: what a heads file keeps."""
    return {str(d): target_fingerprint(model, tokenizer, d) for d in FINGERPRINT_DTYPES}


def load_heads(path, kind, model, tokenizer, build, device, dtype):
    """(heads in eval mode, raw checkpoint dict) of `kind` ("medusa", "eagle"): the module build(state)
    makes, with the file's weights, refused unless they were trained on this target, as it is loaded now."""
    state = load_checkpoint(path, kind)
    key = model.lm_head.weight.dtype
    key = key if key in FINGERPRINT_DTYPES[1:] else torch.float32  # float64 casts back exactly
    if state.get("target", {}).get(str(key)) != target_fingerprint(model, tokenizer, key):
        if state.get("train_settings", {}).get("joint"):
            raise CheckpointError(f"{path} holds Medusa-2 heads, which belong to the target trained with them, "
                                  f"saved beside them as medusa-target.pt: decode from a directory holding that "
                                  f"file as target.pt and the heads as medusa.pt")
        raise CheckpointError(f"{path} was trained for another target model", retrain=kind)
    with torch.device("meta"):  # as load_model's: no memory for weights about to be replaced
        heads = build(state)
    heads.load_state_dict(state["model"], assign=True)
    return heads.to(device=device, dtype=dtype).eval(), state
