"""Redis plumbing without a server: URLs, the key layout and its hash tags, durability rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis import exceptions as rexc
from redis.crc import key_slot

from fencing.errors import BackendUnavailableError, InvalidArgumentError
from serving import redis_db, urls
from serving.redis_db import (
    ResourceKeys,
    escape_tag,
    judge_durability,
    judge_eviction,
    parse_url,
    unescape_tag,
)

RESOURCES = st.text(
    alphabet=st.sampled_from("ab{}%7BD:*?[]\\ é"), min_size=1, max_size=12
) | st.text(min_size=1, max_size=40)


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes: between the first '{' and the next '}'."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if start < 0 or end < 0 or end == start + 1:
        return None
    return key[start + 1 : end]


@given(RESOURCES)
def test_every_key_of_a_resource_hashes_exactly_its_escaped_name(resource: str) -> None:
    keys = ResourceKeys("fencing", resource)
    tag = escape_tag(resource)
    assert "{" not in tag and "}" not in tag
    assert unescape_tag(tag) == resource
    for key in (keys.lease, keys.counter, keys.fence, keys.data, keys.idempotency("k{}")):
        assert hash_tag(key) == tag
        assert key_slot(key.encode()) == key_slot(tag.encode())


@given(RESOURCES, RESOURCES)
def test_escaping_is_injective(a: str, b: str) -> None:
    if a != b:
        assert escape_tag(a) != escape_tag(b)
        assert ResourceKeys("p", a).lease != ResourceKeys("p", b).lease


def test_braces_and_percent_are_escaped() -> None:
    assert escape_tag("a{b}c%") == "a%7Bb%7Dc%25"
    assert escape_tag("%7B") == "%257B"  # not confused with an escaped '{'
    assert ResourceKeys("fencing", "{x}").lease == "fencing:{%7Bx%7D}:lease"
    with pytest.raises(InvalidArgumentError):
        escape_tag("")


def test_parse_url_splits_our_options_from_redis_pys() -> None:
    t = parse_url(
        "redis://u:pw@h:7000/2?prefix=app&socket_timeout=1.5&idempotency_ttl=60",
        own=("idempotency_ttl",),
    )
    assert t.url == "redis://u:pw@h:7000/2?socket_timeout=1.5"
    assert (t.prefix, t.cluster, t.require_durable) == ("app", False, False)
    assert t.options == {"idempotency_ttl": "60"}
    c = parse_url("rediss+cluster://h:7000?require_durable=1")
    assert c.url == "rediss://h:7000" and c.cluster and c.require_durable
    assert c.prefix == redis_db.DEFAULT_PREFIX
    assert parse_url("redis://h?cluster=yes").cluster
    for bad in ("http://h", "redis://h?prefix=a{b", "redis://h?prefix="):
        with pytest.raises(InvalidArgumentError):
            parse_url(bad)


def test_urls_for_other_nodes_keep_credentials_and_logs_hide_them() -> None:
    assert (
        redis_db.url_for_node("redis://u:pw@h:1/0?x=1", "n2", 7002) == "redis://u:pw@n2:7002/0?x=1"
    )
    assert redis_db.url_for_node("redis://h:1", "::1", 7) == "redis://[::1]:7"
    assert urls.redact("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert urls.redact("redis://h:1/0") == "redis://h:1/0"


def test_glob_escape_makes_a_prefix_literal() -> None:
    assert redis_db.glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"


@pytest.mark.parametrize(
    ("config", "durable"),
    [
        ({"appendonly": "yes", "appendfsync": "always", "save": ""}, True),
        ({"appendonly": "yes", "appendfsync": "everysec", "save": "3600 1"}, True),
        ({"appendonly": "yes", "appendfsync": "no", "save": ""}, False),
        ({"appendonly": "no", "appendfsync": "always", "save": "3600 1"}, False),
        ({"appendonly": "no", "appendfsync": "everysec", "save": ""}, False),
        ({}, False),
    ],
)
def test_durable_means_aof_with_fsync(config: dict[str, str], durable: bool) -> None:
    assert (judge_durability(config) is None) == durable


@pytest.mark.parametrize(
    ("config", "lost"),
    [
        ({"maxmemory": "0", "maxmemory-policy": "allkeys-lru"}, None),  # no limit
        ({"maxmemory": "1048576", "maxmemory-policy": "noeviction"}, None),
        ({"maxmemory": "1048576", "maxmemory-policy": "allkeys-lru"}, "fences"),
        ({"maxmemory": "1048576", "maxmemory-policy": "allkeys-random"}, "fences"),
        ({"maxmemory": "1048576", "maxmemory-policy": "volatile-ttl"}, "leases"),
        ({"maxmemory": "1048576", "maxmemory-policy": "volatile-lfu"}, "idempotency keys"),
        ({}, None),  # nothing read: the caller already says CONFIG could not be read
    ],
)
def test_eviction_is_unsafe_with_a_limit_and_any_policy_but_noeviction(
    config: dict[str, str], lost: str | None
) -> None:
    why = judge_eviction(config)
    if lost is None:
        assert why is None
    else:
        assert why is not None and lost in why
        assert f"maxmemory-policy is {config['maxmemory-policy']!r}" in why
        assert "noeviction" in why


def test_clients_never_retry_a_command() -> None:
    assert redis_db.standalone_client("redis://127.0.0.1:1").get_retry().get_retries() == 0  # type: ignore[union-attr]
    cluster = redis_db.cluster_client("redis://127.0.0.1:1")
    assert cluster.retry.get_retries() == 0


def test_clients_use_the_connection_that_raises_a_swallowed_cancellation() -> None:
    """Every client's connections are ours (serving.redis_db._Connection), TLS ones too,
    and a cluster's startup nodes as well as the nodes it finds later."""
    plain = redis_db.standalone_client("redis://127.0.0.1:1")
    assert plain.connection_pool.connection_class is redis_db._Connection
    tls = redis_db.standalone_client("rediss://127.0.0.1:1")
    assert tls.connection_pool.connection_class is redis_db._SSLConnection
    for url, ours in [
        ("redis://127.0.0.1:1", redis_db._Connection),
        ("rediss://127.0.0.1:1", redis_db._SSLConnection),
    ]:
        cluster = redis_db.cluster_client(url)
        assert cluster.connection_kwargs["connection_class"] is ours
        assert [node.connection_class for node in cluster.startup_nodes] == [ours]
        assert cluster.nodes_manager.connection_kwargs["connection_class"] is ours


@pytest.mark.parametrize(
    "error",
    [
        rexc.ConnectionError("refused"),
        rexc.TimeoutError("slow"),
        rexc.BusyLoadingError("loading"),
        rexc.ClusterDownError("CLUSTERDOWN The cluster is down"),
        rexc.ReadOnlyError("READONLY You can't write against a read only replica."),
        rexc.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
        rexc.ResponseError("MASTERDOWN Link with MASTER is down"),
        ConnectionResetError("reset"),
    ],
)
def test_unavailable_errors_become_backend_unavailable(error: Exception) -> None:
    with pytest.raises(BackendUnavailableError) as caught, redis_db.driver_errors("acquire"):
        raise error
    assert caught.value.__cause__ is error
    assert "acquire" in str(caught.value)


def test_other_redis_errors_and_ours_pass_through() -> None:
    bug = rexc.ResponseError("ERR user_script:1: Script attempted to access nonexistent global")
    with pytest.raises(rexc.ResponseError), redis_db.driver_errors("acquire"):
        raise bug
    with pytest.raises(InvalidArgumentError), redis_db.driver_errors("acquire"):
        raise InvalidArgumentError("ours", field="x")
