"""The faults a test site can be told to inject (client.process.faults): specs and what each fault sends; the
faults with real processes are in tests/e2e/test_faults.py."""

import numpy as np
import pytest

from client.process.faults import Fault, parse_fault
from common.params import Manifest, check_arrays, from_wire, pack, packed_nbytes


def test_fault_specs_and_what_each_fault_sends():
    man = Manifest(keys=("embedding.w", "embedding.b"), shapes=((2, 3), (3,)), dtypes=("float32", "float32"))
    good = [np.ones((2, 3), np.float32), np.zeros(3, np.float32)]
    assert parse_fault("") is None
    assert parse_fault("sleep:2.5@2,4") == Fault("sleep", 2.5, frozenset({2, 4}))
    for bad in ("boom", "nan:3", "sleep:x", "nan@two"):
        with pytest.raises(ValueError, match="expected KIND"):
            parse_fault(bad)
    for spec, why in (
        ("nan", "non-finite"),
        ("shape", "has shape"),
        ("dtype", "has dtype float64"),
        ("count", "expected 2 arrays"),
    ):
        sent = parse_fault(spec).corrupt("s", 1, good)
        with pytest.raises(ValueError, match=why):
            check_arrays(man, sent, who="update")
    big = parse_fault("scale:1e6").corrupt("s", 1, good)
    np.testing.assert_array_equal(big[0], np.full((2, 3), 1e6, np.float32))
    check_arrays(man, big, who="update")  # finite, right shape and dtype: only the norm bound stops it
    assert parse_fault("nan@3").corrupt("s", 1, good) is good  # not its round: untouched
    check_arrays(man, good, who="update")  # the input was not modified
    # on the wire (one packed array): the coordinator refuses the wrong lengths with the manifest's numbers
    assert packed_nbytes(man) == 36
    assert parse_fault("nan@3").wire("s", 1, man, good).tobytes() == pack(man, good).tobytes()
    for spec, found in (("shape", 40), ("dtype", 72), ("count", 24)):
        with pytest.raises(ValueError, match=f"hold {found} bytes, the manifest {man.hash} \\(2 tensors\\) needs 36"):
            from_wire(man, [parse_fault(spec).wire("s", 1, man, good)], who="update")
    with pytest.raises(ValueError, match="non-finite"):
        check_arrays(man, from_wire(man, [parse_fault("nan").wire("s", 1, man, good)], who="u"), who="update")


def test_several_faults_for_one_site_each_in_its_rounds(monkeypatch):
    from client.process import faults as faults_module
    from client.process.faults import parse_faults
    from client.process.round_hooks import ProcessRoundHooks

    man = Manifest(keys=("embedding.w",), shapes=((2, 3),), dtypes=("float32",))
    good = [np.ones((2, 3), np.float32)]
    assert parse_faults("") == ()
    hooks = ProcessRoundHooks(parse_faults("nan@1; sleep:30@2;dtype@3"))
    slept = []
    monkeypatch.setattr(faults_module.time, "sleep", slept.append)
    for rnd in (1, 2, 3, 4):
        hooks.before_training("s", rnd)
    assert slept == [30.0]  # only in round 2
    one = from_wire(man, [hooks.reply("s", 1, man, good)], who="u")
    assert np.isnan(one[0]).sum() == 1 and np.isposinf(one[0]).sum() == 1  # nan and inf in the one array
    assert hooks.reply("s", 2, man, good) is None  # round 2: the update as it is
    assert hooks.reply("s", 3, man, good).nbytes == 2 * packed_nbytes(man)  # float64: twice the bytes
    assert hooks.reply("s", 4, man, good) is None
    for bad in ("nan;dtype@2", "nan@1,2;scale:2@2"):  # two changes of the update in one round
        with pytest.raises(ValueError, match="at most one of"):
            parse_faults(bad)
    with pytest.raises(ValueError, match="expected KIND"):
        parse_faults("nan@1;boom")
