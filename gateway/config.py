"""Magnetar's configuration, as a protocol plugin sees it: the keys a handler declares,
and the configuration it reads them from.

A protocol handler declares the keys it reads in a class attribute ``config_keys``, a
sequence of :class:`Key` (made with the helpers here, or as a ``Key`` for a custom
check)::

    from gateway.config import int_key, listeners_key

    class EchoProtocolHandler:
        name = "echo"
        config_keys = (
            listeners_key("echoListeners", ("echo://127.0.0.1:7007",),
                          "Echo listener URLs.", "echo"),
            int_key("echoMaxLine", 4096, "Longest line echoed, in bytes.", 1, 65536),
        )

        def __init__(self, config, broker):
            self.max_line = config.get("echoMaxLine")

When ``messagingProtocols`` names the handler (a built-in name, an entry point of the
``magnetar.protocols`` group, or ``module:Class``), its keys are keys like the core
ones: set in the configuration file, by ``PULSAR_PREFIX_<key>`` (or ``<key>`` for a key
present in the file) and by ``-c key=value``; defaulted, parsed and validated with the
same messages (``echoMaxLine: 'x' is not an integer (expected an integer 1-65536)``);
read with ``config.get("echoMaxLine")``; listed in :attr:`Config.keys`.

A key has one owner: a protocol declaring a core key, or a key another loaded protocol
declares, stops the broker at start with an error naming both. A protocol's keys cannot
be dynamic (changed while the broker runs). A key of a protocol that is not loaded is an
unknown key: logged and kept, as a string, in :attr:`Config.unknown`.
"""

from gateway._config import (
    Config,
    ConfigError,
    Key,
    Listener,
    bool_key,
    enum_key,
    float_key,
    int_key,
    listeners_key,
    parse_duration,
    parse_listener,
    port_key,
    str_key,
)

__all__ = [
    "Config",
    "ConfigError",
    "Key",
    "Listener",
    "bool_key",
    "enum_key",
    "float_key",
    "int_key",
    "listeners_key",
    "parse_duration",
    "parse_listener",
    "port_key",
    "str_key",
]
