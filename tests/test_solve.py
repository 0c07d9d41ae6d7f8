"""The closed-form solve against independent computations, and its linearity."""

import pytest
import torch

from ptc.compiler.method.descriptor import normalise
from ptc.compiler.method.ridge import (
    factorize,
    first_order_descriptor,
    ridge_filter,
    solve_dense,
    solve_operator,
)
from ptc.compiler.verify.checks import linearity


def _grid(n, m, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, d, generator=g, dtype=torch.float64)
    classes = normalise(torch.randn(m, d, generator=g, dtype=torch.float64))
    return inputs, classes, torch.randn(n, m, generator=g, dtype=torch.float64) * 0.1


@pytest.mark.parametrize("n,m,d", [(40, 12, 8), (10, 6, 16), (30, 30, 30)])
@pytest.mark.parametrize("ridge", [1e-3, 0.5, 1.0])
def test_factored_solve_equals_explicit_inverses(n, m, d, ridge):
    inputs, classes, descriptor = _grid(n, m, d)
    fast = solve_operator(factorize(inputs, classes), descriptor, ridge)
    dense = solve_dense(inputs, classes, descriptor, ridge)
    assert fast.shape == (d, d)
    assert torch.allclose(fast, dense, rtol=1e-10, atol=1e-12)


def test_vanishing_ridge_is_the_least_squares_solution():
    # min ||F A^T G^T - U|| over A, written as one vectorised least-squares problem:
    # vec(F X G^T) = (G kron F) vec(X) with column-major vec.
    n, m, d = 30, 12, 5
    inputs, classes, descriptor = _grid(n, m, d, seed=3)
    f = normalise(inputs)
    design = torch.kron(classes, f)
    x = torch.linalg.lstsq(design, descriptor.T.reshape(-1, 1)).solution.reshape(d, d).T  # X = A^T
    solved = solve_operator(factorize(inputs, classes), descriptor, ridge=1e-13)
    assert torch.allclose(solved.T, x, rtol=1e-6, atol=1e-8)


def test_descriptor_in_the_span_is_reproduced():
    n, m, d = 50, 10, 6
    inputs, classes, _ = _grid(n, m, d, seed=4)
    true_operator = torch.randn(d, d, dtype=torch.float64) * 0.05
    descriptor = first_order_descriptor(inputs, classes, true_operator)
    solved = solve_operator(factorize(inputs, classes), descriptor, ridge=1e-13)
    assert torch.allclose(solved, true_operator, atol=1e-9)


def test_ridge_shrinks_the_operator():
    inputs, classes, descriptor = _grid(40, 12, 8, seed=5)
    factors = factorize(inputs, classes)
    norms = [float(solve_operator(factors, descriptor, r).norm()) for r in (0.01, 0.1, 1.0, 10.0)]
    assert norms == sorted(norms, reverse=True)
    s = factors.s_inputs
    assert torch.allclose(ridge_filter(s, 1.0), s / (s * s + (s * s).mean()))


def test_linearity_identity_in_fp64_and_at_stored_fp32():
    inputs, classes, descriptor = _grid(60, 20, 16, seed=6)
    others = [_grid(60, 20, 16, seed=s)[2] for s in (7, 8)]
    figures = linearity(factorize(inputs, classes), [descriptor, *others], ridge=1.0)
    assert figures["max_rel_diff_fp64"] < 1e-13
    assert 1e-10 < figures["max_rel_diff_fp32"] < 1e-6  # float32 rounding is visible but small


def test_shape_mismatch_is_refused():
    inputs, classes, descriptor = _grid(20, 5, 4)
    with pytest.raises(ValueError, match="does not match the grid"):
        solve_operator(factorize(inputs, classes), descriptor[:, :4], 1.0)


@pytest.mark.parametrize("n,p", [(40, 11), (9, 13)])
def test_regressor_solve_equals_explicit_inverses_and_reproduces_an_edit_in_its_span(n, p):
    # A residual head: the edit E (d x p) moves z by E r(x); the solve runs on Phi = R / ||z||.
    m, d = 7, 6
    inputs, classes, descriptor = _grid(n, m, d, seed=9)
    regressors = torch.randn(n, p, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    factors = factorize(inputs, classes, regressors)
    fast = solve_operator(factors, descriptor, 0.3)
    assert fast.shape == (d, p)
    assert torch.allclose(
        fast, solve_dense(inputs, classes, descriptor, 0.3, regressors), rtol=1e-10, atol=1e-12
    )
    if n >= p:  # Phi has full column rank: an edit's own first-order descriptor gives it back
        true_edit = torch.randn(d, p, dtype=torch.float64) * 0.05
        induced = first_order_descriptor(inputs, classes, true_edit, regressors)
        assert torch.allclose(solve_operator(factors, induced, ridge=1e-13), true_edit, atol=1e-9)
