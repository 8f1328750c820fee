"""swap: an attribute, environment variables or an inert stand-in for the length of a block, and nothing left behind."""

from __future__ import annotations

import os
import types

import pytest

from sglang_dcp_dspark.core import swap


class Base:
    @staticmethod
    def answer() -> int:
        return 1


class Child(Base):
    pass


def test_an_attribute_is_swapped_and_put_back_as_the_descriptor_it_was():
    with swap.attribute(Base, "answer", lambda: 2):
        assert Base.answer() == 2 and Child.answer() == 2
    assert Base.answer() == 1 and isinstance(vars(Base)["answer"], staticmethod)


def test_an_inherited_attribute_is_removed_again_not_copied_down():
    with swap.attribute(Child, "answer", lambda: 3):
        assert Child.answer() == 3 and Base.answer() == 1
    assert "answer" not in vars(Child) and Child.answer() == 1


def test_a_module_attribute_goes_back_even_when_the_block_raises():
    module = types.ModuleType("m")
    module.value = "old"
    with pytest.raises(RuntimeError), swap.attribute(module, "value", "new"):
        assert module.value == "new"
        raise RuntimeError
    assert module.value == "old"


def test_a_missing_attribute_is_refused():
    with pytest.raises(AttributeError), swap.attribute(types.ModuleType("m"), "nothing", 1):
        pass


def test_environment_variables_are_set_and_restored_or_removed(monkeypatch):
    monkeypatch.setenv("DCP_DSPARK_SWAP_SET", "before")
    monkeypatch.delenv("DCP_DSPARK_SWAP_NEW", raising=False)
    with swap.environ(DCP_DSPARK_SWAP_SET="inside", DCP_DSPARK_SWAP_NEW="1"):
        assert os.environ["DCP_DSPARK_SWAP_SET"] == "inside" and os.environ["DCP_DSPARK_SWAP_NEW"] == "1"
    assert os.environ["DCP_DSPARK_SWAP_SET"] == "before" and "DCP_DSPARK_SWAP_NEW" not in os.environ


def test_returning_answers_whatever_it_is_asked():
    assert swap.returning((9, 0))(0, device="x") == (9, 0)


def test_the_inert_stand_in_accepts_anything_and_yields_nothing():
    inert = swap.Inert()
    assert isinstance(inert.group.all_gather(1, dim=0), swap.Inert) and bool(inert)
    assert list(inert) == [] and len(inert) == 0 and 3 not in inert
    with inert as entered:
        assert entered is inert
    with pytest.raises(AttributeError):
        inert.__wrapped__  # noqa: B018 (dunder lookups are not faked: inspect and copy stay honest)
