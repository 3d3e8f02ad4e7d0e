"""The Kafka protocol's configuration keys (``KafkaProtocolHandler.config_keys``).

Kept apart from the handler, and importing nothing of it, so that a configuration is
read without loading the protocol. Where Kafka's broker has a key, it has Kafka's name
(``group.min.session.timeout.ms``); Kafka's default unless the doc says otherwise.
"""

from __future__ import annotations

from gateway.config import Key, int_key, listeners_key, str_key

__all__ = ["CONFIG_KEYS"]

CONFIG_KEYS: tuple[Key, ...] = (
    listeners_key("kafkaListeners", ("PLAINTEXT://127.0.0.1:9092",),
                  "Kafka listener URLs: PLAINTEXT://host:port, or SASL_PLAINTEXT://host:port "
                  "(with authenticationEnabled every Kafka listener requires SASL/PLAIN with "
                  "the password token:<jwt>, whichever its scheme)."),
    listeners_key("kafkaAdvertisedListeners", (),
                  "Kafka listener URLs given to clients in metadata; empty means the bound "
                  "listener."),
    str_key("kafkaTenant", "public", "Tenant that Kafka topics live in."),
    str_key("kafkaNamespace", "default", "Namespace that Kafka topics live in."),
    int_key("max.request.partition.size.limit", 2000,
            "Most partitions one Kafka DescribeTopicPartitions answer lists (Kafka's default "
            "2000).", 1),
    int_key("max.incremental.fetch.session.cache.slots", 1000,
            "Kafka incremental fetch sessions (KIP-227) kept at once; 0 disables them.", 0),
    int_key("min.incremental.fetch.session.eviction.ms", 120000,
            "Idle time after which a Kafka fetch session may be evicted for a new one.", 0),
    int_key("group.min.session.timeout.ms", 6000,
            "Shortest session timeout a Kafka consumer group member may ask for; a JoinGroup "
            "asking less is INVALID_SESSION_TIMEOUT.", 0),
    int_key("group.max.session.timeout.ms", 1800000,
            "Longest session timeout a Kafka consumer group member may ask for; a JoinGroup "
            "asking more is INVALID_SESSION_TIMEOUT.", 0),
    int_key("group.initial.rebalance.delay.ms", 0,
            "How long the first rebalance of an empty Kafka consumer group waits for more "
            "members to join (each new one restarts the wait, up to the rebalance timeout), "
            "so that a group starting up is assigned once rather than once per member. 0 "
            "answers at once; Kafka's broker default, which conf/broker.conf sets, is 3000.", 0),
    int_key("offsets.retention.minutes", 10080,
            "Minutes a Kafka group's committed offsets are kept: from when it became empty "
            "(a consumer group), or from each commit (a group that only stores offsets).", 1),
    int_key("offsets.retention.check.interval.ms", 600000,
            "How often Kafka groups' committed offsets are checked for expiry.", 1),
    int_key("log.retention.hours", 168,
            "Retention, in hours, that a topic a Kafka client creates (CreateTopics without "
            "retention.ms, or auto-creation) gets as its own retention.ms, as Kafka gives "
            "every topic; negative: none of its own, the namespace's applies.", -(1 << 31)),
    int_key("connections.max.idle.ms", 600000,
            "Milliseconds after which a Kafka connection with nothing received and no request "
            "open is closed; -1 never closes it.", -1),
)
