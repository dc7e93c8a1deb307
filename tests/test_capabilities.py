"""Capabilities: a family says what it provides, a method what it needs; the host matches them."""
from __future__ import annotations

import dataclasses

import pytest

from vitbench.catalog import KIND_NEEDS, FamilySpec, MethodSpec, missing_capabilities
from vitbench.host import get_host


@dataclasses.dataclass(frozen=True)
class _NoParams:
    pass


def _method(**kwargs) -> MethodSpec:
    return MethodSpec(name="m", params=_NoParams, build="pkg.mod:build", **kwargs)


def test_a_method_needs_what_its_kind_needs_unless_it_says() -> None:
    assert _method(kind="merging").needs == {"token_steps"} == KIND_NEEDS["pruning"]
    assert _method(kind="channel").needs == {"channels"}
    assert _method(kind="pruning", needs=frozenset({"token_steps", "cls_attn"})).needs == {"token_steps", "cls_attn"}


@pytest.mark.parametrize("make", [lambda: _method(needs=frozenset({"token_stepz"})),
                                  lambda: FamilySpec(name="f", matches="a:b", describe="a:b", patch="a:b",
                                                     provides=frozenset({"token_stepz"}))])
def test_an_unknown_capability_is_refused_naming_the_valid_ones(make) -> None:
    with pytest.raises(ValueError, match=r"unknown capability 'token_stepz' of (method 'm'|family 'f'); valid "
                                         r"capabilities: token_steps, grid_merges, channels"):
        make()


def test_the_host_runs_a_method_on_the_families_that_provide_its_needs() -> None:
    host = get_host()
    assert host.families_for(host.method("tome")) == ["mobilevit", "swin", "vit"]
    assert host.families_for(host.method("topk")) == ["vit"]
    assert missing_capabilities(host.method("topk"), host.family("swin")) == {"cls_attn"}
    assert missing_capabilities(host.method("tome"), host.family("efficientvit")) == {"token_steps"}


def test_the_deprecated_family_list_still_restricts_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match="MethodSpec.families of 'm' is deprecated"):
        spec = _method(kind="merging", families=("vit",))
    host = get_host()
    assert missing_capabilities(spec, host.family("vit")) == frozenset()
    assert missing_capabilities(spec, host.family("swin")) == {"the swin family (MethodSpec.families)"}
