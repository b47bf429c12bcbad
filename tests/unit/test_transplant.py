"""The carry-over road a migration takes (pure logic)."""

from __future__ import annotations

import pytest

from stateops.core.errors import StateOpsError
from stateops.ops.transplant import TransplantRefused, choose_road

pytestmark = pytest.mark.unit

WHY = ["the old state has 2 partitions, the query 3 (shuffle_partitions)"]


def test_auto_takes_the_transplant_where_it_applies_and_says_why_not_where_it_does_not():
    said = []
    assert choose_road("auto", [], said.append) == "transplant" and not said
    assert choose_road("auto", WHY, said.append) == "initial_state"
    assert said == [f"transplant does not apply ({WHY[0]}): falling back to the initialState road"]


def test_an_explicit_choice_is_kept_or_refused_with_the_reasons():
    assert choose_road("initial_state", []) == "initial_state"
    assert choose_road("initial_state", WHY) == "initial_state"
    assert choose_road("transplant", []) == "transplant"
    with pytest.raises(
        TransplantRefused,
        match=r"does not apply: the old state has 2 part.*; "
        "choose carry_over auto or initial_state",
    ):
        choose_road("transplant", WHY)
    with pytest.raises(StateOpsError, match="carry_over 'copy': choose one of auto, transplant"):
        choose_road("copy", [])


def test_a_transforms_state_takes_the_transplant_or_nothing():
    assert choose_road("auto", [], transform=True) == "transplant"
    with pytest.raises(
        TransplantRefused,
        match=r"does not apply: the old state has 2 part.*; "
        "a transform's state moves to a new source by transplant only",
    ):
        choose_road("auto", WHY, transform=True)
    with pytest.raises(StateOpsError, match="initial_state is for processors"):
        choose_road("initial_state", [], transform=True)
