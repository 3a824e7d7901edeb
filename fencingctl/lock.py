"""``fencing lock RESOURCE [-n N] [--ttl DURATION] [--timeout DURATION] -- CMD [ARGS...]``.

Run CMD holding a lease, like ``etcdctl lock NAME CMD``, ``consul lock`` or ``flock``,
with a fencing token:

1. takes the lease on RESOURCE, waiting up to ``--timeout`` seconds (default: forever)
   while someone else holds it, so a second ``fencing lock`` on the same resource waits
   its turn; with a guard address (the default) the new token is first *promised* to
   the guard (``Fence``), so from then on the guard refuses every older token, even
   before CMD writes anything;
2. runs CMD with ``FENCING_RESOURCE``, ``FENCING_TOKEN``, ``FENCING_HOLDER`` and the
   lease/guard addresses in its environment (``fencing put`` inside reads the token
   from there, so a shell script writes fenced without naming it);
3. renews the lease while CMD runs (the SDK's session, every ttl/3);
4. if the lease is lost (a renewal refused, or the local deadline passed, e.g. after
   the whole process was paused), sends CMD SIGTERM, then SIGKILL after ``--grace``
   seconds; anything CMD still sends the guard after the loss is refused there;
5. releases the lease when CMD exits, and exits with CMD's status.

With ``-n N`` (like ``consul lock -n N``) up to N commands hold RESOURCE at once: each
takes one of N slot leases ``RESOURCE/slot-0`` .. ``RESOURCE/slot-{N-1}`` (a
semaphore, :mod:`fencing.semaphore`), with its own token, and ``FENCING_RESOURCE``
names that slot, so what CMD writes with ``fencing put "$FENCING_RESOURCE" ...`` is
fenced per slot. Every holder of RESOURCE must give the same N.

Exit codes of its own (CMD's status otherwise; a CMD killed by signal N gives 128+N):
75 (``EXIT_NOT_ACQUIRED``) when the timeout ran out with the lease still held by
another, 76 (``EXIT_LOST``) when the lease was lost while CMD ran (whatever CMD
then returned), 127 when CMD cannot be started, 130 when interrupted (Ctrl-C) while
still waiting for the lease. An error before CMD ran exits with its code in the
table of ``fencing --help``, as every command: 12 (UNREACHABLE) when no server
answered at the address, 2 for a bad flag.
Once CMD runs, SIGINT and SIGTERM are passed on to it, and it decides.

"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from types import FrameType
from typing import Any

from fencing.client import GuardClient, Lease, LeaseClient
from fencing.errors import AcquireTimeoutError, FencingError, LeaseLost
from fencing.semaphore import MAX_LIMIT, Semaphore
from fencingctl import connect, flags, hints
from serving import exits

#: Exit code when the lease was not acquired within ``--timeout`` (serving.exits.TABLE).
EXIT_NOT_ACQUIRED = exits.CODES["NOT_ACQUIRED"]
#: Exit code when the lease was lost while CMD ran.
EXIT_LOST = exits.CODES["LOST_WHILE_RUNNING"]
#: Exit code when CMD could not be started (as a shell says).
EXIT_NO_COMMAND = exits.CODES["NO_COMMAND"]


def child_env(
    args: argparse.Namespace, lease: Lease, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """CMD's environment: ours plus the lease's proof and where to use it.

    The connection settings given as flags are passed as the variables the client
    commands read, so ``fencing put`` inside connects as this command did.
    """
    env = dict(os.environ)
    env.update(
        FENCING_RESOURCE=lease.resource,
        FENCING_TOKEN=str(lease.token),
        FENCING_HOLDER=lease.holder,
    )
    env[connect.LEASE_ADDR_ENV] = args.lease_addr
    env[connect.GUARD_ADDR_ENV] = args.guard_addr
    for flag, var in (
        ("tls_ca", "FENCING_TLS_CA"),
        ("tls_cert", "FENCING_TLS_CERT"),
        ("tls_key", "FENCING_TLS_KEY"),
        ("tls_server_name", "FENCING_TLS_SERVER_NAME"),
        ("auth_token", "FENCING_AUTH_TOKEN"),
    ):
        value = getattr(args, flag, None)
        if value:
            env[var] = value
    env.update(extra or {})
    return env


def exit_status(returncode: int) -> int:
    """A shell's convention: a child killed by signal N exits 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervised:
    """CMD run as a child: stopped with SIGTERM, then SIGKILL after ``grace`` seconds,
    once :meth:`lose` is called (from any thread: the renewal thread calls it)."""

    def __init__(self, command: Sequence[str], env: dict[str, str], grace: float) -> None:
        self.proc = subprocess.Popen(list(command), env=env)
        self.grace = grace
        self.lost = threading.Event()

    def lose(self, _lease: object = None) -> None:
        self.lost.set()

    def forward(self, signum: int, _frame: FrameType | None) -> None:
        """A SIGINT/SIGTERM to us goes to CMD (which decides), as ``etcdctl lock`` does."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def wait(self) -> int:
        """Wait for CMD to exit, stopping it if the lease is lost; its returncode."""
        while True:
            try:
                return self.proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
            if self.lost.is_set():
                return self._stop()

    def _stop(self) -> int:
        print("fencing lock: lease lost: sending SIGTERM to the command", file=sys.stderr)
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            print("fencing lock: command still running: SIGKILL", file=sys.stderr)
            self.proc.kill()
            return self.proc.wait()


@contextmanager
def forwarding_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Install ``handler`` for SIGINT and SIGTERM (main thread only), restore after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_while_held(
    args: argparse.Namespace,
    lease: Lease,
    command: Sequence[str],
    *,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run ``command`` while ``lease`` is held (renewed by the caller's ``hold``); the
    exit code to return (CMD's status, or :data:`EXIT_LOST`), not counting a loss
    that the enclosing ``hold`` reports on exit."""
    try:
        child = Supervised(command, child_env(args, lease, extra_env), args.grace)
    except OSError as exc:
        print(f"error: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return EXIT_NO_COMMAND
    lease.on_lost(child.lose)
    with forwarding_signals(child.forward):
        code = child.wait()
    return EXIT_LOST if child.lost.is_set() else exit_status(code)


def guard_of(args: argparse.Namespace, stack: ExitStack) -> list[GuardClient]:
    """The guards to promise a new token to: the one ``--guard-addr`` names, if any."""
    if args.no_fence:
        return []
    guard = stack.enter_context(connect.guard_client(args))
    return [guard]


def command_of(args: argparse.Namespace) -> list[str]:
    """Split what follows the name into options and CMD at the first ``--``.

    argparse cannot take options after a positional followed by a command line of
    its own, so the options between the name and ``--`` are parsed here, by the
    same option parser (the ones before the name were parsed already).
    """
    rest: list[str] = list(args.cmd)
    parser: argparse.ArgumentParser = args.parser
    if "--" in rest:
        cut = rest.index("--")
        args.options.parse_args(rest[:cut], namespace=args)
        rest = rest[cut + 1 :]
    elif rest and rest[0].startswith("-"):
        parser.error("put -- between the options and the command")
    if not rest:
        parser.error("a command to run is required after --")
    return rest


def holding(
    args: argparse.Namespace, leases: LeaseClient, fence: list[GuardClient]
) -> AbstractContextManager[Lease]:
    """The lease on RESOURCE, or with ``-n N`` above 1 one of its semaphore's N slot leases
    (``RESOURCE/slot-i``, each with its own token: :mod:`fencing.semaphore`)."""
    if args.limit > 1:
        semaphore = Semaphore(leases, args.name, args.limit, args.ttl, fence=fence)
        return semaphore.hold(timeout=args.timeout)
    return leases.hold(args.name, args.ttl, timeout=args.timeout, fence=fence)


def _run(args: argparse.Namespace) -> int:
    command = command_of(args)
    try:
        with ExitStack() as stack:
            leases = stack.enter_context(connect.lease_client(args, holder=args.holder))
            fence = guard_of(args, stack)
            code = 0
            try:
                with holding(args, leases, fence) as lease:
                    code = run_while_held(args, lease, command)
            except LeaseLost:
                return EXIT_LOST
            return code
    except AcquireTimeoutError as exc:
        print(f"fencing lock: not acquired: {exc}", file=sys.stderr)
        return EXIT_NOT_ACQUIRED
    except (FencingError, ValueError) as exc:  # ValueError: unreadable TLS files
        return hints.fail(args, exc)
    except KeyboardInterrupt:  # while waiting for the lease: nothing was started
        return exits.CODES["INTERRUPTED"]


def add_addresses(p: argparse.ArgumentParser) -> None:
    """The lease server to hold on, and the guard to promise each new token to."""
    connect.add_lease_address(p, "the lease server to hold the lease on")
    connect.add_guard_address(
        p,
        "the guard the new token is promised to before CMD starts, and that CMD's "
        "'fencing put' writes to",
    )
    p.add_argument(
        "--no-fence",
        action="store_true",
        help="do not promise the new token to the guard (CMD's first guarded write does)",
    )
    connect.add_options(p)


def add_run_options(
    p: argparse.ArgumentParser,
    addresses: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Options of a command that runs CMD under a lease (``lock``, ``elect``), with
    ``addresses`` adding its connection options (default: :func:`add_addresses`)."""
    p.add_argument(
        "--grace",
        type=flags.seconds,
        metavar="DURATION",
        default=10.0,
        help="how long between SIGTERM and SIGKILL once the lease is lost (default 10s)",
    )
    p.add_argument("--holder", default="", help="holder name (default host-pid-random)")
    (addresses or add_addresses)(p)


def runner_parser(
    sub: Any, name: str, options: argparse.ArgumentParser, metavar: str = "NAME", **kwargs: Any
) -> argparse.ArgumentParser:
    """A subcommand ``NAME [OPTIONS] -- CMD [ARGS...]`` whose options are ``options``'s."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, parents=[options], formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
    )
    options.prog = p.prog  # its errors name the command
    p.add_argument("name", metavar=metavar)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(options=options, parser=p)
    return p


def register(sub: Any) -> None:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--ttl",
        type=flags.ttl,
        metavar="DURATION",
        default=10.0,
        help="the lease's ttl: 30s, 1m... (default 10s)",
    )
    options.add_argument(
        "--timeout",
        type=flags.seconds,
        metavar="DURATION",
        default=None,
        help="how long to wait while another holds it (default: forever); then exit "
        f"{EXIT_NOT_ACQUIRED}",
    )
    options.add_argument(
        "-n",
        "--limit",
        type=flags.integer(1, MAX_LIMIT),
        default=1,
        metavar="N",
        help="let up to N hold RESOURCE at once, like consul lock -n (a semaphore: each "
        "holder gets one of N slot leases RESOURCE/slot-0..N-1 with its own token, and "
        "FENCING_RESOURCE names that slot; default %(default)s: RESOURCE itself)",
    )
    add_run_options(options)
    p = runner_parser(
        sub,
        "lock",
        options,
        metavar="RESOURCE",
        help="run a command holding a lease (like etcdctl lock / flock)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.set_defaults(run=_run)
