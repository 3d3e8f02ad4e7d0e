"""Topic filters matched through a tree, for every protocol that routes by pattern.

A filter is a topic name whose levels may be wildcards: MQTT's ``a/+/c`` and ``a/#``
(levels split on ``/``, ``+`` one level, ``#`` any number of levels, itself included, at
the end only), and AMQP's topic exchange patterns ``a.*.c`` and ``a.#`` (levels split on
``.``, ``*`` exactly one word, ``#`` zero or more words, anywhere). :class:`TopicTree`
holds many filters, each with the values subscribed under it, and answers which of them
match a topic by walking the topic's levels once: a publish costs the depth of the topic
times the branching of wildcards on the way, never a scan of every filter.

MQTT's ``$`` rule (MQTT-4.7.2-1): a filter that starts with a wildcard does not match a
topic whose first level starts with ``$`` (``#`` does not match ``$SYS/uptime``).

>>> tree = TopicTree.mqtt()
>>> tree.add("sensors/+/temp", "s1"); tree.add("sensors/#", "s2"); tree.add("#", "s3")
>>> sorted(v for _, v in tree.match("sensors/kitchen/temp"))
['s1', 's2', 's3']
>>> sorted(v for _, v in tree.match("$SYS/uptime"))
[]
>>> amqp = TopicTree.amqp()
>>> amqp.add("stock.#.nyse", "q1"); amqp.add("stock.*", "q2")
>>> sorted(v for _, v in amqp.match("stock.ibm.nyse")), sorted(v for _, v in amqp.match("stock.nyse"))
(['q1'], ['q1', 'q2'])
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["TopicTree", "FilterError", "mqtt_filter_error", "filter_matches"]

V = TypeVar("V", bound=Hashable)


class FilterError(ValueError):
    """A filter that breaks its protocol's wildcard rules."""


def mqtt_filter_error(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid MQTT topic filter (MQTT-4.7.1-1..3), or None."""
    if not topic_filter:
        return "a topic filter is at least one character long"
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return "'#' must be a whole level, and the last one"
        if "+" in level and level != "+":
            return "'+' must be a whole level"
    return None


_NO_VALUES: frozenset[Any] = frozenset()


@dataclass(slots=True)
class _Node(Generic[V]):
    children: dict[str, _Node[V]] = field(default_factory=dict)
    #: the values subscribed with a filter that ends here (a set of its own once it has
    #: one: the inner levels of a session's filters hold none)
    values: set[V] | frozenset[V] = _NO_VALUES
    #: the filter that ends here (to hand back with its values)
    filter: str = ""


class TopicTree(Generic[V]):
    """Filters and the values subscribed under them, matched against topic names."""

    def __init__(self, separator: str, one: str, many: str, *, many_matches_none: bool,
                 dollar_rule: bool):
        self.separator = separator
        self.one = one
        self.many = many
        # MQTT's "a/#" matches "a" (the parent level); AMQP's "#" matches zero words
        # anywhere. Both match zero levels; the flag says "#" may also sit mid-pattern.
        self.many_matches_none = many_matches_none
        self.dollar_rule = dollar_rule
        self._root: _Node[V] = _Node()
        self._count = 0

    @classmethod
    def mqtt(cls) -> TopicTree[V]:
        return cls("/", "+", "#", many_matches_none=True, dollar_rule=True)

    @classmethod
    def amqp(cls) -> TopicTree[V]:
        return cls(".", "*", "#", many_matches_none=True, dollar_rule=False)

    def __len__(self) -> int:
        return self._count

    def add(self, topic_filter: str, value: V) -> None:
        node = self._root
        for level in topic_filter.split(self.separator):
            node = node.children.setdefault(level, _Node())
        node.filter = topic_filter
        values = node.values
        if value not in values:
            if not isinstance(values, set):
                values = node.values = set()
            values.add(value)
            self._count += 1

    def remove(self, topic_filter: str, value: V) -> bool:
        """Forget ``value`` under ``topic_filter``; whether it was there. Branches left
        empty are pruned, so the tree's size follows what is subscribed."""
        path = [self._root]
        levels = topic_filter.split(self.separator)
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return False
            path.append(child)
        values = path[-1].values
        if value not in values or not isinstance(values, set):
            return False
        values.discard(value)
        self._count -= 1
        for level, i in zip(reversed(levels), range(len(levels), 0, -1), strict=True):
            node = path[i]
            if node.values or node.children:
                break
            del path[i - 1].children[level]
        return True

    def match(self, topic: str) -> Iterator[tuple[str, V]]:
        """Every (filter, value) whose filter matches ``topic``; a value subscribed under
        several matching filters comes once per filter."""
        levels = topic.split(self.separator)
        dollar = self.dollar_rule and topic.startswith("$")
        seen: set[int] = set()
        for node in self._walk(self._root, levels, 0, dollar):
            if id(node) in seen:
                continue  # AMQP's '#' can reach one node along several paths
            seen.add(id(node))
            for value in node.values:
                yield node.filter, value

    def _walk(self, node: _Node[V], levels: list[str], i: int, dollar: bool) -> Iterator[_Node[V]]:
        children = node.children
        if i == len(levels):
            yield node
            many = children.get(self.many)
            if many is not None and self.many_matches_none:
                yield from self._walk(many, levels, i, False)
            return
        first = i == 0 and dollar
        exact = children.get(levels[i])
        if exact is not None:
            yield from self._walk(exact, levels, i + 1, False)
        if first:
            return
        one = children.get(self.one)
        if one is not None:
            yield from self._walk(one, levels, i + 1, False)
        many = children.get(self.many)
        if many is not None:
            # '#' takes zero or more of the remaining levels
            for j in range(i, len(levels) + 1):
                yield from self._walk(many, levels, j, False)


def filter_matches(tree_kind: str, topic_filter: str, topic: str) -> bool:
    """Whether one filter matches one topic (``tree_kind`` "mqtt" or "amqp")."""
    tree: TopicTree[int] = TopicTree.mqtt() if tree_kind == "mqtt" else TopicTree.amqp()
    tree.add(topic_filter, 0)
    return any(True for _ in tree.match(topic))
