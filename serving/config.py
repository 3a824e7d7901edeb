"""Server configuration: flags > ``FENCING_*`` environment > TOML file > defaults.

Each server command (``lease-server``, ``fencing-guard``, ``fencing serve``) declares
its settings as :class:`Option` objects; :func:`add_options` puts them on its argparse
parser and :func:`resolve` fills every one from the first source that sets it:

1. the command-line flag (``--metrics-port 9100``);
2. the environment variable (``FENCING_METRICS_PORT=9100``; empty counts as unset);
3. the TOML file named by ``--config`` / ``FENCING_CONFIG`` (``metrics_port = 9100``,
   flat keys named like the flags with underscores);
4. the default.

Everything is validated before the server starts, and all problems are reported
at once, each naming where the bad value came from: an unknown key in the TOML
file, a value of the wrong type, a port out of range, a certificate that cannot be
read, plaintext on a non-loopback address. ``--check-config`` validates, prints the
resolved settings with their sources, and exits. ``docs/configuration.md`` is
generated from these declarations (``python scripts/gen_config_docs.py``).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from fencing.tls import TLSConfig, check_transport
from serving import storage
from serving.admission import (
    DEFAULT_MAX_SESSION_IN_FLIGHT,
    DEFAULT_MAX_WAITERS,
    DEFAULT_MAX_WATCH_STREAMS,
)
from serving.auth import AuthPolicy
from serving.flags import DeprecatedFlag, address_problem, warn_deprecated
from serving.loop import EVENT_LOOPS
from serving.metrics import Metrics
from serving.server import ServerOptions

T = TypeVar("T")


class ConfigError(ValueError):
    """One or more settings are invalid; the message lists each, naming its source."""


# -- values -------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected a boolean (true/false, 1/0, yes/no, on/off), got {text!r}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


_PARSE: dict[type, Callable[[str], Any]] = {bool: _bool, int: _int, float: _float, str: str}
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _from_toml(kind: type, value: Any) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise ValueError(f"expected {_TYPE_NAMES[kind]}, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(f"expected {_TYPE_NAMES[kind]}, got {value!r}")
    return value


# -- checks -------------------------------------------------------------------------------

Check = Callable[[Any], None]


def port_range(value: Any) -> None:
    if not 0 <= value <= 65535:
        raise ValueError(f"must be a port number 0..65535, got {value}")


def positive(value: Any) -> None:
    if value <= 0:
        raise ValueError(f"must be greater than 0, got {value}")


def non_negative(value: Any) -> None:
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")


def address(value: Any) -> None:
    problem = address_problem(value)
    if problem is not None:
        raise ValueError(f"must be host:port: {problem}")


# -- declarations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One setting: its TOML key (and ``args`` attribute), flag, variable and default."""

    key: str
    env: str
    default: Any
    help: str
    kind: type = str
    choices: tuple[str, ...] = ()
    check: Check | None = None
    metavar: str | None = None
    #: Applied to a value before it is checked (e.g. ``str.upper`` for log levels).
    normalize: Callable[[Any], Any] | None = None
    #: Former TOML keys (and so flags) of this setting, still accepted for one release
    #: with a deprecation warning on stderr.
    old_keys: tuple[str, ...] = ()
    #: Former environment variables, read after ``env`` (with a warning) for one release.
    old_envs: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return _flag(self.key)

    @property
    def old_flags(self) -> tuple[str, ...]:
        return tuple(_flag(key) for key in self.old_keys)

    def parse(self, text: str) -> Any:
        value = _PARSE[self.kind](text)
        return self.validate(value)

    def validate(self, value: Any) -> Any:
        if value is None:
            return None
        if self.normalize is not None:
            value = self.normalize(value)
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}; got {value!r}")
        if self.check is not None:
            self.check(value)
        return value


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _argparse_type(option: Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return option.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = option.kind.__name__
    return convert


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Add each option's flag (default None: "not given"), plus --config and --check-config."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="TOML file with settings (env FENCING_CONFIG); flags and env override it",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate the settings, print them with their sources, and exit",
    )
    for option in options:
        env = f" (env {option.env}"
        default = "" if option.default is None else f"; default {option.default}"
        formerly = ", ".join((*option.old_flags, *option.old_envs))
        formerly = f"; formerly {formerly}, deprecated" if formerly else ""
        help_text = f"{option.help}{env}{default}{formerly})".replace("%", "%%")
        if option.kind is bool:
            parser.add_argument(
                option.flag,
                dest=option.key,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
            if option.old_keys:
                raise TypeError(f"{option.key}: a boolean setting with old_keys")
            continue
        metavar = option.metavar or (
            "{" + ",".join(option.choices) + "}" if option.choices else option.key.upper()
        )
        parser.add_argument(
            option.flag,
            dest=option.key,
            type=_argparse_type(option),
            default=None,
            metavar=metavar,
            help=help_text,
        )
        for old in option.old_flags:
            parser.add_argument(
                old,
                dest=option.key,
                type=_argparse_type(option),
                metavar=metavar,
                action=DeprecatedFlag,
                new=option.flag,
            )


def resolve(
    args: argparse.Namespace, options: Sequence[Option], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Fill ``args.<key>`` for every option (flag > env > file > default); return the sources.

    Raises :class:`ConfigError` listing every problem found.
    """
    environ = os.environ if environ is None else environ
    errors: list[str] = []
    file_values: dict[str, Any] = {}
    config_path = args.config or environ.get("FENCING_CONFIG") or None
    if config_path:
        args.config = config_path
        try:
            file_values = _load_file(config_path, options)
        except ConfigError as exc:
            errors.append(str(exc))
    sources: dict[str, str] = {}
    for option in options:
        flag_value = getattr(args, option.key, None)
        env_name = option.env
        env_text = environ.get(env_name, "")
        for old_env in option.old_envs if not env_text.strip() else ():
            if environ.get(old_env, "").strip():
                warn_deprecated(old_env, option.env)
                env_name, env_text = old_env, environ[old_env]
                break
        file_key = option.key
        for old_key in option.old_keys if option.key not in file_values else ():
            if old_key in file_values:
                warn_deprecated(f"{config_path}: {old_key}", option.key)
                file_key = old_key
                break
        try:
            if flag_value is not None:
                value, source = flag_value, f"flag {option.flag}"
            elif env_text.strip():
                source = f"env {env_name}"
                value = option.parse(env_text)
            elif file_key in file_values:
                source = f"{config_path}: {file_key}"
                value = option.validate(_from_toml(option.kind, file_values[file_key]))
            else:
                value, source = option.default, "default"
        except ValueError as exc:
            errors.append(f"{source}: {exc}")
            value = option.default
        setattr(args, option.key, value)
        sources[option.key] = source
    if errors:
        raise ConfigError("\n".join(errors))
    return sources


def _load_file(path: str, options: Sequence[Option]) -> dict[str, Any]:
    try:
        with Path(path).open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from exc
    known = {key for option in options for key in (option.key, *option.old_keys)}
    unknown = [key for key in data if key not in known]
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown key {unknown[0]!r}"
            + (f" (and {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else "")
            + f"; known keys: {', '.join(sorted(option.key for option in options))}"
        )
    return data


# -- the settings every server command shares ---------------------------------------------

REFLECTION = Option("reflection", "FENCING_REFLECTION", False, "enable gRPC reflection", bool)
REQUIRE_DURABLE = Option(
    "require_durable",
    "FENCING_REQUIRE_DURABLE",
    False,
    "refuse to start on a backend or store that may forget acknowledged tokens or fences "
    "(memory://, Redis without AOF or with a maxmemory-policy that evicts)",
    bool,
)
#: lease-server and fencing-guard: their storage URL may name a SQLite file that is not
#: there yet (``fencing serve`` keeps its files in a data directory of its own).
CREATE = Option(
    "create",
    "FENCING_CREATE",
    True,
    "create a SQLite file that does not exist yet, every counter at 1 (with a WARNING); "
    "--no-create refuses to start on one instead (a mistyped path), as --require-durable does",
    bool,
)
GRACE = Option(
    "grace",
    "FENCING_GRACE",
    5.0,
    "seconds to drain in-flight calls on SIGTERM",
    float,
    check=non_negative,
    metavar="SECONDS",
)
BACKEND_TIMEOUT = Option(
    "backend_timeout",
    "FENCING_BACKEND_TIMEOUT",
    storage.DEFAULT_BACKEND_TIMEOUT,
    "deadline of each backend/store call; past it the call fails UNAVAILABLE",
    float,
    check=positive,
    metavar="SECONDS",
)
HEALTH_INTERVAL = Option(
    "health_interval",
    "FENCING_HEALTH_INTERVAL",
    storage.DEFAULT_HEALTH_INTERVAL,
    "seconds between backend health probes (NOT_SERVING while unreachable)",
    float,
    check=positive,
    metavar="SECONDS",
)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL = Option(
    "log_level", "FENCING_LOG_LEVEL", "INFO", "log level", choices=LOG_LEVELS, normalize=str.upper
)
LOG_FORMAT = Option(
    "log_format",
    "FENCING_LOG_FORMAT",
    "console",
    "console (readable) or json (one object per line)",
    choices=("console", "json"),
)
EVENT_LOOP = Option(
    "event_loop",
    "FENCING_EVENT_LOOP",
    "asyncio",
    "asyncio (the standard loop) or uvloop (pip install 'fencing-guard[uvloop]'; less "
    "server CPU per call)",
    choices=EVENT_LOOPS,
)
TLS_CERT = Option(
    "tls_cert", "FENCING_TLS_CERT", None, "PEM certificate chain: serve TLS", metavar="PATH"
)
TLS_KEY = Option("tls_key", "FENCING_TLS_KEY", None, "PEM private key of tls_cert", metavar="PATH")
TLS_CA = Option(
    "tls_ca",
    "FENCING_TLS_CA",
    None,
    "PEM CA of client certificates: require mTLS, principal = cert SAN/CN",
    metavar="PATH",
)
INSECURE = Option(
    "insecure",
    "FENCING_INSECURE",
    False,
    "allow plaintext on a non-loopback address (no TLS: anyone on the path sees tokens)",
    bool,
)
AUTH_FILE = Option(
    "auth_file",
    "FENCING_AUTH_FILE",
    None,
    "TOML auth policy: bearer tokens -> principals, per-prefix permissions; turns auth on",
    metavar="PATH",
)
METRICS_PORT = Option(
    "metrics_port",
    "FENCING_METRICS_PORT",
    0,
    "serve Prometheus /metrics on this port; 0 = off",
    int,
    check=port_range,
    metavar="PORT",
)
METRICS_HOST = Option(
    "metrics_host",
    "FENCING_METRICS_HOST",
    "127.0.0.1",
    "address the metrics endpoint binds",
    metavar="HOST",
)
MAX_WAITERS = Option(
    "max_waiters_per_client",
    "FENCING_MAX_WAITERS_PER_CLIENT",
    DEFAULT_MAX_WAITERS,
    "concurrent Acquire calls with wait_ms > 0 per client (principal, or peer address)",
    int,
    check=positive,
    metavar="N",
)
MAX_WATCH_STREAMS = Option(
    "max_watch_streams_per_client",
    "FENCING_MAX_WATCH_STREAMS_PER_CLIENT",
    DEFAULT_MAX_WATCH_STREAMS,
    "concurrent Watch streams per client",
    int,
    check=positive,
    metavar="N",
)
MAX_SESSION_IN_FLIGHT = Option(
    "session_max_in_flight",
    "FENCING_SESSION_MAX_IN_FLIGHT",
    DEFAULT_MAX_SESSION_IN_FLIGHT,
    "acquires in flight per lease Session stream, and as many renewals and releases "
    "apart from them (told to the client in its initial metadata); a call beyond its "
    "limit is answered RESOURCE_EXHAUSTED",
    int,
    check=positive,
    metavar="N",
)

WORKERS = Option(
    "workers",
    "FENCING_WORKERS",
    1,
    "server processes sharing the port (SO_REUSEPORT), each about one core; not with "
    "memory://; with metrics_port, worker i serves metrics on metrics_port + i",
    int,
    check=positive,
    metavar="N",
)

#: Settings of every server process, after its own.
SERVER_OPTIONS: tuple[Option, ...] = (
    TLS_CERT,
    TLS_KEY,
    TLS_CA,
    INSECURE,
    AUTH_FILE,
    METRICS_PORT,
    METRICS_HOST,
    BACKEND_TIMEOUT,
    HEALTH_INTERVAL,
    GRACE,
    REFLECTION,
    REQUIRE_DURABLE,
    LOG_LEVEL,
    LOG_FORMAT,
    EVENT_LOOP,
)
#: Per-client caps, for processes that serve the lease service.
LEASE_LIMIT_OPTIONS: tuple[Option, ...] = (MAX_WAITERS, MAX_WATCH_STREAMS, MAX_SESSION_IN_FLIGHT)


def server_options(
    args: argparse.Namespace, addresses: Sequence[str], metrics: Metrics | None = None
) -> ServerOptions:
    """The :class:`ServerOptions` of resolved ``args``, every file read and checked now.

    ``addresses`` are the listen addresses: plaintext on a non-loopback one needs
    ``insecure``. Raises :class:`ConfigError` listing every problem.
    """
    errors: list[str] = []
    tls: TLSConfig | None = None
    tls_ok = True
    if args.tls_cert or args.tls_key or args.tls_ca:
        try:
            tls = TLSConfig(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
            tls.check(server=True)
        except ValueError as exc:
            errors.append(
                f"{exc} [--tls-cert/--tls-key/--tls-ca or FENCING_TLS_CERT/FENCING_TLS_KEY/"
                "FENCING_TLS_CA]: name readable PEM files (a certificate chain, its private "
                "key, the clients' CA)"
            )
            tls_ok = False
    for listen in addresses if tls_ok else ():
        try:
            check_transport(listen, tls, args.insecure)
        except ValueError as exc:
            errors.append(str(exc))
    policy = None
    if args.auth_file:
        try:
            policy = AuthPolicy.load(args.auth_file)
        except ValueError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    return ServerOptions(
        tls=tls,
        insecure=args.insecure,
        auth=policy,
        max_waiters=getattr(args, "max_waiters_per_client", DEFAULT_MAX_WAITERS),
        max_watch_streams=getattr(args, "max_watch_streams_per_client", DEFAULT_MAX_WATCH_STREAMS),
        session_max_in_flight=getattr(args, "session_max_in_flight", DEFAULT_MAX_SESSION_IN_FLIGHT),
        metrics=metrics,
        backend_timeout=args.backend_timeout,
        health_interval=args.health_interval,
    )


@dataclass
class Settled(Generic[T]):
    """A server command's validated settings: ``args`` resolved, ``server`` options built,
    ``extra`` what the command prepared from them (its backend or store), ``sources``
    where each setting came from."""

    args: argparse.Namespace
    server: ServerOptions
    extra: T
    sources: dict[str, str]

    def report(self, command: str) -> int:
        """``--check-config``: print every setting with its source; exit status 0."""
        print(describe(self.args, self.sources))
        print(f"{command}: configuration OK", flush=True)
        return 0


def settle(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    options: Sequence[Option],
    listen: Sequence[str],
    prepare: Callable[[argparse.Namespace], T],
) -> Settled[T]:
    """Resolve and validate a server command's settings, or exit 2 naming every problem.

    ``listen`` names the options holding listen addresses; ``prepare(args)`` builds
    what the command needs without I/O (a backend from its URL) and may raise
    ``ValueError`` (``InvalidArgumentError`` is one) to reject a setting.
    """
    try:
        sources = resolve(args, options)
        server = server_options(args, [getattr(args, key) for key in listen], Metrics())
        extra = prepare(args)
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return Settled(args, server, extra, sources)


def describe(args: argparse.Namespace, sources: Mapping[str, str]) -> str:
    """The resolved settings as TOML-ish lines, each with its source (for --check-config)."""
    lines = []
    for key, source in sources.items():
        value = getattr(args, key)
        shown = "(unset)" if value is None else repr(value).replace("'", '"')
        lines.append(f"{key} = {shown}  # {source}")
    return "\n".join(lines)


def markdown_table(commands: Mapping[str, Sequence[Option]]) -> str:
    """One table of every option of ``commands`` (a row per distinct option)."""
    rows: dict[int, tuple[Option, list[str]]] = {}
    for command, options in commands.items():
        for option in options:
            rows.setdefault(id(option), (option, []))[1].append(command)
    out = [
        "| key (TOML) | flag | environment | default | commands | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    all_commands = list(commands)
    for option, used_by in sorted(rows.values(), key=lambda r: (r[0].key, r[1])):
        default = (
            "(none)"
            if option.default is None
            else f"`{str(option.default).lower() if option.kind is bool else option.default}`"
        )
        who = "all" if used_by == all_commands else ", ".join(f"`{c}`" for c in used_by)
        meaning = option.help
        if option.choices:
            meaning += " (" + " \\| ".join(option.choices) + ")"
        formerly = [f"`{name}`" for name in (*option.old_flags, *option.old_envs)]
        if formerly:
            meaning += f"; formerly {', '.join(formerly)} (deprecated, still read)"
        out.append(
            f"| `{option.key}` | `{option.flag}` | `{option.env}` | {default} | {who} | {meaning} |"
        )
    return "\n".join(out)


__all__ = [
    "LEASE_LIMIT_OPTIONS",
    "SERVER_OPTIONS",
    "WORKERS",
    "ConfigError",
    "DeprecatedFlag",
    "Option",
    "Settled",
    "add_options",
    "address_problem",
    "describe",
    "markdown_table",
    "resolve",
    "server_options",
    "settle",
    "warn_deprecated",
]
