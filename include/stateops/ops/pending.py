"""Pending work: what an interrupted or unfinished operation left for the next one to finish
or refuse on. The markers themselves are read and written by :mod:`stateops.control.markers`;
this module is the one place that says what they mean: a rollback or a repartition that was
interrupted (nothing may start until it is finished or undone), a repartition a killed start
of a transplanted checkpoint left (the next start undoes and does it again), and state carried
over to a new checkpoint that waits for its first batch (a bootstrap's initial state, a
transplant's proof).
"""

from __future__ import annotations

import os
from typing import Any

from stateops.control.markers import (
    clear_carry_over,
    read_carry_over,
    read_repartition,
    read_rollback,
    write_carry_over,
)
from stateops.core.errors import StateOpsError
from stateops.core.registry import Query
from stateops.core.storage import location, unfinished
from stateops.ops.carry import finish_image_batch

__all__ = ["killed_repartition", "mark_transplant", "pending_carry_over", "refuse_pending_rollback"]


def refuse_pending_rollback(
    checkpoint: str | os.PathLike[str], to_batch: int | None = None, *, redone: bool = False
):
    """Raise while an interrupted rollback (to another batch than ``to_batch``) or repartition
    (unless ``to_batch`` goes back to before it: the rollback finishes it; or ``redone``: the
    start undoes and does it again, :func:`killed_repartition`) is
    pending, or a restore or transplant into the checkpoint was interrupted before it was
    whole (its publish's marker is there: what Spark would find is any part of it)."""
    if unfinished(location(checkpoint)):
        raise StateOpsError(
            f"{checkpoint}: a restore or transplant into it was interrupted before the "
            "checkpoint was whole; run it again (it empties what it left and publishes again)"
        )
    repartition = None if redone else read_repartition(checkpoint)
    if repartition is not None and (to_batch is None or to_batch >= repartition["batch"]):
        before = repartition["batch"] - 1
        raise StateOpsError(
            f"{checkpoint}: a repartition to {repartition['partitions']} partitions (run "
            f"{repartition['run_id']}) was interrupted; run it again (stateops repartition "
            f"{checkpoint} --partitions {repartition['partitions']}) or undo it (stateops "
            f"rollback {checkpoint} --to-batch {before})"
        )
    pending = read_rollback(checkpoint)
    if pending is None:
        return None
    if to_batch is None or pending["to_batch"] != to_batch:
        raise StateOpsError(
            f"{checkpoint}: a rollback to batch {pending['to_batch']} (run {pending['run_id']}) "
            f"was interrupted; finish it first: stateops rollback {checkpoint} "
            f"--to-batch {pending['to_batch']}"
        )
    return pending


def mark_transplant(transplant: dict[str, Any]) -> None:
    """A transplanted checkpoint awaits its first batch, whose state is then proven against
    the old checkpoint's (``transplant``: what ``transplant_checkpoint`` returned). That is
    batch N + 1; where the partition count changes, the start first has Spark repartition the
    state (batch N + 1, ``partitions``) and the first batch is N + 2."""
    repartition = transplant.get("repartition")
    write_carry_over(
        transplant["new"],
        {
            "road": "transplant",
            "checkpoint": transplant["new"],
            "from_checkpoint": transplant["old"],
            "batch": transplant["batch"],
            "first": transplant["first"],
            "partitions": repartition and repartition[1],
        },
    )


def killed_repartition(query: Query) -> dict[str, Any] | None:
    """The marker of the repartition a killed start of a transplanted checkpoint left (see
    :func:`mark_transplant`), which the next start undoes and does again; else None."""
    carried, marker = read_carry_over(query.checkpoint), read_repartition(query.checkpoint)
    if carried and marker and carried.get("partitions") and marker["batch"] == carried["batch"] + 1:
        return marker
    return None


def pending_carry_over(query: Query, last_committed: int | None) -> dict[str, Any] | None:
    """The carried-over state awaiting its first batch on this start, or None: a bootstrap's
    initial state until batch 0 commits, a transplant until its first batch commits (N + 1,
    or N + 2 after a repartition). The marker lies beside the checkpoint it describes
    (:func:`stateops.control.markers.carry_over_marker`), so whichever host starts the query
    sees it."""
    record = read_carry_over(query.checkpoint)
    if record is None:
        return None
    batch = record.get("batch")
    awaiting = [batch] if batch is None else range(batch, record.get("first", batch + 1))
    if last_committed not in awaiting:
        if last_committed == 0 and record.get("origin"):
            # Stopped between the image batch's commit and its watermark: finish it first.
            finish_image_batch(query.checkpoint, record["origin"])
        clear_carry_over(query.checkpoint)  # settled
        return None
    return record
