"""The bytes a Tinker ``retrieve_future`` answers with, encoded once per result.

A finished sample is the SDK's protobuf ``SampleResponse`` (content type
``application/x-protobuf``; SDK >= 0.25 refuses JSON for samples). The schema is
re-declared here from its field numbers, as the public SDK's
``tinker/proto/tinker_public_pb2.py`` defines them (checked against the SDK's own
decoder in tests/server/tinker/test_wire.py):

- ``SampleResponse``: 1 ``sequences`` (repeated ``SampledSequence``), 2
  ``prompt_logprobs`` (optional bytes: float32 little-endian, NaN where undefined),
  4 ``prompt_cache_hit_tokens`` (int32).
- ``SampledSequence``: 1 ``stop_reason`` (enum: 0 stop, 1 length), 2 ``tokens``
  (bytes: int32 little-endian), 3 ``logprobs`` (optional bytes: float32 LE).

The messages live in a private descriptor pool under their own package name, so
they never clash with the SDK's generated module when both are imported; the
package name is not part of the wire format.

A failed sample is the SDK's JSON error object ``{"error": str, "category":
"user" | "server"}`` (``tinker.types.RequestErrorCategory``), terminal for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "PROTOBUF",
    "JSON",
    "STOP",
    "LENGTH",
    "encode_sample_response",
    "encode_error",
    "TRY_AGAIN",
]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# SampledSequence.stop_reason enum values (tinker_public.StopReason).
STOP = 0
LENGTH = 1

# Body of a 408 answer to a poll held past its limit: the SDK reads
# ``queue_state`` from it for its progress observer and re-polls at once.
TRY_AGAIN = orjson.dumps({"type": "try_again", "queue_state": "active"})

_F = descriptor_pb2.FieldDescriptorProto


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    kind: int,
    *,
    repeated: bool = False,
    type_name: str = "",
    optional_oneof: int | None = None,
) -> None:
    f = msg.field.add(name=name, number=number, type=kind)
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        f.type_name = type_name
    if optional_oneof is not None:
        # proto3 ``optional``: a synthetic one-field oneof, so presence is tracked
        # and an empty-but-set value is still written.
        f.oneof_index = optional_oneof
        f.proto3_optional = True


def _build() -> tuple[type[Any], type[Any]]:
    fd = descriptor_pb2.FileDescriptorProto(
        name="trioforward_tinker_wire.proto", package="trioforward_tinker", syntax="proto3"
    )
    enum = fd.enum_type.add(name="StopReason")
    enum.value.add(name="STOP_REASON_STOP", number=STOP)
    enum.value.add(name="STOP_REASON_LENGTH", number=LENGTH)

    seq = fd.message_type.add(name="SampledSequence")
    seq.oneof_decl.add(name="_logprobs")
    _field(seq, "stop_reason", 1, _F.TYPE_ENUM, type_name=".trioforward_tinker.StopReason")
    _field(seq, "tokens", 2, _F.TYPE_BYTES)
    _field(seq, "logprobs", 3, _F.TYPE_BYTES, optional_oneof=0)

    resp = fd.message_type.add(name="SampleResponse")
    resp.oneof_decl.add(name="_prompt_logprobs")
    _field(
        resp,
        "sequences",
        1,
        _F.TYPE_MESSAGE,
        repeated=True,
        type_name=".trioforward_tinker.SampledSequence",
    )
    _field(resp, "prompt_logprobs", 2, _F.TYPE_BYTES, optional_oneof=0)
    _field(resp, "prompt_cache_hit_tokens", 4, _F.TYPE_INT32)

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    classes = message_factory.GetMessages([fd], pool=pool)
    return (
        classes["trioforward_tinker.SampleResponse"],
        classes["trioforward_tinker.SampledSequence"],
    )


SampleResponse, SampledSequence = _build()


def _le(array: np.ndarray, dtype: str) -> bytes:
    """The array as contiguous little-endian bytes of ``dtype`` ("<i4" or "<f4")."""
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def encode_sample_response(
    sequences: Sequence[tuple[np.ndarray, np.ndarray | None, int]],
    prompt_logprobs: np.ndarray | None = None,
    prompt_cache_hit_tokens: int = 0,
) -> bytes:
    """One ``SampleResponse`` as protobuf bytes.

    ``sequences``: per sample ``(tokens, logprobs, stop_reason)`` with ``tokens``
    int (n,), ``logprobs`` float (n,) or ``None``, ``stop_reason`` :data:`STOP` or
    :data:`LENGTH`. ``prompt_logprobs``: float (len(prompt),), NaN where
    undefined (position 0), or ``None`` when not asked for.
    """
    msg = SampleResponse(prompt_cache_hit_tokens=prompt_cache_hit_tokens)
    for tokens, logprobs, stop_reason in sequences:
        seq = msg.sequences.add(stop_reason=stop_reason, tokens=_le(tokens, "<i4"))
        if logprobs is not None:
            seq.logprobs = _le(logprobs, "<f4")
    if prompt_logprobs is not None:
        msg.prompt_logprobs = _le(prompt_logprobs, "<f4")
    data: bytes = msg.SerializeToString()
    return data


def encode_error(message: str, category: str) -> bytes:
    """The SDK's failed-request object; ``category`` is "user" or "server"."""
    return orjson.dumps({"error": message, "category": category})
