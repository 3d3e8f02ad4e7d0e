"""Magnetar's broker domain: names, policies, metadata, topics, subscriptions.

Handlers talk to :class:`core.broker.BrokerService`; storage lives in the native core
(:mod:`core._native`).
"""
