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
"""
import torch


class KVCache:
    def __init__(self, n_layer, batch_size, n_head, head_dim, capacity, dtype=torch.float32, device="cpu"):
        shape = (n_layer, batch_size, n_head, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nh, capacity, hs)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0   # committed entries, shared by every layer and batch row
        self.pending = 0  # scratch entries written by the last forward, waiting for commit

    def write(self, layer, k_new, v_new):
        """Store a forward's n new entries (B, nh, n, hs) as scratch for `layer`.
        Returns the keys and values of the prefix plus the new entries: (B, nh, length + n, hs)."""
        n = k_new.size(2)
        end = self.length + n
        if end > self.capacity:
            raise RuntimeError(
                f"KV cache overflow: {self.length} committed + {n} new entries > capacity {self.capacity}")
        self.k[layer, :, :, self.length:end] = k_new
        self.v[layer, :, :, self.length:end] = v_new
        self.pending = n
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def commit(self, keep=None):
        """Append the scratch entries `keep` (indices 0..pending-1, in the order given) to the
        committed prefix and drop the rest. keep=None keeps everything the last forward wrote."""
        keep = list(range(self.pending)) if keep is None else [int(i) for i in keep]
        if len(set(keep)) != len(keep) or any(not 0 <= i < self.pending for i in keep):
            raise ValueError(f"commit: indices {keep} must be distinct and within the {self.pending} scratch entries")
        start = self.length
        if keep != list(range(len(keep))):  # a prefix of the scratch is already in place
            src = torch.tensor(keep, device=self.k.device) + start
            # advanced indexing copies the gathered entries first, so sources and targets may overlap
            self.k[:, :, :, start:start + len(keep)] = self.k[:, :, :, src]
            self.v[:, :, :, start:start + len(keep)] = self.v[:, :, :, src]
        self.length = start + len(keep)
        self.pending = 0

    def rollback(self, length):
        """Forget everything after the first `length` committed entries."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback: length {length} is outside [0, {self.length}]")
        self.length = length
        self.pending = 0
