"""A preallocated key/value cache with speculative scratch space, commit and rollback.

Layout per layer: slots [0, length) hold the committed tokens; a forward pass writes its n new
entries as scratch into [length, length + n). Nothing becomes part of the context until `commit`
says which scratch entries to keep:

    committed: t0 t1 t2 | scratch: a  b  c  d  e        commit([0, 2, 4])
    committed: t0 t1 t2 a  c  e                         length 3 -> 6, b and d are dropped

Plain decoding commits everything it wrote; a speculative verifier commits only the accepted
root-to-leaf path of its candidate tree. `rollback` truncates to a shorter committed length (a draft
model throwing away its rejected guesses). Slots past `length` are never read as context, so dropped
entries need no clearing: the next forward overwrites them.

In a batch each row keeps its own committed length (batched decoding: prompts of different lengths,
and speculation accepting different paths in each row). A forward writes every row's n new entries
right after that row's own prefix, and commit takes a list of entries to keep per row.
"""
import torch


class Cache:
    """What a forward (GPT.forward, EagleHead.forward) asks of a cache. KVCache is the cache itself;
    RowView hands a forward some of its rows, model/compiled.py's static view the whole at tensor
    positions. What a forward writes stays scratch until KVCache.commit keeps it: views never commit."""

    @property
    def length(self):
        """The committed length, when every row has the same (always, for a single sequence)."""
        if len(self.lengths) > 1 and self.ragged:
            raise RuntimeError(f"the batch rows hold different lengths {self.lengths}; read lengths")
        return self.lengths[0]

    @property
    def ragged(self):
        return min(self.lengths) != max(self.lengths)

    def row_lengths(self):
        """Each row's committed length as a (B,) tensor when the rows differ, else None: attention
        then has to be told where each row's own keys end (kernels.attention's `lengths`)."""
        raise NotImplementedError

    def write(self, layer, k_new, v_new):
        """Store a forward's n new entries (B, nh, n, hs) as scratch for `layer`, each row's right after
        its committed prefix. Returns the keys and values the new queries attend over: (B, nh, T, hs)."""
        raise NotImplementedError

    def end_of_pass(self, n):
        """The slot after the longest row's n new entries, if the cache has room for them."""
        end = max(self.lengths) + n
        if end > self.capacity:
            raise RuntimeError(
                f"KV cache overflow: {max(self.lengths)} committed + {n} new entries > capacity {self.capacity}")
        return end


class KVCache(Cache):
    def __init__(self, n_layer, batch_size, n_head, head_dim, capacity, dtype=torch.float32, device="cpu"):
        shape = (n_layer, batch_size, n_head, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nh, capacity, hs)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.lengths = [0] * batch_size  # committed entries of each batch row, in every layer
        self.pending = 0  # scratch entries after each row's prefix since the last commit or rollback
        self._row_lengths = None  # self.lengths as a tensor, while the rows differ
        self._row_slots = None  # where a pass writes in each row, while the rows differ
        self._take_views()

    def row_lengths(self):
        if self._row_lengths is None and self.ragged:
            self._row_lengths = torch.tensor(self.lengths, device=self.k.device)
        return self._row_lengths

    def _take_views(self):
        """Each layer's keys and values, and the same as (B * nh * capacity, hs) rows for a ragged
        write, taken once per storage: indexing the (L, B, ...) tensors in every layer of every pass
        made a ragged write 40% slower (docs/2026-12-06-epyc-aa.md)."""
        B, nh, capacity, hs = self.k.shape[1:]
        layers = range(self.k.size(0))
        self.layer_k, self.layer_v = [self.k[l] for l in layers], [self.v[l] for l in layers]  # (B, nh, capacity, hs)
        self.flat_k, self.flat_v = [k.view(-1, hs) for k in self.layer_k], [v.view(-1, hs) for v in self.layer_v]
        self._head_start = torch.arange(B * nh, device=self.k.device).view(B, nh, 1) * capacity  # a (row, head)'s first slot

    def write(self, layer, k_new, v_new):
        n = k_new.size(2)
        end = self.end_of_pass(n)
        k, v = self.layer_k[layer], self.layer_v[layer]
        if self.row_lengths() is None:
            start = self.lengths[0]
            k[:, :, start:end] = k_new
            v[:, :, start:end] = v_new
        else:  # index_copy_ of whole (hs,) rows, at slots built for the pass's first layer, takes 0.4-0.6x
            # scatter_'s time, itself half of indexed assignment's (docs/2026-12-06-epyc-w.md)
            hs = k_new.size(-1)
            if self._row_slots is None or self._row_slots.numel() != k_new.numel() // hs:
                slots = self._row_lengths[:, None] + torch.arange(n, device=self.k.device)  # (B, n)
                self._row_slots = (self._head_start + slots[:, None, :]).flatten()  # (B * nh * n,)
            self.flat_k[layer].index_copy_(0, self._row_slots, k_new.reshape(-1, hs))
            self.flat_v[layer].index_copy_(0, self._row_slots, v_new.reshape(-1, hs))
        self.wrote(n)
        return k[:, :, :end], v[:, :, :end]  # (B, nh, max(lengths) + n, hs)

    def wrote(self, n):
        """n scratch entries were written after each row's prefix (by write, a static pass, row views):
        until the next commit or rollback, the widest write is what `commit` may keep."""
        self.pending = max(self.pending, n)

    def commit(self, keep=None):
        """Append the scratch entries `keep` (indices 0..pending-1, in the order given) to the
        committed prefix and drop the rest. keep=None keeps everything the last forward wrote; a
        list of indices applies to every row; a list of B such lists gives each row its own."""
        if keep is None:
            keep = list(range(self.pending))
        per_row = bool(keep) and isinstance(keep[0], list)
        if per_row and len(keep) != len(self.lengths):
            raise ValueError(f"commit: {len(keep)} lists of entries for {len(self.lengths)} batch rows")
        if per_row or self.ragged:
            for row in range(len(self.lengths)):
                self._keep(keep[row] if per_row else keep, row)
        else:
            self._keep(keep)
        self.pending = 0
        self._row_lengths = self._row_slots = None

    def _keep(self, keep, row=None):
        """Move the scratch entries `keep` to the end of the committed prefix of one row (or of
        every row, when they all have the same length)."""
        keep = [int(i) for i in keep]
        if len(set(keep)) != len(keep) or any(not 0 <= i < self.pending for i in keep):
            raise ValueError(f"commit: indices {keep} must be distinct and within the {self.pending} scratch entries")
        rows = slice(None) if row is None else row
        start = self.lengths[0 if row is None else row]
        if keep != list(range(len(keep))):  # a prefix of the scratch is already in place
            src = torch.tensor(keep, device=self.k.device) + start
            # advanced indexing copies the gathered entries first, so sources and targets may overlap
            self.k[:, rows, :, start:start + len(keep)] = self.k[:, rows, :, src]
            self.v[:, rows, :, start:start + len(keep)] = self.v[:, rows, :, src]
        for r in range(len(self.lengths)) if row is None else [row]:
            self.lengths[r] = start + len(keep)

    def rollback(self, length, row=None):
        """Forget everything after the first `length` committed entries (of one batch row, or all)."""
        rows = range(len(self.lengths)) if row is None else [row]
        if not all(0 <= length <= self.lengths[r] for r in rows):
            raise ValueError(f"rollback: length {length} is outside [0, {min(self.lengths[r] for r in rows)}]")
        for r in rows:
            self.lengths[r] = length
        self.pending = 0
        self._row_lengths = self._row_slots = None

    def select_rows(self, rows):
        """Keep only the batch rows `rows` (indices, in order): finished sequences stop costing work."""
        index = torch.tensor(rows, device=self.k.device)
        self.k, self.v = self.k[:, index].contiguous(), self.v[:, index].contiguous()
        self._take_views()
        self.lengths = [self.lengths[r] for r in rows]
        self._row_lengths = self._row_slots = None


class RowView(Cache):
    """Some rows of a cache, for a forward over them alone: a batch round where a few rows re-prefill
    half a window runs one forward per group of rows rather than pad every row to that width. A view
    writes the cache's own storage, and the cache's commit then keeps what its forwards wrote."""

    def __init__(self, cache, rows):
        self.cache, self.rows = cache, torch.tensor(rows, device=cache.k.device)
        self.k, self.v, self.capacity = cache.k, cache.v, cache.capacity  # the cache's own storage
        self.lengths = [cache.lengths[r] for r in rows]
        self.starts = torch.tensor(self.lengths, device=cache.k.device)  # (B,), fixed: a view is never committed

    def row_lengths(self):
        return self.starts if self.ragged else None

    def write(self, layer, k_new, v_new):
        n = k_new.size(2)
        end = self.end_of_pass(n)
        slots = self.starts[:, None] + torch.arange(n, device=self.starts.device)  # (B, n)
        # advanced indices split by a slice put their dims first: the target is (B, n, nh, hs)
        self.k[layer][self.rows[:, None], :, slots] = k_new.transpose(1, 2)
        self.v[layer][self.rows[:, None], :, slots] = v_new.transpose(1, 2)
        self.cache.wrote(n)
        return self.k[layer][self.rows, :, :end], self.v[layer][self.rows, :, :end]
