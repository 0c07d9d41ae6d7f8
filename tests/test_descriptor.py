"""Affinities and descriptors against direct loops, and against transformers itself."""

import torch

from ptc.compiler.method.descriptor import affinity, class_embeddings, cosine, task_descriptor


def test_class_embeddings_average_normalised_templates():
    g = torch.Generator().manual_seed(0)
    prompts = torch.randn(3 * 4, 8, generator=g, dtype=torch.float64)  # 3 classes x 4 templates
    rows = class_embeddings(prompts, 3)
    for c in range(3):
        block = prompts[4 * c : 4 * c + 4]
        mean = (block / block.norm(dim=1, keepdim=True)).mean(0)
        assert torch.allclose(rows[c], mean / mean.norm())


def test_descriptor_is_the_affinity_change():
    g = torch.Generator().manual_seed(1)
    pre, ft = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    rows = class_embeddings(torch.randn(3, 8, generator=g), 3)
    utd = task_descriptor(ft, pre, rows)
    for i in range(5):
        for j in range(3):
            s_ft = float(ft[i].double() @ rows[j].double() / ft[i].double().norm())
            s_pre = float(pre[i].double() @ rows[j].double() / pre[i].double().norm())
            assert abs(float(utd[i, j]) - (s_ft - s_pre)) < 1e-12
    assert torch.count_nonzero(task_descriptor(pre, pre, rows)) == 0
    assert abs(cosine(utd, 2 * utd) - 1) < 1e-12
    assert affinity(pre, rows).shape == (5, 3)
