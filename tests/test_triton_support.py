"""Which Triton interpreters run our kernels on CPU tensors (kernels/triton_support.py): the
versions measured to fail are unavailable with the reason, never run to give wrong values."""
import pytest

from fusebench.kernels import triton_support


@pytest.mark.parametrize("triton, numpy, says", [
    ((3, 0), (2, 2), "wrong values"),
    ((3, 1), (2, 4), "wrong values"),
    ((3, 2), (2, 4), "numpy 2.4 refuses"),
    ((3, 6), (2, 5), "numpy 2.4 refuses"),
    ((3, 6), (2, 3), None),
    ((3, 2), (1, 26), None),
    ((3, 7), (2, 4), None),
    ((4, 0), (3, 0), None),
    (None, (2, 4), None),            # no distribution metadata: nothing measured against it
])
def test_the_interpreter_versions_measured_to_fail_are_refused(triton, numpy, says):
    reason = triton_support.interpreter_reason_for(triton, numpy)
    if says is None:
        assert reason == ""
    else:
        assert says in reason and f"triton {triton[0]}.{triton[1]}'s interpreter" in reason
        assert "triton >= 3.7 runs them" in reason


def test_an_interpreter_that_fails_makes_every_family_unavailable_on_cpu(monkeypatch):
    from fusebench.kernels import get_impl, list_impls
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_support, "_has_triton", lambda: True)
    monkeypatch.setattr(triton_support, "interpreter_reason", lambda: "triton 3.0's interpreter")
    assert triton_support.available("cpu") == (False, "triton 3.0's interpreter")
    families = [f for f in ("silu", "ln2d", "bn_act", "dwconv", "rms_norm", "gn_act")
                if "triton" in list_impls(f)]
    assert len(families) >= 5
    for family in families:
        assert get_impl(family, "triton").available("cpu") == (False, "triton 3.0's interpreter")
