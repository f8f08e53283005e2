"""A session as a trajectory a trainer trains on (docs/sessions.md, "Trajectories").

``trajectory_json(session)`` is what ``GET /v1/sessions/{id}`` answers and what
one JSONL export line holds::

    {"id", "tenant", "created", "last_used", "rewards": {name: float},
     "branch_points": [turn, ...],
     "turns": [{"turn", "prompt_token_ids", "token_ids", "logprobs", "new_start",
                "branch", "branch_reason", "weight_versions", "started",
                "finished", "queue_time", "engine_time", "engine",
                "finish_reason", "reward"}],
     "sequences": [{"turns": [first, last], "token_ids", "loss_mask", "logprobs"}]}

A *sequence* is one linear run of turns (a first turn or a branch starts one):
its ``token_ids`` are the run's last prompt plus the last sampled ids, which
hold every earlier turn of the run token for token; ``loss_mask`` is 1 on the
ids the model sampled and 0 on the template's and the environment's;
``logprobs`` the model's logprob of each sampled id, 0 where the mask is 0.
:func:`sequence_arrays` gives the same as numpy arrays (``int32``, ``int8``,
``float32``, shape ``(L,)``). Times are Unix seconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from trioforward.sessions._store import Session, Turn

__all__ = ["trajectory_json", "sequence_arrays"]


def _runs(turns: list[Turn]) -> list[tuple[int, int]]:
    starts = [i for i, t in enumerate(turns) if i == 0 or t.branch]
    ends = [s - 1 for s in starts[1:]] + [len(turns) - 1]
    return list(zip(starts, ends, strict=True)) if turns else []


def sequence_arrays(session: Session) -> list[dict[str, Any]]:
    """Each linear run as ``{"turns": (first, last), "token_ids": int32 (L,),
    "loss_mask": int8 (L,), "logprobs": float32 (L,)}``."""
    out = []
    for first, last in _runs(session.turns):
        end = session.turns[last]
        ids = np.concatenate([end.prompt_ids, end.token_ids])
        mask = np.zeros(len(ids), dtype=np.int8)
        lps = np.zeros(len(ids), dtype=np.float32)
        for turn in session.turns[first : last + 1]:
            start = len(turn.prompt_ids)
            stop = start + len(turn.token_ids)
            mask[start:stop] = 1
            lps[start:stop] = turn.logprobs
        out.append({"turns": (first, last), "token_ids": ids, "loss_mask": mask, "logprobs": lps})
    return out


def _floats(values: npt.NDArray[np.float32]) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values.tolist()]


def trajectory_json(session: Session) -> dict[str, Any]:
    """The session as JSON-ready data (module docstring)."""
    turns = [
        {
            "turn": i,
            "prompt_token_ids": t.prompt_ids.tolist(),
            "token_ids": t.token_ids.tolist(),
            "logprobs": _floats(t.logprobs),
            "new_start": t.new_start,
            "branch": t.branch,
            "branch_reason": t.branch_reason,
            "weight_versions": t.weight_versions,
            "started": t.started,
            "finished": t.finished,
            "queue_time": t.queue_time,
            "engine_time": t.engine_time,
            "engine": t.engine,
            "finish_reason": t.finish_reason,
            "reward": t.reward,
        }
        for i, t in enumerate(session.turns)
    ]
    sequences = [
        {
            "turns": list(s["turns"]),
            "token_ids": s["token_ids"].tolist(),
            "loss_mask": s["loss_mask"].tolist(),
            "logprobs": s["logprobs"].tolist(),
        }
        for s in sequence_arrays(session)
    ]
    return {
        "id": session.id,
        "tenant": session.tenant,
        "created": session.created,
        "last_used": session.last_used,
        "rewards": session.rewards,
        "branch_points": [i for i, t in enumerate(session.turns) if t.branch],
        "turns": turns,
        "sequences": sequences,
    }
