"""guard.stores.mysql without a server: its URL, and what it says about durability."""

from __future__ import annotations

import pytest

from fencing.errors import InvalidArgumentError

pytest.importorskip("asyncmy", reason="the mysql extra is not installed")

from guard.stores import open_store
from guard.stores.mysql import MySQLConfig, MySQLStore, flush_warning


def test_a_url_says_where_and_which_tables() -> None:
    c = MySQLConfig("mysql://app:p%40ss@db:3307/shop?prefix=g_&pool_max=4&timeout=2")
    assert (c.host, c.port, c.user, c.password, c.database) == ("db", 3307, "app", "p@ss", "shop")
    assert (c.prefix, c.pool_max, c.timeout) == ("g_", 4, 2)
    assert isinstance(open_store("mariadb://root@127.0.0.1/test"), MySQLStore)
    assert open_store("mysql://root@h/test?pool_max=6").commit_concurrency == 3


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("mysql://h/", "store"),
        ("mysql://h/db?prefix=a-b", "prefix"),
        ("mysql://h/db?pool_max=0", "pool_max"),
        ("mysql://h/db?timeout=x", "timeout"),
        ("mysql://h/db?schema=x", "schema"),
    ],
)
def test_a_bad_url_names_its_field(url: str, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        MySQLConfig(url)
    assert err.value.field == field


def test_only_a_flush_at_every_commit_is_durable() -> None:
    assert flush_warning(1) is None
    for lazy in (0, 2):
        warning = flush_warning(lazy)
        assert warning is not None and f"innodb_flush_log_at_trx_commit = {lazy}" in warning
