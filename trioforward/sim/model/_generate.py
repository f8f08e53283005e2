"""The simulated model: deterministic tokens and logprobs (no I/O, no trio).

Everything the simulated engine generates is a pure function of
``(model, prompt, seed, index)``, so a test anywhere can predict an answer with
:func:`expected_completion` and :func:`expected_prompt_logprobs`.

- Vocabulary: token ids ``0 .. VOCAB_SIZE-1``; a token renders as ``" t<id>"``
  (:func:`render_token`), so text is ``"".join(render_token(t) for t in tokens)``.
- A string prompt is tokenized as its UTF-8 bytes (ids 0..255): :func:`tokenize`.
- Logprobs are ``-k / 2**22`` for a 24-bit ``k``: always in ``(-4, 0]`` and
  exactly representable as float32, so numpy ``float32`` arrays compare equal.
- The per-sequence stream is SplitMix64 seeded from a BLAKE2b hash of the
  model name, the seed (``str(seed)``, so ``None`` is its own seed), the choice
  index and the prompt ids (as int64). No Python ``hash()``: outputs are the
  same in every process.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b
from typing import NamedTuple

__all__ = [
    "VOCAB_SIZE",
    "Sample",
    "tokenize",
    "render_token",
    "render_text",
    "sample",
    "scripted_sample",
    "expected_completion",
    "expected_tokens",
    "expected_prompt_logprobs",
    "expected_top_logprobs",
]

VOCAB_SIZE = 32000
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_LP_SCALE = float(1 << 22)


class Sample(NamedTuple):
    """One generated sequence.

    ``tokens``/``logprobs``: generated ids and their logprobs, same length,
    a matching stop token included; ``finish_reason``: ``"stop"`` or
    ``"length"``; ``stop_reason``: the stop token id or stop string, else None;
    ``text``: the rendered text (a stop token id or stop string excluded, as vLLM).
    """

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: int | str | None
    text: str
    #: A scripted reply (:func:`scripted_sample`): one character of ``text`` a token.
    scripted: bool = False


def tokenize(text: str) -> list[int]:
    """A string prompt's token ids: its UTF-8 bytes."""
    return list(text.encode())


def render_token(token: int) -> str:
    """The text of one token id: ``" t<id>"``."""
    return f" t{token}"


def render_text(tokens: Sequence[int]) -> str:
    """The text of a token sequence."""
    return "".join([f" t{t}" for t in tokens])


def _mix(z: int) -> int:
    # SplitMix64 finalizer (Steele, Lea, Flood 2014).
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _seed(*parts: object, prompt: Sequence[int] = ()) -> int:
    h = blake2b(digest_size=8)
    h.update("\0".join(map(str, parts)).encode())
    h.update(b"\0")
    h.update(array("q", prompt).tobytes())
    return int.from_bytes(h.digest(), "little")


def sample(
    model: str,
    prompt: Sequence[int],
    seed: int | None,
    index: int,
    max_tokens: int,
    stop_token_ids: Sequence[int] = (),
    stop: Sequence[str] = (),
) -> Sample:
    """Generate one sequence (choice ``index``) for ``prompt`` on ``model``.

    Stops after ``max_tokens`` tokens (``"length"``), at the first token in
    ``stop_token_ids`` (``"stop"``, token kept in ``tokens``, not in ``text``),
    or once the text contains a string of ``stop`` (``"stop"``, text cut before
    it, tokens kept up to the one completing it).
    """
    base = _seed(model, seed, index, prompt=prompt)
    tokens: list[int] = []
    logprobs: list[float] = []
    stops = set(stop_token_ids)
    finish, reason = "length", None
    text_parts: list[str] = []
    for i in range(max_tokens):
        z = _mix((base + (i + 1) * _GOLDEN) & _M64)
        token = z % VOCAB_SIZE
        tokens.append(token)
        logprobs.append(-(z >> 40) / _LP_SCALE)
        if token in stops:
            finish, reason = "stop", token
            break
        if stop:
            text_parts.append(f" t{token}")
            joined = "".join(text_parts)
            hit = min(((joined.find(s), s) for s in stop if s and s in joined), default=None)
            if hit is not None:
                return Sample(tokens, logprobs, "stop", hit[1], joined[: hit[0]])
    if finish == "stop":
        return Sample(tokens, logprobs, finish, reason, render_text(tokens[:-1]))
    return Sample(tokens, logprobs, finish, reason, render_text(tokens))


def scripted_sample(
    model: str, prompt: Sequence[int], seed: int | None, text: str, max_tokens: int
) -> Sample:
    """A scripted reply (docs/sim.md, "Scripted replies"): ``text`` (ASCII) as its
    byte ids (:func:`tokenize`), cut after ``max_tokens`` (``"length"``, else
    ``"stop"`` with no stop token, the sim having no end-of-sequence token);
    logprobs drawn as :func:`sample` draws them. Raises ``ValueError`` for a
    non-ASCII ``text``."""
    if not text.isascii():
        raise ValueError(f"a scripted reply is ASCII text (got {text!r})")
    ids = tokenize(text)[:max_tokens]
    base = _seed(model, seed, 0, prompt=prompt)
    lps = [-(_mix((base + (i + 1) * _GOLDEN) & _M64) >> 40) / _LP_SCALE for i in range(len(ids))]
    finish = "stop" if len(ids) == len(text) else "length"
    return Sample(ids, lps, finish, None, text[: len(ids)], scripted=True)


def expected_completion(
    model: str,
    prompt: Sequence[int] | str,
    seed: int | None,
    index: int,
    max_tokens: int,
    stop_token_ids: Sequence[int] = (),
) -> tuple[list[int], list[float], str]:
    """``(tokens, logprobs, finish_reason)`` the engine generates for choice ``index``.

    ``prompt`` is token ids or a string (tokenized by :func:`tokenize`).
    """
    ids = tokenize(prompt) if isinstance(prompt, str) else prompt
    s = sample(model, ids, seed, index, max_tokens, stop_token_ids)
    return s.tokens, s.logprobs, s.finish_reason


def expected_tokens(
    model: str, prompt: Sequence[int] | str, seed: int | None, index: int, max_tokens: int
) -> list[int]:
    """Just the token ids of :func:`expected_completion` (no stop tokens)."""
    return expected_completion(model, prompt, seed, index, max_tokens)[0]


def expected_top_logprobs(token: int, logprob: float, k: int) -> dict[str, float]:
    """The ``top_logprobs`` entry of one generated token for ``logprobs=k``.

    The sampled token plus ``k`` alternatives (at most ``k + 1`` entries, keys
    are rendered token texts), the alternatives' logprobs below the sampled one.
    """
    top = {f" t{token}": logprob}
    for j in range(1, k + 1):
        alt = (token + 7919 * j) % VOCAB_SIZE
        top.setdefault(f" t{alt}", logprob - 0.125 * j)
    return top


def expected_prompt_logprobs(
    model: str, prompt: Sequence[int] | str, k: int = 0
) -> list[dict[str, dict[str, float | int | str]] | None]:
    """vLLM's ``prompt_logprobs`` list for ``prompt``: ``None`` first, then one dict per position.

    Each dict maps ``str(token_id)`` to ``{"logprob", "rank", "decoded_token"}``:
    the prompt token itself (rank 1..4, logprob in ``(-4, 0]``) plus the tokens
    of ranks ``1..k`` other than the prompt token's rank, logprobs ordered by rank.
    """
    ids = tokenize(prompt) if isinstance(prompt, str) else prompt
    if not ids:
        return []
    base = _seed(model, "prompt", prompt=ids)
    out: list[dict[str, dict[str, float | int | str]] | None] = [None]
    for i in range(1, len(ids)):
        token = ids[i]
        z = _mix((base + i * _GOLDEN) & _M64)
        rank = 1 + (z & 3)
        lp = -(rank << 18) / _LP_SCALE - (z >> 44) / _LP_SCALE
        entry: dict[str, dict[str, float | int | str]] = {
            str(token): {"logprob": lp, "rank": rank, "decoded_token": f" t{token}"}
        }
        for j in range(1, k + 1):
            if j == rank:
                continue
            alt = (token + 104729 * j) % VOCAB_SIZE
            if str(alt) in entry:
                continue
            entry[str(alt)] = {
                "logprob": lp + (rank - j) / 32.0,
                "rank": j,
                "decoded_token": f" t{alt}",
            }
        out.append(entry)
    return out
