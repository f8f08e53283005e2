"""Probe requests whose answers from a real vLLM are recorded in vllm_0_32_fixtures/.

Each probe runs against one of two engines, in this order:

- ``"base"``: ``--served-model-name tiny --max-model-len 256``, no LoRA;
- ``"lora"``: the same plus ``--enable-lora --max-loras 2``, runtime LoRA
  updating and the filesystem resolver (``VLLM_LORA_RESOLVER_CACHE_DIR={dir}/resolver``),
  adapters ``a1``, ``a2``, ``a3`` in ``{dir}/loras/`` and, in the resolver
  directory, ``res1`` (an adapter), ``broken`` (corrupt weights),
  ``notanadapter`` (no adapter_config.json) and ``badbase`` (another base model).

``{dir}`` in a probe body is the directory holding them. The recorder
(tests/real_engine/record_vllm.py) writes ``NAME.json`` (``{status,
content_type, body}``) or, for a stream, ``NAME.txt`` (``HTTP STATUS``, the
headers, then the raw SSE body); the contract test
(tests/sim/test_vllm_contract.py) sends the same probes to the simulated engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "vllm_0_32_fixtures"
MODEL = "tiny"
MAX_MODEL_LEN = 256
PROMPT_IDS = [0, 413, 14, 355]  # "<s>Hello, how" in the tiny tokenizer
LONG_PROMPT_IDS = [7] * 250  # 250 + max_tokens 50 > 256: cut, not refused
TOO_LONG_PROMPT_IDS = [7] * 300  # > 256: refused


@dataclass(frozen=True)
class Probe:
    name: str
    path: str
    body: Any = None  # a JSON value, or bytes sent as they are; None = GET
    engine: str = "base"
    stream: bool = False
    sim: str | None = None  # why the simulated engine is not held to this answer

    @property
    def method(self) -> str:
        return "GET" if self.body is None else "POST"

    def content(self, directory: str) -> bytes:
        """The request body with ``{dir}`` replaced by ``directory``."""
        import orjson

        if isinstance(self.body, bytes):
            return self.body
        return orjson.dumps(self.body).replace(b"{dir}", directory.encode())


def _cmpl(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 8, "temperature": 0, **fields}


def _chat(**fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hello, how are you?"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, **fields}


def _tokens(**params: Any) -> dict[str, Any]:
    """A body of vLLM's token route (on with ``--enable-scale-out``)."""
    return {"token_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 8, "temperature": 0, **params}}


def _load(name: str, path: str, **fields: Any) -> dict[str, Any]:
    return {"lora_name": name, "lora_path": path, **fields}


C, CHAT = "/v1/completions", "/v1/chat/completions"
GEN, ABORT = "/inference/v1/generate", "/inference/v1/abort_requests"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
USAGE = {"include_usage": True}
NO_ROUTE = "the gateway never calls this route, so the sim does not serve it"

PROBES: list[Probe] = [
    Probe("health", "/health"),
    Probe("models", "/v1/models"),
    Probe("completion_text_prompt", C, _cmpl(prompt="Hello, how are you?")),
    Probe(
        "completion_tokenids_logprobs",
        C,
        _cmpl(logprobs=0, prompt_logprobs=1, return_token_ids=True),
    ),
    Probe("completion_n2_seed", C, _cmpl(n=2, seed=7, temperature=1.0, logprobs=1, return_token_ids=True)),
    Probe("completion_batch_prompts", C, _cmpl(prompt=["Hello", "Hi there"], max_tokens=4)),
    Probe(
        "completion_stream",
        C,
        _cmpl(stream=True, stream_options=USAGE, logprobs=0, return_token_ids=True),
        stream=True,
    ),
    Probe(
        "completion_stream_n2_nousage",
        C,
        _cmpl(stream=True, n=2, seed=3, temperature=1.0, max_tokens=4),
        stream=True,
    ),
    # A boolean "logprobs" (some clients send it): vLLM's pydantic model reads it as
    # the int it coerces to, true = 1, false = 0 (logprobs of the sampled token).
    Probe("completion_logprobs_true", C, _cmpl(logprobs=True, max_tokens=3)),
    Probe("completion_logprobs_false", C, _cmpl(logprobs=False, max_tokens=3)),
    Probe("chat", CHAT, _chat(logprobs=True, top_logprobs=1, return_token_ids=True)),
    Probe("chat_stream", CHAT, _chat(stream=True, stream_options=USAGE, max_tokens=4), stream=True),
    # return_tokens_as_token_ids: logprob tokens as "token_id:<id>" (AReaL asks for it)
    Probe(
        "completion_tokens_as_ids",
        C,
        _cmpl(logprobs=1, return_token_ids=True, return_tokens_as_token_ids=True),
    ),
    Probe(
        "completion_stream_tokens_as_ids",
        C,
        _cmpl(stream=True, logprobs=1, max_tokens=4, return_tokens_as_token_ids=True),
        stream=True,
    ),
    Probe("chat_tokens_as_ids", CHAT, _chat(logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)),
    Probe("no_model_field", C, {"prompt": "Hi", "max_tokens": 2}),
    Probe("err_unknown_model", C, _cmpl(model="nope")),
    Probe("err_unknown_model_chat", CHAT, _chat(model="nope")),
    Probe("err_stream_unknown_model", C, _cmpl(model="nope", stream=True), stream=True),
    Probe("err_missing_prompt", C, {"model": MODEL, "max_tokens": 4}),
    Probe("err_invalid_json", C, b"{bad json"),
    Probe("err_bad_param_max_tokens_type", C, _cmpl(max_tokens="x")),
    Probe("err_bad_param_temperature", C, _cmpl(temperature=-1)),
    Probe("err_bad_logprobs_too_many", C, _cmpl(logprobs=50)),
    Probe("err_token_id_out_of_vocab", C, _cmpl(prompt=[1, 99999])),
    Probe("err_too_long_prompt", C, _cmpl(prompt=TOO_LONG_PROMPT_IDS)),
    Probe("err_prompt_plus_max_tokens_too_long", C, _cmpl(prompt=LONG_PROMPT_IDS, max_tokens=50)),
    Probe("version", "/version", sim=NO_ROUTE),
    Probe("tokenize", "/tokenize", {"model": MODEL, "prompt": "Hello, how are you?"}, sim=NO_ROUTE),
    Probe("detokenize", "/detokenize", {"model": MODEL, "tokens": PROMPT_IDS}, sim=NO_ROUTE),
    Probe("lora_load_route_disabled", LOAD, _load("a1", "{dir}/loras/a1")),
    # -- vLLM's token route, on the base engine (--enable-scale-out) --
    Probe("tokens_generate", GEN, _tokens()),
    Probe("tokens_generate_logprobs", GEN, {**_tokens(logprobs=1), "request_id": "probe-lp"}),
    Probe("tokens_generate_n2_seed", GEN, _tokens(n=2, seed=7, temperature=1.0, max_tokens=4)),
    Probe("tokens_generate_model", GEN, {**_tokens(max_tokens=2), "model": MODEL}),
    # Not a field of the token route: ignored, its logprobs keep integer token_id.
    Probe("tokens_generate_tokens_as_ids", GEN, {**_tokens(logprobs=1), "return_tokens_as_token_ids": True}),
    Probe(
        "tokens_generate_stream",
        GEN,
        {**_tokens(logprobs=0), "stream": True, "stream_options": USAGE},
        stream=True,
    ),
    # No max_tokens: the generation runs to the model length (252 = 256 - 4 here),
    # not /v1/completions' default of 16.
    Probe("tokens_generate_no_max_tokens", GEN, {"token_ids": PROMPT_IDS, "sampling_params": {"temperature": 0}}),
    Probe("tokens_err_missing_token_ids", GEN, {"sampling_params": {"max_tokens": 2}}),
    Probe("tokens_err_token_ids_type", GEN, {**_tokens(), "token_ids": "hello"}),
    Probe("tokens_err_missing_sampling_params", GEN, {"token_ids": PROMPT_IDS}),
    Probe("tokens_err_invalid_json", GEN, b"{bad json"),
    Probe("tokens_err_max_tokens_type", GEN, _tokens(max_tokens="x")),
    Probe("tokens_err_unknown_model", GEN, {**_tokens(), "model": "nope"}),
    Probe("tokens_err_out_of_vocab", GEN, {**_tokens(), "token_ids": [1, 99999]}),
    Probe("tokens_err_too_long_prompt", GEN, {**_tokens(), "token_ids": TOO_LONG_PROMPT_IDS}),
    Probe(
        "tokens_prompt_plus_max_tokens_too_long",
        GEN,
        {**_tokens(max_tokens=50), "token_ids": LONG_PROMPT_IDS},
    ),
    Probe("tokens_abort_unknown_id", ABORT, {"request_ids": ["nobody"]}),
    Probe("tokens_abort_missing_ids", ABORT, {}),
    # -- the LoRA engine, in order (each step depends on the ones before) --
    Probe("lora_models_before", "/v1/models", engine="lora"),
    Probe("lora_unknown_adapter_before_load", C, _cmpl(model="a1"), engine="lora"),
    Probe("lora_load_a1", LOAD, _load("a1", "{dir}/loras/a1"), engine="lora"),
    Probe("lora_load_a1_again", LOAD, _load("a1", "{dir}/loras/a1"), engine="lora"),
    Probe(
        "lora_load_a1_again_inplace",
        LOAD,
        _load("a1", "{dir}/loras/a1", load_inplace=True),
        engine="lora",
    ),
    Probe("lora_load_a2", LOAD, _load("a2", "{dir}/loras/a2"), engine="lora"),
    Probe("lora_load_a3_beyond_max_loras", LOAD, _load("a3", "{dir}/loras/a3"), engine="lora"),
    Probe("lora_load_base_name_conflict", LOAD, _load(MODEL, "{dir}/loras/a1"), engine="lora"),
    Probe("lora_load_missing_field", LOAD, {"lora_name": "m0"}, engine="lora"),
    Probe("lora_load_missing_path", LOAD, _load("m1", "{dir}/missing/m1"), engine="lora"),
    Probe("lora_load_not_adapter_dir", LOAD, _load("m2", "{dir}/not_an_adapter"), engine="lora"),
    Probe(
        "lora_load_corrupt_weights",
        LOAD,
        _load("c1", "{dir}/corrupt"),
        engine="lora",
        sim="the sim reads no weights, so none can be corrupt",
    ),
    Probe("lora_base_completion", C, _cmpl(return_token_ids=True), engine="lora"),
    Probe(
        "lora_completion_a1", C, _cmpl(model="a1", logprobs=0, return_token_ids=True), engine="lora"
    ),
    Probe("lora_completion_a2", C, _cmpl(model="a2", return_token_ids=True), engine="lora"),
    Probe("lora_completion_a3", C, _cmpl(model="a3", return_token_ids=True), engine="lora"),
    Probe("lora_chat_a1", CHAT, _chat(model="a1", max_tokens=4), engine="lora"),
    Probe("lora_unload_a2", UNLOAD, {"lora_name": "a2"}, engine="lora"),
    Probe("lora_unload_a2_again", UNLOAD, {"lora_name": "a2"}, engine="lora"),
    Probe("lora_completion_a2_after_unload", C, _cmpl(model="a2"), engine="lora"),
    Probe("lora_models_after", "/v1/models", engine="lora"),
    Probe("resolver_first_request_res1", C, _cmpl(model="res1", return_token_ids=True), engine="lora"),
    Probe(
        "resolver_second_request_res1", C, _cmpl(model="res1", return_token_ids=True), engine="lora"
    ),
    Probe("resolver_chat_res1", CHAT, _chat(model="res1", max_tokens=4), engine="lora"),
    Probe("resolver_models_after", "/v1/models", engine="lora"),
    Probe("resolver_missing_subfolder", C, _cmpl(model="nosuch"), engine="lora"),
    Probe("resolver_notanadapter", C, _cmpl(model="notanadapter"), engine="lora"),
    Probe("resolver_badbase", C, _cmpl(model="badbase"), engine="lora"),
    Probe(
        "resolver_broken_weights",
        C,
        _cmpl(model="broken"),
        engine="lora",
        sim="the sim reads no weights, so none can be corrupt",
    ),
    Probe("resolver_stream_unknown", C, _cmpl(model="nosuch2", stream=True), engine="lora"),
]
