"""The topic tree: MQTT and AMQP filters against topic names."""

from __future__ import annotations

import random

import pytest

from core.routing import TopicTree, filter_matches, mqtt_filter_error


def matched(tree: TopicTree[str], topic: str) -> list[str]:
    return sorted(v for _, v in tree.match(topic))


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/broker", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/broker", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
])
def test_mqtt_matching_follows_the_spec_examples(topic_filter, topic, expected):
    assert filter_matches("mqtt", topic_filter, topic) is expected


@pytest.mark.parametrize(("pattern", "key", "expected"), [
    ("stock.#", "stock", True),
    ("stock.#", "stock.usd.nyse", True),
    ("stock.*", "stock.usd.nyse", False),
    ("*.usd.*", "stock.usd.nyse", True),
    ("#.nyse", "nyse", True),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y.c", False),
    ("#", "", True),
    ("*", "", True),
])
def test_amqp_topic_patterns(pattern, key, expected):
    assert filter_matches("amqp", pattern, key) is expected


def test_invalid_mqtt_filters_are_named():
    for bad in ("", "a/#/b", "a#", "a/b+", "+a/b"):
        assert mqtt_filter_error(bad) is not None
    for good in ("#", "+", "a/+/b", "/", "a//b", "$SYS/#"):
        assert mqtt_filter_error(good) is None


def test_removing_prunes_and_a_value_matches_once_per_filter():
    tree: TopicTree[str] = TopicTree.mqtt()
    tree.add("a/+", "s1")
    tree.add("a/#", "s1")
    tree.add("a/+", "s1")  # again: no second copy
    assert len(tree) == 2
    assert sorted(tree.match("a/b")) == [("a/#", "s1"), ("a/+", "s1")]
    assert tree.remove("a/+", "s1") and not tree.remove("a/+", "s1")
    assert tree.remove("a/#", "s1")
    assert len(tree) == 0 and tree._root.children == {}


def test_the_tree_agrees_with_a_brute_force_matcher():
    rng = random.Random(7)
    words = ["a", "b", "c", "$x"]

    def brute(f: list[str], t: list[str]) -> bool:
        if not f:
            return not t
        if f[0] == "#":
            return True
        if not t:
            return False
        return (f[0] == "+" or f[0] == t[0]) and brute(f[1:], t[1:])

    filters = set()
    while len(filters) < 60:
        levels = [rng.choice(words + ["+"]) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            levels.append("#")
        filters.add("/".join(levels))
    tree: TopicTree[str] = TopicTree.mqtt()
    for f in filters:
        tree.add(f, f)
    for _ in range(400):
        topic = [rng.choice(words) for _ in range(rng.randint(1, 4))]
        name = "/".join(topic)
        want = sorted(f for f in filters if brute(f.split("/"), topic)
                      and not (name.startswith("$") and f[0] in "+#"))
        assert matched(tree, name) == want, name
