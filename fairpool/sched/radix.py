"""A radix tree over token sequences or text, with owners and LRU eviction.

One tree serves two places:

- an engine's prefix cache (one owner, the engine; `lock` keeps the prefixes of running
  requests from being evicted, as vLLM's and SGLang's block reference counts do);
- the gateway's global approximate tree (owners are worker ids, as in SGLang's router and
  D2LPM's `R.LongestMatchWorkers`, seed 000 Algorithm 2 lines 2, 13, 18 and 27).

Keys are lists of ints (token ids), `str` (text, one element per character) or `bytes`;
one tree holds one kind. Edges are path-compressed, children are found by their first
element, and a whole edge is compared at once (`startswith` for text and bytes, which
copies nothing; slice equality for lists), with a binary search for a split point, so
matching a 4k-token prompt costs one C-level compare per edge on its path rather than a
Python loop per token. Token lists cost more than text: comparing two lists compares each
pair of ints, unless they are the same objects.

Invariant: the owners of a node are a subset of its parent's owners. A worker that caches
a prefix caches every shorter prefix of it, so `insert` adds the owner along the whole path
and `evict` removes it from a node and everything below. Nodes left with no owner are
pruned, so every node in the tree has at least one owner.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fairpool.sched.errors import ConfigError, require_count

Owner = Hashable
Key = Any  # list[int] | str | bytes; one kind per tree


@dataclass(frozen=True)
class Match:
    """The longest prefix of a query the tree holds, and the owners that hold all of it."""

    length: int
    owners: frozenset[Owner]


@dataclass(frozen=True)
class LockHandle:
    """What `lock` returns and `unlock` takes; `length` is the locked prefix length."""

    node: _Node
    length: int


@dataclass(frozen=True)
class TreeStats:
    nodes: int
    tokens: int
    owners: int
    evicted_tokens: int


class _Node:
    __slots__ = ("children", "detached", "key", "last_access", "owners", "parent", "refs")

    def __init__(self, key: Key, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[Any, _Node] = {}
        self.owners: set[Owner] = set()
        self.last_access = 0
        self.refs = 0
        self.detached = False


def _whole_edge_matches(seq: Key, position: int, key: Key) -> bool:
    """Does seq continue with the whole of `key` at `position`?

    str and bytes compare in place with startswith; lists need a slice.
    """
    end = position + len(key)
    if end > len(seq):
        return False
    if isinstance(seq, list):
        return bool(seq[position:end] == key)
    return bool(seq.startswith(key, position))


def _common_prefix_length(seq: Key, start: int, key: Key) -> int:
    """Length of the common prefix of seq[start:] and key (key[0] is known to match).

    Slices of lists copy, so the search keeps them short: a probe of the first few
    elements catches the usual early divergence, one compare confirms a full match, and
    otherwise a bisection over ever smaller sub-slices narrows down the split point.
    """
    length = min(len(key), len(seq) - start)
    probe = min(length, _PROBE)
    if seq[start : start + probe] != key[:probe]:
        high = probe
    elif seq[start : start + length] == (key if length == len(key) else key[:length]):
        return length
    else:
        high = length
    low = 0  # seq matches key on [0, low); the first mismatch lies in [low, high)
    while high - low > _PROBE:
        middle = (low + high) // 2
        if seq[start + low : start + middle] == key[low:middle]:
            low = middle
        else:
            high = middle
    while seq[start + low] == key[low]:
        low += 1
    return low


_PROBE = 16


class RadixTree:
    """Prefix tree with owners, LRU eviction under a node and token budget, and locks.

    `max_tokens` / `max_nodes` bound the tree; when an insert goes over either bound, the
    least recently used unlocked leaves are evicted until it fits again. `None` means
    unbounded.
    """

    def __init__(
        self,
        max_tokens: int | None = None,
        max_nodes: int | None = None,
        on_evict: Callable[[Key, int, frozenset[Owner]], None] | None = None,
    ) -> None:
        """`on_evict(seq, keep, owners)` hears of every LRU eviction: the owners no
        longer hold `seq` beyond its first `keep` elements (an engine reports this to the
        router, seed 000 Algorithm 2 line 27)."""
        self.on_evict = on_evict
        if max_tokens is not None:
            require_count("max_tokens", max_tokens, minimum=1)
        if max_nodes is not None:
            require_count("max_nodes", max_nodes, minimum=1)
        self.max_tokens = max_tokens
        self.max_nodes = max_nodes
        self._root = _Node(key=None, parent=None)
        self._kind: type | None = None
        self._clock = 0
        self._node_count = 0
        self._token_count = 0
        self._evicted_tokens = 0
        self._locked_tokens = 0
        self._owner_tokens: dict[Owner, int] = {}
        self._leaf_heap: list[tuple[int, int, _Node]] = []
        self._tiebreak = itertools.count()

    # ------------------------------------------------------------------ queries

    def match(self, seq: Sequence[Any]) -> Match:
        """Longest prefix of `seq` in the tree and the owners holding all of it.

        Marks the matched path as recently used. An empty match has no owners.
        """
        seq = self._normalise(seq, learn=False)
        node, length = self._walk(seq, touch=True)
        if length == 0:
            return Match(0, frozenset())
        return Match(length, frozenset(node.owners))

    def match_length(self, seq: Sequence[Any], owner: Owner | None = None) -> int:
        """Length of the longest prefix of `seq` held by `owner` (by anyone if None)."""
        seq = self._normalise(seq, learn=False)
        node, length = self._walk(seq, touch=False)
        if owner is None:
            return length
        lengths = self._lengths_along(node, length)
        return lengths.get(owner, 0)

    def match_lengths(self, seq: Sequence[Any]) -> dict[Owner, int]:
        """Each owner's longest held prefix of `seq` (owners with no match are absent)."""
        seq = self._normalise(seq, learn=False)
        node, length = self._walk(seq, touch=False)
        return self._lengths_along(node, length)

    def owner_tokens(self, owner: Owner) -> int:
        """Tokens (or characters) the tree believes `owner` holds."""
        return self._owner_tokens.get(owner, 0)

    def owners(self) -> set[Owner]:
        return set(self._owner_tokens)

    def stats(self) -> TreeStats:
        return TreeStats(
            nodes=self._node_count,
            tokens=self._token_count,
            owners=len(self._owner_tokens),
            evicted_tokens=self._evicted_tokens,
        )

    def __len__(self) -> int:
        """Number of tokens (or characters) stored."""
        return self._token_count

    @property
    def locked_tokens(self) -> int:
        """Tokens on locked paths: in use, not evictable."""
        return self._locked_tokens

    # ------------------------------------------------------------------ updates

    def insert(self, seq: Sequence[Any], owner: Owner) -> int:
        """Record that `owner` holds `seq` (and so every prefix of it).

        Returns how many of `seq`'s elements `owner` did not hold before. May evict
        least recently used leaves to stay within the budget.
        """
        elements: Key = self._normalise(seq, learn=True)
        node = self._root
        position = 0
        length = len(elements)
        added = 0
        self._clock += 1
        clock = self._clock
        while position < length:
            child = node.children.get(elements[position])
            if child is None:
                child = self._new_node(elements[position:], node)
                added += self._add_owner(child, owner)
                self._push_leaf(child)
                break
            key = child.key
            if _whole_edge_matches(elements, position, key):
                position += len(key)
            else:
                common = _common_prefix_length(elements, position, key)
                child = self._split(child, common)
                position += common
            if owner not in child.owners:
                added += self._add_owner(child, owner)
            child.last_access = clock
            node = child
        self._enforce_budget()
        return added

    def evict(self, seq: Sequence[Any], owner: Owner, keep: int | None = None) -> int:
        """Record that `owner` holds at most `seq[:keep]` of this path (default: all but
        the last element), and so nothing that extends it.

        An engine that evicts a cache block reports the sequence up to the block's end
        and `keep` = the block's start. Returns the number of tokens taken from `owner`.
        """
        seq = self._normalise(seq, learn=False)
        keep = len(seq) - 1 if keep is None else keep
        if not 0 <= keep < len(seq):
            return 0
        node = self._root
        position = 0
        while True:
            child = node.children.get(seq[position])
            if child is None:
                return 0
            common = _common_prefix_length(seq, position, child.key)
            if position + len(child.key) > keep:
                break  # seq[keep] falls inside this edge
            if common < len(child.key):
                return 0  # seq leaves the tree before `keep`
            node = child
            position += common
        if position + common <= keep or owner not in child.owners:
            return 0  # the tree, or at least `owner`, does not hold seq[keep]
        if keep > position:
            self._split(child, keep - position)  # `child` keeps the lower part
        return self._remove_owner_below(child, owner)

    def remove_owner(self, owner: Owner) -> int:
        """Forget everything `owner` held (a worker left the pool)."""
        return sum(
            self._remove_owner_below(child, owner) for child in list(self._root.children.values())
        )

    def lock(self, seq: Sequence[Any]) -> LockHandle:
        """Protect the held prefix of `seq` from LRU eviction until `unlock`."""
        seq = self._normalise(seq, learn=False)
        node, length = self._walk(seq, touch=True, split_partial=True)
        self._add_refs(node, +1)
        return LockHandle(node, length)

    def unlock(self, handle: LockHandle) -> None:
        self._add_refs(handle.node, -1)
        self._enforce_budget()

    def evict_lru(self, tokens: int) -> int:
        """Evict at least `tokens` tokens of unlocked leaves, oldest first, if possible."""
        target = max(self._token_count - tokens, 0)
        return self._evict_until(lambda: self._token_count <= target)

    def iter_sequences(self) -> Iterator[tuple[Key, frozenset[Owner]]]:
        """Every root-to-leaf sequence with its owners (for debugging and tests)."""
        stack: list[tuple[_Node, Key]] = [
            (child, child.key) for child in self._root.children.values()
        ]
        while stack:
            node, prefix = stack.pop()
            if not node.children:
                yield prefix, frozenset(node.owners)
            for child in node.children.values():
                stack.append((child, prefix + child.key))

    # ------------------------------------------------------------------ internals

    def _normalise(self, seq: Sequence[Any], learn: bool) -> Key:
        if isinstance(seq, str | bytes):
            kind: type = type(seq)
        elif isinstance(seq, list):
            kind = list
        else:
            seq = list(seq)
            kind = list
        if self._kind is None:
            if learn and len(seq):
                self._kind = kind
        elif kind is not self._kind:
            raise ConfigError(
                "sequence",
                f"this tree holds {self._kind.__name__} keys, got {kind.__name__}",
            )
        return seq

    def _walk(self, seq: Key, touch: bool, split_partial: bool = False) -> tuple[_Node, int]:
        """Deepest node on seq's path and the matched length (may end inside that node)."""
        node = self._root
        position = 0
        length = len(seq)
        if touch:
            self._clock += 1
        clock = self._clock
        while position < length:
            child = node.children.get(seq[position])
            if child is None:
                break
            key = child.key
            if _whole_edge_matches(seq, position, key):  # the usual case on a shared path
                if touch:
                    child.last_access = clock
                node = child
                position += len(key)
                continue
            common = _common_prefix_length(seq, position, key)
            if split_partial:
                child = self._split(child, common)
            if touch:
                child.last_access = clock
            return child, position + common
        return node, position

    def _lengths_along(self, node: _Node, length: int) -> dict[Owner, int]:
        """For a path ending at `node` (matched `length` deep), each owner's match length.

        Owners shrink going down, so the deepest node an owner appears on is the first
        one met walking up; its match ends where that node's matched part ends. The owners
        met so far are those of the node below, so a node with no more owners than that
        holds the same ones and is skipped: O(depth + owners), not O(depth * owners).
        """
        lengths: dict[Owner, int] = {}
        end = length
        start = self._start_depth(node)
        while node is not self._root:
            if len(node.owners) > len(lengths):
                for owner in node.owners:
                    lengths.setdefault(owner, end)
            assert node.parent is not None
            end, node = start, node.parent
            if node is not self._root:
                start -= len(node.key)
        return lengths

    def _path_to(self, node: _Node) -> Key:
        """The whole sequence from the root to the end of `node`."""
        keys = []
        current: _Node | None = node
        while current is not None and current is not self._root:
            keys.append(current.key)
            current = current.parent
        keys.reverse()
        if isinstance(keys[0], list):
            return list(itertools.chain.from_iterable(keys))
        return keys[0][:0].join(keys)  # str or bytes

    def _start_depth(self, node: _Node) -> int:
        depth = 0
        while node.parent is not None and node.parent is not self._root:
            node = node.parent
            depth += len(node.key)
        return depth

    def _new_node(self, key: Key, parent: _Node) -> _Node:
        node = _Node(key, parent)
        node.last_access = self._clock
        parent.children[key[0]] = node
        self._node_count += 1
        self._token_count += len(key)
        return node

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut node's edge after `at` elements; returns the new upper node."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        upper = _Node(node.key[:at], parent)
        upper.owners = set(node.owners)
        upper.last_access = node.last_access
        upper.refs = node.refs
        parent.children[upper.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        self._node_count += 1
        return upper

    def _add_owner(self, node: _Node, owner: Owner) -> int:
        if owner in node.owners:
            return 0
        node.owners.add(owner)
        self._owner_tokens[owner] = self._owner_tokens.get(owner, 0) + len(node.key)
        return len(node.key)

    def _drop_owner(self, node: _Node, owner: Owner) -> int:
        node.owners.discard(owner)
        remaining = self._owner_tokens[owner] - len(node.key)
        if remaining:
            self._owner_tokens[owner] = remaining
        else:
            del self._owner_tokens[owner]
        return len(node.key)

    def _remove_owner_below(self, top: _Node, owner: Owner) -> int:
        """Remove `owner` from `top` and its subtree; prune nodes left without owners."""
        removed = 0
        stack = [top]
        while stack:
            node = stack.pop()
            if owner not in node.owners:
                continue  # nor anywhere below (subset invariant)
            if len(node.owners) == 1:
                removed += self._detach(node)  # the subtree belonged to `owner` alone
            else:
                removed += self._drop_owner(node, owner)
                stack.extend(node.children.values())
        return removed

    def _detach(self, node: _Node) -> int:
        """Remove `node` and its subtree from the tree; returns the tokens removed."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[0]]
        if node.refs:
            # Locks inside the subtree stop at its detached top when unlocked, so take
            # their counts off the ancestors that stay in the tree now.
            self._add_refs(parent, -node.refs)
        removed = 0
        stack = [node]
        while stack:
            current = stack.pop()
            removed += len(current.key)
            self._node_count -= 1
            self._token_count -= len(current.key)
            for owner in list(current.owners):
                self._drop_owner(current, owner)
            if current.refs > 0:
                self._locked_tokens -= len(current.key)
            current.detached = True
            current.parent = None
            stack.extend(current.children.values())
        if parent is not self._root and not parent.children:
            self._push_leaf(parent)
        return removed

    def _add_refs(self, node: _Node, delta: int) -> None:
        current: _Node | None = node
        while current is not None and current is not self._root:
            was_locked = current.refs > 0
            current.refs += delta
            if current.refs < 0:
                raise ConfigError("handle", "unlock without a matching lock")
            if was_locked != (current.refs > 0) and not current.detached:
                self._locked_tokens += (
                    len(current.key) if was_locked is False else -len(current.key)
                )
            current = current.parent  # None once an owner eviction detached the path

    def _push_leaf(self, node: _Node) -> None:
        if node is self._root or node.children:
            return
        heapq.heappush(self._leaf_heap, (node.last_access, next(self._tiebreak), node))
        if len(self._leaf_heap) > 4 * self._node_count + 64:
            self._rebuild_leaf_heap()

    def _rebuild_leaf_heap(self) -> None:
        leaves: list[tuple[int, int, _Node]] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append((node.last_access, next(self._tiebreak), node))
        heapq.heapify(leaves)
        self._leaf_heap = leaves

    def _over_budget(self) -> bool:
        return (self.max_tokens is not None and self._token_count > self.max_tokens) or (
            self.max_nodes is not None and self._node_count > self.max_nodes
        )

    def _enforce_budget(self) -> None:
        if self._over_budget():
            self._evict_until(lambda: not self._over_budget())

    def _evict_until(self, done: Any) -> int:
        if self._locked_tokens == self._token_count:
            return 0  # every node is locked: no need to pop every locked leaf to find out
        evicted = 0
        locked: list[tuple[int, int, _Node]] = []
        while not done() and self._leaf_heap:
            entry = heapq.heappop(self._leaf_heap)
            stamp, _, node = entry
            if node.parent is None or node.children:
                continue  # no longer a leaf of the tree
            if node.last_access != stamp:
                # Touched since it was queued: requeue it under its real access time.
                heapq.heappush(self._leaf_heap, (node.last_access, next(self._tiebreak), node))
                continue
            if node.refs > 0:
                locked.append(entry)
                continue
            evicted += len(node.key)
            self._evicted_tokens += len(node.key)
            if self.on_evict is not None:
                path = self._path_to(node)
                self.on_evict(path, len(path) - len(node.key), frozenset(node.owners))
            self._detach(node)
        for entry in locked:
            heapq.heappush(self._leaf_heap, entry)
        return evicted
