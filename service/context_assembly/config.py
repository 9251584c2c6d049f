"""Service settings (docs/configuration.md): a TOML file, overridden by ``CONTEXT_ASSEMBLY_*`` variables.

Nested keys use ``__`` in variable names (``CONTEXT_ASSEMBLY_STORE__BACKEND=redis``). Settings are
built once in the entrypoint and passed to ``create_app(settings)``; validators refuse unsafe
combinations at start-up (authentication off on a non-loopback bind, SQLite with several workers).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from context_assembly.tokens.prices import LongContextTier, ModelPrices, PriceEntry
from context_assembly.tokens.registry import ModelEntry, ModelRegistry
from context_assembly.validation import nearest

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# An MCP header value is a reference to an environment variable, never the value itself.
_ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]*)$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Headers the MCP calls set themselves (contributors/mcp_exchange.py); a registration cannot.
_MCP_OWN_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "connection",
        "content-length",
        "content-type",
        "host",
        "last-event-id",
        "mcp-protocol-version",
        "mcp-session-id",
        "transfer-encoding",
    }
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    drain_seconds: float = Field(default=10.0, ge=0, le=300)
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class ApiKey(_Section):
    tenant: str = Field(min_length=1, max_length=128)
    key_sha256: str

    @field_validator("key_sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        value = value.lower()
        if not _HEX64.match(value):
            raise ValueError("key_sha256 must be the 64-character hex sha256 of the key")
        return value


class AuthSettings(_Section):
    mode: Literal["api_key", "none"] = "none"
    keys: list[ApiKey] = Field(default_factory=list)
    admin_key_sha256: str | None = None


class StoreSettings(_Section):
    backend: Literal["sqlite", "redis"] = "sqlite"
    path: str = "context-assembly.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "ca:"
    ttl_seconds: int = Field(default=3600, ge=1, le=30 * 24 * 3600)
    # SQLite's PRAGMA synchronous: "full" also keeps the last commits through a power loss or an
    # OS crash, at an fsync per commit (docs/decisions.md, Storage).
    sqlite_synchronous: Literal["normal", "full"] = "normal"


class ContributorSettings(_Section):
    """A registered contributor: a webhook (the default kind) or an MCP server (``kind = "mcp"``,
    whose keys are ``resources``, ``tool``, ``tool_arguments`` and ``headers``)."""

    kind: Literal["webhook", "mcp"] = "webhook"
    url: str
    secret: SecretStr | None = None
    failure_policy: Literal["fail", "omit"] = "fail"
    tenants: list[str] | None = None
    # kind = "mcp": pinned resource URIs read every prepare, or "listed" (resources/list, those
    # whose audience includes the assistant); one tool called every prepare, with arguments whose
    # strings may hold "{input}" (the latest user text); headers by environment reference.
    resources: list[str] | Literal["listed"] | None = None
    tool: str | None = Field(default=None, min_length=1)
    tool_arguments: dict[str, JsonValue] | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("headers", mode="before")
    @classmethod
    def _headers_from_environment(cls, value: Any) -> Any:
        # ``{name = "env:VARIABLE"}``: the value is read from the environment at load (and again
        # at each reload). Errors name the header and the variable, never a value.
        if not isinstance(value, dict):
            return value
        resolved: dict[str, SecretStr] = {}
        for name, ref in value.items():
            if not isinstance(name, str) or not _HEADER_NAME.match(name):
                raise ValueError("a header name must be an HTTP token (letters, digits, -)")
            if name.lower() in _MCP_OWN_HEADERS:
                raise ValueError(f"header {name!r} is set by the service itself")
            if isinstance(ref, SecretStr):
                resolved[name.lower()] = ref
                continue
            match = _ENV_REF.match(ref) if isinstance(ref, str) else None
            if match is None:
                raise ValueError(
                    f'header {name!r} must be a reference "env:VARIABLE": a header value is '
                    "read from the environment, never written in the configuration"
                )
            variable = match.group(1)
            if variable not in os.environ:
                raise ValueError(f"header {name!r}: environment variable {variable} is not set")
            if _CONTROL.search(os.environ[variable]):
                raise ValueError(
                    f"header {name!r}: environment variable {variable} holds a control character"
                )
            resolved[name.lower()] = SecretStr(os.environ[variable])
        return resolved

    @model_validator(mode="after")
    def _keys_of_kind(self) -> ContributorSettings:
        mcp_keys = [
            key for key in ("resources", "tool", "tool_arguments") if getattr(self, key) is not None
        ] + (["headers"] if self.headers else [])
        if self.kind == "webhook":
            if mcp_keys:
                raise ValueError(f'{", ".join(mcp_keys)}: only for kind = "mcp"')
            return self
        if self.secret is not None:
            raise ValueError(
                "secret signs webhook calls; an MCP server takes "
                'headers = { authorization = "env:NAME" }'
            )
        if self.resources is None and self.tool is None:
            raise ValueError('kind = "mcp" needs resources, a tool, or both')
        if isinstance(self.resources, list):
            if not self.resources:
                raise ValueError('resources: list at least one URI, or give "listed"')
            if any(not uri or _CONTROL.search(uri) for uri in self.resources):
                raise ValueError("resources: a URI must be nonempty, without control characters")
            if len(set(self.resources)) != len(self.resources):
                raise ValueError("resources: a URI is listed twice")
        if self.tool_arguments is not None and self.tool is None:
            raise ValueError("tool_arguments needs a tool")
        return self

    @field_validator("secret")
    @classmethod
    def _standard_webhooks_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # Refuse a bad secret at start-up rather than with a 500 on the first prepare. Stricter
        # than the signing library (which pads and skips invalid characters): "whsec_", strict
        # base64, at least 16 key bytes. The error never echoes the value.
        if value is None:
            return None
        raw = value.get_secret_value()
        body = raw.removeprefix("whsec_")
        try:
            key = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if not raw.startswith("whsec_") or len(key) < 16:
            raise ValueError(
                "secret must be 'whsec_' followed by strict base64 of at least 16 bytes"
            )
        return value


class InlineUrlEntry(_Section):
    """An allowlist entry that may also admit private answers: ``{prefix = "...",
    allow_private = true}`` (a sidecar on loopback), where a plain string admits public ones."""

    prefix: str
    allow_private: bool = False


class InlineUrlSettings(_Section):
    allow: list[str | InlineUrlEntry] = Field(default_factory=list)
    # Every entry admits private answers (prefer the entry's own ``allow_private``).
    allow_private: bool = False

    def entries(self) -> list[str | tuple[str, bool]]:
        """The allowlist as ``UrlPolicy`` takes it."""
        return [e if isinstance(e, str) else (e.prefix, e.allow_private) for e in self.allow]


class LimitSettings(_Section):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # The request head (target and header fields, all together) and how long its head and its
    # body may take to arrive: enforced per connection by ``http_limits.py``, read at start.
    max_head_bytes: int = Field(default=64 * 1024, ge=1024, le=1024 * 1024)
    head_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    max_contributor_response_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # Contributor calls in flight at once, all contributors together (a call over it waits for
    # a free connection, within its deadline). 256: 32 concurrent prepares fanning out to eight
    # contributors each. Read at start (a reload does not change it).
    max_contributor_connections: int = Field(default=256, ge=1, le=65_536)
    validate_timeout_ms: int = Field(default=1000, ge=1, le=30_000)
    # Usage reports one preparation keeps (each ``report_id`` for idempotency); a new one over
    # it is refused. A preparation serves one model call, its wrap-up and a few repairs.
    max_usage_reports: int = Field(default=64, ge=1, le=10_000)


class CacheSettings(_Section):
    # The HMAC key of automatic ``prompt_cache_key``s. Unset: a random one is generated once and
    # kept in the store, so every replica and restart shares it. Read at start.
    key_secret: SecretStr | None = Field(default=None, min_length=16)


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds to loopback only."""
    if host in {"localhost", "localhost."}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything the service is configured with."""

    model_config = SettingsConfigDict(
        env_prefix="CONTEXT_ASSEMBLY_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    contributors: dict[str, ContributorSettings] = Field(default_factory=dict)
    inline_urls: InlineUrlSettings = Field(default_factory=InlineUrlSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    # [models."name"]: the operator's model entries, added to the shipped registry or replacing
    # the shipped entry of the same name; validated like the data file's entries.
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    # [prices."name"]: the operator's prices, added to the shipped ones or replacing the shipped
    # price of the same name; validated like the price file's entries. The name is a registry
    # entry's (shipped or [models."name"]).
    prices: dict[str, PriceEntry] = Field(default_factory=dict)

    @field_validator("models", "prices", mode="before")
    @classmethod
    def _names_from_tables(cls, value: Any, info: ValidationInfo) -> Any:
        # A table's name is the model's name: [models."gpt-5.2"] is the entry "gpt-5.2", and
        # [prices."gpt-5.2"] its price.
        if not isinstance(value, Mapping):
            return value
        named: dict[Any, Any] = {}
        for name, table in value.items():
            if isinstance(table, Mapping):
                if "name" in table:
                    raise ValueError(
                        f"{info.field_name}.{name}: the table's name is the model's name; "
                        'remove "name"'
                    )
                table = {"name": name, **table}
            named[name] = table
        return named

    @field_validator("models")
    @classmethod
    def _models_fit_the_registry(cls, value: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
        # A configured name or alias may not be another entry's name or alias.
        ModelRegistry.load().with_configured(value)
        return value

    @field_validator("prices")
    @classmethod
    def _prices_fit_the_registry(
        cls, value: dict[str, PriceEntry], info: ValidationInfo
    ) -> dict[str, PriceEntry]:
        # Each name is a registry entry's (shipped or configured) and the rates fit its provider.
        # With invalid [models] tables (reported on their own) there is no registry to check.
        if value and "models" in info.data:
            registry = ModelRegistry.load().with_configured(info.data["models"])
            ModelPrices.load(registry).with_configured(value)
        return value

    @model_validator(mode="after")
    def _safe(self) -> Settings:
        if self.auth.mode == "none" and not is_loopback(self.server.host):
            raise ValueError(
                f"auth mode 'none' is only allowed on a loopback bind, not {self.server.host!r}; "
                'configure [auth] mode = "api_key" with keys'
            )
        if self.auth.mode == "api_key" and not self.auth.keys:
            raise ValueError("auth mode 'api_key' needs at least one [[auth.keys]] entry")
        if self.store.backend == "sqlite" and self.server.workers > 1:
            raise ValueError(
                'the SQLite store serves one process: use --workers 1, or [store] backend = "redis"'
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments win, then the environment, then the TOML file (if any).
        toml_file = _TOML_FILE.get("path")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


_TOML_FILE: dict[str, Path | None] = {"path": None}


ENV_PREFIX = "CONTEXT_ASSEMBLY_"


def _refuse_single_underscore_env() -> None:
    """``CONTEXT_ASSEMBLY_STORE_BACKEND`` is a typo for ``CONTEXT_ASSEMBLY_STORE__BACKEND`` that
    the environment source would ignore, starting the service on a setting it was not given:
    a variable naming a section with one underscore is refused, naming the spelling meant.
    Other ``CONTEXT_ASSEMBLY_*`` variables (the clients' ``..._URL``, ``..._API_KEY``) pass."""
    for name in sorted(os.environ):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        for section in Settings.model_fields:
            head = section.upper() + "_"
            if rest.startswith(head) and not rest.startswith(head + "_"):
                meant = f"{ENV_PREFIX}{section.upper()}__{rest[len(head) :]}"
                raise ValueError(
                    f"environment variable {name} is not a setting: nested keys take a double "
                    f"underscore ({meant})"
                )


# ``CONTEXT_ASSEMBLY_*`` variables that are not settings, and are left alone: the file ``serve``
# hands its worker processes (``server.CONFIG_ENV``), and what the examples, the clients' READMEs
# and the TypeScript client's tests read beside a service (the service to call, its key, the
# executable to start, the example contributor's port and secret).
OTHER_ENV = frozenset(
    {
        "CONTEXT_ASSEMBLY_CONFIG_FILE",
        "CONTEXT_ASSEMBLY_URL",
        "CONTEXT_ASSEMBLY_API_KEY",
        "CONTEXT_ASSEMBLY_KEY",
        "CONTEXT_ASSEMBLY_BIN",
        "CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_PORT",
        "CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_SECRET",
    }
)


def _env_keys(annotation: Any) -> dict[str, Any] | None:
    """The keys a variable may name below a setting of type ``annotation``: a section's keys
    with their types; ``{}`` for a table of free names (a ``dict``, such as
    ``[contributors.NAME]``: any key below it is the table's own, and is not checked here);
    ``None`` for a value, which has no keys."""
    members = [annotation]
    if get_origin(annotation) is Union or isinstance(annotation, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
    keys: dict[str, Any] = {}
    for member in members:
        if get_origin(member) is dict:
            return {}
        if isinstance(member, type) and issubclass(member, BaseModel):
            keys.update({name: info.annotation for name, info in member.model_fields.items()})
    return keys or None


def unknown_env_variable(name: str) -> str | None:
    """Why ``name``, a ``CONTEXT_ASSEMBLY_*`` variable, sets nothing (naming the nearest valid
    variable, or the keys valid where it goes wrong); ``None`` when it names a setting (or
    is one of ``OTHER_ENV``). Case does not matter, as for the settings themselves."""
    upper = name.upper()
    if upper in OTHER_ENV:
        return None
    parts = upper[len(ENV_PREFIX) :].lower().split("__")
    keys = _env_keys(Settings)
    meant: list[str] = []
    wrong: tuple[int, list[str]] | None = None  # where it first goes wrong: its part, the keys
    for index, part in enumerate(parts):
        if keys == {}:  # below a table of free names: the rest is the table's own
            meant += parts[index:]
            break
        if keys is None:
            wrong = wrong or (index, [])
            meant = []
            break
        valid = list(keys)
        if index == 0 and len(parts) == 1:  # the variables that are not settings are valid too
            valid += [other[len(ENV_PREFIX) :].lower() for other in sorted(OTHER_ENV)]
        found = part if part in keys else nearest(part, valid)
        if found != part:
            wrong = wrong or (index, list(keys))
        if found is None:
            meant = []
            break
        meant.append(found)
        keys = _env_keys(keys[found]) if found in keys else None
    if wrong is None:
        return None
    index, valid = wrong
    said = f"environment variable {name} names no setting"
    if meant:
        return f"{said}; did you mean {ENV_PREFIX}{'__'.join(meant).upper()}?"
    if not valid:
        return f"{said}: {'.'.join(parts[:index])} takes no nested key"
    return f"{said}: valid keys at {'.'.join(parts[:index]) or 'the top'}: {', '.join(valid)}"


def _refuse_unknown_env() -> None:
    """A ``CONTEXT_ASSEMBLY_*`` variable that names no setting (``CONTEXT_ASSEMBLY_AUHT__MODE``)
    would be ignored, starting the service on a setting it was not given: it is refused, naming
    the nearest valid variable (:func:`unknown_env_variable`)."""
    for name in sorted(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            problem = unknown_env_variable(name)
            if problem is not None:
                raise ValueError(problem)


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from an optional TOML file, the environment and explicit overrides.

    Raises:
        ValueError: (pydantic ``ValidationError``) naming the offending setting.
        FileNotFoundError: when ``config`` names a file that does not exist.
    """
    path = Path(config) if config is not None else None
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"configuration file not found: {path}")
    _refuse_single_underscore_env()
    _refuse_unknown_env()
    _TOML_FILE["path"] = path
    try:
        return Settings(**overrides)
    finally:
        _TOML_FILE["path"] = None


def explain(error: Mapping[str, Any]) -> str:
    """One configuration error as ``key: what is wrong``; an unknown key names the nearest valid
    key of its section (``store.bakend: unknown key; did you mean store.backend?``)."""
    path = [str(part) for part in error["loc"]]
    loc = ".".join(path) or "(settings)"
    if error["type"] != "extra_forbidden":
        return f"{loc}: {error['msg']}"
    model = _section_model(path)
    valid = list(model.model_fields) if model is not None else []
    near = nearest(path[-1], valid)
    if near is not None:
        return f"{loc}: unknown key; did you mean {'.'.join([*path[:-1], near])}?"
    if valid:
        return f"{loc}: unknown key (valid keys: {', '.join(valid)})"
    return f"{loc}: unknown key"


def _section_model(path: list[str]) -> type[BaseModel] | None:
    """The settings model whose key the last part of ``path`` should be."""
    if len(path) == 1:
        return Settings
    if path[0] == "contributors":  # [contributors.NAME]: free names, then a registration's keys
        return ContributorSettings if len(path) == 3 else None
    if path[0] == "models":  # [models."name"]: free names, then an entry's keys
        return ModelEntry if len(path) == 3 else None
    if path[0] == "prices":  # [prices."name"]: free names, then a price's keys
        if len(path) == 4 and path[2] == "long_context":
            return LongContextTier
        return PriceEntry if len(path) == 3 else None
    field = Settings.model_fields.get(path[0])
    annotation = field.annotation if field is not None else None
    if len(path) == 2 and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
