"""build_server(): one grpc.aio server with health, reflection, the boundary interceptor and size limits.

Clients come from :func:`channel` with the same message-size limits (the docs: set in one
place, equal on servers and clients), a retry policy for UNAVAILABLE only, ``round_robin`` load balancing over every
address of the target and keepalive pings; servers accept those pings and close connections at
``server.max_connection_age_s`` so clients re-resolve and reach new replicas (:class:`ConnectionSettings`).

TLS (docs/security.md): servers serve TLS, or mutual TLS, when ``server.tls`` names a certificate
(:func:`server_credentials`); channels use TLS per :class:`ClientTLS`, which a command line takes from its
``--tls-*`` options or the environment (``MASCOT_TLS_CA``, ``MASCOT_TLS_CERT``, ``MASCOT_TLS_KEY``,
``MASCOT_TLS_SERVER_NAME``, ``MASCOT_TLS=1`` for the system roots) and the gateway from ``server.tls``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mascot.core.interceptors import DEFAULT_STREAM_STALL_S, BoundaryInterceptor

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: Environment variables of client TLS (:meth:`ClientTLS.from_env`) and of the public API's caller token.
ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY = "MASCOT_TLS_CA", "MASCOT_TLS_CERT", "MASCOT_TLS_KEY"
ENV_TLS_SERVER_NAME, ENV_TLS_ON = "MASCOT_TLS_SERVER_NAME", "MASCOT_TLS"
ENV_CALLER_TOKEN = "MASCOT_CALLER_TOKEN"


def _read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file.

    Raises:
        ValueError: the file cannot be read or is empty (the message names ``what`` and the path, never content).
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be read ({e.strerror or type(e).__name__})") from None
    if not data.strip():
        raise ValueError(f"{what} {path} is empty")
    return data


def server_credentials(tls: Any) -> grpc.ServerCredentials | None:
    """Server credentials of a ``TLSConfig`` (``server.tls``): TLS with ``cert_file``/``key_file``, and with
    ``client_auth`` a required client certificate signed by ``ca_file``; None when TLS is off.

    Raises:
        ValueError: a file cannot be read.
    """
    if tls is None or not tls.enabled:
        return None
    chain = _read_pem(tls.cert_file, "server.tls.cert_file")
    key = _read_pem(tls.key_file, "server.tls.key_file")
    ca = _read_pem(tls.ca_file, "server.tls.ca_file") if tls.client_auth else None
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=ca, require_client_auth=bool(tls.client_auth))


@dataclass(frozen=True)
class ClientTLS:
    """TLS of a client channel.

    Attributes:
        enabled: Use TLS (False: plaintext).
        ca_file: PEM CA bundle that verifies the server; empty = the system roots.
        cert_file: PEM client certificate chain for mutual TLS; empty = none.
        key_file: PEM key of ``cert_file``.
        server_name: Name checked against the server certificate instead of the target host; empty = the host.
    """

    enabled: bool = True
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    @classmethod
    def plaintext(cls) -> "ClientTLS":
        """No TLS."""
        return cls(enabled=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ClientTLS":
        """TLS from ``MASCOT_TLS_CA`` / ``MASCOT_TLS_CERT`` / ``MASCOT_TLS_KEY`` / ``MASCOT_TLS_SERVER_NAME``; on when
        any of the first three is set or ``MASCOT_TLS`` is 1/true (the system roots), else plaintext."""
        env = os.environ if environ is None else environ
        ca, cert, key, name = (env.get(k, "").strip() for k in (ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY,
                                                                 ENV_TLS_SERVER_NAME))
        on = bool(ca or cert or key) or env.get(ENV_TLS_ON, "").strip().lower() in ("1", "true", "yes")
        return cls(enabled=on, ca_file=ca, cert_file=cert, key_file=key, server_name=name)

    @classmethod
    def from_config(cls, tls: Any) -> "ClientTLS":
        """The gateway's outbound TLS from ``server.tls``: TLS when the servers serve it, verified with ``ca_file``;
        under ``client_auth`` presenting ``client_cert_file`` (default: the server certificate)."""
        if tls is None or not tls.enabled:
            return cls.plaintext()
        cert, key = tls.client_cert_file, tls.client_key_file
        if not cert and tls.client_auth:
            cert, key = tls.cert_file, tls.key_file
        return cls(enabled=True, ca_file=tls.ca_file, cert_file=cert, key_file=key, server_name=tls.server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        """``grpc.ssl_channel_credentials`` of these files.

        Raises:
            ValueError: a file cannot be read, or a certificate without its key (or the reverse).
        """
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs its key and a key its certificate (--tls-cert with "
                             "--tls-key, or MASCOT_TLS_CERT with MASCOT_TLS_KEY)")
        return grpc.ssl_channel_credentials(
            root_certificates=_read_pem(self.ca_file, "TLS CA file") if self.ca_file else None,
            private_key=_read_pem(self.key_file, "TLS client key") if self.key_file else None,
            certificate_chain=_read_pem(self.cert_file, "TLS client certificate") if self.cert_file else None)


class _BearerToken:
    """Adds ``authorization: Bearer <token>`` to every call that does not send its own authorization."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = list(d.metadata or ())
        if any(k == "authorization" for k, _ in md):
            return d
        return grpc.aio.ClientCallDetails(d.method, d.timeout, grpc.aio.Metadata(*md, self._header), d.credentials,
                                          d.wait_for_ready)


# grpc.aio files an interceptor under ONE call type (the first base it matches), hence one class per type.
class _BearerUnary(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Callable, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _BearerStream(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Callable, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


def _options(max_message_bytes: int, max_receive_bytes: int | None = None) -> list[tuple[str, Any]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes if max_receive_bytes is None
             else min(max_receive_bytes, max_message_bytes))]


#: The load-balancing policy of every channel: calls go to every address the target resolves to in turn (the pods of
#: a headless Service), not all to the first one (gRPC's default ``pick_first``).
LOAD_BALANCING = [{"round_robin": {}}]
#: Keepalive ping interval, in seconds, of a client without a config (``server.keepalive_time_s``'s default): servers
#: accept pings at half of ``min(their own keepalive_time_s, this)``, so a client on the defaults is never refused.
DEFAULT_KEEPALIVE_TIME_S = 30.0
#: The shortest ping interval servers accept: half the smallest ``server.keepalive_time_s`` the config allows (1 s).
MIN_ACCEPTED_PING_S = 0.5


@dataclass(frozen=True)
class ConnectionSettings:
    """Keepalive and connection age of gRPC servers and channels (``server.keepalive_time_s``,
    ``keepalive_timeout_s``, ``max_connection_age_s``, ``max_connection_age_grace_s``; all in seconds).

    Attributes:
        keepalive_time_s: Interval of a channel's keepalive pings, idle connections included (>= 1).
        keepalive_timeout_s: How long a ping may go unanswered before the channel drops the connection (>= 1).
        max_connection_age_s: Age at which a server sends GOAWAY so the client reconnects and re-resolves; 0 = never.
        max_connection_age_grace_s: How long calls running at that age may go on before the connection is closed.
    """

    keepalive_time_s: float = DEFAULT_KEEPALIVE_TIME_S
    keepalive_timeout_s: float = 10.0
    max_connection_age_s: float = 300.0
    max_connection_age_grace_s: float = 600.0

    @classmethod
    def from_config(cls, server: Any) -> "ConnectionSettings":
        """The settings of a ``ServerConfig`` (``cfg.server``)."""
        return cls(keepalive_time_s=server.keepalive_time_s, keepalive_timeout_s=server.keepalive_timeout_s,
                   max_connection_age_s=server.max_connection_age_s,
                   max_connection_age_grace_s=server.max_connection_age_grace_s)

    def server_options(self) -> list[tuple[str, Any]]:
        """gRPC server arguments: keepalive pings accepted from clients, idle or not, every
        :data:`MIN_ACCEPTED_PING_S` seconds, whatever this server's own setting (more often is a strike: GOAWAY
        ``too_many_pings`` after two), so no client the config allows (``keepalive_time_s`` >= 1) is ever cut off,
        even one whose component config sets a shorter interval than the server's; and ``max_connection_age`` / its
        grace (none when ``max_connection_age_s`` is 0). ``SO_REUSEPORT`` is off (grpcio turns it on by default on
        Linux): a second server started on a port another one holds fails to bind (:class:`PortInUse`) instead of
        silently sharing its traffic."""
        min_ping_s = MIN_ACCEPTED_PING_S
        options: list[tuple[str, Any]] = [("grpc.so_reuseport", 0), ("grpc.keepalive_permit_without_calls", 1),
                                          ("grpc.http2.min_ping_interval_without_data_ms", int(min_ping_s * 1000))]
        if self.max_connection_age_s > 0:
            options += [("grpc.max_connection_age_ms", int(self.max_connection_age_s * 1000)),
                        ("grpc.max_connection_age_grace_ms", int(self.max_connection_age_grace_s * 1000))]
        return options

    def client_options(self) -> list[tuple[str, Any]]:
        """gRPC channel arguments: a keepalive ping every ``keepalive_time_s`` on every connection, idle ones
        too, without a limit on pings between data frames, each answered within ``keepalive_timeout_s``."""
        return [("grpc.keepalive_time_ms", int(self.keepalive_time_s * 1000)),
                ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_s * 1000)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0)]


class Server:
    """A started gRPC server: ``port`` is the bound port, ``health`` the health servicer."""

    def __init__(self, server: grpc.aio.Server, port: int, health_servicer: health.aio.HealthServicer,
                 services: Sequence[str]) -> None:
        self.server, self.port, self.health, self.services = server, port, health_servicer, services

    async def set_serving(self, serving: bool = True) -> None:
        """Mark every service (and the overall server, "") SERVING or NOT_SERVING."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", *self.services):
            await self.health.set(name, status)

    async def stop(self, grace: float = 5.0) -> None:
        """Mark NOT_SERVING, then stop, letting in-flight RPCs finish for ``grace`` seconds."""
        await self.set_serving(False)
        await self.server.stop(grace)


DESCRIPTOR_SET = Path(__file__).resolve().parents[1] / "api" / "descriptors.binpb"


@functools.lru_cache(maxsize=1)
def _documented_files() -> dict[str, bytes]:
    """File name -> serialized FileDescriptorProto with source info (comments), from :data:`DESCRIPTOR_SET`."""
    from google.protobuf import descriptor_pb2

    return {f.name: f.SerializeToString()
            for f in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes()).file}


def enable_reflection(service_names: Sequence[str], server: Any) -> None:
    """gRPC server reflection of ``service_names`` on an aio ``server`` that serves our protos with their comments
    (``make protos`` writes them with source info into ``mascot/api/descriptors.binpb``), so ``grpcurl describe`` shows
    the API documentation. Other files (health, reflection, KServe's) are served as grpcio-reflection serves them,
    without comments. grpcio-reflection 1.x builds each answer with ``FileDescriptor.CopyToProto``, which drops
    comments; this servicer answers file requests from the stored descriptors instead."""
    from google.protobuf import descriptor_pool
    from grpc_reflection.v1alpha import reflection_pb2 as rpb
    from grpc_reflection.v1alpha import reflection_pb2_grpc as rpb_grpc
    from grpc_reflection.v1alpha._async import ReflectionServicer

    documented = _documented_files()

    class DocumentedReflection(ReflectionServicer):
        def _answer(self, request: Any, descriptor: Any) -> Any:
            files: dict[str, bytes] = {}

            def collect(fd: Any) -> None:
                if fd.name in files:
                    return
                files[fd.name] = documented.get(fd.name) or fd.serialized_pb
                for dep in fd.dependencies:
                    collect(dep)

            collect(descriptor)
            return rpb.ServerReflectionResponse(original_request=request, file_descriptor_response=
                                                rpb.FileDescriptorResponse(file_descriptor_proto=list(files.values())))

        def _file_by_filename(self, request: Any, filename: str) -> Any:
            try:
                return self._answer(request, self._pool.FindFileByName(filename))
            except KeyError:
                return super()._file_by_filename(request, filename)

        def _file_containing_symbol(self, request: Any, name: str) -> Any:
            try:
                return self._answer(request, self._pool.FindFileContainingSymbol(name))
            except KeyError:
                return super()._file_containing_symbol(request, name)

    rpb_grpc.add_ServerReflectionServicer_to_server(
        DocumentedReflection(service_names, pool=descriptor_pool.Default()), server)


def service_rpcs(service_names: Sequence[str]) -> list[str]:
    """The method names of the named gRPC services (full names, e.g. ``mascot.api.director.v1.DirectorService``), as
    the boundary interceptor labels them in ``mascot_rpc_requests_total{rpc}``. Raises KeyError for an unknown service
    (its ``_pb2`` module not imported)."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    return [m.name for name in service_names for m in pool.FindServiceByName(name).methods]


class PortInUse(OSError):
    """A server port could not be bound; the message names the port and the setting that chooses it."""


def port_in_use_message(what: str, host: str, port: int, setting: str) -> str:
    """The one wording of a port that cannot be bound: which port, on which address, and how to pick another."""
    return (f"cannot listen on {host}:{port}, {what} ({setting}): the port is in use by another process (or "
            f"{host} is not an address of this machine); stop that process or set {setting} to a free port "
            "(0 picks one)")


async def build_server(component: str, metrics: Any, add: Sequence[tuple[Callable, Any, str]], *,
                       host: str = "127.0.0.1", port: int = 0,
                       max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_request_bytes: int | None = None,
                       tls: Any = None, stream_stall_s: float = DEFAULT_STREAM_STALL_S,
                       connections: ConnectionSettings | None = None, reflection_on: bool = True,
                       port_setting: str = "") -> Server:
    """Create, bind and start a server.

    Args:
        component: Metric label of this server.
        metrics: :class:`~mascot.core.metrics.Metrics`.
        add: ``(add_XServicer_to_server, servicer, full_service_name)`` triples.
        host: Bind address (127.0.0.1 in embedded mode and tests).
        port: Port; 0 picks a free one.
        max_message_bytes: gRPC send/receive limit.
        max_request_bytes: A lower receive limit (the gateway's ``server.max_request_bytes``): a bigger request is
            RESOURCE_EXHAUSTED from gRPC before it is parsed; None = ``max_message_bytes``.
        tls: ``server.tls`` (:class:`~mascot.core.config.TLSConfig`); TLS or mutual TLS when it names a certificate,
            plaintext when None or off.
        stream_stall_s: ``server.stream_stall_s`` (see :class:`~mascot.core.interceptors.BoundaryInterceptor`).
        connections: Keepalive pings accepted and ``max_connection_age`` (:meth:`ConnectionSettings.server_options`);
            None = the defaults (a connection is asked to reconnect after 300 s).
        reflection_on: Serve gRPC reflection (``server.reflection``; ``control.reflection`` for the control plane).
            Off, the reflection service is not registered (a client's reflection call is UNIMPLEMENTED).
        port_setting: The setting that names ``port``, for the error message; default ``server.<component>_port``.

    Raises:
        PortInUse: the port could not be bound (another process holds it, or the address is not this host's).
        ValueError: a TLS file cannot be read.
    """
    creds = server_credentials(tls)
    server = grpc.aio.server(interceptors=[BoundaryInterceptor(component, metrics, stream_stall_s)],
                             options=[*_options(max_message_bytes, max_request_bytes),
                                      *(connections or ConnectionSettings()).server_options()])
    names = []
    for adder, servicer, name in add:
        adder(servicer, server)
        names.append(name)
    metrics.declare(rpcs={component: service_rpcs(names)})
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    if reflection_on:
        enable_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = bind_port(server, host, port, creds, f"the {component}'s gRPC port",
                      port_setting or f"server.{component}_port")
    await server.start()
    srv = Server(server, bound, hs, names)
    await srv.set_serving(True)
    return srv


def bind_port(server: grpc.aio.Server, host: str, port: int, creds: Any, what: str, setting: str) -> int:
    """Add ``host:port`` to ``server`` (TLS when ``creds`` is not None); returns the bound port (0 picks one).

    Raises:
        PortInUse: the port could not be bound; the message names ``what`` and the ``setting`` that chooses it.
    """
    address = f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, creds) if creds is not None else server.add_insecure_port(address)
    except RuntimeError:  # grpcio raises "Failed to bind to address" without the reason
        bound = 0
    if bound == 0:
        raise PortInUse(port_in_use_message(what, host, port, setting))
    return bound


#: Environment variable of ``server.max_message_bytes`` (pydantic-settings naming); clients without a config read it.
ENV_MAX_MESSAGE_BYTES = "MASCOT_SERVER__MAX_MESSAGE_BYTES"


def client_max_message_bytes() -> int:
    """The send/receive limit of a client that has no :class:`MascotConfig` (the CLIs):
    ``$MASCOT_SERVER__MAX_MESSAGE_BYTES`` when set, else the config's default (16 MiB), so one setting sizes servers
    and clients alike.

    Raises:
        ValueError: the variable is not an integer in [1024, 256 MiB] (the range of ``server.max_message_bytes``).
    """
    raw = os.environ.get(ENV_MAX_MESSAGE_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_MESSAGE_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 1024 <= value <= 256 * 1024 * 1024:
        raise ValueError(f"{ENV_MAX_MESSAGE_BYTES}={raw!r} must be an integer from 1024 to {256 * 1024 * 1024} bytes")
    return value


def channel(target: str, max_message_bytes: int | None = None, *, tls: ClientTLS | None = None,
            token: str | None = None, connections: ConnectionSettings | None = None) -> grpc.aio.Channel:
    """An async channel with equal size limits, retries of UNAVAILABLE (3 attempts), ``round_robin`` over every
    address the target resolves to, keepalive pings, and connections of its own (never another channel's backoff).

    Args:
        target: ``host:port`` or ``dns:///host:port`` (the chart's form: the name of a headless Service, which
            resolves to every ready pod); each resolved address gets a connection and the calls take them in turn.
            The name is resolved again when a connection ends (a server's ``max_connection_age``, a pod gone).
        max_message_bytes: gRPC send/receive limit; None = :func:`client_max_message_bytes` (servers' channels pass
            their ``server.max_message_bytes``).
        tls: TLS of the channel; None = :meth:`ClientTLS.from_env` (plaintext unless ``MASCOT_TLS_*`` is set).
        token: Caller token of the public API sent as ``authorization: Bearer <token>`` on every call that sends
            no authorization of its own; None = ``MASCOT_CALLER_TOKEN`` (none when unset), "" = none.
        connections: Keepalive of the channel (:meth:`ConnectionSettings.client_options`); None = the defaults
            (servers' channels pass their ``server.*`` settings).

    Raises:
        ValueError: a TLS file cannot be read, or a bad ``MASCOT_SERVER__MAX_MESSAGE_BYTES``.
    """
    service_config = {"loadBalancingConfig": LOAD_BALANCING, "methodConfig": [{
        "name": [{}],
        "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"]},
    }]}
    tls = ClientTLS.from_env() if tls is None else tls
    token = os.environ.get(ENV_CALLER_TOKEN, "").strip() if token is None else token.strip()
    if max_message_bytes is None:
        max_message_bytes = client_max_message_bytes()
    # A channel owns its connections (``use_local_subchannel_pool``): with gRPC's process-wide pool, a new channel to
    # an address that an older channel failed to reach (a pod IP reused, a port reused) shares that connection's
    # reconnect backoff and fails at once with the old "connection refused", retries included.
    options = [*_options(max_message_bytes), ("grpc.service_config", json.dumps(service_config)),
               ("grpc.enable_retries", 1), ("grpc.use_local_subchannel_pool", 1),
               *(connections or ConnectionSettings()).client_options()]
    interceptors = [_BearerUnary(token), _BearerStream(token)] if token else None
    if tls.enabled:
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        return grpc.aio.secure_channel(target, tls.credentials(), options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
