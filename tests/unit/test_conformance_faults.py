"""The conformance runner's fault control: a line names a proxy fault, bad lines are refused
naming what is wrong, and a real proxy is acted on (a reset closes its connections)."""

from __future__ import annotations

import socket

import pytest

from chaos.proxy import ThreadedFaultProxy
from conformance.faults import apply, fault_proxy


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("explode", "unknown fault 'explode'"),
        ("half_open", "half_open takes one of upstream, downstream"),
        ("half_open sideways", "half_open takes one of upstream, downstream"),
        ("reset now", "reset takes no arguments"),
    ],
)
def test_a_bad_line_is_refused_naming_it(line: str, message: str) -> None:
    with ThreadedFaultProxy("127.0.0.1", 9) as proxy, pytest.raises(ValueError, match=message):
        apply(proxy, line)


def test_the_control_socket_acts_on_the_proxy() -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    with fault_proxy(f"127.0.0.1:{upstream.getsockname()[1]}") as (proxy, control):
        host, port = proxy.rsplit(":", 1)
        client = socket.create_connection((host, int(port)), timeout=5)
        served, _ = upstream.accept()
        chost, cport = control.rsplit(":", 1)
        with socket.create_connection((chost, int(cport)), timeout=5) as ctl:
            answers = ctl.makefile()
            ctl.sendall(b"half_open upstream\n")
            assert answers.readline() == "ok\n"
            served.sendall(b"held")  # a reply held by the half-open link
            ctl.sendall(b"reset\n")
            assert answers.readline() == "ok\n"
            ctl.sendall(b"bogus\n")
            assert answers.readline().startswith("error unknown fault")
        with pytest.raises(ConnectionResetError):
            while client.recv(16):  # the held reply never arrives: the link was reset
                pass
        client.close()
        served.close()
    upstream.close()
