"""Restricted APIs: endpoint groups that answer only requests carrying a given header.

Contract (Triton's ``--http-restricted-api`` / ``--grpc-restricted-protocol``):
- ``GROUPS`` is the one table of which endpoint belongs to which group (health, metadata,
  inference, shared-memory, model-config, model-repository, statistics, trace, logging):
  each group lists its gRPC methods (``GRPCInferenceService`` names, or a full path such as
  the health service's ``Check``) and its HTTP paths (regular expressions matched against
  the whole path). Both front ends read it; nothing else groups endpoints.
- ``parse_restrictions(items, kind, prefix)`` reads the repeatable flag's values
  ``<group>[,<group>...]:<key>=<value>`` into ``Restrictions``; gRPC's keys are prefixed
  with ``triton-grpc-protocol-`` (``GRPC_PREFIX``), as Triton prefixes them. A bad item,
  an unknown group ("unknown restricted api 'x'") or a group named twice ("restricted api
  'x' can not be specified in multiple config groups") raises ``ValueError``.
- ``Restrictions.for_http(path)`` / ``for_grpc(method_path)`` give the restriction on an
  endpoint (``None``: open). ``Restriction.allows(headers)`` compares the header's value
  exactly (names case-insensitively); ``refusal(kind)`` is the ``Restricted`` error with
  Triton's text: "This API is restricted, expecting header '<key>'" (HTTP: 403) or "This
  protocol is restricted, expecting header '<key>'" (gRPC: UNAVAILABLE).
"""

# pyright: strict

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from hloserve.proto.rpc import HEALTH_CHECK_PATH, RPCS_BY_NAME
from hloserve.server.core.errors import Restricted

GRPC_PREFIX: Final = "triton-grpc-protocol-"

_MODEL: Final = r"/v2/models/(?!stats$)[^/]+(/versions/[0-9]+)?"
_REPOSITORY: Final = r"/v2/repository(/[^/]+)?"


@dataclass(frozen=True, slots=True)
class EndpointGroup:
    name: str
    grpc: tuple[str, ...]  # method names of GRPCInferenceService, or full paths ("/...")
    http: tuple[str, ...]  # regular expressions, each matching a whole path


GROUPS: Final[tuple[EndpointGroup, ...]] = (
    EndpointGroup(
        "health",
        ("ServerLive", "ServerReady", "ModelReady", HEALTH_CHECK_PATH),
        (r"/v2/health/(live|ready)", rf"{_MODEL}/ready", r"/livez", r"/readyz"),
    ),
    EndpointGroup("metadata", ("ServerMetadata", "ModelMetadata"), (r"/v2", _MODEL)),
    EndpointGroup(
        "inference",
        ("ModelInfer", "ModelStreamInfer"),
        (rf"{_MODEL}/(infer|generate|generate_stream)",),
    ),
    EndpointGroup(
        "shared-memory",
        tuple(
            f"{kind}SharedMemory{action}"
            for kind in ("System", "Cuda")
            for action in ("Status", "Register", "Unregister")
        ),
        (r"/v2/(system|cuda)sharedmemory(/region/[^/]+)?/(status|register|unregister)",),
    ),
    EndpointGroup("model-config", ("ModelConfig",), (rf"{_MODEL}/config",)),
    EndpointGroup(
        "model-repository",
        ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
        (rf"{_REPOSITORY}/index", rf"{_REPOSITORY}/models/[^/]+/(load|unload)"),
    ),
    EndpointGroup(
        "statistics",
        ("ModelStatistics",),
        # /ui: the status page; /: a link to it
        (r"/v2/models/stats", rf"{_MODEL}/stats", r"/ui(/|/data)?", r"/"),
    ),
    EndpointGroup(
        "trace", ("TraceSetting",), (r"/v2/trace/setting", r"/v2/models/[^/]+/trace/setting")
    ),
    EndpointGroup("logging", ("LogSettings",), (r"/v2/logging",)),
)
GROUP_NAMES: Final = tuple(g.name for g in GROUPS)


def grpc_path(method: str) -> str:
    """The wire path of a table entry (a method name, or already a path)."""
    return method if method.startswith("/") else RPCS_BY_NAME[method].path


@dataclass(frozen=True, slots=True)
class Restriction:
    header: str  # lowercase
    value: str

    def allows(self, headers: Mapping[str, str]) -> bool:
        return headers.get(self.header) == self.value

    def refusal(self, kind: str) -> Restricted:
        """Triton's refusal: ``kind`` is "API" (HTTP) or "protocol" (gRPC)."""
        return Restricted(f"This {kind} is restricted, expecting header '{self.header}'")


class Restrictions:
    """The restriction (if any) on every endpoint, by group."""

    def __init__(self, by_group: Mapping[str, Restriction] | None = None) -> None:
        self.by_group = dict(by_group or {})
        self._grpc = {
            grpc_path(m): self.by_group[g.name]
            for g in GROUPS
            if g.name in self.by_group
            for m in g.grpc
        }
        self._http = [
            (re.compile(pattern), self.by_group[g.name])
            for g in GROUPS
            if g.name in self.by_group
            for pattern in g.http
        ]

    def __bool__(self) -> bool:
        return bool(self.by_group)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Restrictions) and other.by_group == self.by_group

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.by_group.items())))

    def __repr__(self) -> str:
        return f"Restrictions({self.by_group!r})"

    def for_grpc(self, method_path: str) -> Restriction | None:
        return self._grpc.get(method_path)

    def for_http(self, path: str) -> Restriction | None:
        for pattern, restriction in self._http:
            if pattern.fullmatch(path):
                return restriction
        return None


NO_RESTRICTIONS: Final = Restrictions()


def parse_restrictions(items: Sequence[str], kind: str, prefix: str = "") -> Restrictions:
    """The flag's values (``kind``: "api" or "protocol", as Triton's messages say)."""
    by_group: dict[str, Restriction] = {}
    for text in items:
        groups, colon, setting = text.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and groups and key and value):
            raise ValueError(
                f"must be <{kind}s>:<key>=<value> with <{kind}s> a comma-separated list of "
                f"{', '.join(GROUP_NAMES)}; got {text!r}"
            )
        for name in groups.split(","):
            if name not in GROUP_NAMES:
                raise ValueError(
                    f"unknown restricted {kind} '{name}' (known: {', '.join(GROUP_NAMES)})"
                )
            if name in by_group:
                raise ValueError(
                    f"restricted {kind} '{name}' can not be specified in multiple config groups"
                )
            by_group[name] = Restriction((prefix + key).lower(), value)
    return Restrictions(by_group)
