"""Committed state of earlier calls, reused when a new prompt starts with the same tokens.

An agent re-sends its whole conversation every turn. Attention K/V could be cut back to any
length, but a Gated DeltaNet recurrent state cannot be rolled back, so the cache keeps whole
:class:`ModelCache` snapshots taken at block boundaries, keyed by the exact tokens they cover and by
the attention rule that produced them (block-causal diffusion state and causal state differ). A
lookup returns a private copy of the longest stored snapshot that is a prefix of the new tokens.

Memory is bounded by ``max_bytes`` (the snapshots' ``nbytes()``); the least recently used entries go
first, and a snapshot larger than the whole budget is not kept. Lookups and stores may come from
several threads (the requests of a batch, ``engine/batching.py``): a lock keeps the store whole.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

import torch

from clover_agent.engine.model.cache import ModelCache

P = ParamSpec("P")
R = TypeVar("R")

#: Default budget: enough for a few long conversations of the full model on a GPU.
DEFAULT_MAX_BYTES = 4 * 1024**3


def _locked(method: Callable[Concatenate[PrefixCache, P], R]) -> Callable[Concatenate[PrefixCache, P], R]:
    """``method`` run holding the cache's lock."""

    @functools.wraps(method)
    def locked(self: PrefixCache, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


@dataclass
class _Entry:
    tokens: torch.Tensor  # int64 [length], on the CPU
    attention: str
    cache: ModelCache
    nbytes: int


class PrefixCache:
    """LRU store of ``ModelCache`` snapshots keyed by (attention rule, token prefix)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (got {max_bytes})")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int, int], _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(entry.nbytes for entry in self._entries.values())

    @_locked
    def store(self, tokens: Sequence[int], attention: str, cache: ModelCache) -> None:
        """Keep ``cache`` (which must cover exactly ``tokens``) as the state after ``tokens``.

        The cache object is kept as it is: the caller hands it over and must not commit to it
        afterwards (pass a ``clone()`` to keep using the original)."""
        if cache.length != len(tokens):
            raise ValueError(f"snapshot covers {cache.length} tokens but {len(tokens)} tokens were given")
        if not tokens:
            return
        key_tokens = torch.tensor(list(tokens), dtype=torch.long)
        key = (attention, len(tokens), hash(key_tokens.numpy().tobytes()))
        size = cache.nbytes()
        self._entries.pop(key, None)
        if size > self.max_bytes:
            return
        self._entries[key] = _Entry(key_tokens, attention, cache, size)
        self._evict()

    @_locked
    def lookup(
        self,
        tokens: Sequence[int],
        attention: str,
        *,
        max_length: int,
        multiple_of: int = 1,
        capacity: int = 0,
        into: ModelCache | None = None,
    ) -> ModelCache | None:
        """A private copy of the longest stored state for a prefix of ``tokens`` no longer than
        ``max_length`` whose length is a multiple of ``multiple_of`` (with K/V room for ``capacity``
        tokens), or ``into`` loaded with it (``ModelCache.load``); None when there is none."""
        query = torch.tensor(list(tokens[:max_length]), dtype=torch.long)
        best_key, best_length = None, 0
        for key, entry in self._entries.items():
            length = entry.tokens.numel()
            if (
                entry.attention != attention
                or length > query.numel()
                or length <= best_length
                or length % multiple_of
            ):
                continue
            if torch.equal(entry.tokens, query[:length]):
                best_key, best_length = key, length
        if best_key is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(best_key)
        stored = self._entries[best_key].cache
        if into is not None:
            into.load(stored)
            return into
        return stored.clone(capacity)

    @_locked
    def holds(
        self,
        tokens: Sequence[int],
        attention: str | None = None,
        *,
        at_least: int | None = None,
        multiple_of: int = 1,
    ) -> bool:
        """Whether a snapshot of exactly ``tokens`` is stored (under ``attention``; None: any rule),
        or with ``at_least``, one of a prefix of them no shorter, its length a multiple of
        ``multiple_of`` (what :meth:`lookup` would start a call from)."""
        query = torch.tensor(list(tokens), dtype=torch.long)
        shortest = query.numel() if at_least is None else at_least
        for entry in self._entries.values():
            length = entry.tokens.numel()
            if attention is not None and entry.attention != attention:
                continue
            fits = shortest <= length <= query.numel() and not length % multiple_of
            if fits and torch.equal(entry.tokens, query[:length]):
                return True
        return False

    @_locked
    def clear(self) -> None:
        self._entries.clear()

    def _evict(self) -> None:
        total = self.nbytes
        while total > self.max_bytes and self._entries:
            _, entry = self._entries.popitem(last=False)
            total -= entry.nbytes
