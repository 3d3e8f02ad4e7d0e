"""The configuration a running broker reads: the static one, plus Pulsar's dynamic keys.

Theory of operation
-------------------
A broker is started with a :class:`~gateway._config.Config`, which never changes. Some
keys (those declared ``dynamic`` in :data:`~gateway._config.KEYS`) may be changed while
the broker runs, the way ``pulsar-admin brokers update-dynamic-config`` changes them on a
Pulsar broker. A key is declared dynamic only where every place that reads it reads it
when it is used (a limit checked at each subscribe, a rate at each dispatch), so that a
change is honoured without a restart.

:class:`RuntimeConfig` is the one object the broker, its protocol handlers and its admin
API all hold and read through ``get``: a dynamic value set at runtime wins over the
process's own fixed values (a one-bookie standalone's quorums), which win over the
static configuration.

Dynamic values are kept where Pulsar keeps them, in the metadata store at
:data:`DYNAMIC_CONFIG_PATH`, as one JSON object of key -> value string, and applied again
when the broker starts: a stored value that is no longer valid (the key is unknown or no
longer dynamic, or its value does not parse) is logged and ignored, never fatal. A write
is a compare-and-set on the entry's version, so two concurrent updates of different keys
both land. The entry is not watched (a watch on the standalone's SQLite store is a polling
thread, and an idle broker must not wake): a change takes effect on the broker whose admin
API made it, and on any other broker when it next starts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from core.metadata import AlreadyExistsError, BadVersionError, MetadataStore, NotFoundError
from gateway._config import KEYS, Config, ConfigError, Key

__all__ = [
    "DYNAMIC_CONFIG_PATH",
    "NotDynamicError",
    "RuntimeConfig",
    "as_text",
    "dynamic_names",
]

log = logging.getLogger(__name__)

#: Where dynamic values live in the metadata store (Pulsar's
#: ``DynamicConfigurationResources.BROKER_SERVICE_CONFIGURATION_PATH``).
DYNAMIC_CONFIG_PATH = "/admin/configuration"


class NotDynamicError(ConfigError):
    """A key that cannot be changed while the broker runs: not dynamic, or not a key."""


def dynamic_names() -> list[str]:
    """The keys that may be changed at runtime, in table order."""
    return [key.name for key in KEYS.values() if key.dynamic]


def _dynamic_key(name: str) -> Key:
    """The dynamic key ``name``; :class:`NotDynamicError` for any other name."""
    key = KEYS.get(name)
    if key is None or not key.dynamic:
        raise NotDynamicError(f"{name} is not a dynamic configuration key")
    return key


def _dynamic_value(name: str, raw: str) -> Any:
    """``raw`` parsed as the value of the dynamic key ``name``; :class:`NotDynamicError`
    for a key that is not dynamic, :class:`ConfigError` for a value that is not valid."""
    return _dynamic_key(name).parse(raw.strip())


def as_text(value: Any) -> str:
    """A value the way the runtime configuration shows it: as the configuration file
    would spell it (``true``, ``Exclusive,Shared``), so it can be given back as is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return "" if value is None else str(value)


class RuntimeConfig:
    """The broker's configuration while it runs (see the module docs): ``get`` and
    attribute access by Pulsar key name, like :class:`~gateway._config.Config`."""

    def __init__(self, base: Config, fixed: Mapping[str, Any] | None = None):
        self._base = base
        self._fixed = dict(fixed or {})
        self._dynamic: dict[str, Any] = {}
        # what get answers for every known key: the static values, the fixed ones over
        # them and the dynamic ones over those, kept in step by _set_dynamic (the static
        # configuration never changes), so that a get, made on the publish and dispatch
        # paths, is one lookup and no further call
        self._view: dict[str, Any] = {}
        self._set_dynamic({})
        self._store: MetadataStore | None = None

    # -- reading ----------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        view = self._view
        if key in view:
            return view[key]
        return self._base.get(key, default)  # an unknown key's raw value, or default

    def __getattr__(self, name: str) -> Any:
        if name in KEYS:
            return self.get(name)
        return getattr(self._base, name)

    def __getitem__(self, key: str) -> Any:
        if key not in KEYS:
            raise KeyError(key)
        return self.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._base

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def is_set(self, key: str) -> bool:
        """Whether ``key`` was set by the operator: in the configuration, or at runtime."""
        return key in self._dynamic or self._base.is_set(key)

    def as_dict(self) -> dict[str, Any]:
        """Every known key's current value, dynamic values included."""
        return dict(self._view)

    # -- dynamic values ---------------------------------------------------------------------

    def attach(self, store: MetadataStore) -> None:
        """Apply the dynamic values stored in ``store``, and from now on keep them there."""
        self._store = store
        applied: dict[str, Any] = {}
        for name, raw in self.stored().items():
            try:
                applied[name] = _dynamic_value(name, raw)
            except ConfigError as exc:
                log.warning("ignoring the stored dynamic configuration %s=%r: %s", name, raw, exc)
        self._set_dynamic(applied)

    def stored(self) -> dict[str, str]:
        """The dynamic values stored, as given (Pulsar's ``configuration/values``)."""
        return self._read()[0]

    def update(self, name: str, raw: str) -> None:
        """Set the dynamic key ``name`` to ``raw``, stored and in effect at once. Raises
        :class:`NotDynamicError` or :class:`ConfigError` (the value does not parse)."""
        value = _dynamic_value(name, raw)
        self._change(lambda values: values.__setitem__(name, raw))
        self._set_dynamic({**self._dynamic, name: value})
        log.info("dynamic configuration %s set to %r", name, raw)

    def delete(self, name: str) -> None:
        """Take ``name`` back to its static value. Raises :class:`NotDynamicError`."""
        _dynamic_key(name)
        self._change(lambda values: values.pop(name, None))
        self._set_dynamic({k: v for k, v in self._dynamic.items() if k != name})
        log.info("dynamic configuration %s deleted: back to %r", name, self.get(name))

    def _set_dynamic(self, values: dict[str, Any]) -> None:
        self._dynamic = values
        self._view = {**self._base.as_dict(), **self._fixed, **values}

    def _read(self) -> tuple[dict[str, str], int | None]:
        """The stored values and the entry's version (None when there is no entry)."""
        if self._store is None:
            return {}, None
        found = self._store.get(DYNAMIC_CONFIG_PATH)
        if found is None:
            return {}, None
        data, version = found
        try:
            values = json.loads(data)
        except ValueError:
            values = None
        if not isinstance(values, dict):
            log.warning("ignoring the dynamic configuration stored at %s: not a JSON object",
                        DYNAMIC_CONFIG_PATH)
            return {}, version
        return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}, version

    def _change(self, edit: Callable[[dict[str, str]], object]) -> None:
        if self._store is None:
            raise RuntimeError("the runtime configuration has no metadata store")
        while True:
            stored, version = self._read()
            values = dict(stored)
            edit(values)
            if values == stored:
                return  # nothing to write (deleting a key never set)
            data = json.dumps(values, sort_keys=True).encode()
            try:
                self._store.put(DYNAMIC_CONFIG_PATH, data, -1 if version is None else version)
                return
            except (AlreadyExistsError, BadVersionError, NotFoundError):
                continue  # written meanwhile: edit what is there now
