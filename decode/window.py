"""Which part of the text a model's KV cache holds, and the slide past the context window.

A model has block_size learned positions. When the text no longer fits, the cache is emptied and
the next pass re-prefills the last half window: the model keeps at least half a window of context,
and the next slide is half a window away. The target (decode/speculative.py) and a draft model
(decode/draft.py) slide by this one rule, each on its own cache.
"""


class ContextWindow:
    def __init__(self, cache, block_size):
        self.cache, self.block_size = cache, block_size
        self.start = self.cached = 0  # the cache holds tokens[start:cached]

    def slide_if_full(self, length, ahead=0, row=None):
        """Slide if `length` tokens plus `ahead` more would not fit; True if it slid. row: the batch
        row of the cache this text lives in (None: the cache holds only this text)."""
        if length - self.start + ahead <= self.block_size:
            return False
        self.start = self.cached = length - self.block_size // 2
        self.cache.rollback(0, row=row)
        return True

    def room(self, length):
        """How many positions are left after `length` tokens."""
        return self.block_size - (length - self.start)
