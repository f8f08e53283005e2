"""Every knob of trioforward, with its default, unit and validation (docs/configuration.md).

One frozen :class:`Settings` object is filled from (lowest to highest) the
defaults below, a TOML file, ``TRIOFORWARD_<KNOB>`` environment variables and
CLI flags. The CLI flags, the environment names and the configuration reference
in ``docs/configuration.md`` are all generated from the field metadata here, so
they cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from trioforward._settings_values import (
    FIELD_KINDS,
    RENAMED_KNOBS,
    TYPE_NAMES,
    SettingsError,
    coerce,
    kind_of,
    validate,
)
from trioforward._state_url import StateURLError, check_state_url, redact_url
from trioforward._tenant_spec import TenantSpec

__all__ = ["Settings", "SettingsError", "Knob", "knobs", "ROUTING_POLICIES", "RENAMED_KNOBS", "coerce"]

ROUTING_POLICIES = ("least-outstanding", "round-robin", "session", "prefix")
# session_tool_parser's values: vLLM's --tool-call-parser names (docs/sessions.md, "Tool calls").
TOOL_PARSERS = ("hermes", "qwen3_json", "none")
ENGINE_KINDS = ("auto", "vllm", "sglang", "openai", "none")
LOG_LEVELS = ("debug", "info", "warning", "error")
ENV_PREFIX = "TRIOFORWARD_"


def _knob(default: Any, help: str, unit: str = "", group: str = "dispatch", **kw: Any) -> Any:
    meta = {"help": help, "unit": unit, "group": group}
    if isinstance(default, (list, dict, tuple)) and not isinstance(default, tuple):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """All knobs; times in seconds, ``None`` = no limit. Raises :class:`SettingsError`."""

    # --- engines and dispatch -------------------------------------------------
    engines: tuple[str, ...] = _knob((), "engine roots, http://host:port (no /v1, query or credentials: docs/server.md, \"Engine URLs\")", "URL list", "engines")
    engine_capacity: int = _knob(256, "requests run at once per engine (vLLM max_num_seqs); 0 = unlimited", "requests")
    max_connections_per_engine: int | None = _knob(None, "connection slots per engine; unset = engine_capacity; 0 = unlimited", "connections")
    idle_expiry: float = _knob(4.0, "idle keep-alive connections older than this are closed, not reused (below the engines' 5 s)", "s")
    queue_timeout: float | None = _knob(None, "longest wait for engine capacity (QUEUED); never charged to other budgets", "s")
    unhealthy_timeout: float | None = _knob(60.0, "longest a request waits while no engine is healthy (paused ones count as healthy); unset = forever", "s")
    connect_timeout: float | None = _knob(60.0, "longest TCP connect to an engine (a saturated engine accepts slowly)", "s")
    dispatch_timeout: float | None = _knob(2048.0, "from capacity acquired until the response is complete; covers every retry", "s")
    read_timeout: float | None = _knob(None, "longest silence between body bytes", "s")
    connect_retries: int = _knob(4, "retries of a failed connect, with jittered exponential backoff", "retries")
    rejection_retries: int = _knob(1, "retries of an engine rejection (429/502/503/504)", "retries")
    backoff_initial: float = _knob(0.1, "first retry backoff; doubles each retry, jittered", "s")
    backoff_max: float = _knob(5.0, "largest retry backoff (also caps Retry-After)", "s")
    retry_budget_ratio: float = _knob(0.2, "retries allowed as a fraction of requests (token bucket)", "ratio")
    retry_budget_min: float = _knob(10.0, "retries per second always allowed by the retry budget", "retries/s")
    routing: str = _knob("least-outstanding", "least-outstanding | round-robin | session | prefix", "")
    prefix_load_factor: float = _knob(1.25, "routing = prefix: an engine without a free slot takes no request while its outstanding load is at ceil(factor x mean); >= 1", "ratio")
    prefix_tokens: int = _knob(256, "routing = prefix: leading prompt tokens hashed for a new prefix's engine (same choice on every gateway)", "tokens")
    prefix_table_size: int = _knob(65536, "routing = prefix: prompts remembered so their continuations follow them (local, LRU); 0 = none", "prompts")
    affinity_floor: int = _knob(8, "routing = prefix / session: an engine with a free slot keeps a prompt's or session's affinity while fewer than this many requests are outstanding on it, however low the fleet's mean (docs/dispatch.md)", "requests")
    session_affinity_size: int = _knob(65536, "routing = session / prefix: sessions whose engine is remembered (local, LRU), so a session moved off a saturated engine stays where it went", "sessions")
    session_affinity_ttl: float = _knob(600.0, "a session with no request this long is forgotten by routing (POST /finish_session forgets it at once)", "s")
    adaptive_capacity: bool = _knob(False, "learn each vLLM / SGLang engine's capacity from its own load reports (running, waiting, KV use, preemptions); engine_capacity becomes the upper bound (docs/dispatch.md, \"Capacity from the engine\")", "")
    load_interval: float = _knob(0.1, "adaptive_capacity: seconds between two load reports read from each engine (control pool)", "s")
    health_interval: float = _knob(5.0, "seconds between GET /health probes of each engine", "s")
    health_timeout: float = _knob(5.0, "timeout of one health probe", "s")
    health_failures: int = _knob(3, "consecutive failures that eject an engine", "failures")
    health_successes: int = _knob(1, "consecutive successes that re-admit an engine", "successes")
    adapters: dict[str, str] = _knob({}, "LoRA adapters the gateway may load on demand: name = path", "name=path", "adapters")
    adapter_root: str = _knob("./adapters", "absolute directory, as the engines see it, of tinker://RUN/sampler_weights/NAME adapters (<root>/RUN/NAME); a relative one refuses such paths", "path", "adapters")
    adapter_load_timeout: float = _knob(10.0, "timeout of one POST /v1/load_lora_adapter", "s", "adapters")
    max_loaded_adapters: int = _knob(4, "adapters kept loaded per engine; beyond, the least recently used one not in use is unloaded (POST /v1/unload_lora_adapter); match the engines' --max-cpu-loras; 0 = unlimited", "adapters", "adapters")
    max_registered_adapters: int = _knob(1024, "adapters the gateway keeps registered; beyond, the least recently used one not in use is forgotten; 0 = unlimited", "adapters", "adapters")
    adapter_max_attempts: int = _knob(6, "completion attempts while an adapter is being loaded", "attempts", "adapters")
    adapter_backoff_max: float = _knob(2.0, "largest backoff between adapter retries (0.1*2^k)", "s", "adapters")
    engine_kind: str = _knob("auto", "kind of every engine: auto (detected from its own endpoints when registered) | vllm | sglang | openai (any other OpenAI-compatible server; none is its former name); drives weight updates, health probes, adapter loading and the token routes (docs/operations.md)", "")
    engine_kinds: dict[str, str] = _knob({}, "kind of single engines, overriding engine_kind: URL = vllm | sglang | openai", "URL=kind")
    engine_control_timeout: float = _knob(30.0, "timeout of one engine pause/resume/version call (a pause in mode wait: dispatch_timeout)", "s")
    abort_grace: float = _knob(1.0, "after an abort call (POST /admin/abort) asked an engine to end a request, time the engine gets to answer it with its partial output before the gateway closes the connection (docs/operations.md)", "s")
    abort_answer_grace: float = _knob(2.0, "after the engines answered an abort pause with replay \"continue\", time their abort answers (200 with the tokens so far) get to arrive before the gateway closes what is still open, which is then replayed whole (docs/operations.md)", "s")
    max_continuations: int = _knob(8, "times one generation is continued after abort pauses with replay \"continue\" (docs/operations.md); beyond, its caller gets 503 aborted", "continuations")
    max_migrations: int = _knob(2, "times one generation moves to another engine after its engine failed mid-answer (connection broken, an engine abort no pause asked for), going on from the tokens it had on an engine of the same weight version (docs/operations.md, \"Migration\"); 0 = never: its caller gets 502 upstream_broken", "migrations")
    assemble_answers: bool = _knob(False, "ask the engine for a stream when a caller wants a whole /v1/completions answer, and assemble the answer, so the tokens of an answer its engine broke off are known and it migrates (docs/operations.md, \"Migration\")", "")
    max_outstanding: int = _knob(262144, "requests outstanding (queued + running), and unfinished Tinker samples, beyond which new ones get 429; 0 = unlimited; formerly max_queued", "requests")

    # --- gateway server -------------------------------------------------------
    host: str = _knob("127.0.0.1", "address the gateway listens on", "", "server")
    port: int = _knob(8000, "port the gateway listens on", "", "server")
    api_keys: tuple[str, ...] = _knob((), "client API keys (Bearer on /v1, X-API-Key on /api/v1); empty = open", "keys", "server", repr=False)
    admin_token: str | None = _knob(None, "token required (Bearer) on /admin/*; unset = open", "", "server", repr=False)
    log_level: str = _knob("info", "debug | info | warning | error", "", "server")
    access_log: bool = _knob(True, "one log line per request (engine, status, attempts, queue/engine time)", "", "server")
    shutdown_grace: float = _knob(30.0, "on SIGTERM/SIGINT, time in-flight requests get to finish", "s", "server")
    backlog: int = _knob(4096, "listen backlog (capped by the OS somaxconn)", "connections", "server")
    keep_alive: float = _knob(75.0, "server keep-alive timeout for client connections", "s", "server")
    max_body_size: int = _knob(64 * 1024 * 1024, "largest request body; 413 beyond", "bytes", "server")

    # --- agent sessions (docs/sessions.md) ---------------------------------------
    chat_sessions: bool = _knob(True, "X-Session-Id on POST /v1/chat/completions makes the request a turn of that agent session (n = 1, no structured outputs, no forced tool call: those are forwarded as before); false = the header only routes", "", "server")
    session_ttl: float = _knob(3600.0, "a chat session (X-Session-Id) unused this long is dropped with its trajectory", "s", "server")
    max_sessions: int = _knob(100000, "chat sessions held at most; a new one beyond is refused 429 session_store_full; 0 = unlimited", "sessions", "server")
    session_tokenizer: str | None = _knob(None, "local model directory (tokenizer.json and its chat template) that renders session turns; unset = the engine's POST /tokenize", "path", "server")
    session_tool_parser: str = _knob("hermes", "how tool calls in a session turn's answer are parsed, as vLLM's --tool-call-parser of that name: hermes (<tool_call>{json}</tool_call>: Qwen2.5/Qwen3, Hermes) | qwen3_json (the same) | none (left in the content)", "", "server")

    # --- traces (docs/operations.md, "End-to-end traces") ---------------------
    otlp_endpoint: str | None = _knob(None, "OpenTelemetry collector base URL (http://host:4318): spans go to URL/v1/traces over OTLP/HTTP protobuf; unset = the OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT variables, and no tracing without them (needs the tracing extra)", "URL", "tracing")
    trace_sample_ratio: float | None = _knob(None, "fraction 0..1 of new traces sampled (a client's traceparent decides its own); unset = OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, else all", "ratio", "tracing")
    service_name: str | None = _knob(None, "service.name of the gateway's spans; unset = OTEL_SERVICE_NAME, else trioforward", "", "tracing")
    # --- tenants (docs/dispatch.md, "Tenants and fair queueing") -------------
    tenants: dict[str, TenantSpec] = _knob({}, "the tenant table: [tenants.NAME] keys, weight, priority, max_outstanding (as a string: NAME:keys=K1|K2,weight=3,priority=1,max_outstanding=N;NAME2:...); a key in api_keys but no tenant is a tenant of its own (key-N)", "tenants", "tenants", repr=False)
    default_tenant: str = _knob("default", "the tenant of requests when no key is configured, and of embedded calls that name none", "", "tenants")

    # --- Tinker futures -------------------------------------------------------
    future_hold: float = _knob(30.0, "longest a retrieve_future poll is held before 408", "s", "tinker")
    future_retention: float = _knob(300.0, "how long a delivered result is kept for re-polls", "s", "tinker")
    max_retained_futures: int = _knob(262144, "results kept at most; oldest delivered evicted first (410)", "futures", "tinker")

    # --- fleet mode (docs/fleet.md) -------------------------------------------
    state_url: str | None = _knob(None, "Redis/Valkey URL shared by the fleet: redis://, rediss://, unix://, redis+cluster://HOST:PORT, redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]; unset = no fleet", "URL", "fleet", repr=False)
    fleet_name: str = _knob("trioforward", "processes naming the same state_url and fleet_name are one fleet", "", "fleet")
    workers: int = _knob(1, "worker processes on this box, one listening socket; > 1 without state_url starts a private Valkey", "processes", "fleet")
    lease_interval: float = _knob(0.1, "how often each member publishes its demand and re-splits engine capacity", "s", "fleet")
    member_ttl: float = _knob(1.0, "a member that has not written for this long leaves the fleet (its share returns, its pending futures answer 410); must outlast the longest event-loop stall", "s", "fleet")

    def __post_init__(self) -> None:
        if isinstance(self.tenants, (dict, str)):  # TOML-shaped rows given directly
            object.__setattr__(self, "tenants", coerce("tenants", self.tenants))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if type(value) is list and FIELD_KINDS[f.name][0] is tuple:
                # A list is as good as a tuple (Settings(engines=[...])); kept as a
                # tuple so the settings stay immutable and hashable.
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            validate(f.name, value)
        if self.session_tool_parser not in TOOL_PARSERS:
            raise SettingsError("session_tool_parser", self.session_tool_parser, f"must be one of {', '.join(TOOL_PARSERS)}")
        if self.routing not in ROUTING_POLICIES:
            raise SettingsError("routing", self.routing, f"must be one of {', '.join(ROUTING_POLICIES)}")
        if self.prefix_load_factor < 1:
            raise SettingsError("prefix_load_factor", self.prefix_load_factor, "must be >= 1")
        if self.prefix_tokens < 1:
            raise SettingsError("prefix_tokens", self.prefix_tokens, "must be >= 1")
        if self.affinity_floor < 0:
            raise SettingsError("affinity_floor", self.affinity_floor, "must be >= 0")
        if self.session_affinity_size < 1:
            raise SettingsError("session_affinity_size", self.session_affinity_size, "must be >= 1")
        if self.session_affinity_ttl <= 0:
            raise SettingsError("session_affinity_ttl", self.session_affinity_ttl, "must be > 0")
        if self.load_interval <= 0:
            raise SettingsError("load_interval", self.load_interval, "must be > 0")
        if self.engine_kind not in ENGINE_KINDS:
            raise SettingsError("engine_kind", self.engine_kind, f"must be one of {', '.join(ENGINE_KINDS)}")
        if self.engine_kinds:
            object.__setattr__(self, "engine_kinds", _engine_kinds(self.engine_kinds))
        # Python's level names are upper case (`--log-level DEBUG`): either case is read.
        object.__setattr__(self, "log_level", self.log_level.lower())
        if self.log_level not in LOG_LEVELS:
            raise SettingsError("log_level", self.log_level, f"must be one of {', '.join(LOG_LEVELS)}")
        if not 0 < self.port < 65536:
            raise SettingsError("port", self.port, "must be in 1..65535")
        if self.max_body_size < 1:  # not "0 = unlimited" as elsewhere: 0 refused every body
            raise SettingsError("max_body_size", self.max_body_size, "must be >= 1")
        for url in self.engines:
            _validate_engine_url(url)
        if self.workers < 1:
            raise SettingsError("workers", self.workers, "must be >= 1")
        if self.lease_interval <= 0:
            raise SettingsError("lease_interval", self.lease_interval, "must be > 0")
        if self.member_ttl < 2 * self.lease_interval:
            raise SettingsError("member_ttl", self.member_ttl, "must be at least 2 x lease_interval")
        if not self.fleet_name or any(c in self.fleet_name for c in "{}: "):
            raise SettingsError("fleet_name", self.fleet_name, "must be non-empty, without braces, colons or spaces")
        if self.state_url is not None:
            _validate_state_url(self.state_url)
        if self.otlp_endpoint is not None:
            _validate_otlp_endpoint(self.otlp_endpoint)
        if self.trace_sample_ratio is not None and not 0 <= self.trace_sample_ratio <= 1:
            raise SettingsError("trace_sample_ratio", self.trace_sample_ratio, "must be in 0..1")
        if self.service_name is not None and not self.service_name.strip():
            raise SettingsError("service_name", self.service_name, "must not be empty")
        if not self.default_tenant or len(self.default_tenant) > 64:
            raise SettingsError("default_tenant", self.default_tenant, "must be a tenant name of 1-64 characters")

    @property
    def connections_per_engine(self) -> int:
        """Connection slots per engine: the explicit knob, else the capacity (0 = unlimited)."""
        if self.max_connections_per_engine is not None:
            return self.max_connections_per_engine
        return self.engine_capacity

    @property
    def max_queued(self) -> int:
        """Deprecated name of :attr:`max_outstanding` (warns; removed in the next release)."""
        _deprecated("max_queued")
        return self.max_outstanding

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (validated, coerced like any other source)."""
        return dataclasses.replace(
            self, **{_current(k): coerce(_current(k), v) for k, v in changes.items()}
        )

    @classmethod
    def load(
        cls,
        *,
        config_file: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> Settings:
        """Defaults < TOML file < ``TRIOFORWARD_*`` environment < ``overrides`` (CLI flags).

        The TOML file holds knobs at the top level (or under ``[trioforward]``).
        Unknown keys are an error naming the key. Raises :class:`SettingsError`.
        """
        # The sources' checks read this module's names (an import here, not above).
        from trioforward._settings_sources import knob_table, warn_unknown_variables

        values: dict[str, Any] = {}
        if config_file is not None:
            with open(config_file, "rb") as fh:
                data = tomllib.load(fh)
            data = knob_table(data)
            for key, value in data.items():
                name = _current(key.replace("-", "_"))
                values[name] = coerce(name, value, toml=True)
        env = os.environ if environ is None else environ
        warn_unknown_variables(env)
        for old, new in RENAMED_KNOBS.items():
            raw = env.get(ENV_PREFIX + old.upper())
            if raw is not None:
                _deprecated(ENV_PREFIX + old.upper(), ENV_PREFIX + new.upper())
                values[new] = coerce(new, raw)  # the new name, read next, wins
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = coerce(f.name, raw)
        for key, value in (overrides or {}).items():
            if value is not None:
                values[_current(key)] = coerce(_current(key), value)
        return cls(**values)


def _current(name: str) -> str:
    """``name``, or its new name if it is a renamed knob (warns)."""
    new = RENAMED_KNOBS.get(name)
    if new is None:
        return name
    _deprecated(name)
    return new


def _deprecated(old: str, new: str | None = None) -> None:
    new = new or RENAMED_KNOBS[old]
    warnings.warn(
        f"setting {old!r} is deprecated, use {new!r} (it is removed in the next release)",
        FutureWarning,
        stacklevel=4,
    )


@dataclass(frozen=True, slots=True)
class Knob:
    """One knob, as the CLI, environment and docs see it.

    ``kind`` is the value's type (``int``, ``float``, ``bool``, ``str``, ``tuple``
    of strings or ``dict`` of name to path); ``optional``: ``None`` (unset) is
    allowed.
    """

    name: str
    default: Any
    kind: type
    optional: bool
    help: str
    unit: str
    group: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def type_name(self) -> str:
        """The type in words, for the docs (``"int"``, ``"list of strings"`` ...)."""
        return TYPE_NAMES.get(self.kind, self.kind.__name__)


# Read from the annotations (resolved, not their text) once, at import.
FIELD_KINDS.update({name: kind_of(name, hint) for name, hint in get_type_hints(Settings).items()})


def knobs() -> list[Knob]:
    """Every knob with its default, type, help text, unit and group."""
    out = []
    for f in dataclasses.fields(Settings):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        kind, optional = FIELD_KINDS[f.name]
        out.append(
            Knob(f.name, default, kind, optional, f.metadata["help"], f.metadata["unit"], f.metadata["group"])
        )
    return out


def _validate_state_url(url: str) -> None:
    try:
        check_state_url(url)
    except StateURLError as exc:
        # The value is redacted: a state URL may carry a password.
        raise SettingsError("state_url", redact_url(url), exc.reason) from None


def _engine_kinds(kinds: dict[str, str]) -> dict[str, str]:
    """``engine_kinds`` keyed as the registry keys engines (docs/server.md, "Engine URLs")."""
    from trioforward._engine_url import EngineURLError, engine_url

    out: dict[str, str] = {}
    for url, kind in kinds.items():
        if kind not in ENGINE_KINDS[1:4]:
            raise SettingsError("engine_kinds", {url: kind}, f"a kind must be one of {', '.join(ENGINE_KINDS[1:4])}")
        try:
            out[engine_url(url)] = kind
        except EngineURLError as exc:
            raise SettingsError("engine_kinds", url, exc.reason) from None
    return out


def _validate_engine_url(url: str) -> None:
    from trioforward._engine_url import EngineURLError, engine_url

    try:
        engine_url(url)
    except EngineURLError as exc:
        raise SettingsError("engines", url, exc.reason) from None


def _validate_otlp_endpoint(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError("otlp_endpoint", url, "must be an http:// or https:// URL with a host (the collector's base URL, e.g. http://127.0.0.1:4318)")
    if parts.path.rstrip("/").endswith("/v1/traces"):
        raise SettingsError("otlp_endpoint", url, "is the base URL: /v1/traces is added (give http://host:4318)")
