"""Tests of fairpool.sched.radix: unit cases, LRU and locks, and a model-based check.

The model-based machines compare the tree against a naive reference: for each owner, the
set of every prefix it holds (holding a sequence means holding all its prefixes). Every
answer of the tree (match, match_lengths, owner_tokens, insert/evict/remove_owner return
values) follows from those sets, and after every step the tree's structure is checked
against its invariants by walking its private nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fairpool.sched.errors import ConfigError
from fairpool.sched.radix import LockHandle, Match, RadixTree, TreeStats

pytestmark = pytest.mark.unit

# ---------------------------------------------------------------------------- helpers

# One tree holds one kind of key; the same token ids can be written in each of them.
KINDS: dict[str, Callable[[Sequence[int]], Any]] = {
    "list": list,
    "str": lambda tokens: "".join(chr(ord("a") + t) for t in tokens),
    "bytes": bytes,
}


def all_nodes(tree: RadixTree) -> list[Any]:
    """Every node below the root (private structure, for invariant checks)."""
    nodes = []
    stack = list(tree._root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


def is_attached(tree: RadixTree, node: Any) -> bool:
    while node is not None and node is not tree._root:
        node = node.parent
    return node is tree._root


def path_to(tree: RadixTree, node: Any) -> list[Any]:
    """The nodes from the root's child down to `node` (empty for the root)."""
    path = []
    while node is not tree._root:
        path.append(node)
        node = node.parent
    return path[::-1]


def check_structure(tree: RadixTree, handles: Sequence[LockHandle] = ()) -> None:
    """The structural invariants of the tree, and the lock counts of `handles`."""
    root = tree._root
    assert root.owners == set() and root.refs == 0
    nodes = all_nodes(tree)
    owner_tokens: dict[Hashable, int] = {}
    for node in nodes:
        assert len(node.key) > 0, "empty edge"
        assert node.parent is not None
        assert node.parent.children[node.key[0]] is node, "child not under its first element"
        assert node.owners, "a node without owners was not pruned"
        if node.parent is not root:
            assert node.owners <= node.parent.owners, "child owners not a subset of parent's"
        for owner in node.owners:
            owner_tokens[owner] = owner_tokens.get(owner, 0) + len(node.key)
    stats = tree.stats()
    assert stats.nodes == len(nodes)
    assert stats.tokens == len(tree) == sum(len(node.key) for node in nodes)
    assert tree._owner_tokens == owner_tokens
    assert stats.owners == len(owner_tokens)
    assert tree.owners() == set(owner_tokens)
    # refs(node) = number of outstanding locks whose (still attached) path passes node.
    expected_refs = {id(node): 0 for node in nodes}
    for handle in handles:
        if handle.node is root or not is_attached(tree, handle.node):
            continue
        for node in path_to(tree, handle.node):
            expected_refs[id(node)] += 1
    for node in nodes:
        assert node.refs == expected_refs[id(node)], "lock count drifted"
    assert tree.locked_tokens == sum(len(node.key) for node in nodes if node.refs), "locked"


# ---------------------------------------------------------------------------- basics


@pytest.mark.parametrize("kind", list(KINDS))
def test_insert_and_match(kind: str) -> None:
    k = KINDS[kind]
    tree = RadixTree()
    assert tree.match(k([1, 2])) == Match(0, frozenset())
    assert tree.insert(k([1, 2, 3, 4]), "a") == 4
    assert tree.insert(k([1, 2, 3, 4]), "a") == 0
    assert tree.insert(k([1, 2]), "a") == 0  # a prefix of something held
    assert tree.match(k([1, 2, 3, 4])) == Match(4, frozenset({"a"}))
    assert tree.match(k([1, 2, 3, 4, 5, 6])) == Match(4, frozenset({"a"}))
    assert tree.match(k([1, 2, 3, 9])) == Match(3, frozenset({"a"}))  # ends inside an edge
    assert tree.match(k([1, 2])) == Match(2, frozenset({"a"}))
    assert tree.match(k([2, 1])) == Match(0, frozenset())
    assert tree.match(k([])) == Match(0, frozenset())

    assert tree.insert(k([1, 2, 5]), "b") == 3  # splits [1, 2, 3, 4] after [1, 2]
    assert tree.match(k([1, 2])) == Match(2, frozenset({"a", "b"}))
    assert tree.match(k([1, 2, 5, 5])) == Match(3, frozenset({"b"}))
    assert tree.match(k([1, 2, 3])) == Match(3, frozenset({"a"}))
    assert tree.match(k([1, 7])) == Match(1, frozenset({"a", "b"}))
    assert tree.match_length(k([1, 2, 3, 4])) == 4
    assert tree.match_length(k([1, 2, 3, 4]), "a") == 4
    assert tree.match_length(k([1, 2, 3, 4]), "b") == 2
    assert tree.match_length(k([1, 2, 3, 4]), "nobody") == 0
    assert tree.insert(k([1, 2, 3]), "b") == 1
    assert tree.match(k([1, 2, 3, 4])) == Match(4, frozenset({"a"}))
    assert tree.match(k([1, 2, 3])) == Match(3, frozenset({"a", "b"}))
    assert tree.insert(k([]), "c") == 0
    assert "c" not in tree.owners()
    assert sorted((list(s), o) for s, o in tree.iter_sequences()) == sorted(
        [(list(k([1, 2, 3, 4])), frozenset({"a"})), (list(k([1, 2, 5])), frozenset({"b"}))]
    )
    check_structure(tree)


def test_long_edges_split_at_the_right_place() -> None:
    """Mismatches far into long edges (the bisection in the prefix compare)."""
    base = list(range(1000))
    for at in [0, 1, 15, 16, 17, 31, 32, 33, 100, 511, 512, 513, 998, 999]:
        tree = RadixTree()
        tree.insert(base, "a")
        other = [*base[:at], -1, *base[at + 1 :]]
        assert tree.match(other) == Match(at, frozenset({"a"} if at else ()))
        assert tree.match_lengths(other) == ({"a": at} if at else {})
        assert tree.insert(other, "b") == 1000
        assert tree.match(base[: at + 1]).length == at + 1
        assert tree.match(other).owners == {"b"}
        assert tree.match(base[:at]).owners == ({"a", "b"} if at else frozenset())
        check_structure(tree)
    # A query that ends inside a long edge, at every kind of offset.
    tree = RadixTree()
    tree.insert(base, "a")
    for end in [1, 16, 17, 500, 999]:
        assert tree.match(base[:end]) == Match(end, frozenset({"a"}))


def test_tuples_are_taken_as_token_lists() -> None:
    tree = RadixTree()
    tree.insert((1, 2, 3), "a")
    assert tree.match([1, 2, 3]).length == 3
    assert tree.match((1, 2)).length == 2
    assert tree.match(iter([1, 2, 3])).length == 3


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ([1, 2], "ab"),
        ("ab", [1, 2]),
        ("ab", b"ab"),
        (b"ab", "ab"),
        ([97, 98], b"ab"),
        (b"ab", [97, 98]),
    ],
)
def test_mixing_kinds_raises(first: Any, second: Any) -> None:
    tree = RadixTree()
    tree.insert(first, "a")
    for call in (
        lambda: tree.insert(second, "a"),
        lambda: tree.match(second),
        lambda: tree.match_length(second),
        lambda: tree.match_lengths(second),
        lambda: tree.evict(second, "a"),
        lambda: tree.lock(second),
    ):
        with pytest.raises(ConfigError, match="sequence") as error:
            call()
        assert error.value.parameter == "sequence"
    assert tree.match(first).length == 2  # nothing changed


def test_kind_is_learned_from_the_first_non_empty_insert() -> None:
    tree = RadixTree()
    assert tree.match("abc").length == 0  # a query does not fix the kind
    tree.insert([], "a")  # nor does an empty insert
    tree.insert("abc", "a")
    with pytest.raises(ConfigError, match="sequence"):
        tree.insert([1], "a")


def test_owners_subset_invariant_and_match_lengths() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4, 5, 6], "a")
    tree.insert([1, 2, 3, 7], "b")
    tree.insert([1, 2], "c")
    tree.insert([1, 2, 3, 4, 5, 9], "d")
    tree.insert([8, 8], "a")
    check_structure(tree)
    assert tree.match_lengths([1, 2, 3, 4, 5, 6, 0]) == {"a": 6, "b": 3, "c": 2, "d": 5}
    assert tree.match_lengths([1, 2, 3, 7]) == {"a": 3, "b": 4, "c": 2, "d": 3}
    assert tree.match_lengths([1, 2, 3, 4, 5, 9]) == {"a": 5, "b": 3, "c": 2, "d": 6}
    assert tree.match_lengths([1, 5]) == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert tree.match_lengths([8, 8, 8]) == {"a": 2}
    assert tree.match_lengths([9]) == {}
    assert tree.match_lengths([]) == {}
    for owner, length in tree.match_lengths([1, 2, 3, 4, 5, 6]).items():
        assert tree.match_length([1, 2, 3, 4, 5, 6], owner) == length
    assert tree.match([1, 2, 3, 4, 5, 6]) == Match(6, frozenset({"a"}))
    assert tree.match([1, 2, 3, 4, 5]) == Match(5, frozenset({"a", "d"}))
    assert tree.match([1, 2, 3]) == Match(3, frozenset({"a", "b", "d"}))


# ---------------------------------------------------------------------------- evict


def test_evict_default_keep_drops_the_last_element() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4], "a")
    tree.insert([1, 2, 3, 4], "b")
    assert tree.evict([1, 2, 3, 4], "a") == 1
    assert tree.match_lengths([1, 2, 3, 4]) == {"a": 3, "b": 4}
    assert tree.owner_tokens("a") == 3
    assert tree.evict([1, 2, 3, 4], "a") == 0  # a no longer holds [1, 2, 3, 4]
    assert tree.evict([1, 2, 3], "a") == 1
    assert tree.match_lengths([1, 2, 3, 4]) == {"a": 2, "b": 4}
    check_structure(tree)


def test_evict_block_style_keep_drops_everything_that_extends_the_block() -> None:
    block = 4
    seq = list(range(100, 116))  # four blocks
    tree = RadixTree()
    tree.insert(seq, "a")
    tree.insert(seq[:6], "b")
    tree.insert([*seq[:10], 0, 0], "a")  # forks inside block 2
    # The engine evicts block 2 (tokens 8..11): it reports the sequence up to the block's
    # end and keep = the block's start; the owner keeps seq[:8] and nothing beyond.
    removed = tree.evict(seq[: 3 * block], "a", keep=2 * block)
    assert removed == (16 - 8) + 2  # the rest of seq and the fork's tail [.., 0, 0]
    assert tree.match_lengths(seq) == {"a": 8, "b": 6}
    assert tree.match_lengths([*seq[:10], 0, 0]) == {"a": 8, "b": 6}
    assert tree.owner_tokens("a") == 8
    assert tree.match(seq) == Match(8, frozenset({"a"}))
    # keep = 0 drops the whole path.
    assert tree.evict(seq[:block], "a", keep=0) == 8
    assert "a" not in tree.owners()
    assert tree.match(seq) == Match(6, frozenset({"b"}))
    check_structure(tree)


def test_evict_of_a_sequence_that_leaves_the_tree_is_a_no_op() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4, 5, 6], "a")
    tree.insert([1, 2, 7], "b")
    before = (sorted(map(str, tree.iter_sequences())), tree.stats())
    assert tree.evict([1, 2, 9, 4, 5, 6], "a") == 0  # diverges before keep
    assert tree.evict([1, 2, 9, 4, 5, 6], "a", keep=3) == 0
    assert tree.evict([1, 9], "a", keep=1) == 0  # seq[keep] is not held
    assert tree.evict([5, 6, 7], "a") == 0  # not in the tree at all
    assert tree.evict([1, 2, 7], "a") == 0  # in the tree, but not held by a
    assert tree.evict([1, 2, 3, 4, 5, 6], "nobody", keep=2) == 0
    assert tree.evict([1, 2, 3, 4, 5, 6], "a", keep=6) == 0  # keep out of range
    assert tree.evict([1, 2, 3, 4, 5, 6], "a", keep=-1) == 0
    assert tree.evict([], "a") == 0
    assert tree.evict([1, 2, 3, 4, 5, 6], "b", keep=3) == 0  # b holds only [1, 2] here
    assert (sorted(map(str, tree.iter_sequences())), tree.stats()) == before
    assert tree.match_lengths([1, 2, 3, 4, 5, 6]) == {"a": 6, "b": 2}
    check_structure(tree)


def test_remove_owner() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4], "a")
    tree.insert([1, 2, 5], "b")
    tree.insert([6, 6], "a")
    assert tree.remove_owner("a") == 6
    assert tree.owners() == {"b"}
    assert tree.owner_tokens("a") == 0
    assert tree.match([1, 2, 3, 4]) == Match(2, frozenset({"b"}))
    assert tree.match([6, 6]) == Match(0, frozenset())
    assert tree.stats() == TreeStats(nodes=2, tokens=3, owners=1, evicted_tokens=0)
    assert tree.remove_owner("a") == 0
    assert tree.remove_owner("b") == 3
    assert tree.stats() == TreeStats(nodes=0, tokens=0, owners=0, evicted_tokens=0)
    check_structure(tree)


def test_owner_tokens_accounting() -> None:
    tree = RadixTree()
    tree.insert("hello world", "a")
    tree.insert("hello there", "b")
    tree.insert("help", "a")
    assert tree.owner_tokens("a") == len("hello world") + len("p")
    assert tree.owner_tokens("b") == len("hello there")
    assert len(tree) == len("hello world") + len("there") + len("p")
    tree.insert("hello there", "a")
    assert tree.owner_tokens("a") == len("hello world") + len("p") + len("there")
    assert tree.evict("hello world", "a", keep=6) == len("world")
    assert tree.owner_tokens("a") == len("hello there") + len("p")
    assert tree.owner_tokens("nobody") == 0
    check_structure(tree)


# ---------------------------------------------------------------------------- LRU, locks


def test_lru_under_max_tokens_evicts_the_least_recently_used() -> None:
    tree = RadixTree(max_tokens=12)
    a, b, c, d = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3], [4, 4, 4, 4]
    tree.insert(a, "w")
    tree.insert(b, "w")
    tree.insert(c, "w")
    assert tree.match(a).length == 4  # a is now more recently used than b and c
    tree.insert(d, "w")
    assert tree.match_length(b) == 0  # b: inserted after a, but not used since
    assert [tree.match_length(s) for s in (a, c, d)] == [4, 4, 4]
    assert tree.stats().evicted_tokens == 4
    assert len(tree) == 12
    check_structure(tree)


def test_lru_evicts_leaves_first_and_a_partial_match_is_a_use() -> None:
    tree = RadixTree(max_tokens=9)
    tree.insert([1, 2, 3, 4, 5], "w")  # node [1, 2, 3, 4, 5]
    tree.insert([1, 2, 3, 9, 9], "w")  # split: [1, 2, 3] -> [4, 5] and [9, 9]
    tree.insert([7, 7], "w")
    assert len(tree) == 9
    assert tree.match([1, 2, 3, 4, 0]).length == 4  # uses [1, 2, 3] and leaf [4, 5]
    tree.insert([8], "w")  # one over: the oldest leaf is [9, 9]
    assert tree.match_length([1, 2, 3, 9, 9]) == 3
    assert tree.match_length([1, 2, 3, 4, 5]) == 5
    assert tree.match_length([7, 7]) == 2
    check_structure(tree)


def test_lru_under_max_nodes() -> None:
    tree = RadixTree(max_nodes=3)
    for first in (1, 2, 3):
        tree.insert([first, 0], "w")
    tree.match([1, 0])
    tree.match([2])
    tree.insert([4, 0], "w")  # [3, 0] is least recently used
    assert [tree.match_length([x, 0]) for x in (1, 2, 3, 4)] == [2, 2, 0, 2]
    assert tree.stats().nodes == 3
    tree.insert([1, 0, 5], "w")  # a new leaf under [1, 0]: evicts [2, 0]
    assert [tree.match_length([x, 0]) for x in (1, 2, 3, 4)] == [2, 0, 0, 2]
    assert tree.match_length([1, 0, 5]) == 3
    check_structure(tree)


def test_evicting_a_leaf_exposes_its_parent_for_eviction() -> None:
    tree = RadixTree(max_tokens=6)
    tree.insert([1, 2, 3], "w")
    tree.insert([1, 2, 4], "w")  # nodes [1, 2] -> [3], [4]
    tree.insert([5, 5], "w")
    assert len(tree) == 6
    tree.insert([6, 6, 6, 6], "w")  # needs 4 tokens: [3], [4], then [1, 2]
    assert tree.match_length([1, 2, 3]) == 0
    assert tree.match_length([5, 5]) == 2
    assert tree.match_length([6, 6, 6, 6]) == 4
    assert tree.stats().evicted_tokens == 4
    check_structure(tree)


def test_evict_lru() -> None:
    tree = RadixTree()
    tree.insert([1, 1, 1], "w")
    tree.insert([2, 2, 2], "w")
    tree.insert([3, 3, 3], "w")
    assert tree.evict_lru(4) == 6
    assert [tree.match_length([x] * 3) for x in (1, 2, 3)] == [0, 0, 3]
    assert tree.evict_lru(100) == 3
    assert tree.evict_lru(1) == 0
    check_structure(tree)


def test_locked_prefixes_are_not_evicted_until_unlocked() -> None:
    tree = RadixTree(max_tokens=8)
    a, b, c = [1] * 4, [2] * 4, [3] * 4
    tree.insert(a, "w")
    handle = tree.lock(a)
    assert handle.length == 4
    tree.insert(b, "w")
    tree.match(b)
    tree.insert(c, "w")  # a is least recently used but locked: b goes
    assert [tree.match_length(s) for s in (a, b, c)] == [4, 0, 4]
    tree.match(a)
    tree.insert(b, "w")  # c goes
    assert [tree.match_length(s) for s in (a, b, c)] == [4, 4, 0]
    check_structure(tree, [handle])
    tree.unlock(handle)
    check_structure(tree)
    tree.insert(c, "w")  # now a (the least recently used) can go
    assert [tree.match_length(s) for s in (a, b, c)] == [0, 4, 4]


def test_unlock_enforces_the_budget_the_lock_held_up() -> None:
    tree = RadixTree(max_nodes=1)
    tree.insert([1, 2, 3, 4], "a")
    handle = tree.lock([1, 2, 3, 4])
    tree.insert([1, 2], "b")  # a split: two nodes, both locked
    assert tree.stats().nodes == 2
    tree.unlock(handle)
    assert tree.stats().nodes == 1
    assert tree.match_lengths([1, 2, 3, 4]) == {"a": 2, "b": 2}


def test_two_locks_on_one_path() -> None:
    tree = RadixTree(max_tokens=4)
    tree.insert([1, 1, 1, 1], "w")
    handle = tree.lock([1, 1, 1, 1])
    tree.insert([2, 2, 2, 2], "w")  # over budget; only the new leaf is unlocked
    assert tree.match_length([1, 1, 1, 1]) == 4
    assert tree.match_length([2, 2, 2, 2]) == 0
    handle2 = tree.lock([1, 1, 1, 1])
    tree.insert([3, 3], "w")
    assert len(tree) == 4  # [3, 3] evicted right away
    tree.unlock(handle)
    assert tree.match_length([1, 1, 1, 1]) == 4  # still locked by handle2
    tree.unlock(handle2)
    assert tree.match_length([1, 1, 1, 1]) == 4  # within budget: nothing to evict
    tree.insert([3, 3], "w")
    assert tree.match_length([1, 1, 1, 1]) == 0
    assert tree.match_length([3, 3]) == 2


def test_lock_of_a_partial_prefix_splits_and_protects_only_that_prefix() -> None:
    tree = RadixTree(max_tokens=8)
    tree.insert([1, 2, 3, 4, 5, 6], "w")
    handle = tree.lock([1, 2, 3, 9])  # holds [1, 2, 3]
    assert handle.length == 3
    check_structure(tree, [handle])
    tree.insert([7, 7, 7, 7, 7], "w")  # 11 tokens: the unlocked tail [4, 5, 6] goes
    assert tree.match_length([1, 2, 3, 4, 5, 6]) == 3
    assert tree.match_length([7] * 5) == 5
    check_structure(tree, [handle])
    tree.unlock(handle)
    tree.insert([8], "w")
    assert tree.match_length([1, 2, 3]) == 0


def test_unlock_twice_raises() -> None:
    tree = RadixTree()
    tree.insert([1, 2], "w")
    handle = tree.lock([1, 2])
    tree.unlock(handle)
    with pytest.raises(ConfigError, match="handle"):
        tree.unlock(handle)


def test_lock_of_nothing_is_harmless() -> None:
    tree = RadixTree(max_tokens=2)
    handle = tree.lock([1, 2])
    assert handle.length == 0
    tree.unlock(handle)
    tree.insert([1, 2, 3], "w")
    assert len(tree) == 0


@pytest.mark.parametrize("drop", ["remove_owner", "evict"])
def test_a_lock_on_a_path_an_owner_drops_does_not_pin_the_rest(drop: str) -> None:
    """Regression: dropping a locked subtree leaked its lock counts on the ancestors."""
    tree = RadixTree(max_tokens=8)
    tree.insert([1, 2], "b")
    tree.insert([1, 2, 3, 4], "a")
    handle = tree.lock([1, 2, 3, 4])
    if drop == "remove_owner":
        assert tree.remove_owner("a") == 4
    else:
        assert tree.evict([1, 2, 3, 4], "a", keep=2) == 2
    check_structure(tree, [handle])
    tree.unlock(handle)
    check_structure(tree)
    tree.insert([7, 7, 7, 7, 7, 7, 7], "c")  # [1, 2] is the LRU leaf and unlocked now
    assert tree.match_length([1, 2]) == 0
    assert tree.match_length([7] * 7) == 7


def test_stats() -> None:
    tree = RadixTree(max_tokens=10)
    assert tree.stats() == TreeStats(nodes=0, tokens=0, owners=0, evicted_tokens=0)
    tree.insert([1, 2, 3], "a")
    tree.insert([1, 2, 4], "b")
    assert tree.stats() == TreeStats(nodes=3, tokens=4, owners=2, evicted_tokens=0)
    tree.insert([5] * 8, "c")  # 12 tokens: the leaves [3] and [4] go
    assert tree.stats() == TreeStats(nodes=2, tokens=10, owners=3, evicted_tokens=2)
    tree.insert([6], "c")  # then [1, 2], the least recently used leaf now
    assert tree.stats() == TreeStats(nodes=2, tokens=9, owners=1, evicted_tokens=4)
    assert tree.owners() == {"c"}


@pytest.mark.parametrize("parameter", ["max_tokens", "max_nodes"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10"])
def test_bad_constructor_arguments(parameter: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=parameter) as error:
        RadixTree(**{parameter: value})
    assert error.value.parameter == parameter


def test_good_constructor_arguments() -> None:
    tree = RadixTree(max_tokens=1, max_nodes=1)
    assert (tree.max_tokens, tree.max_nodes) == (1, 1)
    assert RadixTree().max_tokens is None


# ---------------------------------------------------------------------------- model-based

# Short sequences over a 3-letter alphabet, and long ones glued from chunks that diverge
# deep inside each other, so that splits and matches go through the prefix compare's
# bisection (which only starts past its 16-element probe).
CHUNKS = [
    (0,) * 20,
    (0,) * 19 + (1,),
    (1, 2) * 17,
    (1, 2) * 16 + (0, 0),
    (2,) * 40,
    (2,) * 37 + (1,),
    (0,),
    (1,),
    (2,),
]
TOKENS = st.one_of(
    st.lists(st.integers(0, 2), max_size=9).map(tuple),
    st.lists(st.sampled_from(CHUNKS), max_size=4).map(lambda chunks: sum(chunks, ())),
)
OWNERS = st.sampled_from(["w0", "w1", "w2"])
KEEPS = st.one_of(st.none(), st.integers(-1, 10), st.integers(-1, 170))


class ReferenceModel:
    """owner -> every non-empty prefix it holds, as tuples of token ids."""

    def __init__(self) -> None:
        self.held: dict[str, set[tuple[int, ...]]] = {}

    def insert(self, seq: tuple[int, ...], owner: str) -> int:
        prefixes = {seq[:i] for i in range(1, len(seq) + 1)}
        held = self.held.setdefault(owner, set())
        added = len(prefixes - held)
        held |= prefixes
        if not held:
            del self.held[owner]
        return added

    def evict(self, seq: tuple[int, ...], owner: str, keep: int | None) -> int:
        keep = len(seq) - 1 if keep is None else keep
        if not 0 <= keep < len(seq) or owner not in self.held:
            return 0
        block = seq[: keep + 1]
        gone = {p for p in self.held[owner] if p[: keep + 1] == block}
        self.held[owner] -= gone
        if not self.held[owner]:
            del self.held[owner]
        return len(gone)

    def remove_owner(self, owner: str) -> int:
        return len(self.held.pop(owner, set()))

    def lengths(self, seq: tuple[int, ...]) -> dict[str, int]:
        result = {}
        for owner, held in self.held.items():
            length = max((i for i in range(1, len(seq) + 1) if seq[:i] in held), default=0)
            if length:
                result[owner] = length
        return result

    def match(self, seq: tuple[int, ...]) -> Match:
        lengths = self.lengths(seq)
        length = max(lengths.values(), default=0)
        return Match(length, frozenset(o for o, n in lengths.items() if n == length and n))

    def sequences(self) -> set[tuple[int, ...]]:
        return set().union(*self.held.values()) if self.held else set()


class RadixAgainstModel(RuleBasedStateMachine):
    """An unbounded tree against `ReferenceModel`, with locks checked structurally."""

    kind = "list"

    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree()
        self.model = ReferenceModel()
        self.handles: list[LockHandle] = []
        self.make = KINDS[self.kind]

    @rule(seq=TOKENS, owner=OWNERS)
    def insert(self, seq: tuple[int, ...], owner: str) -> None:
        assert self.tree.insert(self.make(seq), owner) == self.model.insert(seq, owner)

    @rule(seq=TOKENS)
    def match(self, seq: tuple[int, ...]) -> None:
        assert self.tree.match(self.make(seq)) == self.model.match(seq)

    @rule(seq=TOKENS, owner=st.one_of(st.none(), OWNERS))
    def match_length(self, seq: tuple[int, ...], owner: str | None) -> None:
        lengths = self.model.lengths(seq)
        expected = max(lengths.values(), default=0) if owner is None else lengths.get(owner, 0)
        assert self.tree.match_length(self.make(seq), owner) == expected

    @rule(seq=TOKENS)
    def match_lengths(self, seq: tuple[int, ...]) -> None:
        assert self.tree.match_lengths(self.make(seq)) == self.model.lengths(seq)

    @rule(seq=TOKENS, owner=OWNERS, keep=KEEPS)
    def evict(self, seq: tuple[int, ...], owner: str, keep: int | None) -> None:
        expected = self.model.evict(seq, owner, keep)
        assert self.tree.evict(self.make(seq), owner, keep) == expected

    @rule(owner=OWNERS)
    def remove_owner(self, owner: str) -> None:
        assert self.tree.remove_owner(owner) == self.model.remove_owner(owner)

    @rule(seq=TOKENS)
    def lock(self, seq: tuple[int, ...]) -> None:
        handle = self.tree.lock(self.make(seq))
        assert handle.length == self.model.match(seq).length
        self.handles.append(handle)

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 50))
    def unlock(self, index: int) -> None:
        self.tree.unlock(self.handles.pop(index % len(self.handles)))

    @invariant()
    def structure_and_accounting(self) -> None:
        check_structure(self.tree, self.handles)
        for owner in ("w0", "w1", "w2"):
            held = self.model.held.get(owner, set())
            assert self.tree.owner_tokens(owner) == len(held)
        assert self.tree.owners() == set(self.model.held)
        # The tree stores exactly the union of everything held, one element per prefix.
        assert len(self.tree) == len(self.model.sequences())
        leaves = {tuple(self.make_tokens(s)) for s, _ in self.tree.iter_sequences()}
        stored = self.model.sequences()
        assert leaves == {s for s in stored if not any(t[: len(s)] == s and t != s for t in stored)}

    def make_tokens(self, key: Any) -> list[int]:
        if isinstance(key, str):
            return [ord(c) - ord("a") for c in key]
        return list(key)


class RadixAgainstModelStr(RadixAgainstModel):
    kind = "str"


class RadixAgainstModelBytes(RadixAgainstModel):
    kind = "bytes"


TestRadixAgainstModel = RadixAgainstModel.TestCase
TestRadixAgainstModelStr = RadixAgainstModelStr.TestCase
TestRadixAgainstModelBytes = RadixAgainstModelBytes.TestCase


class BoundedRadix(RuleBasedStateMachine):
    """A tree under a small budget: it stays within budget unless locks prevent it, never
    claims more than an owner was given, and never loses a locked prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.model = ReferenceModel()
        self.handles: list[tuple[LockHandle, tuple[int, ...]]] = []
        self.tree = RadixTree()

    @initialize(max_tokens=st.one_of(st.none(), st.integers(1, 12)), max_nodes=st.integers(1, 6))
    def setup(self, max_tokens: int | None, max_nodes: int) -> None:
        self.tree = RadixTree(max_tokens=max_tokens, max_nodes=max_nodes)

    @rule(seq=TOKENS, owner=OWNERS)
    def insert(self, seq: tuple[int, ...], owner: str) -> None:
        self.model.insert(seq, owner)
        self.tree.insert(list(seq), owner)

    @rule(seq=TOKENS)
    def match(self, seq: tuple[int, ...]) -> None:
        found = self.tree.match(list(seq))
        lengths = self.model.lengths(seq)
        for owner in found.owners:
            assert lengths.get(owner, 0) >= found.length
        for owner, length in self.tree.match_lengths(list(seq)).items():
            assert 0 < length <= lengths.get(owner, 0)

    @rule(seq=TOKENS)
    def lock(self, seq: tuple[int, ...]) -> None:
        self.handles.append((self.tree.lock(list(seq)), seq))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 50))
    def unlock(self, index: int) -> None:
        handle, _ = self.handles.pop(index % len(self.handles))
        self.tree.unlock(handle)

    @rule(tokens=st.integers(0, 12))
    def evict_lru(self, tokens: int) -> None:
        before = len(self.tree)
        evicted = self.tree.evict_lru(tokens)
        assert len(self.tree) == before - evicted

    @invariant()
    def bounded(self) -> None:
        check_structure(self.tree, [handle for handle, _ in self.handles])
        for handle, seq in self.handles:
            assert self.tree.match_length(list(seq)) >= handle.length
        locked = any(handle.length for handle, _ in self.handles)
        if not locked:
            stats = self.tree.stats()
            assert self.tree.max_nodes is None or stats.nodes <= self.tree.max_nodes
            assert self.tree.max_tokens is None or stats.tokens <= self.tree.max_tokens
        for owner in ("w0", "w1", "w2"):
            assert self.tree.owner_tokens(owner) <= len(self.model.held.get(owner, set()))


TestBoundedRadix = BoundedRadix.TestCase
