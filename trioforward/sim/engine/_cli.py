"""``trioforward sim-engine``: run a simulated vLLM-compatible engine in the foreground."""

from __future__ import annotations

import math

import click
import trio

from trioforward.sim.engine._open import open_engine
from trioforward.sim.physics._physics import PROFILES

__all__ = ["sim_engine"]


def _pairs(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"expected NAME=PATH, got {value!r}", param_hint=flag)
        out[name] = path
    return out


# Times and rates are non-negative: a bad value is a usage error (exit 2), not a traceback.
_SECONDS = click.FloatRange(min=0)


@click.command("sim-engine")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="ADDRESS", help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), required=True, metavar="PORT", help="Port to bind (0 = any free port; printed).")
@click.option(
    "--capacity",
    "--max-num-seqs",
    "capacity",
    type=click.IntRange(min=0),
    default=256,
    show_default=True,
    metavar="REQUESTS",
    help="Requests (with --profile: sequences) run at once (vLLM --max-num-seqs); 0 = unlimited.",
)
@click.option(
    "--prefill-ms-per-token",
    type=_SECONDS,
    metavar="MS",
    default=0.0,
    show_default=True,
    help="Prefill time per prompt token (ms).",
)
@click.option(
    "--decode-ms-per-token",
    type=_SECONDS,
    metavar="MS",
    default=0.0,
    show_default=True,
    help="Time per decode step (ms); both 0 = instant.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="Base model name (repeatable; default sim-base and sim-base-2).",
)
@click.option(
    "--adapter",
    "adapters",
    multiple=True,
    metavar="NAME=PATH",
    help="An adapter the engine can find (lazy mode); repeatable.",
)
@click.option(
    "--lora-module",
    "lora_modules",
    multiple=True,
    metavar="NAME=PATH",
    help="An adapter loaded at start; repeatable.",
)
@click.option(
    "--lazy-adapters",
    type=_SECONDS,
    default=None,
    metavar="SECONDS",
    help="Load a findable adapter by itself this long after its first request.",
)
@click.option(
    "--keep-alive", type=_SECONDS, default=5.0, show_default=True, metavar="SECONDS", help="Idle keep-alive timeout (s)."
)
@click.option(
    "--no-runtime-lora",
    is_flag=True,
    help='Disable the load/unload endpoints (404 {"detail": "Not Found"}).',
)
@click.option(
    "--unknown-model-status",
    type=click.Choice(["404", "400"]),
    default="404",
    show_default=True,
    help="Status for an unknown model or unloaded adapter.",
)
@click.option(
    "--adapter-load-seconds",
    type=_SECONDS,
    metavar="SECONDS",
    default=0.0,
    show_default=True,
    help="Time a load request takes (s).",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=1),
    default=None,
    metavar="TOKENS",
    help="Model length (vLLM --max-model-len): longer prompts 400, longer outputs cut; default unlimited.",
)
@click.option(
    "--prefix-cache-tokens",
    type=click.IntRange(min=0),
    metavar="TOKENS",
    default=0,
    show_default=True,
    help="Prefix cache capacity in tokens (vLLM automatic prefix caching, LRU); 0 = no cache.",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    metavar="TOKENS",
    default=16,
    show_default=True,
    help="Prefix cache block size in tokens (vLLM --block-size).",
)
@click.option(
    "--kind",
    type=click.Choice(["vllm", "sglang", "none", "openai"]),
    default="vllm",
    show_default=True,
    help="The engine simulated: vLLM 0.32 in dev mode (/pause ...), SGLang's native API (/generate, /pause_generation ...), vLLM without dev mode (none) or a plain OpenAI-compatible server.",
)
@click.option(
    "--enable-scale-out",
    "scale_out",
    is_flag=True,
    help="A vLLM kind also serves POST /inference/v1/generate and /inference/v1/abort_requests (vLLM 0.32's flag).",
)
@click.option(
    "--profile",
    type=click.Choice(sorted(PROFILES)),
    default=None,
    help="Engine model: step time from batch and KV, chunked prefill, KV budget, preemption (docs/sim.md, \"Engine model\").",
)
@click.option(
    "--kv-cache-tokens",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="TOKENS",
    help="KV cache budget in tokens, in blocks of --block-size, shared with the prefix cache; 0 = unlimited (needs --profile).",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    metavar="X",
    help="Wall seconds per modelled second with --profile (0.01 = 100x faster).",
)
def sim_engine(
    host: str,
    port: int,
    capacity: int,
    prefill_ms_per_token: float,
    decode_ms_per_token: float,
    models: tuple[str, ...],
    adapters: tuple[str, ...],
    lora_modules: tuple[str, ...],
    lazy_adapters: float | None,
    keep_alive: float,
    no_runtime_lora: bool,
    unknown_model_status: str,
    adapter_load_seconds: float,
    max_model_len: int | None,
    prefix_cache_tokens: int,
    block_size: int,
    kind: str,
    scale_out: bool,
    profile: str | None,
    kv_cache_tokens: int,
    time_scale: float,
) -> None:
    """Run a simulated vLLM-compatible engine (faults: POST /sim/faults; counters: GET /sim/stats)."""
    options = dict(
        host=host,
        port=port,
        capacity=capacity,
        prefill_ms_per_token=prefill_ms_per_token,
        decode_ms_per_token=decode_ms_per_token,
        models=models or ("sim-base", "sim-base-2"),
        adapters=_pairs(adapters, "--adapter"),
        lora_modules=_pairs(lora_modules, "--lora-module"),
        lazy_adapters=lazy_adapters,
        keep_alive=keep_alive,
        runtime_lora=not no_runtime_lora,
        unknown_model_status=int(unknown_model_status),
        adapter_load_seconds=adapter_load_seconds,
        max_model_len=max_model_len,
        prefix_cache_tokens=prefix_cache_tokens,
        block_size=block_size,
        kind=kind,
        scale_out=scale_out,
        profile=profile,
        kv_cache_tokens=kv_cache_tokens,
        time_scale=time_scale,
    )
    if kv_cache_tokens and profile is None:
        raise click.BadParameter("needs --profile (the engine model)", param_hint="--kv-cache-tokens")
    if 0 < kv_cache_tokens < block_size:
        raise click.BadParameter(
            f"must hold at least one block ({block_size} tokens)", param_hint="--kv-cache-tokens"
        )
    if 0 < prefix_cache_tokens < block_size:
        raise click.BadParameter(
            f"must hold at least one block ({block_size} tokens)", param_hint="--prefix-cache-tokens"
        )

    listening = False

    async def run() -> None:
        nonlocal listening
        async with open_engine(**options) as engine:  # type: ignore[arg-type]
            listening = True
            click.echo(
                f"sim-engine listening on {engine.url} (models: {', '.join(engine.adapters.base)})",
                err=True,
            )
            await trio.sleep(math.inf)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        pass
    except (OSError, BaseExceptionGroup) as exc:
        error = _sole_os_error(exc)
        if listening or error is None:
            raise
        # e.g. the port is taken: one line, exit 1 (as trioforward serve), no traceback
        raise click.ClickException(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def _sole_os_error(exc: BaseException) -> OSError | None:
    """The one ``OSError`` ``exc`` is or wraps (trio nurseries group errors), else ``None``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None
