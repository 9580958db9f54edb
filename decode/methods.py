"""Every decoding method by name (METHODS), with its one setting and that setting's default (defined
in each method's own module): what the commands build a proposer from. A setting is written the way
the command line takes it (`--lookahead 5,3,5`), so that a benchmark row and a generation with the
same words build the same proposer.
"""
from dataclasses import dataclass
from functools import partial

from decode import draft, eagle, jacobi, lookahead, medusa, prompt_lookup
from decode.cost import StoredCosts, forward_seconds, profile_prefix
from decode.plain import Plain
from decode.sizing import Costs, measure
from model.checkpoint import CheckpointError, load_model

MAX_SIZE = 64        # the most a window, n-gram or match setting may be
MAX_TREE_SIZE = 256  # the most candidates a Medusa tree may have


class SettingError(ValueError):
    """A method's setting that is malformed or out of range."""


@dataclass(frozen=True)
class Method:
    name: str
    flag: str | None       # the command-line flag that carries the setting
    metavar: str
    default: str | None
    needs: str | None      # the checkpoint it needs besides the target's: "draft", "medusa" or "eagle"
    help: str


def _triple(values):
    return ",".join(map(str, values))


METHODS = {m.name: m for m in [
    Method("none", None, "", None, None, "plain decoding: one target forward per token"),
    Method("draft", "--k", "N|auto|heuristic", str(draft.DEFAULT_K), "draft",
           "draft: guesses per round: a number, auto (chosen each round from the measured costs and "
           "acceptance) or heuristic (Hugging Face's schedule)"),
    Method("jacobi", "--jacobi", "W", str(jacobi.DEFAULT_WINDOW), None, "jacobi: guesses per pass"),
    Method("lookahead", "--lookahead", "W,N,G",
           _triple((lookahead.WINDOW, lookahead.NGRAM_SIZE, lookahead.MAX_NGRAMS)), None,
           "lookahead: window columns W, n-gram size N (N-1 Jacobi levels), at most G pool n-grams "
           "verified per pass"),
    Method("prompt-lookup", "--prompt-lookup", "L,P,M",
           _triple((prompt_lookup.MAX_MATCH, prompt_lookup.NUM_PROPOSED, prompt_lookup.NUM_MATCHES)), None,
           "prompt-lookup: longest suffix looked up L, tokens proposed per match P, matches verified M"),
    Method("medusa", "--medusa-tree", "saved|chain|N", medusa.DEFAULT_TREE, "medusa",
           "medusa: the tree saved with the heads, the top-1 of each head as a chain, or a tree of N "
           "candidates built from the heads' measured accuracies"),
    Method("eagle", "--eagle", "chain:K|tree:N", eagle.DEFAULT, "eagle",
           "eagle: a chain of K guesses or a dynamic tree of N nodes per round, or either sized each round "
           "(chain:auto, tree:auto) from the measured costs and the head's confidence"),
]}


def _sizes(method, setting, count):
    try:
        values = tuple(int(x) for x in setting.split(","))
    except ValueError:
        values = ()
    if len(values) != count or not all(1 <= v <= MAX_SIZE for v in values):
        what, example = ("one number", "5") if count == 1 else ("three comma-separated numbers", "5,3,5")
        raise SettingError(f"{METHODS[method].flag} takes {what} from 1 to {MAX_SIZE}, like {example}; "
                           f"got {setting!r}")
    return values


def parse_setting(method, setting):
    """The setting of `method` as its proposer takes it, checked; SettingError if it is not valid."""
    if method in ("draft", "eagle"):
        parse, flag = (draft.parse_k, "--k:") if method == "draft" else (eagle.parse_shape, "--eagle")
        try:
            return parse(setting)
        except ValueError as e:
            raise SettingError(f"{flag} {e}") from None
    if method == "jacobi":
        return _sizes(method, setting, 1)[0]
    if method == "lookahead":
        values = _sizes(method, setting, 3)
        if values[1] < 2:
            raise SettingError(f"--lookahead {setting}: N must be at least 2 (N = 2 is Jacobi decoding with a pool)")
        return values
    if method == "prompt-lookup":
        return _sizes(method, setting, 3)
    if method == "medusa":
        if setting in ("saved", "chain"):
            return setting
        if not setting.isdigit() or not 1 <= int(setting) <= MAX_TREE_SIZE:
            raise SettingError(f"--medusa-tree takes saved, chain or a tree size from 1 to {MAX_TREE_SIZE}, "
                               f"got {setting!r}")
        return int(setting)
    if method != "none":
        raise SettingError(f"unknown method {method!r}; methods: {', '.join(METHODS)}")
    return None


def _costs(costs, name, target, largest, batch_size, **how):
    """The Costs called `name` (at batch_size) in the StoredCosts `costs`, else measure's now (of passes
    of up to `largest` tokens, `how` its options). An earlier version stored a lookahead curve r alone."""
    name += f" batch {batch_size}" if batch_size > 1 else ""
    stored = costs.get(name, lambda: measure(target, largest, batch_size, **how))
    return Costs(*stored) if isinstance(stored[0], list) else Costs(stored)


def make_proposer(method, setting, target, draft_model=None, heads=None, sizing=lookahead.SIZING,
                  pool_from_prompt=False, typical=False, costs=None, eagle_head=None, batch_size=1):
    """The proposer of `method` with `setting` (parse_setting's input; None = the default).
    draft_model: the draft GPT, for "draft"; heads: (MedusaHeads, their checkpoint dict), for
    "medusa"; eagle_head: (EagleHead, its checkpoint dict), for "eagle". sizing and
    pool_from_prompt are lookahead's options, typical Medusa's. costs: the StoredCosts that the
    methods which size themselves to the machine read their Costs from (by default they are
    measured now); batch_size: the batch the proposer's row decodes in, whose costs size it."""
    value = parse_setting(method, METHODS[method].default if setting is None else setting)
    costs = costs or StoredCosts()
    if method == "none":
        return Plain()
    if method == "draft":
        k, schedule = value
        step = partial(forward_seconds, draft_model, 1, profile_prefix(draft_model), batch_size=batch_size)
        measured = (_costs(costs, "draft", target, draft.AUTO_K_MAX + 1, batch_size, drafter=step)
                    if schedule == "auto" else None)  # chain passes, and a draft step of all rows at once
        return draft.DraftModel(draft_model, k, schedule, costs=measured)
    if method == "jacobi":
        return jacobi.Jacobi(value)
    if method == "lookahead":
        window, ngram_size, max_ngrams = value  # the largest pass: the window and G n-grams, N-1 deep
        measured = (_costs(costs, "lookahead " + _triple(value), target, (window + max_ngrams) * (ngram_size - 1) + 1,
                           batch_size, tree=True, repeats=5) if sizing == "auto" else None)
        return lookahead.Lookahead(*value, pool_from_prompt=pool_from_prompt, costs=measured)
    if method == "prompt-lookup":
        return prompt_lookup.PromptLookup(*value)
    if method == "eagle":
        shape, size = value
        head, state = eagle_head
        forward = partial(eagle.head_seconds, head, target.config.vocab_size, profile_prefix(target))
        measured = (_costs(costs, "eagle", target, eagle.MAX_AUTO_NODES + 1, batch_size, tree=True, drafter=forward,
                           drafters_per_step=batch_size) if size == "auto" else None)  # a head forward per row
        return eagle.Eagle(head, shape, size, costs=measured, ranks=state.get("ranks"))
    module, state = heads
    paths = (state["tree"] if value == "saved" else value if value == "chain"
             else medusa.build_tree(state["accuracies"], value))
    return medusa.Medusa(module, paths, typical=medusa.TYPICAL if typical else None)


def load_draft(path, tokenizer, device, dtype):
    """The draft model at `path`, refused unless it speaks the target's tokenizer."""
    model, draft_tokenizer, _ = load_model(path, kind="draft", device=device, dtype=dtype)
    if draft_tokenizer.spec != tokenizer.spec:
        raise CheckpointError(f"{path} uses another tokenizer ({draft_tokenizer.name}) than the target "
                              f"({tokenizer.name})", retrain="draft")
    return model

