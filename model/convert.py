"""Import a GPT-2-family checkpoint from a local Hugging Face folder into SpecGPT's format.

    python -m model.convert HF_DIR OUT.pt

HF_DIR holds what `save_pretrained` writes: config.json, model.safetensors (or pytorch_model.bin)
and the tokenizer's vocab.json and merges.txt. Nothing is downloaded. The model is GPT-2 exactly
(model/gpt.py keeps its parameter names), with two differences of storage: GPT-2 keeps its linear
layers as Conv1D, whose weights are the transpose of nn.Linear's, and it may store its tied output
projection or leave it out. The weights are memory-mapped from the file; only the transposed Conv1D
weights are copied before the checkpoint is written.
"""
import json
import mmap
import os
import sys

import torch

from model.checkpoint import CheckpointError, save_checkpoint
from model.gpt import GPT, GPTConfig
from model.tokenizer import Tokenizer, TokenizerError

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
NOT_WEIGHTS = (".attn.bias", ".attn.masked_bias")  # old GPT-2 files store the causal mask as a buffer
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# what GPT-2 is; a checkpoint that differs computes something model/gpt.py does not
GPT2_SETTINGS = dict(activation_function=("gelu_new", "gelu_pytorch_tanh"), layer_norm_epsilon=(1e-5,),
                     n_inner=(None,), scale_attn_weights=(True,), scale_attn_by_inverse_layer_idx=(False,),
                     tie_word_embeddings=(True,))


def read_config(hf_dir):
    """Our GPTConfig from HF_DIR/config.json, refused unless it describes a GPT-2."""
    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except ValueError as e:
        raise CheckpointError(f"{path} is not JSON ({e})") from None
    if hf.get("model_type") != "gpt2":
        raise CheckpointError(f"{hf_dir}/config.json describes a {hf.get('model_type')!r} model, not a GPT-2")
    for key, allowed in GPT2_SETTINGS.items():
        value = hf.get(key, allowed[0])
        if key == "n_inner" and value == 4 * hf.get("n_embd", 0):
            continue
        if value not in allowed:
            raise CheckpointError(f"{hf_dir}/config.json: {key} = {value!r}; SpecGPT's GPT-2 has {allowed[0]!r}")
    try:
        return GPTConfig(block_size=hf["n_positions"], vocab_size=hf["vocab_size"], n_layer=hf["n_layer"],
                         n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=0.0, bias=True)
    except KeyError as e:
        raise CheckpointError(f"{hf_dir}/config.json has no {e.args[0]!r}") from None


def read_safetensors(path):
    """{name: tensor} of a .safetensors file, each tensor a view of the memory-mapped file: nothing is
    read until it is used. (The format: an 8-byte little-endian header length, a JSON header giving
    each tensor's dtype, shape and byte range, then the bytes.)"""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private pages: tensors may be written
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            start, end = info["data_offsets"]
            count = (end - start) // dtype.itemsize
            flat = torch.frombuffer(data, dtype=dtype, count=count, offset=8 + size + start) if count else torch.empty(0, dtype=dtype)
            tensors[name] = flat.view(info["shape"])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{path} is not a safetensors file of float tensors ({type(e).__name__}: {e})") from None
    return tensors


def read_weights(hf_dir):
    path = os.path.join(hf_dir, "model.safetensors")
    if os.path.exists(path):
        return read_safetensors(path)
    path = os.path.join(hf_dir, "pytorch_model.bin")
    if not os.path.exists(path):
        raise CheckpointError(f"{hf_dir} has neither model.safetensors nor pytorch_model.bin")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # a pickle that is not plain tensors, or not a zip archive
        raise CheckpointError(f"{path} cannot be read as weights only ({type(e).__name__})") from None


def gpt_state_dict(hf_weights, model):
    """Our state dict for `model` (on the meta device: names and shapes only) from GPT-2's tensors:
    prefix 'transformer.', Conv1D weights transposed, the output projection tied to the embedding."""
    state = {}
    for name, tensor in hf_weights.items():
        name = name.removeprefix("transformer.")
        if name.endswith(NOT_WEIGHTS) or name == "lm_head.weight":
            continue
        state["transformer." + name] = tensor.t().contiguous() if name.endswith(CONV1D) else tensor
    wte = state.get("transformer.wte.weight")
    lm_head = hf_weights.get("lm_head.weight")
    if lm_head is not None and wte is not None and not torch.equal(lm_head, wte):
        raise CheckpointError("the checkpoint's lm_head is not tied to its token embedding, as GPT-2's is")
    state["lm_head.weight"] = wte
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    missing = [k for k in shapes if state.get(k) is None]
    unknown = [k for k in state if k not in shapes]
    wrong = [k for k in shapes if k not in missing and state[k].shape != shapes[k]]
    if missing or unknown or wrong:
        raise CheckpointError(f"the weights do not fit the config: missing {missing[:3]}, unknown {unknown[:3]}, "
                              f"misshapen {wrong[:3]}")
    return state


def convert(hf_dir, out_path):
    """Write HF_DIR's GPT-2 as a SpecGPT target checkpoint at out_path. Returns (config, tokenizer)."""
    if not os.path.isdir(hf_dir):
        raise CheckpointError(f"{hf_dir} is not a folder")
    config = read_config(hf_dir)
    try:
        tokenizer = Tokenizer.from_files(os.path.join(hf_dir, "vocab.json"), os.path.join(hf_dir, "merges.txt"))
    except FileNotFoundError as e:
        raise CheckpointError(f"{hf_dir} has no {os.path.basename(e.filename)}: the tokenizer needs vocab.json "
                              "and merges.txt") from None
    except (TokenizerError, ValueError) as e:
        raise CheckpointError(f"{hf_dir}: {e}") from None
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens, more than the model's "
                              f"{config.vocab_size}")
    with torch.device("meta"):
        model = GPT(config)
    model.load_state_dict(gpt_state_dict(read_weights(hf_dir), model), assign=True)
    save_checkpoint(out_path, model, tokenizer, kind="target", data=None, source=dict(hf_dir=os.path.abspath(hf_dir)))
    return config, tokenizer


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0].startswith("-"):
        print(__doc__.strip().split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    try:
        config, tokenizer = convert(*argv)
    except CheckpointError as e:  # bad input: one line and status 2, as from every command
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {argv[1]}: {config.n_layer} layers, {config.n_head} heads, {config.n_embd} wide, context "
          f"{config.block_size}, vocabulary {config.vocab_size} ({tokenizer.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
