"""common/models/from_state.py: a module built straight into a state's tensors is the module a
normal build plus ``load_state_dict`` gives, without drawing from torch's random stream."""

import pytest
import torch
from torch import nn

from common.models.from_state import module_from_state
from common.models.reid import build_model


def random_state(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """``module``'s state with every float tensor redrawn (running statistics included) and the
    integer counters set, so nothing can match a fresh build by accident."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for k, v in module.state_dict().items():
        if v.is_floating_point():
            x = torch.rand(v.shape, generator=g, dtype=v.dtype)
            state[k] = x + 0.5 if k.endswith("running_var") else x - 0.5
        else:
            state[k] = torch.full_like(v, 7)
    return state


def build():
    return build_model("resnet18", 5, hidden=32, dropout=0.0)


def test_the_same_tensors_flags_and_outputs_as_build_then_load():
    torch.manual_seed(0)
    state = random_state(build(), seed=1)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    m = module_from_state(build, state, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before)  # no initialisation was drawn
    ref = build()  # the usual way: build (draws), then load
    assert not torch.equal(torch.get_rng_state(), before)
    ref.load_state_dict(state)
    got = m.state_dict()
    assert list(got) == list(state)
    for k, v in state.items():
        assert got[k].device.type == "cpu" and got[k].dtype == v.dtype, k
        assert torch.equal(got[k], v), k
        assert got[k].data_ptr() != v.data_ptr(), k  # copied in, not aliased
    assert [p.requires_grad for p in m.parameters()] == [p.requires_grad for p in ref.parameters()]
    assert [x.training for x in m.modules()] == [x.training for x in ref.modules()]
    x = torch.rand(2, 3, 32, 16, generator=torch.Generator().manual_seed(4))
    m.eval(), ref.eval()
    with torch.no_grad():
        assert torch.equal(m(x), ref(x))


class WithScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("scale", torch.full((3,), 2.0), persistent=False)  # in no state dict


def test_a_tensor_no_state_can_give_is_built_as_usual():
    state = {"fc.weight": torch.ones(2, 3), "fc.bias": torch.zeros(2)}
    m = module_from_state(WithScale, state, "cpu")
    assert torch.equal(m.scale, torch.full((3,), 2.0))  # initialised by its own build, not left empty
    assert torch.equal(m.fc.weight, torch.ones(2, 3)) and torch.equal(m.fc.bias, torch.zeros(2))


def test_a_state_missing_a_tensor_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r"0\.bias"):
        module_from_state(lambda: nn.Sequential(nn.Linear(3, 2)), {"0.weight": torch.ones(2, 3)}, "cpu")
